"""What a session answers when the server asks the client's model for a completion (MCP
sampling, `sampling/createMessage`).

With no model configured the MCP SDK refuses at once ("Sampling not supported"), so a server
never waits. `Sampler(model)` answers with any LiteLLM model instead (`sampling_model`), text in
and text out; a failing model becomes an error reply, never a hang. Sampling is deprecated in
the 2026-07-28 protocol, and few servers use it.
"""

from __future__ import annotations

from typing import Any

from mcp import types as mcp_types

from ruler import JudgeError, LLMClient, Usage

__all__ = ["Sampler"]


def _text(content: Any) -> str:
    parts = content if isinstance(content, list) else [content]
    return "\n".join(getattr(p, "text", "") or f"[{getattr(p, 'type', 'non-text')} omitted]"
                     for p in parts)  # fmt: skip


class Sampler:
    """The SDK's sampling callback, answering with a LiteLLM model."""

    def __init__(self, model: str, *, api_base: str | None = None, api_key: str | None = None):
        self.llm = LLMClient(model, api_base=api_base, api_key=api_key, timeout=120.0)
        self.seen: list[dict[str, Any]] = []

    async def __call__(
        self, context: Any, params: mcp_types.CreateMessageRequestParams
    ) -> mcp_types.CreateMessageResult | mcp_types.ErrorData:
        messages = (
            [{"role": "system", "content": params.system_prompt}] if params.system_prompt else []
        )
        messages += [{"role": m.role, "content": _text(m.content)} for m in params.messages]
        extra: dict[str, Any] = {"max_tokens": params.max_tokens}
        if params.temperature is not None:
            extra["temperature"] = params.temperature
        if params.stop_sequences:
            extra["stop"] = params.stop_sequences
        try:
            text = await self.llm.complete(self.llm.request(messages, **extra), Usage())
        except JudgeError as exc:
            self.seen.append({"messages": messages, "error": str(exc)})
            return mcp_types.ErrorData(
                code=mcp_types.INTERNAL_ERROR, message=f"the client's model failed: {exc}"
            )
        self.seen.append({"messages": messages, "reply": text})
        return mcp_types.CreateMessageResult(
            role="assistant",
            content=mcp_types.TextContent(type="text", text=text),
            model=self.llm.model,
            stop_reason="endTurn",
        )
