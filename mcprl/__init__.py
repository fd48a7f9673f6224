"""mcprl: train open models to use any MCP server's tools with reinforcement learning.

The training toolkit. Its judge, RULER, lives in the standalone package `ruler`. Serving
(`mcprl.serving`) and reports (`mcprl.report`) load torch or matplotlib and are imported on
their own; `TrainingRun` is the loop behind `mcprl train`.

ART's names are here too, so that an ART training loop runs with `import mcprl as art`:
`TrainableModel` (`await model.register(backend)`, `model.train`, `model.log`,
`model.get_step`), `Trajectory(messages_and_choices=...)`, `TrajectoryGroup(awaitables)`,
`gather_trajectory_groups`, `TrainConfig`, `LocalBackend` (also `mcprl.local`) and
`ruler_score_group` (also `mcprl.rewards`).
"""

from __future__ import annotations

from mcprl.backends import Backend, BackendError, LocalBackend, RemoteBackend, TrainResult
from mcprl.curriculum import ScenarioSampler
from mcprl.errors import (
    MCPConnectionError,
    MCPRLError,
    MCPServerError,
    MCPServerStartError,
    PreflightError,
    ScenarioFileError,
    ScenarioGenerationError,
    ServerSpecError,
)
from mcprl.evaluate import evaluate_models
from mcprl.gather import GatherError, gather_groups, gather_trajectory_groups
from mcprl.model import LiteLLMModel, Model, TrainableModel
from mcprl.rewards import ReferenceReward, reference_reward, ruler_score_group, scorer
from mcprl.rollout import RolloutConfig, rollout
from mcprl.scenarios import Scenario, ScenarioSet
from mcprl.train import RunConfig, RunSummary, TrainingRun
from mcprl.training import LoraConfig, TrainConfig
from mcprl.types import (
    AttemptError,
    Choice,
    Messages,
    Trajectory,
    TrajectoryGroup,
    read_groups,
    write_groups,
)

__version__ = "0.1.0"

__all__ = [
    "AttemptError",
    "Backend",
    "BackendError",
    "Choice",
    "GatherError",
    "LiteLLMModel",
    "LocalBackend",
    "LoraConfig",
    "MCPConnectionError",
    "MCPRLError",
    "MCPServerError",
    "MCPServerStartError",
    "Messages",
    "Model",
    "PreflightError",
    "ReferenceReward",
    "RemoteBackend",
    "RolloutConfig",
    "RunConfig",
    "RunSummary",
    "Scenario",
    "ScenarioFileError",
    "ScenarioGenerationError",
    "ScenarioSampler",
    "ScenarioSet",
    "ServerSpecError",
    "TrainConfig",
    "TrainResult",
    "TrainableModel",
    "TrainingRun",
    "Trajectory",
    "TrajectoryGroup",
    "__version__",
    "evaluate_models",
    "gather_groups",
    "gather_trajectory_groups",
    "read_groups",
    "reference_reward",
    "rollout",
    "ruler_score_group",
    "scorer",
    "write_groups",
]
