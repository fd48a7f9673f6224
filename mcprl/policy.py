"""Policies: where the replies of an attempt come from, and the client that reaches them.

- `Policy`: what the agent loop needs of a model: the name to request, an OpenAI-shaped client,
  whether the client is shared (then the loop must not close it) and whether the replies must
  carry token data for training.
- `Model`: any OpenAI-compatible endpoint (base URL, key, model name): a hosted baseline, a vLLM
  server, or `mcprl serve`.
- `LiteLLMModel`: any LiteLLM model string ("anthropic/...", "openai/...", "ollama/..."), for
  baselines in `mcprl eval`; its client speaks the OpenAI SDK's shape through LiteLLM.
- `policy_client(model)`: the client for the length of a block, closed only by whoever opened it.

The model being trained, `mcprl.model.TrainableModel`, is a policy too.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from openai import AsyncOpenAI

__all__ = ["LiteLLMModel", "Model", "Policy", "policy_client"]


@runtime_checkable
class Policy(Protocol):
    """What the agent loop (`mcprl.rollout`) asks of a model."""

    @property
    def served_name(self) -> str:
        """The model name to request from the endpoint."""
        ...

    def openai_client(self, **kwargs: Any) -> Any:
        """An `AsyncOpenAI`-shaped client of the endpoint."""
        ...

    @property
    def shares_client(self) -> bool:
        """True when `openai_client()` returns one client shared by every caller, which the
        model owns: the agent loop then leaves it open."""
        ...

    @property
    def wants_token_data(self) -> bool:
        """True when replies must carry token ids and log-probabilities (a model in training)."""
        ...


class Model(BaseModel):
    """A model behind an OpenAI-compatible endpoint."""

    model_config = ConfigDict(frozen=True)
    name: str = Field(description="the model name the endpoint expects")
    base_url: str
    api_key: str = "EMPTY"
    extensions: tuple[str, ...] = Field(
        default=(), description="mcprl's request fields the endpoint reads (`Inference`)"
    )

    @property
    def served_name(self) -> str:
        return self.name

    def get_inference_name(self, step: int | None = None) -> str:
        return self.name

    shares_client: ClassVar[bool] = False  # each `openai_client()` is the caller's own
    wants_token_data: ClassVar[bool] = False

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

    shares_client: ClassVar[bool] = False
    wants_token_data: ClassVar[bool] = False

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


@contextlib.asynccontextmanager
async def policy_client(model: Any) -> AsyncIterator[Any]:
    """The client that reaches `model`, for the length of the block. Whoever opens a client owns
    it: a shared client (a `TrainableModel`'s, as ART's `openai_client()`) belongs to the model
    and stays open for the attempts still using it; any other model's client is made here and
    closed here."""
    if getattr(model, "shares_client", False):
        yield model.openai_client()
        return
    async with model.openai_client() as client:
        yield client
