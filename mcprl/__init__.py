"""mcprl: train open models to use any MCP server's tools with reinforcement learning.

The training toolkit. Its judge, RULER, lives in the standalone package `ruler`. Serving
(`mcprl.serving`) loads torch and is imported on its own.
"""

from __future__ import annotations

from mcprl.errors import (
    MCPConnectionError,
    MCPRLError,
    MCPServerError,
    MCPServerStartError,
    ScenarioFileError,
    ScenarioGenerationError,
    ServerSpecError,
)
from mcprl.gather import GatherError, gather_groups
from mcprl.model import Model, TrainableModel
from mcprl.rewards import reference_reward, scorer
from mcprl.rollout import RolloutConfig, rollout
from mcprl.scenarios import Scenario, ScenarioSet
from mcprl.types import AttemptError, Choice, Trajectory, TrajectoryGroup, read_groups, write_groups

__version__ = "0.1.0"

__all__ = [
    "AttemptError",
    "Choice",
    "GatherError",
    "MCPConnectionError",
    "MCPRLError",
    "MCPServerError",
    "MCPServerStartError",
    "Model",
    "RolloutConfig",
    "Scenario",
    "ScenarioFileError",
    "ScenarioGenerationError",
    "ScenarioSet",
    "ServerSpecError",
    "TrainableModel",
    "Trajectory",
    "TrajectoryGroup",
    "__version__",
    "gather_groups",
    "read_groups",
    "reference_reward",
    "rollout",
    "scorer",
    "write_groups",
]
