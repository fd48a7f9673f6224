"""mcprl: train open models to use any MCP server's tools with reinforcement learning.

The training toolkit. Its judge, RULER, lives in the standalone package `ruler`. Serving
(`mcprl.serving`), the backends and reports (`mcprl.report`) load torch or matplotlib and are
imported on their own; `TrainingRun` is the loop behind `mcprl train`.
"""

from __future__ import annotations

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
from mcprl.gather import GatherError, gather_groups
from mcprl.model import LiteLLMModel, Model, TrainableModel
from mcprl.rewards import ReferenceReward, reference_reward, scorer
from mcprl.rollout import RolloutConfig, rollout
from mcprl.scenarios import Scenario, ScenarioSet
from mcprl.train import RunConfig, RunSummary, TrainingRun
from mcprl.types import AttemptError, Choice, Trajectory, TrajectoryGroup, read_groups, write_groups

__version__ = "0.1.0"

__all__ = [
    "AttemptError",
    "Choice",
    "GatherError",
    "LiteLLMModel",
    "MCPConnectionError",
    "MCPRLError",
    "MCPServerError",
    "MCPServerStartError",
    "Model",
    "PreflightError",
    "ReferenceReward",
    "RolloutConfig",
    "RunConfig",
    "RunSummary",
    "Scenario",
    "ScenarioFileError",
    "ScenarioGenerationError",
    "ScenarioSampler",
    "ScenarioSet",
    "ServerSpecError",
    "TrainableModel",
    "TrainingRun",
    "Trajectory",
    "TrajectoryGroup",
    "__version__",
    "evaluate_models",
    "gather_groups",
    "read_groups",
    "reference_reward",
    "rollout",
    "scorer",
    "write_groups",
]
