"""`LLMClient`: one LLM, called the careful way.

The judge and mcprl's generators talk to LLMs through this: LiteLLM's `acompletion` (or an
injected async function with its signature), transient errors retried with backoff, fatal ones
raised at once as `JudgeAPIError`, a JSON schema sent where the provider takes one (with one
fall-back to plain instructions if it refuses), a concurrency limit, and usage and cost counted.
"""

from __future__ import annotations

import logging
import os
import random
import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal

import anyio
import anyio.lowlevel
from pydantic import BaseModel

from ruler._types import Usage
from ruler.errors import JudgeAPIError
from ruler.errors import status_code_of as _status

__all__ = ["CompletionFn", "LLMClient", "RetryPolicy"]

logger = logging.getLogger("ruler")

CompletionFn = Callable[..., Awaitable[Any]]

_TRANSIENT_STATUS = {408, 409, 425, 429}


class RetryPolicy(BaseModel):
    """Retries of transient API errors (rate limits, time-outs, connection errors, 5xx)."""

    max_attempts: int = 4
    initial_delay: float = 1.0
    max_delay: float = 30.0
    multiplier: float = 2.0

    def delay(self, attempt: int) -> float:
        base = min(self.max_delay, self.initial_delay * self.multiplier ** (attempt - 1))
        return base * random.uniform(0.8, 1.2)


def is_transient(exc: BaseException) -> bool:
    status = _status(exc)
    if status is not None:
        return status in _TRANSIENT_STATUS or status >= 500
    names = {cls.__name__ for cls in type(exc).__mro__}
    return bool(
        isinstance(exc, (TimeoutError, ConnectionError))
        or names & {"APIConnectionError", "APITimeoutError", "Timeout", "TimeoutException"}
    )


def _litellm():
    # LiteLLM fetches its price list from the internet at import unless told not to.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.suppress_debug_info = True
    return litellm


_NO_LIBRARY_RETRIES = {"max_retries": 0, "num_retries": 0}


async def litellm_acompletion(**kwargs: Any) -> Any:
    return await _litellm().acompletion(**kwargs)


def _field(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)


def read_response(resp: Any) -> tuple[str, int, int]:
    """(content, prompt_tokens, completion_tokens) from a completion object, dict or string."""
    if isinstance(resp, str):
        return resp, 0, 0
    choices = _field(resp, "choices") or []
    message = _field(choices[0], "message") if choices else None
    content = _field(message, "content") if message is not None else None
    usage = _field(resp, "usage")
    prompt = _field(usage, "prompt_tokens") if usage is not None else 0
    completion = _field(usage, "completion_tokens") if usage is not None else 0
    return content or "", int(prompt or 0), int(completion or 0)


def _cost(resp: Any) -> float | None:
    if not type(resp).__module__.startswith("litellm"):
        return None
    try:
        return float(_litellm().completion_cost(completion_response=resp))
    except Exception:  # LiteLLM raises for models it has no price for
        return None


