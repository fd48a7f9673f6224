"""Token data from an OpenAI-compatible reply: what GRPO trains on, in each server's dialect.

Training needs, for every completion, the prompt's token ids, the sampled token ids and their
log-probabilities. Servers give them in different places:

- **mcprl** (`mcprl serve`, the local backend): per choice `prompt_token_ids`, `token_ids`, and
  `mcprl.token_logprobs` / `mcprl.model_logprobs` (the log-probabilities under the sampling
  distribution and under the model);
- **vLLM** (asked with `return_token_ids`, `logprobs` and `return_tokens_as_token_ids`): the
  prompt's ids at the top level (`prompt_token_ids`), the choice's `token_ids`, and
  `logprobs.content[i].logprob` with tokens spelled `token_id:N`.

`per_choice_transport()` is an HTTP transport for the OpenAI client that copies vLLM's
top-level `prompt_token_ids` into each choice, so that a choice alone (what ART's loops append
to a trajectory) carries everything a trainer needs. `TOKEN_REQUEST` holds the request fields
that ask for all of it; both servers accept them. `read_choice(choice, response, index)` reads
either dialect into a `Choice`. `check_token_data` asks an endpoint once and raises
`TokenDataError` if its replies could not be trained on, so a run never trains on nothing in
silence.
"""

from __future__ import annotations

from typing import Any

from mcprl.errors import TokenDataError
from mcprl.types import Choice

__all__ = [
    "TOKEN_REQUEST",
    "TokenDataError",
    "check_token_data",
    "per_choice_transport",
    "read_choice",
]

# keyword arguments for `client.chat.completions.create` that ask for token data
TOKEN_REQUEST: dict[str, Any] = {
    "logprobs": True,
    "extra_body": {"return_token_ids": True, "return_tokens_as_token_ids": True},
}


def read_choice(choice: Any, response: Any, index: int) -> Choice:
    """A `Choice` (the reply at `messages[index]`) with whatever token data the reply holds."""
    return Choice.from_reply(choice, response, index)


async def check_token_data(client: Any, served: str) -> None:
    """Ask `served` for one token; raise `TokenDataError` naming what its reply lacks."""
    response = await client.chat.completions.create(
        model=served,
        messages=[{"role": "user", "content": "Say OK."}],
        max_tokens=1,
        temperature=1.0,
        **TOKEN_REQUEST,
    )
    choice = read_choice(response.choices[0], response, 1)
    missing = [
        name
        for name, value in (
            ("prompt token ids", choice.prompt_token_ids),
            ("completion token ids", choice.token_ids),
            ("log-probabilities", choice.sampling_logprobs),
        )
        if not value
    ]
    if missing:
        raise TokenDataError(
            f"the endpoint serving {served!r} returned no {', no '.join(missing)}, so its "
            "attempts could not be trained on. GRPO needs them: serve the model with mcprl "
            "(the local backend, `mcprl serve`) or with vLLM, which returns them when asked "
            "(mcprl asks with return_token_ids, logprobs and return_tokens_as_token_ids)"
        )


def per_choice_transport() -> Any:
    """An `httpx.AsyncBaseTransport` (module docstring) for `AsyncOpenAI(http_client=...)`."""
    import json

    import httpx

    class PerChoice(httpx.AsyncBaseTransport):
        def __init__(self) -> None:
            self.inner = httpx.AsyncHTTPTransport()

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            response = await self.inner.handle_async_request(request)
            if not request.url.path.endswith("/chat/completions") or response.status_code != 200:
                return response
            body = await response.aread()
            try:
                data = json.loads(body)
            except ValueError:
                data = None
            prompt = data.get("prompt_token_ids") if isinstance(data, dict) else None
            choices = data.get("choices") or [] if prompt is not None else []
            if not any("prompt_token_ids" not in c for c in choices):  # nothing to copy
                return httpx.Response(response.status_code, headers=response.headers,
                                      content=body)  # fmt: skip
            for choice in choices:
                choice.setdefault("prompt_token_ids", prompt)
            headers = {k: v for k, v in response.headers.items()
                       if k.lower() not in ("content-length", "content-encoding")}  # fmt: skip
            return httpx.Response(response.status_code, headers=headers, json=data)

        async def aclose(self) -> None:
            await self.inner.aclose()

    return PerChoice()
