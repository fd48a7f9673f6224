"""GRPO on a LoRA adapter: advantages, loss variants, sequences from sampled tokens, the trainer.

from mcprl.training import LoraTrainer, TrainConfig

The configs import without torch (the CLI and `import mcprl` stay quick); everything else loads
torch on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from mcprl.training._config import LoraConfig, TrainConfig

_LAZY = {
    "BatchStats": "_batch",
    "MicroBatch": "_batch",
    "Sequence": "_batch",
    "build_sequences": "_batch",
    "micro_batches": "_batch",
    "split_by_group": "_batch",
    "CISPO": "_losses",
    "GSPO": "_losses",
    "LOSSES": "_losses",
    "Normalizer": "_losses",
    "PPOClip": "_losses",
    "batch_advantages": "_losses",
    "group_advantages": "_losses",
    "LoraTrainer": "_trainer",
    "UnslothTrainer": "_unsloth",
    "pick_trainer": "_unsloth",
    "trainer_factory": "_unsloth",
}

__all__ = ["LoraConfig", "TrainConfig", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f"mcprl.training.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'mcprl.training' has no attribute {name!r}")
