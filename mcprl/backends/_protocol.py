"""The `Backend` protocol: what the training loop, `mcprl eval` and `mcprl report` may ask of
whatever serves and trains a model.

    backend = LocalBackend(".mcprl")               # or RemoteBackend(url, api_key), ...
    step = await backend.register(model)           # resumes a run that has checkpoints
    where = await backend.inference(model)         # base URL, API key, the base model's name
    result = await backend.train(model, groups, TrainConfig(...))   # -> TrainResult(step, ...)
    await backend.log(model, {"reward": 0.4}, "val", groups)

Every method is a coroutine but `close`. A run's records live with the backend: its history
rows, its trajectories per split and step, its checkpoints, and a few named text files
(`scenarios.jsonl`, `run_config.json`, AutoRL's `task.txt` and `system_prompt.txt`; `model.json`
can be read). `export_run` copies all of it but the checkpoints into a local directory, in the
storage layout of DESIGN.md, where `mcprl.report` can read it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pydantic import BaseModel, Field

from mcprl.errors import UsageError
from mcprl.types import TrajectoryGroup, write_groups

if TYPE_CHECKING:
    from mcprl.model import TrainableModel
    from mcprl.training import TrainConfig

__all__ = [
    "RUN_FILES",
    "Backend",
    "Inference",
    "InferenceServer",
    "TrainResult",
    "Trainer",
    "check_run_file",
    "export_run",
]

# the run's text files a client may write (model.json and history.jsonl are the backend's own)
RUN_FILES = (
    "scenarios.jsonl",
    "hindsight.jsonl",
    "held_groups.json",
    "run_config.json",
    "task.txt",
    "system_prompt.txt",
)
_READABLE = (*RUN_FILES, "model.json")
_SPLIT = re.compile(r"^[A-Za-z0-9_-]{1,32}$")


class TrainResult(BaseModel):
    """What one training step did: the new step number and the trainer's metrics."""

    step: int
    metrics: dict[str, float]


class Inference(BaseModel):
    """Where a registered model answers: an OpenAI-compatible base URL and its key.

    The checkpoint of step k is served as `<name>@<k>`; `base_name` is the base model, served
    without any adapter (the local judge and AutoRL's writer use it).
    """

    base_url: str
    api_key: str
    base_name: str
    # mcprl's request extensions the endpoint reads (`final_tools`, `mcprl.serving`); the
    # agent loop sends them only there (vLLM accepts unknown fields but warns at every request)
    extensions: list[str] = Field(default_factory=list)


def check_run_file(name: str, *, write: bool) -> str:
    """`name` if a client may read (or write) it, else a `ValueError` naming those it may."""
    allowed = RUN_FILES if write else _READABLE
    if name not in allowed:
        raise UsageError(
            f"{name!r} is not a run file that can be {'written' if write else 'read'}; "
            f"these can: {', '.join(allowed)}"
        )
    return name


def check_split(split: str) -> str:
    if not _SPLIT.match(split):
        raise UsageError(f"split {split!r}: use letters, digits, '_' or '-' (e.g. train, val)")
    return split


