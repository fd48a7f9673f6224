"""`UnslothTrainer`: the LoRA trainer on Unsloth's `FastLanguageModel` (CUDA only).

    trainer = UnslothTrainer("Qwen/Qwen2.5-3B-Instruct", LoraConfig(), device="cuda")

The step, the losses, the checkpoints (peft's adapter format) and the optimizer are
`LoraTrainer`'s; only the model differs. Unsloth loads the base model with its patched forward
passes and fused LoRA kernels, and gradient checkpointing of its own ("unsloth": activations
offloaded to host memory). Its forward returns the last hidden states instead of logits while
`UNSLOTH_RETURN_HIDDEN_STATES=1` (what Unsloth's own GRPO and ART do): the trainer then projects
only the trained tokens onto the vocabulary, as it does with peft. Rows run whole: a prefix
shared by a step's sequences is not run once per update here (`shares_prefix`), since Unsloth's
forward does not continue rows from a key/value cache while training.

`pick_trainer` decides which trainer a backend uses: `auto` takes Unsloth where it is installed,
the device is a GPU and inference runs in another process (vLLM), and peft otherwise.
Unsloth patches transformers' model classes when it loads a model, and mcprl's own engine runs on
those classes, so the local backend (engine and trainer in one process) always trains with peft.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from mcprl.errors import UsageError
from mcprl.serving import torch_dtype
from mcprl.training._config import LoraConfig
from mcprl.training._trainer import LoraTrainer

__all__ = ["TRAINERS", "UnslothTrainer", "pick_trainer", "trainer_factory", "unsloth_installed"]

logger = logging.getLogger(__name__)

TRAINERS = ("auto", "peft", "unsloth")


class UnslothTrainer(LoraTrainer):
    shares_prefix = False

    def __init__(
        self,
        base_path: str,
        lora: LoraConfig | None = None,
        *,
        adapter_path: str | Path | None = None,
        dtype: str = "bfloat16",
        device: str | None = "cuda",
        max_seq_length: int = 8192,
    ) -> None:
        """`max_seq_length`: the longest sequence a step trains on (Unsloth sizes its rotary
        embedding tables by it)."""
        self.max_seq_length = max_seq_length
        super().__init__(base_path, lora, adapter_path=adapter_path, dtype=dtype, device=device)

    def _load(self, base_path: str, lora: LoraConfig, adapter_path: str | Path | None) -> Any:
        from unsloth import FastLanguageModel

        model, _ = FastLanguageModel.from_pretrained(
            model_name=str(base_path),
            max_seq_length=self.max_seq_length,
            dtype=torch_dtype(self.dtype),
            load_in_4bit=False,
        )
        if adapter_path is not None:  # a checkpoint: its LoRA, trainable, with Unsloth's kernels
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, str(adapter_path), is_trainable=True)
            return FastLanguageModel.patch_peft_model(model, use_gradient_checkpointing="unsloth")
        return FastLanguageModel.get_peft_model(
            model,
            r=lora.r,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            target_modules=list(lora.target_modules),
            bias="none",
            use_gradient_checkpointing="unsloth",
        )

    def _hidden(
        self, ids: torch.Tensor, attention: torch.Tensor, checkpointed: bool = False
    ) -> torch.Tensor:
        # `checkpointed` is left to Unsloth, which checkpoints every layer itself ("unsloth")
        reduced = self.dtype != "float32" and self.device.type == "cuda"
        with (
            _hidden_states_instead_of_logits(),
            torch.autocast(self.device.type, dtype=torch_dtype(self.dtype), enabled=reduced),
        ):
            return self.model(input_ids=ids, attention_mask=attention).logits


@contextlib.contextmanager
def _hidden_states_instead_of_logits() -> Iterator[None]:
    """Unsloth's switch, set for one forward pass and put back as it was."""
    key, before = "UNSLOTH_RETURN_HIDDEN_STATES", os.environ.get("UNSLOTH_RETURN_HIDDEN_STATES")
    os.environ[key] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before


def unsloth_installed() -> bool:
    return importlib.util.find_spec("unsloth") is not None


def pick_trainer(choice: str, device: str, *, separate_inference: bool) -> str:
    """`peft` or `unsloth`, for `choice` (auto, peft, unsloth) on `device`. `separate_inference`:
    the model is served by another process (vLLM), so Unsloth's patches cannot reach it."""
    if choice not in TRAINERS:
        raise UsageError(f"trainer {choice!r}: choose one of {', '.join(TRAINERS)}")
    gpu = device.startswith("cuda")
    if choice == "auto":
        return "unsloth" if gpu and separate_inference and unsloth_installed() else "peft"
    if choice == "unsloth":
        if not separate_inference:
            raise UsageError(
                "`trainer=unsloth` needs `backend=vllm`: Unsloth patches transformers' model "
                "classes, which mcprl's own engine serves with in the same process; use "
                "`trainer=peft` (the default) with this backend"
            )
        if not gpu:
            raise UsageError(
                f"`trainer=unsloth` trains on a CUDA GPU only, and this run's device is {device}: "
                "use `trainer=peft`, or `device=cuda` on a GPU machine"
            )
        if not unsloth_installed():
            raise UsageError(
                "`trainer=unsloth`: Unsloth is not installed here (pip install unsloth, or "
                "pip install -e '.[gpu]'); or use `trainer=peft`"
            )
    return choice


def trainer_factory(
    choice: str, device: str, dtype: str, *, separate_inference: bool
) -> tuple[str, Callable[[Path, LoraConfig, Path | None], LoraTrainer]]:
    """The trainer `choice` picks (`pick_trainer`), and the backends' `(base_path, lora,
    adapter) -> trainer` that makes it. Where `auto` picked Unsloth and Unsloth cannot load the
    model, that trainer is peft's, with a warning naming the reason; an explicit `unsloth`
    raises instead."""
    picked = pick_trainer(choice, device, separate_inference=separate_inference)

    def peft(base_path: Path, lora: LoraConfig, adapter: Path | None) -> LoraTrainer:
        return LoraTrainer(str(base_path), lora, adapter_path=adapter, dtype=dtype, device=device)

    def unsloth(base_path: Path, lora: LoraConfig, adapter: Path | None) -> LoraTrainer:
        try:
            return UnslothTrainer(
                str(base_path), lora, adapter_path=adapter, dtype=dtype, device=device
            )
        except Exception as exc:  # Unsloth's refusals share no type
            if choice == "unsloth":
                raise
            logger.warning(
                "Unsloth could not load %s (%s: %s); training with peft instead "
                "(`trainer=peft` skips the try, `trainer=unsloth` makes this an error)",
                base_path, type(exc).__name__, str(exc)[:300],
            )  # fmt: skip
            return peft(base_path, lora, adapter)

    return picked, unsloth if picked == "unsloth" else peft
