"""The model being trained: `TrainableModel(name, project, base_model)`.

Register it with a backend; the backend serves its latest checkpoint as `name@step`. It is a
`mcprl.policy.Policy` (its client is shared and its replies carry token data), and it has ART's
client methods: `register`, `train`, `log`, `get_step`, `openai_client`.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from mcprl.errors import UsageError
from mcprl.policy import LiteLLMModel, Model, policy_client

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from openai import AsyncOpenAI

    from mcprl.backends import Backend, Inference, TrainResult
    from mcprl.training import TrainConfig
    from mcprl.types import TrajectoryGroup

__all__ = ["LiteLLMModel", "Model", "TrainableModel", "policy_client"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class TrainableModel(BaseModel):
    """The policy being trained: a LoRA on `base_model`, checkpointed per step.

    `await model.register(backend)` loads it (resuming a run that has checkpoints); then
    `model.openai_client()` reaches its latest checkpoint, served as `name@step`
    (`get_inference_name()`), `await model.train(groups, config=TrainConfig(...))` makes a step,
    and `await model.log(groups, split="val")` records an evaluation: ART's client methods.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)
    name: str
    project: str = "default"
    base_model: str = "smollm2-135m"
    config: dict[str, Any] = Field(default_factory=dict)
    backend: Any = Field(default=None, exclude=True)
    _step: int = PrivateAttr(default=0)
    _inference: Any = PrivateAttr(default=None)
    _client: tuple[Any, Any] = PrivateAttr(default=(None, None))

    @field_validator("name", "project")
    @classmethod
    def _safe(cls, value: str) -> str:
        if not _NAME.match(value):
            raise UsageError(
                f"{value!r} must be 1-64 letters, digits, '.', '_' or '-' (it names a directory)"
            )
        return value

    async def register(self, backend: Backend) -> TrainableModel:
        """Load this model on `backend` (resuming its run if it has checkpoints)."""
        self._step = await backend.register(self)
        self._inference = await backend.inference(self)
        self._client = (None, None)
        self.backend = backend
        return self

    def _need_backend(self) -> Backend:
        if self.backend is None:
            raise RuntimeError(
                f"model {self.name!r} is not registered with a backend; call "
                "`await model.register(LocalBackend())` first"
            )
        return self.backend

    async def get_step(self) -> int:
        """The step the backend serves now (0 before the first training step)."""
        self._step = await self._need_backend().get_step(self)
        return self._step

    @property
    def step(self) -> int:
        """The step as of the last `register`, `train` or `get_step`."""
        self._need_backend()
        return self._step

    @property
    def inference(self) -> Inference:
        """Where the backend serves this model (as of `register`)."""
        self._need_backend()
        return self._inference

    def get_inference_name(self, step: int | None = None) -> str:
        """The model name to request: `name@step` (the latest known step by default)."""
        return f"{self.name}@{self.step if step is None else step}"

    @property
    def served_name(self) -> str:
        """The name the endpoint serves the current checkpoint under: `name@step`."""
        return self.get_inference_name()

    @property
    def extensions(self) -> tuple[str, ...]:
        """mcprl's request fields the endpoint reads (`Inference.extensions`)."""
        return tuple(self.inference.extensions)

    @property
    def shares_client(self) -> bool:
        """`openai_client()` without arguments is shared (ART's behaviour): it is the model's."""
        return True

    @property
    def wants_token_data(self) -> bool:
        """Replies carry token ids and log-probabilities: the trainer needs them."""
        return True

    def openai_client(self, **kwargs: Any) -> AsyncOpenAI:
        """A client of the backend's endpoint. Without arguments it is shared, as in ART: one
        per event loop, so rollouts that each ask for it open no new connections (a closed one
        is replaced); with arguments (`timeout=...`), a new client of the caller's own."""
        import asyncio

        from openai import AsyncOpenAI

        where = self.inference
        if kwargs:
            kwargs.setdefault("max_retries", 2)
            return AsyncOpenAI(base_url=where.base_url, api_key=where.api_key, **kwargs)
        try:
            loop: Any = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        client, owner = self._client
        if client is None or client.is_closed() or owner is not loop:
            import httpx

            from mcprl.tokens import per_choice_transport

            # a choice alone carries its prompt's token ids, whatever the server's dialect
            http = httpx.AsyncClient(transport=per_choice_transport(), timeout=600)
            client = AsyncOpenAI(
                base_url=where.base_url, api_key=where.api_key, max_retries=2, http_client=http
            )
            self._client = (client, loop)
        return client

    async def train(
        self,
        groups: Iterable[TrajectoryGroup],
        config: TrainConfig | None = None,
        *,
        metrics: dict[str, float] | None = None,
        on_progress: Callable[[int, int], None] | None = None,
        **options: Any,
    ) -> TrainResult:
        """One GRPO step on `groups`; the new checkpoint is served from then on.

        `config` is a `mcprl.training.TrainConfig`; keyword options (`learning_rate=1e-5`) set
        its fields instead, as in ART's `backend.train(model, groups, learning_rate=...)`.
        `metrics` join the step's history row; `on_progress(done, total)` hears of micro-batches.
        """
        from mcprl.training import TrainConfig

        if options:
            config = TrainConfig.model_validate(
                {**(config or TrainConfig()).model_dump(), **options}
            )
        result = await self._need_backend().train(
            self, list(groups), config, metrics=metrics, on_progress=on_progress
        )
        self._step = result.step
        return result

    async def log(
        self,
        groups: Iterable[TrajectoryGroup] | None = None,
        *,
        split: str = "val",
        metrics: dict[str, float] | None = None,
        step: int | None = None,
    ) -> None:
        """Record `groups` (their reward, success and turn counts) and `metrics` for `split` at
        the current step (`step`, where given, must be it)."""
        from mcprl.collect import summarize

        groups = list(groups) if groups is not None else None
        current = await self.get_step()
        if step is not None and step != current:
            raise UsageError(f"log(step={step}): the backend is at step {current}")
        values = summarize(groups, {}) if groups else {}
        values |= metrics or {}
        await self._need_backend().log(self, values, split, groups)

    async def delete_checkpoints(
        self, keep_last: int = 1, keep_best_by: str | None = "val/reward"
    ) -> list[int]:
        """Delete all checkpoints but the latest, the one served, and the best by a metric."""
        return await self._need_backend().delete_checkpoints(self, keep_last, keep_best_by)