@runtime_checkable
class Trainer(Protocol):
    """What trains a run's LoRA for `LocalBackend`: `mcprl.training.LoraTrainer`, Unsloth's
    (`VLLMBackend(train_with="unsloth")`), or one of yours, made by the factory given as
    `LocalBackend(trainer=factory)`: `factory(base_path, lora, adapter_path) -> Trainer`. Its
    methods run on a worker thread, one at a time."""

    def step(
        self,
        groups: list[TrajectoryGroup],
        config: TrainConfig,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> dict[str, float]:
        """One update from `groups`; its metrics (`on_progress(done, total)` as it goes)."""
        ...

    def save(self, directory: str | Path) -> None:
        """Write the adapter (PEFT's layout) and the optimizer state into `directory`."""
        ...

    def load_state(self, directory: str | Path) -> None:
        """Resume the optimizer state saved with a checkpoint."""
        ...


@runtime_checkable
class InferenceServer(Protocol):
    """What serves the policy for `LocalBackend`: mcprl's `mcprl.serving.LocalServer`, a vLLM
    server (`VLLMServer`), or one of yours, made by `LocalBackend(inference=factory)`:
    `factory(base_model, routes) -> InferenceServer`. It speaks the OpenAI API at `base_url`
    and loads and unloads adapters through `/v1/load_lora_adapter` and
    `/v1/unload_lora_adapter`, as vLLM does."""

    base_url: str
    api_key: str | None

    def paused(self) -> AbstractContextManager[Any]:
        """A context in which it decodes nothing (a training step holds the device)."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class Backend(Protocol):
    """Serves and trains `TrainableModel`s; see the module docstring."""

    async def check_model(self, base_model: str) -> None:
        """Raise `ValueError` (fast, loading nothing) if this backend cannot train
        `base_model`: a preflight check before any long work."""
        ...

    async def register(self, model: TrainableModel) -> int:
        """Load (or resume) `model`; return its current step (0: a fresh LoRA)."""
        ...

    async def claim(self, model: TrainableModel) -> None:
        """Hold the run for this process's writes, before any: raise `RunLockedError`
        (naming the holder) if another process writes it. Reading needs no claim."""
        ...

    async def inference(self, model: TrainableModel) -> Inference: ...

    async def base_inference(self, base_model: str) -> Inference:
        """The endpoint serving `base_model` itself, without an adapter (started if need be)."""
        ...

    async def serve_checkpoint(self, model: TrainableModel, step: int) -> str:
        """Serve checkpoint `step` of a registered model beside its latest one (for evaluating
        an earlier step); return the name it is served as, `name@step`."""
        ...

    async def get_step(self, model: TrainableModel) -> int: ...

    async def train(
        self,
        model: TrainableModel,
        groups: list[TrajectoryGroup],
        config: TrainConfig | None = None,
        *,
        metrics: dict[str, float] | None = None,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> TrainResult:
        """One step on `groups` (their trajectories are stored first), checkpointed and served
        as `name@step`; `metrics` join the step's history row."""
        ...

    async def log(
        self,
        model: TrainableModel,
        metrics: dict[str, float],
        split: str = "val",
        groups: list[TrajectoryGroup] | None = None,
    ) -> None:
        """Record `metrics` (as `split/key`) and `groups` for the current step."""
        ...

    async def history(self, model: TrainableModel) -> list[dict[str, Any]]: ...

    async def trajectories(
        self, model: TrainableModel, split: str
    ) -> dict[int, list[TrajectoryGroup]]: ...

    async def read_file(self, model: TrainableModel, name: str) -> str | None: ...

    async def write_file(self, model: TrainableModel, name: str, text: str) -> None: ...

    async def list_checkpoints(self, model: TrainableModel) -> list[int]: ...

    async def delete_checkpoints(
        self, model: TrainableModel, keep_last: int = 1, keep_best_by: str | None = "val/reward"
    ) -> list[int]: ...

    async def download_checkpoint(self, model: TrainableModel, step: int, dest: Path) -> Path:
        """Copy checkpoint `step` (adapter and trainer state) into the new directory `dest`."""
        ...

    async def local_dir(self, model: TrainableModel) -> Path | None:
        """The run's directory on this machine, where the backend keeps it here; else None."""
        ...

    def close(self) -> None: ...


async def export_run(backend: Backend, model: TrainableModel, dest: Path) -> Path:
    """Copy a run's records (not its checkpoints) into `dest`, laid out as on the backend."""
    import json

    dest.mkdir(parents=True, exist_ok=True)
    for name in _READABLE:
        text = await backend.read_file(model, name)
        if text is not None:
            (dest / name).write_text(text, encoding="utf-8")
    rows = await backend.history(model)
    (dest / "history.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8"
    )
    for split in ("train", "val"):
        for step, groups in (await backend.trajectories(model, split)).items():
            write_groups(dest / "trajectories" / split / f"{step:04d}.jsonl", groups)
    return dest