class LLMClient:
    """Calls one model. See the module docstring for what "carefully" means.

    Args:
        model: a LiteLLM model string ("openai/gpt-4.1-mini", "hosted_vllm/Qwen3-32B", ...).
        api_base, api_key, temperature, timeout: passed to the completion function.
        extra_params: any other keyword arguments for the completion function.
        completion_fn: async callable with LiteLLM's `acompletion` signature.
        retry: retries of transient API errors.
        max_concurrency: calls in flight at once, per event loop.
        structured_output: "auto" sends a JSON schema where the provider is known to take one
            (and falls back to instructions if it refuses); "json_schema" always;
            "instructions" never.
        price: USD per million (prompt, completion) tokens, for a model LiteLLM has no price
            for (a self-hosted judge, say); None: LiteLLM's price list, where it knows the model.
    """

    def __init__(
        self,
        model: str,
        *,
        api_base: str | None = None,
        api_key: str | None = None,
        temperature: float | None = None,
        timeout: float = 180.0,
        extra_params: Mapping[str, Any] | None = None,
        completion_fn: CompletionFn | None = None,
        retry: RetryPolicy | None = None,
        max_concurrency: int = 8,
        structured_output: Literal["auto", "json_schema", "instructions"] = "auto",
        price: tuple[float, float] | None = None,
    ) -> None:
        if not model or not isinstance(model, str):
            raise ValueError("a model string such as 'openai/gpt-4.1-mini' is required")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, got {max_concurrency}")
        self.model = model
        self.api_base = api_base
        self.api_key = api_key
        self.temperature = temperature
        self.timeout = timeout
        self.extra_params = dict(extra_params or {})
        self.completion_fn = completion_fn or litellm_acompletion
        self.retry = retry or RetryPolicy()
        self.max_concurrency = max_concurrency
        self.structured_output = structured_output
        if price is not None and (len(price) != 2 or min(price) < 0):
            raise ValueError(f"price={price}: two non-negative USD amounts per million tokens")
        self.price = price
        self._schema_refused = False
        self._limiters: weakref.WeakKeyDictionary[Any, anyio.CapacityLimiter] = (
            weakref.WeakKeyDictionary()
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.model!r}, api_base={self.api_base!r})"

    def request(self, messages: list[dict[str, Any]], **overrides: Any) -> dict[str, Any]:
        """The keyword arguments a call sends (without `response_format`)."""
        kwargs: dict[str, Any] = {"model": self.model, "messages": messages}
        if self.completion_fn is litellm_acompletion:
            # one retry layer, ours (`retry`): LiteLLM's and the OpenAI client's would multiply it
            kwargs.update(_NO_LIBRARY_RETRIES)
        kwargs.update(self.extra_params)
        for name in ("api_base", "api_key", "temperature", "timeout"):
            if getattr(self, name) is not None:
                kwargs[name] = getattr(self, name)
        if (
            self.api_base
            and self.api_key is None
            and self.model.startswith("openai/")
            and not os.environ.get("OPENAI_API_KEY")
        ):
            # Local OpenAI-compatible servers take any key, but the OpenAI client insists on one.
            kwargs["api_key"] = "EMPTY"
        kwargs.update(overrides)
        return kwargs

    def uses_schema(self) -> bool:
        if self.structured_output != "auto":
            return self.structured_output == "json_schema"
        if self._schema_refused:
            return False
        if self.api_base or self.model.startswith("hosted_vllm/"):
            return True  # OpenAI-compatible servers (vLLM, llama.cpp, mcprl) take json_schema
        try:
            return bool(_litellm().supports_response_schema(model=self.model))
        except Exception:
            return False

    async def complete(
        self,
        request: dict[str, Any],
        usage: Usage,
        *,
        schema: dict[str, Any] | None = None,
        schema_name: str = "reply",
    ) -> str:
        """Send `request` (from `request()`), count usage, return the reply's text."""
        attempt = 0
        while True:
            attempt += 1
            kwargs = dict(request)
            if schema is not None and self.uses_schema():
                kwargs["response_format"] = {
                    "type": "json_schema",
                    "json_schema": {"name": schema_name, "schema": schema, "strict": True},
                }
            try:
                async with self._limiter():
                    resp = await self.completion_fn(**kwargs)
            except Exception as exc:
                if (
                    "response_format" in kwargs
                    and self.structured_output == "auto"
                    and _status(exc) == 400
                ):
                    logger.info("%s refused a JSON schema (%s); using instructions", self, exc)
                    self._schema_refused = True
                    continue
                if is_transient(exc) and attempt < self.retry.max_attempts:
                    delay = self.retry.delay(attempt)
                    logger.warning("call to %s failed (%s); retry in %.1fs", self.model, exc, delay)
                    await anyio.sleep(delay)
                    continue
                raise JudgeAPIError.from_exception(exc, model=self.model, attempts=attempt) from exc
            content, prompt_tokens, completion_tokens = read_response(resp)
            usage.add(
                prompt_tokens, completion_tokens, self._cost(resp, prompt_tokens, completion_tokens)
            )
            return content

    def _cost(self, resp: Any, prompt_tokens: int, completion_tokens: int) -> float | None:
        if self.price is None:
            return _cost(resp)
        return (self.price[0] * prompt_tokens + self.price[1] * completion_tokens) / 1e6

    def context_window(self) -> int | None:
        """The model's input limit in tokens, where LiteLLM knows it (an `ollama_chat/` model is
        looked up under `ollama/` too: LiteLLM's table lists Ollama's models there)."""
        names = [self.model]
        if self.model.startswith("ollama_chat/"):
            names.append("ollama/" + self.model.removeprefix("ollama_chat/"))
        for name in names:
            try:
                info = _litellm().get_model_info(model=name)
            except Exception:  # LiteLLM raises for models it does not know
                continue
            tokens = info.get("max_input_tokens") or info.get("max_tokens")
            if tokens:
                return int(tokens)
        return None

    def _limiter(self) -> anyio.CapacityLimiter:
        loop = anyio.lowlevel.current_token().native_token
        limiter = self._limiters.get(loop)
        if limiter is None:
            limiter = self._limiters[loop] = anyio.CapacityLimiter(self.max_concurrency)
        return limiter
