"""The errors `ruler` raises, in one tree.

```
RulerError
├── InvalidGroupError      the input is not a usable group (bad message, fewer than 2 attempts, ...)
└── JudgeError             the judge could not produce scores
    ├── JudgeAPIError      the provider refused the call, or kept failing after retries
    ├── JudgeParseError    the judge answered, but never with valid scores (carries the raw reply)
    └── PromptTooLargeError the group does not fit max_prompt_chars, even with messages cut
```

Errors of the completion function (LiteLLM's or an injected one) are converted here, in
`JudgeAPIError.from_exception`, and chained with `raise ... from exc`.
"""

from __future__ import annotations

__all__ = [
    "InvalidGroupError",
    "JudgeAPIError",
    "JudgeError",
    "JudgeParseError",
    "PromptTooLargeError",
    "RulerError",
]


class RulerError(Exception):
    """Base class of every error raised by `ruler`."""


class InvalidGroupError(RulerError, ValueError):
    """The trajectories given cannot be judged as a group; the message says what to fix."""


class JudgeError(RulerError):
    """The judge could not produce scores for a group."""


class JudgeAPIError(JudgeError):
    """The judge's provider refused the request, or transient failures outlasted the retries."""

    def __init__(self, message: str, *, model: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.model = model
        self.status_code = status_code

    @classmethod
    def from_exception(cls, exc: BaseException, *, model: str, attempts: int) -> JudgeAPIError:
        status = status_code_of(exc)
        status_text = f"HTTP {status}" if status is not None else "no HTTP status"
        tried = f" after {attempts} attempts" if attempts > 1 else ""
        hint = _HINTS.get(status or 0, "")
        return cls(
            f"call to {model!r} failed{tried} ({status_text}): {type(exc).__name__}: {exc}{hint}",
            model=model,
            status_code=status,
        )


class JudgeParseError(JudgeError):
    """The judge's replies never contained valid scores; `raw_reply` is the last reply."""

    def __init__(self, message: str, *, raw_reply: str, problems: list[str]) -> None:
        super().__init__(message)
        self.raw_reply = raw_reply
        self.problems = problems


class PromptTooLargeError(JudgeError):
    """A group's prompt stays over `max_prompt_chars` with every message cut; nothing was sent."""


_HINTS = {
    401: " — check the API key (--api-key, or the provider's environment variable)",
    403: " — the key is not allowed to use this model",
    404: " — check the model name and --api-base",
}


def status_code_of(exc: BaseException) -> int | None:
    """The HTTP status an exception carries (LiteLLM and OpenAI errors have `status_code`)."""
    status = getattr(exc, "status_code", None)
    if isinstance(status, int):
        return status
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else None
