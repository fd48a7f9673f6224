"""A tool result as data: the forms servers return, read into dicts, lists and scalars.

    parse_result('[{"name": "a"}]')            -> [{"name": "a"}]          JSON
    parse_result("[{'name': 'a'}]")            -> [{"name": "a"}]          a Python repr (SQL tools)
    parse_result("Commit: 1a2b\\nAuthor: Ana")  -> {"Commit": "1a2b", "Author": "Ana"}
    parse_result("Author: Ana\\n\\nAuthor: Ben") -> [{"Author": "Ana"}, {"Author": "Ben"}]
    parse_result("  drafts\\n* main")           -> ["drafts", "main"]         one item a line
    parse_result("391")                        -> 391

Structured content, where the server sent it, is preferred to the text (unwrapped from the
`{"result": …}` that SDKs put around a plain return value). Anything else stays text.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

__all__ = ["parse_result"]

_KEY_VALUE = re.compile(r"^\s*([A-Za-z][\w .-]{0,40}?)\s*:\s+(\S.*?)\s*$")
_ITEM_MARK = re.compile(r"^\s*(?:[*\-•]\s+|\[(?:FILE|DIR)\]\s+|\d+[.)]\s+)?")
_NUMBER = re.compile(r"^-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?$")


def parse_result(text: str, structured: Any = None) -> Any:
    """The result's data (see the module docstring)."""
    if isinstance(structured, dict) and list(structured) == ["result"]:
        structured = structured["result"]
    if isinstance(structured, (dict, list)) and not _only_text(structured):
        return structured
    text = _without_echoed_structure(text or "")
    stripped = text.strip()
    if not stripped:
        return ""
    for reader in (json.loads, _literal):
        try:
            value = reader(stripped)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
        if not isinstance(value, str):
            return value
    if _NUMBER.match(stripped):
        return _number(stripped)
    return _records(stripped) or _items(stripped) or stripped


def _only_text(structured: Any) -> bool:
    """`{"content": "..."}`: structured content that only repeats the text."""
    return isinstance(structured, dict) and list(structured) == ["content"]


def _without_echoed_structure(text: str) -> str:
    """mcprl's result text adds structured content as a JSON line when it differs from the
    text; `{"content": "<the text>"}` adds nothing."""
    head, _, last = text.rpartition("\n")
    if head and last.startswith('{"content":'):
        try:
            if json.loads(last).get("content", "").strip() == head.strip():
                return head
        except (ValueError, AttributeError):
            pass
    return text


def _literal(text: str) -> Any:
    if not text.startswith(("[", "{", "(")):
        raise ValueError("not a literal")
    return ast.literal_eval(text)


def _number(text: str) -> int | float:
    value = float(text)
    return (
        int(value) if value.is_integer() and "." not in text and "e" not in text.lower() else value
    )


def _scalar(text: str) -> Any:
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    return _number(text) if _NUMBER.match(text) else text


def _records(text: str) -> dict[str, Any] | list[dict[str, Any]] | None:
    """`key: value` lines, one record per block (blocks parted by blank lines); a header line
    with nothing after its colon ("Commit history:") is left out."""
    blocks = [b for b in re.split(r"\n\s*\n", text) if b.strip()]
    out: list[dict[str, Any]] = []
    for block in blocks:
        lines = [line for line in block.splitlines() if line.strip()]
        record: dict[str, Any] = {}
        for line in lines:
            m = _KEY_VALUE.match(line)
            if m:
                record[m.group(1).strip()] = _scalar(m.group(2))
            elif not line.rstrip().endswith(":"):
                return None  # prose, not records
        if record:
            out.append(record)
    if not out or sum(len(r) for r in out) < 2:
        return None
    return out[0] if len(out) == 1 else out


def _items(text: str) -> list[Any] | None:
    """Short lines, one item each ("* main", "[FILE] a.txt", "3", …): a list."""
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) < 2 or any(len(line) > 80 or ":" in line for line in lines):
        return None  # a summary line ("Total: 2 files") is no item
    items = [_ITEM_MARK.sub("", line, count=1).strip() for line in lines]
    if any(len(i.split()) > 6 or "  " in i for i in items):
        return None  # sentences, or columns ("notes.txt     41 B")
    return [_scalar(i) for i in items]
