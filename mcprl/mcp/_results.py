"""Tool results as text for a tool message.

Text parts are joined; structured content is added as JSON unless the text already says the same
(then `results_as="json"` shows the JSON instead of the text: `{"result": -160}` for `-160`);
images, audio and other binary parts become a short placeholder naming the type and size; results
longer than the limit are cut with a visible marker. An error result is prefixed "Error: ".
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["ResultsAs", "ToolResult", "tool_result", "truncate"]

ResultsAs = Literal["text", "json"]


@dataclass
class ToolResult:
    """What a tool call gave back, ready for the agent: `text`, and whether it is an error."""

    text: str
    is_error: bool = False
    structured: Any = None
    truncated: bool = False
    elicitations: list[dict[str, Any]] = field(default_factory=list)  # asked during the call


def _size(data: str | None) -> str:
    n = len(data or "") * 3 // 4  # base64 to bytes
    return f"{n / 1024:.1f} KB" if n >= 1024 else f"{n} bytes"


def _part_text(part: Any) -> str:
    kind = getattr(part, "type", None)
    if kind == "text":
        return part.text
    if kind in ("image", "audio"):
        return f"[{kind}: {getattr(part, 'mime_type', None) or 'unknown type'}, {_size(part.data)}]"
    if kind == "resource":
        res = part.resource
        text = getattr(res, "text", None)
        if text is not None:
            return text
        mime = getattr(res, "mime_type", None) or "unknown type"
        return f"[binary resource {res.uri}: {mime}, {_size(getattr(res, 'blob', ''))}]"
    if kind == "resource_link":
        return f"[resource link: {part.uri}]"
    return f"[{kind or type(part).__name__} content]"


def _parts_as_json(text: str) -> list[Any] | None:
    """Each line of `text` as JSON (SDKs send a returned list as one text part per item)."""
    try:
        return [json.loads(line) for line in text.split("\n") if line.strip()]
    except (json.JSONDecodeError, TypeError):
        return None


def _says_the_same(text: str, structured: Any) -> bool:
    wrapped = isinstance(structured, dict) and list(structured) == ["result"]
    if wrapped and text == str(structured["result"]):
        return True
    try:
        parsed = json.loads(text)
    except (json.JSONDecodeError, TypeError):
        items = _parts_as_json(text)
        inner = structured["result"] if wrapped else structured
        return items is not None and isinstance(inner, list) and items == inner
    if parsed == structured:
        return True
    # SDKs wrap a plain return value as {"result": value} in structured content.
    return (
        isinstance(structured, dict)
        and list(structured) == ["result"]
        and (parsed == structured["result"])
    )


def truncate(text: str, limit: int) -> tuple[str, bool]:
    if len(text) <= limit:
        return text, False
    cut = len(text) - limit
    return f"{text[:limit]}\n…[output truncated: {cut} of {len(text)} characters cut]", True


def tool_result(result: Any, max_chars: int = 20_000, results_as: ResultsAs = "text") -> ToolResult:
    """Convert an MCP `CallToolResult` into a `ToolResult`.

    `results_as`: where the structured content and the text say the same, which one the text
    shows ("text": the server's text, "json": the structured content as JSON).
    """
    parts = [_part_text(p) for p in result.content or []]
    text = "\n".join(parts)
    structured = getattr(result, "structured_content", None)
    if structured is not None:
        dumped = json.dumps(structured, ensure_ascii=False)
        if not _says_the_same(text, structured):
            text = f"{text}\n{dumped}" if text else dumped
        elif results_as == "json":
            text = dumped
    is_error = bool(result.is_error)
    if is_error and not text.lower().startswith("error"):
        text = f"Error: {text or 'the tool reported an error without a message'}"
    text, cut = truncate(text, max_chars)
    return ToolResult(text=text, is_error=is_error, structured=structured, truncated=cut)
