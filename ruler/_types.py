"""Data at ruler's edges: the trajectories it reads and the scores it returns.

Input is accepted in the shapes people have at hand (plain OpenAI-format dicts, pydantic models,
OpenAI SDK objects, `Choice` objects, objects with a `messages` attribute) and validated once,
here, into `Trajectory`. Inside, everything is plain.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ruler.errors import InvalidGroupError

__all__ = ["JudgeResult", "JudgeScore", "Message", "ToolCall", "Trajectory", "Usage"]


class ToolFunction(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str
    arguments: str = ""


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: str | None = None
    type: str = "function"
    function: ToolFunction


class Message(BaseModel):
    """One OpenAI-format chat message, reduced to what a judge needs to read."""

    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class Trajectory(BaseModel):
    """One attempt at the task: its messages and, optionally, the tools it was offered."""

    model_config = ConfigDict(extra="ignore")
    messages: list[Message]
    tools: list[dict[str, Any]] | None = None
    id: str | None = None


class JudgeScore(BaseModel):
    """The judge's verdict on one trajectory."""

    trajectory_id: str
    score: float = Field(ge=0.0, le=1.0)
    explanation: str


class Usage(BaseModel):
    """What judging a group cost. `cost_usd` is None where LiteLLM does not know the price."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = None
    judge_calls: int = 0
    cached: bool = False

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def add(self, prompt_tokens: int, completion_tokens: int, cost: float | None) -> None:
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens
        self.judge_calls += 1
        if cost is not None:
            self.cost_usd = (self.cost_usd or 0.0) + cost

    def merge(self, other: Usage) -> None:
        """Add `other`'s tokens, calls and cost to this one."""
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.judge_calls += other.judge_calls
        if other.cost_usd is not None:
            self.cost_usd = (self.cost_usd or 0.0) + other.cost_usd


class JudgeResult(BaseModel):
    """Scores for a group, in the order the trajectories were given, with the usage.

    With two passes (`Judge(passes=2)`), each score is the mean of the passes, `passes` holds
    each pass's scores, and `agreement` is their rank correlation (1: the same order; near 0:
    the judge is guessing; None: a pass scored every attempt alike).
    """

    scores: list[JudgeScore]
    usage: Usage = Field(default_factory=Usage)
    judge: str = ""
    passes: list[list[float]] = Field(default_factory=list)
    agreement: float | None = None

    @property
    def rewards(self) -> list[float]:
        return [s.score for s in self.scores]


# ---------------------------------------------------------------------------------------------
# Coercion of user input


def _plain(obj: Any) -> Any:
    """Turn pydantic / SDK objects into plain dicts, leaving dicts and lists as they are."""
    if isinstance(obj, Mapping):
        return dict(obj)
    if hasattr(obj, "model_dump"):
        return obj.model_dump(exclude_none=True)
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    return obj


def _content_text(content: Any) -> str | None:
    """Flatten multi-part content; non-text parts become a short placeholder."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = []
        for part in content:
            part = _plain(part)
            if isinstance(part, Mapping) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            elif isinstance(part, Mapping):
                parts.append(f"[{part.get('type', 'non-text')} part omitted]")
            else:
                parts.append(str(part))
        return "\n".join(parts)
    return json.dumps(content, ensure_ascii=False, default=str)


def _coerce_message(raw: Any) -> dict[str, Any]:
    raw = _plain(raw)
    # An OpenAI `Choice` (as in ART's messages_and_choices) carries the message inside.
    if isinstance(raw, Mapping) and "message" in raw and "role" not in raw:
        raw = _plain(raw["message"])
    if not isinstance(raw, Mapping):
        raise TypeError(f"expected a message object, got {type(raw).__name__}")
    msg = dict(raw)
    msg["content"] = _content_text(msg.get("content"))
    if msg.get("tool_calls"):
        msg["tool_calls"] = [_plain(tc) for tc in msg["tool_calls"]]
        for tc in msg["tool_calls"]:
            fn = _plain(tc.get("function", {}))
            if isinstance(fn.get("arguments"), Mapping):
                fn["arguments"] = json.dumps(fn["arguments"], ensure_ascii=False)
            tc["function"] = fn
    return msg


def coerce_trajectory(raw: Any, index: int) -> Trajectory:
    """Validate one user-supplied trajectory; errors name the trajectory and message index."""
    if isinstance(raw, Trajectory):
        return raw
    tools = None
    traj_id = None
    if isinstance(raw, Mapping) or hasattr(raw, "messages") or hasattr(raw, "messages_and_choices"):
        obj = raw
        get = obj.get if isinstance(obj, Mapping) else (lambda k, d=None: getattr(obj, k, d))
        messages = get("messages")
        if messages is None:
            messages = get("messages_and_choices")
        if messages is None:
            raise InvalidGroupError(
                f"trajectory {index}: an object trajectory needs a 'messages' list "
                f"(got keys {sorted(obj) if isinstance(obj, Mapping) else type(obj).__name__})"
            )
        tools = get("tools")
        traj_id = get("id")
    else:
        messages = raw
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise InvalidGroupError(
            f"trajectory {index}: expected a list of OpenAI-format messages, "
            f"got {type(messages).__name__}"
        )
    coerced = []
    for j, m in enumerate(messages):
        try:
            coerced.append(_coerce_message(m))
        except TypeError as exc:
            raise InvalidGroupError(f"trajectory {index}, message {j}: {exc}") from exc
    try:
        return Trajectory.model_validate(
            {
                "messages": coerced,
                "tools": [_plain(t) for t in tools] if tools else None,
                "id": None if traj_id is None else str(traj_id),
            }
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InvalidGroupError(
            f"trajectory {index}: {where}: {first['msg']} "
            "(each message needs a 'role' of system/user/assistant/tool and text 'content')"
        ) from exc
