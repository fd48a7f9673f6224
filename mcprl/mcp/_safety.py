"""Which tools may change a server's data, and which results are errors in disguise.

`tool_access(tool)` says whether a tool only reads ("read") or may write ("write"), and why:

1. MCP tool annotations decide where present: `readOnlyHint: true` reads; `readOnlyHint: false`
   or `destructiveHint: true` writes.
2. Without annotations, a conservative reading of the name: a writing verb anywhere in it
   (create, delete, update, add_…, execute, …) writes; a reading verb first (get, list, search,
   read, count, …) reads; anything else is treated as writing, because nothing says it is safe.

`looks_like_error(text)` recognises results that report a failure in ordinary text (servers that
never set the error flag: "Database error: …", "Error: Invalid format …", a traceback), so that
they are never kept as reference answers. It is deliberately narrow: it looks at how the text
starts, and at a few unmistakable phrases.
"""

from __future__ import annotations

import re
from typing import Literal

from mcprl.mcp._inspect import ToolInfo

__all__ = ["looks_like_error", "tool_access", "writing_tools"]

_WRITE = {
    "add", "append", "apply", "archive", "assign", "cancel", "clear", "close", "commit",
    "create", "delete", "deploy", "destroy", "disable", "drop", "edit", "enable", "exec",
    "execute", "import", "insert", "install", "kill", "merge", "modify", "move", "patch",
    "post", "publish", "push", "put", "remove", "rename", "replace", "reset", "restore", "run",
    "save", "send", "set", "start", "stop", "submit", "truncate", "update", "upload", "upsert",
    "write",
}  # fmt: skip
_READ = {
    "calc", "calculate", "check", "compare", "compute", "convert", "count", "describe", "diff",
    "estimate", "explain", "fetch", "find", "get", "inspect", "list", "lookup", "parse",
    "preview", "query", "read", "resolve", "search", "show", "stat", "stats", "status",
    "summarize", "validate", "view",
}  # fmt: skip
# "query" reads only as a first word with no writing verb anywhere (query_users, not a free SQL
# tool named "query" that would run anything: that one has an "sql"/"statement" argument)
_FREE_TEXT_COMMANDS = {"sql", "statement", "command", "cmd", "script", "code"}


def name_words(name: str) -> list[str]:
    """The lower-case words of a name: tableName, table_name: table, name."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return [w for w in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if w]


def tool_access(tool: ToolInfo) -> tuple[Literal["read", "write"], str]:
    """("read" | "write", the reason), as in the module docstring."""
    notes = tool.annotations
    if notes.get("readOnlyHint") is True:
        return "read", "annotated read-only"
    if notes.get("readOnlyHint") is False or notes.get("destructiveHint") is True:
        return "write", "annotated as changing data"
    words = name_words(tool.name)
    writing = sorted(set(words) & _WRITE)
    if writing:
        return "write", f"its name says it writes ({writing[0]})"
    params = set((tool.input_schema.get("properties") or {}).keys())
    if params & _FREE_TEXT_COMMANDS:
        return "write", "it runs a free-text command, which may write"
    if words and words[0] in _READ:
        return "read", f"its name says it reads ({words[0]})"
    return "write", "no annotation, and its name does not say it only reads"


def writing_tools(tools: list[ToolInfo]) -> list[ToolInfo]:
    """The tools that may change the server's data (by `tool_access`)."""
    return [t for t in tools if tool_access(t)[0] == "write"]


_ERROR_START = re.compile(
    r"""^\s*(?:
        error(?:\s*[:!(\-]|\s+\d|\s*$) | errors?: | exception\s*[:(] | traceback\b |
        fatal\b | failed(?:\s+to\b|\s*:) | failure\s*: |
        invalid\b | unknown\s+(?:tool|command|table|column|field|argument|parameter)\b |
        could\s+not\b | couldn't\b | cannot\b | can't\b | unable\s+to\b | not\s+found\b |
        no\s+such\b | permission\s+denied\b | access\s+denied\b | unauthori[sz]ed\b |
        forbidden\b | bad\s+request\b | \w+(?:\s\w+)?\s+error\s*[:!.-]
    )""",
    re.IGNORECASE | re.VERBOSE,
)
_ERROR_ANYWHERE = re.compile(
    r"Traceback \(most recent call last\)|\b(?:Parser|Syntax|Binder|Catalog|Runtime|Value|Type|"
    r"Key|Attribute|Database|Internal Server)\s?Error\b|\bHTTP (?:4|5)\d\d\b",
)


def looks_like_error(text: str) -> bool:
    """Whether a tool result reads as a failure report (see the module docstring)."""
    if not text or not text.strip():
        return False
    head = text.strip()[:400]
    if head.startswith(("{", "[")) and '"error"' in head[:40].lower():
        return True  # {"error": "..."}
    return bool(_ERROR_START.match(head) or _ERROR_ANYWHERE.search(head))
