"""`LocalBackend`: the engine and the trainer in one process, on CPU (or plain torch on CUDA).

    backend = LocalBackend(path=".mcprl")
    model = TrainableModel(name="agent", project="calc")
    await model.register(backend)
    client = model.openai_client()               # serves the latest checkpoint as agent@<step>
    result = await model.train(groups, config=TrainConfig(learning_rate=1e-4))

It implements `mcprl.backends.Backend`. Registering a model that has checkpoints resumes it:
same step count, adapter and optimizer state. Step 0 is a fresh LoRA whose output equals the
base model's. A training step writes its trajectories first, pauses inference, trains, writes
the checkpoint atomically, then loads it into the server as `name@step` and unloads the
previous adapter, both through the server's HTTP adapter endpoints (`/v1/load_lora_adapter`,
the calls a vLLM server takes). `trainer=` replaces the LoRA trainer (a callable
`(base_path, lora, adapter_path) -> Trainer`, the protocol in `mcprl.backends`); `inference=`
replaces the server (`(base_model, routes) -> InferenceServer`; `VLLMBackend` puts a vLLM
server there).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from mcprl.backends._protocol import Inference, InferenceServer, Trainer, TrainResult
from mcprl.backends._records import StoredRuns
from mcprl.backends._store import RunStore, release_run
from mcprl.errors import UsageError
from mcprl.model import TrainableModel
from mcprl.training import LoraConfig, TrainConfig
from mcprl.types import TrajectoryGroup

__all__ = ["LocalBackend", "TrainResult"]

logger = logging.getLogger(__name__)

TrainerFactory = Callable[[Path, LoraConfig, Path | None], Trainer]
ServerFactory = Callable[[str, Sequence[Any]], InferenceServer]


@dataclass
class _Run:
    model: TrainableModel
    store: RunStore
    step: int
    load_trainer: Callable[[], Trainer]
    _trainer: Trainer | None = None

    @property
    def served(self) -> str:
        return f"{self.model.name}@{self.step}"

    @property
    def trainer(self) -> Any:
        """Loaded on first use: serving or evaluating a run needs no trainer."""
        if self._trainer is None:
            self._trainer = self.load_trainer()
        return self._trainer


class LocalBackend(StoredRuns):
    def __init__(
        self,
        path: str | Path = ".mcprl",
        *,
        inference_dtype: str = "auto",
        train_dtype: str = "auto",
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
        max_batch_size: int = 32,
        max_batch_kv_bytes: int | str | None = "auto",
        device: str | None = "auto",
        trainer: TrainerFactory | None = None,
        inference: ServerFactory | None = None,
    ) -> None:
        """`api_key`: what the endpoint requires (default: a random key known to this process
        only; "" for none); `host`/`port`: where it listens (default: loopback, a free port)."""
        from mcprl.serving import pick_device, pick_dtype

        self.device = pick_device(device)  # inference and training (a GPU where present)
        self.path = Path(path)
        # `auto`: bfloat16 where the hardware has it, else float32 (see `pick_dtype`)
        self.inference_dtype = pick_dtype(inference_dtype, self.device)
        self.train_dtype = pick_dtype(train_dtype, self.device)
        self.host, self.port, self.max_batch_size = host, port, max_batch_size
        self.max_batch_kv_bytes = max_batch_kv_bytes
        self._api_key = api_key
        self._make_trainer = trainer or self._lora_trainer
        # (base model, extra routes) -> the inference server: base_url, api_key, paused(), close()
        self._make_server = inference or self._local_server
        self._server: InferenceServer | None = None
        self._base: str | None = None
        self._runs: dict[tuple[str, str], _Run] = {}
        self._extra: set[str] = set()  # earlier checkpoints served by `serve_checkpoint`

    # -- Backend -------------------------------------------------------------------------------

    async def check_model(self, base_model: str) -> None:
        from mcprl.serving import check_model

        check_model(base_model)
        if self._base is not None and base_model != self._base:
            raise UsageError(
                f"this backend serves {self._base!r}; a model on {base_model!r} needs its own "
                "backend"
            )

    async def register(self, model: TrainableModel) -> int:
        key = (model.project, model.name)
        if key in self._runs:
            return self._runs[key].step
        run = await anyio.to_thread.run_sync(self._open_run, model)
        await self._load(run.served, run.store.checkpoint_path(run.step))
        self._runs[key] = run
        return run.step

    async def inference(self, model: TrainableModel) -> Inference:
        self._run(model)
        return await self.base_inference(model.base_model)

    async def base_inference(self, base_model: str) -> Inference:
        await anyio.to_thread.run_sync(self._ensure_server, base_model)
        return Inference(
            base_url=self._server.base_url,
            api_key=self._server.api_key or "EMPTY",
            base_name=self._base,
            extensions=list(getattr(self._server, "extensions", ())),
        )

    async def serve_checkpoint(self, model: TrainableModel, step: int) -> str:
        run = self._run(model)
        if step == run.step:
            return run.served
        path = self.checkpoint(model, step)
        name = f"{model.name}@{step}"
        if name not in self._extra:
            await self._load(name, path)
            self._extra.add(name)
        return name

    async def get_step(self, model: TrainableModel) -> int:
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
        server = self._server

        engine = getattr(server, "engine", None)

        def progress(done: int, total: int) -> None:
            if engine is not None:  # another process may have started: size the threads again
                engine.poll_threads()
            if on_progress is not None:
                on_progress(done, total)

        def work() -> dict[str, float]:
            logger.info("training step %d of %s", step, run.served)
            if engine is not None:  # what the engine cached for the adapter this step replaces
                engine.release_caches(run.served)
            out = run.trainer.step(groups, config, progress)
            started = time.perf_counter()
            run.store.write_checkpoint(step, run.trainer.save, {"metrics": out})
            out["time_checkpoint_s"] = time.perf_counter() - started
            return out

        with anyio.CancelScope(shield=True):
            if run.store.read_only:  # the first step of a resumed run: now it writes
                run.store = RunStore(self.path, model.project, model.name)
            run.store.write_trajectories("train", step, groups)  # nothing is lost
            await anyio.to_thread.run_sync(lambda: run.trainer)  # loaded before inference pauses
            result = await anyio.to_thread.run_sync(_exclusively, server, work)
            previous = run.served
            await self._load(f"{model.name}@{step}", run.store.checkpoint_path(step))
            run.step = step
            await self._unload(previous)
            row = {f"train/{k}": v for k, v in result.items()}
            run.store.append_history({"step": step, **row, **(metrics or {})})
        return TrainResult(step=step, metrics=result)

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for run in self._runs.values():  # other processes may write these runs now
            release_run(run.store.dir)

    # -- this backend's own --------------------------------------------------------------------

    def start(self, base_model: str, routes: Sequence[Any] = ()) -> None:
        """Load `base_model` and start the endpoint now (`register` does it when needed);
        `routes` (Starlette routes) are served beside the OpenAI API, behind its key."""
        self._ensure_server(base_model, routes)

    @property
    def base_model(self) -> str | None:
        """The base model this backend serves (None until a model is registered or started)."""
        return self._base

    def store(self, model: TrainableModel) -> RunStore:
        """Where the run's files live (checkpoints, history, trajectories)."""
        return self._run(model).store

    def __enter__(self) -> LocalBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -----------------------------------------------------------------------------

    def _current_step(self, model: TrainableModel) -> int:
        return self._run(model).step

    def _run(self, model: TrainableModel) -> _Run:
        run = self._runs.get((model.project, model.name))
        if run is None:
            raise RuntimeError(f"model {model.name!r} is not registered with this backend")
        return run

    def _lora_trainer(self, base_path: Path, lora: LoraConfig, adapter: Path | None) -> Trainer:
        """The run's trainer; it reads the base weights of the model this backend serves in
        this process, where they match, instead of holding a copy of its own."""
        from mcprl.training import LoraTrainer

        if adapter is None:
            trainer = LoraTrainer(base_path, lora, dtype=self.train_dtype, device=self.device)
        else:
            trainer = LoraTrainer(
                base_path, adapter_path=adapter, dtype=self.train_dtype, device=self.device
            )
        served = getattr(getattr(self._server, "engine", None), "model", None)
        if served is not None:
            trainer.share_base_weights(served)
        return trainer

    def _open_run(self, model: TrainableModel) -> _Run:
        """Check `model` against what is stored; a new run gets its trainer and checkpoint 0,
        a resumed one loads its trainer when it first trains."""
        lora = LoraConfig(**model.config.get("lora", {}))
        # nothing is written until the model has loaded: a mistyped name leaves no trace
        info = RunStore(self.path, model.project, model.name, read_only=True).read_model_info()
        if info is not None and info.get("base_model") != model.base_model:
            raise UsageError(
                f"{self.path / model.project / model.name} was trained from "
                f"{info.get('base_model')!r}, not {model.base_model!r}; use another model name "
                "or project"
            )
        stored = LoraConfig(**(info or {}).get("lora", {}))
        if info is not None and "lora" in model.config and stored != lora:
            raise UsageError(
                f"{self.path / model.project / model.name} has a LoRA of r={stored.r}, "
                f"alpha={stored.alpha}, not r={lora.r}, alpha={lora.alpha}; resume it with "
                f"`lora.r={stored.r}` `lora.alpha={stored.alpha}`, or start a new run with "
                "another `name`"
            )
        self._ensure_server(model.base_model)
        # a run with checkpoints is only read until it trains here: evaluating a run that
        # another process trains leaves that process's unpublished checkpoint alone
        store = RunStore(self.path, model.project, model.name, read_only=info is not None)
        latest = store.latest_step()
        if latest is None and store.read_only:
            store = RunStore(self.path, model.project, model.name)
        if info is None:
            store.write_model_info({"base_model": model.base_model, "lora": lora.model_dump()})
        from mcprl.serving import resolve_model

        base_path = Path(resolve_model(model.base_model))
        if latest is None:
            trainer = _exclusively(
                self._server, lambda: self._make_trainer(base_path, lora, None), pause=False
            )
            store.write_checkpoint(0, trainer.save, {"base_model": model.base_model})
            return _Run(model, store, 0, lambda: trainer, trainer)

        def resume() -> Any:
            checkpoint = store.checkpoint_path(latest)
            trainer = self._make_trainer(base_path, stored, checkpoint)
            trainer.load_state(checkpoint)
            logger.info("resuming %s/%s at step %d", model.project, model.name, latest)
            return trainer

        def load() -> Any:
            return _exclusively(self._server, resume, pause=False)

        return _Run(model, store, latest, load)

    async def _adapter_call(self, what: str, body: dict[str, str]) -> None:
        from mcprl.serving import adapter_request

        server = self._server
        await anyio.to_thread.run_sync(adapter_request, server.base_url, server.api_key, what, body)

    async def _load(self, name: str, path: Path) -> None:
        allow = getattr(self._server, "allow_adapter_dir", None)
        if allow is not None:  # in-process: a checkpoint of a run this backend was named, which
            allow(path)  # may lie outside `self.path` when the run directory is a symlink
        # absolute: another process (a vLLM server) reads it
        await self._adapter_call("load", {"lora_name": name, "lora_path": str(path.resolve())})

    async def _unload(self, name: str) -> None:
        await self._adapter_call("unload", {"lora_name": name})

    def _local_server(self, base_model: str, routes: Sequence[Any]) -> InferenceServer:
        from mcprl.serving import LocalServer

        return LocalServer(
            base_model,
            dtype=self.inference_dtype,
            device=self.device,
            host=self.host,
            port=self.port,
            api_key=self._api_key,
            max_batch_size=self.max_batch_size,
            max_batch_kv_bytes=self.max_batch_kv_bytes,
            served_name=base_model,
            adapter_dirs=[self.path],
            routes=routes,
        )

    def _ensure_server(self, base_model: str, routes: Sequence[Any] = ()) -> Any:
        if self._server is None:
            self._server = self._make_server(base_model, routes)
            self._base = base_model
        elif base_model != self._base:
            raise UsageError(
                f"this backend serves {self._base!r}; a model on {base_model!r} needs its own "
                "backend"
            )
        return self._server


def _exclusively(server: Any, fn: Callable[[], Any], *, pause: bool = True) -> Any:
    """Run `fn` (a training step, loading a trainer) on the server's engine thread where it has
    one (`Engine.run_exclusive`: nothing decodes meanwhile, and the process keeps one OpenMP
    team, so decoding keeps its speed after training); elsewhere (a vLLM server, a stand-in)
    under its `paused()`, or, with `pause=False`, as it is."""
    run = getattr(server, "run_exclusive", None)
    if run is not None:
        return run(fn)
    if not pause:
        return fn()
    with server.paused():
        return fn()
