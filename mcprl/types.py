"""Trajectories: attempts at scenarios, recorded exactly enough to train on.

A `Trajectory` keeps the conversation as sent and received (OpenAI-format messages), and for
every policy completion a `Choice` with the token ids and log-probabilities the policy sampled, so
the trainer never re-tokenizes text. A `TrajectoryGroup` holds the attempts at one scenario and
the errors of attempts that failed. Both round-trip through JSON Lines without loss.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr

from mcprl.errors import UsageError

__all__ = [
    "AttemptError",
    "Choice",
    "Messages",
    "Trajectory",
    "TrajectoryGroup",
    "read_groups",
    "write_groups",
]

Scalar = str | int | float | bool | None


def _extra(obj: Any) -> dict[str, Any]:
    if isinstance(obj, dict):
        return obj
    return getattr(obj, "model_extra", None) or {}


def _content(choice: Any) -> list[Any]:
    logprobs = getattr(choice, "logprobs", None)
    return list(getattr(logprobs, "content", None) or [])


def _token_id(token: Any) -> int | None:
    text = getattr(token, "token", "")
    if isinstance(text, str) and text.startswith("token_id:"):
        try:
            return int(text.removeprefix("token_id:"))
        except ValueError:
            return None
    return None


class Choice(BaseModel):
    """One completion of the policy, with what it sampled."""

    model_config = ConfigDict(extra="forbid")
    message_index: int = Field(description="index in Trajectory.messages of the reply")
    finish_reason: str | None = None
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = Field(
        default=None, description="per token, under the model (temperature 1, no mask)"
    )
    sampling_logprobs: list[float] | None = Field(
        default=None, description="per token, under the distribution actually sampled from"
    )

    @property
    def trainable(self) -> bool:
        return (
            self.prompt_token_ids is not None
            and self.token_ids is not None
            and self.logprobs is not None
            and len(self.logprobs) == len(self.token_ids) > 0
        )

    @classmethod
    def from_reply(cls, choice: Any, response: Any, index: int) -> Choice:
        """The reply at `messages[index]` (an OpenAI-shaped choice of `response`) with
        whatever token data it holds: mcprl's, vLLM's token ids, or ids spelled in tokens."""
        extra, top = _extra(choice), _extra(response)
        ours = extra.get("mcprl") or {}
        content = _content(choice)
        sampling = ours.get("token_logprobs")
        if sampling is None and content:
            sampling = [float(t.logprob) for t in content]
        token_ids = extra.get("token_ids")
        if token_ids is None and content:  # vLLM without return_token_ids: spelled in the tokens
            spelled = [_token_id(t) for t in content]
            token_ids = spelled if all(i is not None for i in spelled) else None
        return cls(
            message_index=index,
            finish_reason=getattr(choice, "finish_reason", None),
            prompt_token_ids=extra.get("prompt_token_ids") or top.get("prompt_token_ids"),
            token_ids=token_ids,
            logprobs=ours.get("model_logprobs", sampling),
            sampling_logprobs=sampling,
        )


class Messages(list):
    """A trajectory's messages: a list, and callable too (`trajectory.messages()`, as in ART)."""

    def __call__(self) -> list[dict[str, Any]]:
        return list(self)


class _MessagesAndChoices:
    """ART's `trajectory.messages_and_choices`: appending a message dict adds it to `messages`;
    appending a completion's choice (an OpenAI SDK `Choice`) adds its message and a `Choice`
    with the token data the reply carries (`mcprl.tokens.read_choice`)."""

    def __init__(self, trajectory: Trajectory) -> None:
        self.trajectory = trajectory

    def append(self, item: Any) -> None:
        t = self.trajectory
        if isinstance(item, dict):
            t.messages.append(dict(item))
            return
        message = getattr(item, "message", None)
        if message is None:
            raise TypeError(
                f"append a message dict or a completion's choice, not {type(item).__name__}"
            )
        keep = {"role", "content", "tool_calls", "refusal"}
        dumped = message.model_dump(exclude_none=True) if hasattr(message, "model_dump") else {}
        t.messages.append({k: v for k, v in dumped.items() if k in keep})
        t.choices.append(Choice.from_reply(item, None, len(t.messages) - 1))

    def extend(self, items: Iterable[Any]) -> None:
        for item in items:
            self.append(item)

    def __iter__(self) -> Any:
        return iter(self.trajectory.messages)

    def __len__(self) -> int:
        return len(self.trajectory.messages)

    def __getitem__(self, index: Any) -> Any:
        return self.trajectory.messages[index]


