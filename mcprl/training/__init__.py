"""GRPO on a LoRA adapter: advantages, loss variants, sequences from sampled tokens, the trainer.

from mcprl.training import LoraTrainer, TrainConfig
"""

from __future__ import annotations

from mcprl.training._batch import BatchStats, MicroBatch, Sequence, build_sequences, micro_batches
from mcprl.training._config import LoraConfig, TrainConfig
from mcprl.training._losses import CISPO, GSPO, LOSSES, Normalizer, PPOClip, group_advantages
from mcprl.training._trainer import LoraTrainer

__all__ = [
    "CISPO",
    "GSPO",
    "LOSSES",
    "BatchStats",
    "LoraConfig",
    "LoraTrainer",
    "MicroBatch",
    "Normalizer",
    "PPOClip",
    "Sequence",
    "TrainConfig",
    "build_sequences",
    "group_advantages",
    "micro_batches",
]
