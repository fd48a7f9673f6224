"""The errors mcprl raises, in one tree.

```
MCPRLError
├── UsageError                 a setting, argument or input cannot be used: the fix (ValueError)
├── ServerSpecError            a server spec or MCP config file cannot be used (ValueError)
├── MCPConnectionError         an MCP server could not be reached, or the connection was lost
│   └── MCPServerStartError    the server did not start: bad command, exited, hung, junk on stdout
├── MCPServerError             the server answered, but not usably (no tools, a protocol error)
├── ScenarioFileError          a scenario file has a bad line (ValueError)
├── ScenarioGenerationError    could not produce the scenarios asked for
├── PreflightError             a training run cannot start: what is missing and how to fix it
├── ModelNotFoundError         a model that is no known name, local directory or hub model
├── CheckpointError            a checkpoint cannot be loaded safely (never unpickled)
├── RunLockedError             another process is writing the same run folder
├── JudgeFailedError           the judge failed on too many groups of a step: the step is not kept
├── GatherError                too many attempts of a collection failed
├── TokenDataError             a trainable model's endpoint returns no token ids or log-probs
├── BackendError               the remote backend refused a request or could not be reached
│   └── BackendRequestError    it refused what was asked (400, 404, 409) (ValueError)
├── GrammarError               a tool's schema cannot be compiled into a grammar (ValueError)
└── AdapterError               an adapter the server cannot serve (ValueError)
```

ruler's errors (`ruler.errors.RulerError` and below) are ruler's own: the library stands alone.

Dependencies' errors are converted where they are caught, with `raise ... from exc`, so the cause
stays visible. A tool that fails is not an error here: it becomes text for the agent.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AdapterError",
    "BackendError",
    "BackendRequestError",
    "CheckpointError",
    "GatherError",
    "GrammarError",
    "JudgeFailedError",
    "MCPConnectionError",
    "MCPRLError",
    "MCPServerError",
    "MCPServerStartError",
    "ModelNotFoundError",
    "PreflightError",
    "RunLockedError",
    "ScenarioFileError",
    "ScenarioGenerationError",
    "ServerSpecError",
    "TokenDataError",
    "UsageError",
]


class MCPRLError(Exception):
    """Base class of every error raised by mcprl."""


class UsageError(MCPRLError, ValueError):
    """A setting, an argument or an input cannot be used; the message says how to fix it.
    (A `ValueError` too, so code that caught `ValueError` before still does.)"""


class ServerSpecError(MCPRLError, ValueError):
    """A server spec or MCP config file cannot be used; the message says how to fix it."""


class MCPConnectionError(MCPRLError):
    """An MCP server could not be reached or the connection broke. A new session may work."""

    def __init__(self, message: str, *, server: str, stderr_tail: str = "") -> None:
        if stderr_tail:
            message = f"{message}\n--- end of the server's stderr ---\n{stderr_tail}"
        super().__init__(message)
        self.server = server
        self.stderr_tail = stderr_tail


class MCPServerStartError(MCPConnectionError):
    """The server did not get through start-up and the MCP handshake."""


class MCPServerError(MCPRLError):
    """The server answered, but not in a usable way (for example, it offers no tools)."""


class ScenarioFileError(MCPRLError, ValueError):
    """A scenario file cannot be read; the message names the file, the line and the problem."""


class ScenarioGenerationError(MCPRLError):
    """Scenario generation could not produce what was asked within its budget of tries."""


class PreflightError(MCPRLError):
    """A check before a training run failed (judge silent, scenarios unusable, ...)."""


class RunLockedError(MCPRLError):
    """Another process writes this run folder; the message names it. One writer at a time."""


class ModelNotFoundError(MCPRLError, ValueError):
    """A model name that is no known model, no local directory and no model a hub can give."""


class CheckpointError(MCPRLError):
    """A checkpoint is missing a file or holds something that is not plain data."""


class JudgeFailedError(MCPRLError):
    """The judge failed on more groups of a step than allowed; nothing of the step was kept."""


class GatherError(MCPRLError):
    """Too many attempts failed; `errors` holds what they raised (`mcprl.types.AttemptError`)."""

    def __init__(self, message: str, errors: list[Any]) -> None:
        super().__init__(message)
        self.errors = errors


class TokenDataError(MCPRLError):
    """A trainable model's endpoint returns no token ids or log-probabilities."""


class BackendError(MCPRLError):
    """The remote backend refused a request, or could not be reached in time."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class BackendRequestError(BackendError, ValueError):
    """The remote backend refused a request for what it asked (400, 404, 409): the same
    `ValueError` a `LocalBackend` raises."""


class GrammarError(MCPRLError, ValueError):
    """A schema that cannot be compiled into a grammar."""


class AdapterError(MCPRLError, ValueError):
    """An adapter this server cannot serve (the message says why)."""
