"""What a session answers when the server asks the user something (MCP elicitation).

A training run has no user at hand, so a server's `elicitation/create` request gets an answer
by policy (`RolloutConfig.elicitation`):

- `decline` (the default): the user declines; the tool goes on without the answer, as it must
  when a real user says no.
- `accept-defaults`: accept with the defaults the requested schema declares; where a required
  field has no default there is nothing to accept with, and it declines.
- answers scripted per scenario (`Scenario.elicitation`): each request takes the next answer
  in the list, a content object (accepted) or `{"action": ..., "content": ...}`; when they run
  out, the policy answers.

A request for a URL (the user is sent to a web page) is always declined. Every request and its
answer is kept (`Elicitations.seen`), and the rollout writes them into the tool result the agent
reads and into the trajectory, so the judge and the report see them.
"""

from __future__ import annotations

from typing import Any, Literal

from mcp import types as mcp_types

__all__ = ["ElicitationPolicy", "Elicitations", "schema_defaults"]

ElicitationPolicy = Literal["decline", "accept-defaults"]


def schema_defaults(schema: dict[str, Any] | None) -> dict[str, Any] | None:
    """The content a form request's schema gives by default; None where a required field has no
    default (nothing to accept with)."""
    properties = (schema or {}).get("properties") or {}
    content = {
        k: p["default"] for k, p in properties.items() if isinstance(p, dict) and "default" in p
    }
    required = (schema or {}).get("required") or []
    return None if any(k not in content for k in required) else content


class Elicitations:
    """The SDK's elicitation callback, answering by `policy` or the scripted `answers`."""

    def __init__(
        self, policy: ElicitationPolicy = "decline", answers: list[dict[str, Any]] | None = None
    ) -> None:
        self.policy = policy
        self.answers = list(answers or [])
        self.seen: list[dict[str, Any]] = []

    def script(self, answers: list[dict[str, Any]] | None) -> None:
        """Answer the next requests with `answers` (a scenario's script), in order."""
        self.answers = list(answers or [])

    async def __call__(self, context: Any, params: Any) -> mcp_types.ElicitResult:
        action, content = self._answer(params)
        self.seen.append({
            "message": params.message,
            "schema": getattr(params, "requested_schema", None),
            "url": getattr(params, "url", None),
            "action": action,
            "content": content,
        })  # fmt: skip
        return mcp_types.ElicitResult(action=action, content=content)

    def _answer(self, params: Any) -> tuple[str, dict[str, Any] | None]:
        if getattr(params, "mode", "form") == "url":
            return "decline", None  # a web page for a person to visit: nobody is there
        if self.answers:
            answer = self.answers.pop(0)
            if "action" in answer:
                return answer["action"], answer.get("content")
            return "accept", answer
        if self.policy == "accept-defaults":
            content = schema_defaults(getattr(params, "requested_schema", None))
            if content is not None:
                return "accept", content
        return "decline", None


def describe(seen: dict[str, Any]) -> str:
    """One request and its answer, for the tool result the agent reads and the judge sees."""
    answer = seen["action"] + (f" {seen['content']}" if seen.get("content") else "")
    return f"[the server asked the user: {seen['message']!r}; answer: {answer}]"
