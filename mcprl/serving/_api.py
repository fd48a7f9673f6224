"""The OpenAI-compatible request and response shapes, validated at the HTTP edge."""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mcprl.serving._chat import parse_tool_calls
from mcprl.serving._engine import Completion

__all__ = ["ChatRequest", "chat_response", "error_body"]


# mcprl's request fields beyond OpenAI's and vLLM's that change what the server keeps
EXTENSIONS = ("final_tools",)


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ToolFunction(_Open):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(_Open):
    type: Literal["function"] = "function"
    function: ToolFunction


class ToolCallFunction(_Open):
    name: str
    arguments: str | dict[str, Any] = ""


class ToolCall(_Open):
    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction


class Message(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    def plain(self) -> dict[str, Any]:
        content = self.content
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if p.get("type") == "text")
        out: dict[str, Any] = {"role": self.role, "content": content}
        if self.tool_calls:
            out["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        return out


class NamedFunction(_Open):
    name: str
    # mcprl's extension: the call's arguments too, pinned (a demonstration, `mcprl.train`); a
    # server without it ignores the field and the model chooses the arguments. Any: the
    # grammar names what is wrong with one that is not an object
    arguments: Any = None


class NamedToolChoice(_Open):
    type: Literal["function"] = "function"
    function: NamedFunction


class AllowedTools(_Open):
    mode: Literal["auto", "required"]
    tools: list[NamedToolChoice] = Field(min_length=1)


class AllowedToolsChoice(_Open):
    """OpenAI's `{"type": "allowed_tools", ...}`: calls only of these tools, while the prompt
    still lists every tool (so it stays the same from turn to turn)."""

    type: Literal["allowed_tools"]
    allowed_tools: AllowedTools


class ResponseFormat(_Open):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


class ChatRequest(_Open):
    model: str
    messages: list[Message] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: (
        Literal["none", "auto", "required"] | NamedToolChoice | AllowedToolsChoice | None
    ) = None
    response_format: ResponseFormat | None = None
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)  # vLLM's extension
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**63)
    n: int = Field(default=1, ge=1, le=32)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    stream: bool = False
    return_tokens_as_token_ids: bool = False
    ignore_eos: bool = False
    # mcprl's extension: tools whose call ends the conversation (an agent loop's answer tool).
    # A reply that calls only these is never continued, so the server keeps nothing of it for
    # a next turn; a server without the field ignores it and only keeps more than it needs
    final_tools: list[str] | None = None

    @model_validator(mode="after")
    def _check(self) -> ChatRequest:
        if self.stream:
            raise ValueError("stream=true is not supported by this server; send stream=false")
        if self.tool_choice in ("required",) and not self.tools:
            raise ValueError("tool_choice 'required' needs at least one tool in 'tools'")
        if isinstance(self.tool_choice, NamedToolChoice | AllowedToolsChoice) and not self.tools:
            raise ValueError("a named or allowed_tools tool_choice needs its tools in 'tools'")
        fmt = self.response_format
        if fmt and fmt.type == "json_schema" and not fmt.json_schema:
            raise ValueError("response_format json_schema needs a 'json_schema' object")
        return self

    @property
    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def choice(self) -> Any:
        if isinstance(self.tool_choice, NamedToolChoice | AllowedToolsChoice):
            return self.tool_choice.model_dump(exclude_none=True)
        return self.tool_choice or ("auto" if self.tools else "none")


def error_body(message: str, kind: str, status: int, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


_FLOOR = -9999.0  # what vLLM reports for tokens a grammar ruled out: JSON has no -Infinity


def _logprob(value: float) -> float:
    return max(value, _FLOOR)


def _logprobs(c: Completion, tokenizer: Any, as_ids: bool) -> dict[str, Any]:
    def show(token_id: int) -> str:
        return f"token_id:{token_id}" if as_ids else tokenizer.decode([token_id])

    content = []
    for k, (token, lp) in enumerate(zip(c.token_ids, c.logprobs, strict=True)):
        text = show(token)
        top = c.top_logprobs[k] if k < len(c.top_logprobs) else []
        content.append(
            {
                "token": text,
                "logprob": _logprob(lp),
                "bytes": list(text.encode()),
                "top_logprobs": [
                    {"token": show(t), "logprob": _logprob(v), "bytes": list(show(t).encode())}
                    for t, v in top
                ],
            }
        )
    return {"content": content}


def chat_response(
    request: ChatRequest,
    prompt_ids: list[int],
    completions: list[Completion],
    tokenizer: Any,
) -> dict[str, Any]:
    choices = []
    for i, c in enumerate(completions):
        content, calls = (c.text, [])
        if request.tools and request.choice != "none":
            content, calls = parse_tool_calls(c.text)
        finish = "tool_calls" if calls and c.finish_reason == "stop" else c.finish_reason
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
        choices.append(
            {
                "index": i,
                "message": message,
                "finish_reason": finish,
                "logprobs": _logprobs(c, tokenizer, request.return_tokens_as_token_ids)
                if request.logprobs
                else None,
                # Extensions: what was sampled, exactly, so the trainer never re-tokenizes.
                "token_ids": c.token_ids,
                "prompt_token_ids": prompt_ids,
                "mcprl": {"token_logprobs": c.logprobs, "model_logprobs": c.model_logprobs},
            }
        )
    completion_tokens = sum(len(c.token_ids) for c in completions)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request.model,
        "choices": choices,
        "usage": {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": completion_tokens,
            "total_tokens": len(prompt_ids) + completion_tokens,
        },
        "prompt_token_ids": prompt_ids,
    }
