"""`LocalBackend`: the engine and the trainer in one process, on CPU (or plain torch on CUDA).

    backend = LocalBackend(path=".mcprl")
    model = TrainableModel(name="agent", project="calc").register(backend)
    client = model.openai_client()               # serves the latest checkpoint as agent@<step>
    result = await backend.train(model, groups, TrainConfig(learning_rate=1e-4))

Registering a model that has checkpoints resumes it: same step count, adapter and optimizer
state. Step 0 is a fresh LoRA whose output equals the base model's. A training step writes its
trajectories first, pauses inference, trains, writes the checkpoint atomically, then serves it as
`name@step` and retires the previous adapter.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
from pydantic import BaseModel

from mcprl.backends._store import RunStore
from mcprl.model import TrainableModel
from mcprl.training import LoraConfig, LoraTrainer, TrainConfig
from mcprl.types import TrajectoryGroup

__all__ = ["LocalBackend", "TrainResult"]

logger = logging.getLogger(__name__)


class TrainResult(BaseModel):
    step: int
    metrics: dict[str, float]


@dataclass
class _Run:
    model: TrainableModel
    store: RunStore
    trainer: LoraTrainer
    step: int

    @property
    def served(self) -> str:
        return f"{self.model.name}@{self.step}"


class LocalBackend:
    def __init__(
        self,
        path: str | Path = ".mcprl",
        *,
        inference_dtype: str = "bfloat16",
        train_dtype: str = "bfloat16",
        host: str = "127.0.0.1",
        port: int = 0,
        max_batch_size: int = 32,
        device: str | None = "auto",
    ) -> None:
        from mcprl.serving import pick_device

        self.device = pick_device(device)  # inference and training (a GPU where present)
        self.path = Path(path)
        self.inference_dtype = inference_dtype
        self.train_dtype = train_dtype
        self.host, self.port, self.max_batch_size = host, port, max_batch_size
        self._server: Any = None
        self._base: str | None = None
        self._runs: dict[tuple[str, str], _Run] = {}

    # -- Backend interface ---------------------------------------------------------------------

    def register(self, model: TrainableModel) -> None:
        key = (model.project, model.name)
        if key in self._runs:
            return
        lora = LoraConfig(**model.config.get("lora", {}))
        # nothing is written until the model has loaded: a mistyped name leaves no trace
        info = RunStore(self.path, model.project, model.name, read_only=True).read_model_info()
        if info is not None and info.get("base_model") != model.base_model:
            raise ValueError(
                f"{self.path / model.project / model.name} was trained from "
                f"{info.get('base_model')!r}, not {model.base_model!r}; use another model name "
                "or project"
            )
        stored = LoraConfig(**(info or {}).get("lora", {}))
        if info is not None and "lora" in model.config and stored != lora:
            raise ValueError(
                f"{self.path / model.project / model.name} has a LoRA of r={stored.r}, "
                f"alpha={stored.alpha}, not r={lora.r}, alpha={lora.alpha}; resume it with "
                f"--lora-r {stored.r} --lora-alpha {stored.alpha}, or start a new run with --name"
            )
        server = self._ensure_server(model.base_model)
        store = RunStore(self.path, model.project, model.name)
        if info is None:
            store.write_model_info({"base_model": model.base_model, "lora": lora.model_dump()})
        latest = store.latest_step()
        from mcprl.serving import resolve_model

        base_path = resolve_model(model.base_model)
        if latest is None:
            trainer = LoraTrainer(base_path, lora, dtype=self.train_dtype, device=self.device)
            store.write_checkpoint(0, trainer.save, {"base_model": model.base_model})
            latest = 0
        else:
            checkpoint = store.checkpoint_path(latest)
            trainer = LoraTrainer(
                base_path, adapter_path=checkpoint, dtype=self.train_dtype, device=self.device
            )
            trainer.load_state(checkpoint)
            logger.info("resuming %s/%s at step %d", model.project, model.name, latest)
        run = _Run(model, store, trainer, latest)
        server.engine.load_adapter(run.served, str(store.checkpoint_path(latest)))
        self._runs[key] = run

    def endpoint(self, model: TrainableModel) -> tuple[str, str]:
        self._run(model)
        return self._server.base_url, self._server.api_key

    def step(self, model: TrainableModel) -> int:
        return self._run(model).step

    async def train(
        self,
        model: TrainableModel,
        groups: list[TrajectoryGroup],
        config: TrainConfig | None = None,
        *,
        metrics: dict[str, float] | None = None,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> TrainResult:
        """One step: train on `groups`, checkpoint, serve `name@step`, append a history row.

        `metrics` (already prefixed, e.g. `time/rollout_s`) join the row. Cancelling the caller
        (Ctrl-C) lets a started step finish and record itself: it is never left half-done.
        """
        config = config or TrainConfig()
        run = self._run(model)
        step = run.step + 1
        engine = self._server.engine

        def work() -> dict[str, float]:
            with engine.paused():
                logger.info("training step %d of %s", step, run.served)
                out = run.trainer.step(groups, config, on_progress)
                started = time.perf_counter()
                run.store.write_checkpoint(step, run.trainer.save, {"metrics": out})
                out["time_checkpoint_s"] = time.perf_counter() - started
                return out

        with anyio.CancelScope(shield=True):
            run.store.write_trajectories("train", step, groups)  # nothing is lost
            result = await anyio.to_thread.run_sync(work)
            previous = run.served
            engine.load_adapter(f"{model.name}@{step}", str(run.store.checkpoint_path(step)))
            run.step = step
            engine.unload_adapter(previous)
            row = {f"train/{k}": v for k, v in result.items()}
            run.store.append_history({"step": step, **row, **(metrics or {})})
        return TrainResult(step=step, metrics=result)

    def log(
        self,
        model: TrainableModel,
        metrics: dict[str, float],
        split: str = "val",
        groups: list[TrajectoryGroup] | None = None,
    ) -> None:
        """Record evaluation metrics (and their trajectories) for the current step."""
        run = self._run(model)
        if groups is not None:
            run.store.write_trajectories(split, run.step, groups)
        row = {f"{split}/{k}": v for k, v in metrics.items()}
        run.store.append_history({"step": run.step, **row})

    def store(self, model: TrainableModel) -> RunStore:
        """Where the run's files live (checkpoints, history, trajectories)."""
        return self._run(model).store

    @property
    def base_url(self) -> str:
        """The local endpoint; it serves the base model under its own name, too."""
        if self._server is None:
            raise RuntimeError("no model is registered with this backend yet")
        return self._server.base_url

    @property
    def api_key(self) -> str:
        """The local endpoint's API key: random per backend, known only to this process."""
        if self._server is None:
            raise RuntimeError("no model is registered with this backend yet")
        return self._server.api_key

    def list_checkpoints(self, model: TrainableModel) -> list[int]:
        return self._run(model).store.steps()

    def delete_checkpoints(
        self, model: TrainableModel, keep_last: int = 1, keep_best_by: str | None = "val/reward"
    ) -> list[int]:
        """Delete checkpoints but the latest `keep_last` and the best by a history metric."""
        run = self._run(model)
        steps = run.store.steps()
        keep = set(steps[-keep_last:]) if keep_last > 0 else set()
        keep.add(run.step)
        if keep_best_by:
            scored = [
                (r[keep_best_by], r["step"]) for r in run.store.history() if keep_best_by in r
            ]
            if scored:
                keep.add(max(scored)[1])
        deleted = [s for s in steps if s not in keep]
        for s in deleted:
            run.store.delete_checkpoint(s)
        return deleted

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    def __enter__(self) -> LocalBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -----------------------------------------------------------------------------

    def _run(self, model: TrainableModel) -> _Run:
        run = self._runs.get((model.project, model.name))
        if run is None:
            raise RuntimeError(f"model {model.name!r} is not registered with this backend")
        return run

    def _ensure_server(self, base_model: str) -> Any:
        if self._server is None:
            from mcprl.serving import LocalServer

            self._server = LocalServer(
                base_model,
                dtype=self.inference_dtype,
                device=self.device,
                host=self.host,
                port=self.port,
                max_batch_size=self.max_batch_size,
                served_name=base_model,
                adapter_dirs=[self.path],
            )
            self._base = base_model
        elif base_model != self._base:
            raise ValueError(
                f"this backend serves {self._base!r}; a model on {base_model!r} needs its own "
                "LocalBackend"
            )
        return self._server