class Trajectory(BaseModel):
    """One attempt at a scenario.

    ART's spelling works too: `Trajectory(messages_and_choices=[...], reward=0)`, then
    `trajectory.messages_and_choices.append(completion.choices[0])` and `trajectory.messages()`.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    messages: Annotated[list[dict[str, Any]], AfterValidator(Messages)] = Field(
        default_factory=Messages
    )
    choices: list[Choice] = Field(default_factory=list)
    tools: list[dict[str, Any]] = Field(default_factory=list)
    reward: float | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    metadata: dict[str, Scalar] = Field(default_factory=dict)
    logs: list[str] = Field(default_factory=list)
    timings: dict[str, float] = Field(default_factory=dict)

    def __init__(self, /, messages_and_choices: Iterable[Any] | None = None, **data: Any) -> None:
        super().__init__(**data)
        if messages_and_choices is not None:
            self.messages_and_choices.extend(messages_and_choices)

    @property
    def messages_and_choices(self) -> _MessagesAndChoices:
        return _MessagesAndChoices(self)

    @property
    def trainable(self) -> bool:
        """Every completion carries its token ids and log-probabilities."""
        return bool(self.choices) and all(c.trainable for c in self.choices)

    @property
    def helped(self) -> bool:
        """The training loop chose how the attempt started: a first tool it picked (an explored
        attempt), a first call it pinned (a demonstration), or reference calls it made for it
        (a guided one, or a subtask's, which practises one step of a chain). Its success is
        partly the loop's, not the policy's own."""
        return any(k in self.metadata for k in ("first_tool", "guided_calls", "subtask_step"))

    def log(self, text: str) -> None:
        self.logs.append(text)

    def final_answer(self) -> str | None:
        """What the agent reported: its complete_task summary, else its last text reply."""
        answer = self.metadata.get("final_answer")
        if isinstance(answer, str):
            return answer
        for m in reversed(self.messages):
            if m.get("role") == "assistant" and m.get("content"):
                return str(m["content"])
        return None


class AttemptError(BaseModel):
    """Why an attempt failed (it produced no trajectory)."""

    type: str
    message: str

    @classmethod
    def of(cls, exc: BaseException) -> AttemptError:
        return cls(type=type(exc).__name__, message=str(exc))


class TrajectoryGroup(BaseModel):
    """The attempts at one scenario.

    `TrajectoryGroup(items)` takes an iterable of trajectories, or of awaitables that give
    them (ART's `TrajectoryGroup(rollout(model, s) for _ in range(8))`): those are run by
    `gather_trajectory_groups`, or by awaiting the group itself.
    """

    model_config = ConfigDict(extra="forbid")
    scenario_id: str | None = None
    trajectories: list[Trajectory] = Field(default_factory=list)
    exceptions: list[AttemptError] = Field(default_factory=list)
    metadata: dict[str, Scalar] = Field(default_factory=dict)
    _pending: list[Any] = PrivateAttr(default_factory=list)

    def __init__(self, items: Iterable[Any] | None = None, /, **data: Any) -> None:
        pending: list[Any] = []
        if items is not None:
            done = list(data.pop("trajectories", []))
            for item in items:
                (done if isinstance(item, Trajectory) else pending).append(item)
            data["trajectories"] = done
        super().__init__(**data)
        self._pending = pending

    @property
    def pending(self) -> list[Any]:
        """Attempts not run yet (awaitables given to the constructor)."""
        return self._pending

    def __len__(self) -> int:
        return len(self.trajectories) + len(self._pending)

    def __await__(self) -> Any:
        return self._run_pending().__await__()

    async def _run_pending(self) -> TrajectoryGroup:
        """Run the pending attempts together; the first that fails stops the rest and raises
        `GatherError` (`gather_trajectory_groups` runs many groups, with a failure budget)."""
        import inspect

        import anyio

        from mcprl.errors import GatherError

        pending, self._pending = list(self._pending), []

        async def attempt(item: Any) -> None:
            try:
                trajectory = await (
                    item() if callable(item) and not inspect.isawaitable(item) else item
                )
            except Exception as exc:
                error = AttemptError.of(exc)
                self.exceptions.append(error)
                raise GatherError(
                    f"1 of {len(pending)} attempts failed (allowed: 0); first: {error.type}: "
                    f"{error.message}",
                    [error],
                ) from exc
            self.trajectories.append(trajectory)

        try:
            async with anyio.create_task_group() as tg:
                for item in pending:
                    tg.start_soon(attempt, item)
        except BaseExceptionGroup as group:
            raise first_error(group) from None
        if self.scenario_id is None and self.trajectories:
            found = self.trajectories[0].metadata.get("scenario_id")
            self.scenario_id = found if isinstance(found, str) else None
        return self

    @property
    def rewards(self) -> list[float | None]:
        return [t.reward for t in self.trajectories]


def write_groups(path: str | os.PathLike[str], groups: Iterable[TrajectoryGroup]) -> Path:
    """Write groups as JSON Lines, atomically (a crash leaves no half-written file)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for g in groups:
                f.write(g.model_dump_json() + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return p


def text_lines(path: str | os.PathLike[str]) -> list[str]:
    """The lines of a UTF-8 text file; bytes that are not UTF-8 raise a `ValueError` naming the
    file, the line and the column."""
    p = Path(path)
    lines = p.read_bytes().split(b"\n")
    out = []
    for n, raw in enumerate(lines, start=1):
        try:
            out.append(raw.decode("utf-8").removesuffix("\r"))
        except UnicodeDecodeError as exc:
            raise UsageError(
                f"{p} line {n}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at column "
                f"{exc.start + 1}); save the file as UTF-8"
            ) from None
    if out and out[-1] == "":
        out.pop()
    return out


def read_groups(path: str | os.PathLike[str]) -> list[TrajectoryGroup]:
    p = Path(path)
    groups = []
    for n, line in enumerate(text_lines(p), start=1):
        if line.strip():
            try:
                groups.append(TrajectoryGroup.model_validate_json(line))
            except ValueError as exc:
                raise UsageError(f"{p} line {n}: not a trajectory group: {exc}") from exc
    return groups


def first_error(group: BaseExceptionGroup) -> BaseException:
    """The error to raise for a task group's failures: a `GatherError` where one is there (it
    says how many attempts failed), else the first leaf."""
    from mcprl.errors import GatherError

    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            return first_error(exc)
        if isinstance(exc, GatherError):
            return exc
    leaf: BaseException = group.exceptions[0]
    return first_error(leaf) if isinstance(leaf, BaseExceptionGroup) else leaf
