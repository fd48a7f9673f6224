"""Model handles: where a policy (or a baseline) answers, and how to reach it.

- `Model`: any OpenAI-compatible endpoint (base URL, key, model name): a hosted baseline, a vLLM
  server, or `mcprl serve`.
- `LiteLLMModel`: any LiteLLM model string ("anthropic/...", "openai/...", "ollama/..."), for
  baselines in `mcprl eval`; its client speaks the OpenAI SDK's shape through LiteLLM.
- `TrainableModel(name, project, base_model)`: the model being trained. Register it with a
  backend; the backend serves its latest checkpoint as `name@step`.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator

if TYPE_CHECKING:
    from openai import AsyncOpenAI

__all__ = ["Endpoint", "LiteLLMModel", "Model", "TrainableModel"]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class Endpoint(Protocol):
    """What a backend gives a registered model."""

    def endpoint(self, model: TrainableModel) -> tuple[str, str]: ...  # (base_url, api_key)

    def step(self, model: TrainableModel) -> int: ...


class Model(BaseModel):
    """A model behind an OpenAI-compatible endpoint."""

    model_config = ConfigDict(frozen=True)
    name: str = Field(description="the model name the endpoint expects")
    base_url: str
    api_key: str = "EMPTY"

    @property
    def served_name(self) -> str:
        return self.name

    def openai_client(self, **kwargs: Any) -> AsyncOpenAI:
        from openai import AsyncOpenAI

        kwargs.setdefault("max_retries", 2)
        return AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, **kwargs)


class LiteLLMModel(BaseModel):
    """A model reached through LiteLLM (any provider); its attempts are for evaluation only."""

    model_config = ConfigDict(frozen=True)
    name: str = Field(description='a LiteLLM model string, e.g. "openai/gpt-4.1-mini"')
    api_base: str | None = None
    api_key: str | None = None

    @property
    def served_name(self) -> str:
        return self.name

    def openai_client(self, **kwargs: Any) -> _LiteLLMClient:
        return _LiteLLMClient(self)


class _LiteLLMClient:
    """`client.chat.completions.create(...)` answered by `litellm.acompletion`."""

    def __init__(self, model: LiteLLMModel) -> None:
        self.model = model
        self.chat = self.completions = self

    async def create(self, **kwargs: Any) -> Any:
        from ruler._llm import litellm_acompletion

        kwargs.pop("extra_body", None)  # mcprl-server options mean nothing to providers
        kwargs["model"] = self.model.name
        for key in ("api_base", "api_key"):
            if getattr(self.model, key):
                kwargs[key] = getattr(self.model, key)
        return await litellm_acompletion(**kwargs)

    async def close(self) -> None:
        return None

    async def __aenter__(self) -> _LiteLLMClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


class TrainableModel(BaseModel):
    """The policy being trained: a LoRA on `base_model`, checkpointed per step."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    name: str
    project: str = "default"
    base_model: str = "smollm2-135m"
    config: dict[str, Any] = Field(default_factory=dict)
    backend: Any = Field(default=None, exclude=True)

    @field_validator("name", "project")
    @classmethod
    def _safe(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(
                f"{value!r} must be 1-64 letters, digits, '.', '_' or '-' (it names a directory)"
            )
        return value

    def register(self, backend: Endpoint) -> TrainableModel:
        if hasattr(backend, "register"):
            backend.register(self)
        self.backend = backend
        return self

    def _need_backend(self) -> Endpoint:
        if self.backend is None:
            raise RuntimeError(
                f"model {self.name!r} is not registered with a backend; call "
                "model.register(LocalBackend()) first"
            )
        return self.backend

    def get_step(self) -> int:
        return self._need_backend().step(self)

    @property
    def served_name(self) -> str:
        """The name the endpoint serves the current checkpoint under: `name@step`."""
        return f"{self.name}@{self.get_step()}"

    def openai_client(self, **kwargs: Any) -> AsyncOpenAI:
        from openai import AsyncOpenAI

        base_url, api_key = self._need_backend().endpoint(self)
        kwargs.setdefault("max_retries", 2)
        return AsyncOpenAI(base_url=base_url, api_key=api_key, **kwargs)
