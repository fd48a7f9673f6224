"""What never becomes practice material: meta tools, secrets, and answers no one should ask for.

- `is_meta_tool(tool)`: call logs, echoes, debug and demo tools, environment dumps, toggles,
  resets, server info, images: tools that tell about the server or the session, not about the
  user's data. Read by name and description; `grounded` also drops tools whose result changes
  when the same call is repeated in one session (a log or a counter of its own calls).
- `leaks_secret(text)`: the environment (a `NAME=value` dump, a variable's value), a credential
  or token, or a path under the user's home that the user did not give the server. Such text
  is never a task, an answer or an argument, and a result that holds it is never kept.
- `undescribed_arguments(tool)`: required arguments that take objects whose fields the schema
  does not name (`{"type": "object"}` alone, or an array of them). Nothing a user would say can
  be drawn for them: a sampler fills them with `{}`, and the task reads "For requests [{}], ...".
- `answer_problem(answer, task, arguments)`: why a value makes a poor answer (an echo of the
  task's words or arguments, a dump, a timestamp, a random id), or None.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from mcprl.mcp import ServerSpec, ToolInfo, name_words

__all__ = [
    "answer_problem",
    "is_meta_tool",
    "leaks_secret",
    "server_paths",
    "undescribed_arguments",
]

_META_NAME_WORDS = {
    "echo", "debug", "logging", "ping", "health", "healthcheck", "version", "env",
    "environment", "toggle", "trigger", "simulate", "simulated", "demo", "sample", "tiny",
    "image", "annotated", "roots", "allowed", "config", "configuration", "reset", "sleep",
    "wait", "whoami", "server", "capabilities", "notification", "notifications", "elicitation",
    "sampling", "gzip", "resource", "resources",
}  # fmt: skip
# "notifications" is a user's data in a task tracker; only as the whole name is it a meta tool
_META_ALONE = {"notification", "notifications", "server", "resource", "resources"}
_META_DESCRIPTION = re.compile(
    r"\b(?:echo(?:es|ed)?\s+back|for\s+debugging|debug(?:ging)?\s+(?:tool|info)|"
    r"demonstrates?|simulat(?:es|ed|ion)|for\s+testing|test\s+tool|environment\s+variables|"
    r"call\s+log|log\s+of\s+(?:calls|requests)|long[\s-]running\s+operation|"
    r"server\s+(?:info|information|version|status)|allowed\s+to\s+access|"
    r"(?:tiny|sample)\s+(?:\w+\s+)?image|resource\s+(?:links?|reference))\b",
    re.IGNORECASE,
)


def undescribed_arguments(tool: ToolInfo) -> list[str]:
    """The required arguments of `tool` that take objects with no named fields (or arrays of
    them), and no example to copy: arguments no practice task can give a value a user would."""
    schema = tool.input_schema or {}
    defs = schema.get("$defs", schema.get("definitions", {})) or {}

    def resolve(prop: Any) -> dict:
        prop = prop if isinstance(prop, dict) else {}
        ref = prop.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/"):
            return defs.get(ref.rsplit("/", 1)[-1], {}) or {}
        return prop

    def undescribed(prop: Any) -> bool:
        prop = resolve(prop)
        if prop.get("examples") or "enum" in prop or "const" in prop or "default" in prop:
            return False
        options = prop.get("anyOf") or prop.get("oneOf")
        if options:
            real = [o for o in options if resolve(o).get("type") != "null"]
            return bool(real) and all(undescribed(o) for o in real)
        kind = prop.get("type")
        if kind == "array":
            return undescribed(prop.get("items") or {})
        return kind == "object" and not prop.get("properties")

    props = schema.get("properties") or {}
    return [name for name in schema.get("required", []) if undescribed(props.get(name, {}))]


# a log is data (git's commit log) unless it logs calls or requests
_META_PAIRS = [{"call", "log"}, {"call", "logs"}, {"request", "log"}, {"request", "logs"}]


def is_meta_tool(tool: ToolInfo) -> bool:
    """Whether the tool tells about the server or session rather than the user's data."""
    words = name_words(tool.name)
    if any(pair <= set(words) for pair in _META_PAIRS):
        return True
    hits = set(words) & _META_NAME_WORDS
    if hits and not (hits <= _META_ALONE and len(words) > 1):
        return True
    return bool(_META_DESCRIPTION.search(tool.description or ""))


_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|AUTH|CREDENTIAL|COOKIE|SESSION|PRIVATE", re.I)
_CREDENTIAL = re.compile(
    r"\bsk-[A-Za-z0-9_-]{16,}|\bgh[pousr]_[A-Za-z0-9]{20,}|\bxox[abprs]-[A-Za-z0-9-]{10,}|"
    r"\bAKIA[0-9A-Z]{16}\b|\beyJ[\w-]{8,}\.[\w-]{8,}|\bBearer\s+[\w.~+/-]{12,}|"
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----|"
    r"(?i:\b(?:api[_-]?key|secret|password|passwd|access[_-]?token)\b\s*[:=]\s*\S{4,})"
)
_ENV_LINE = re.compile(r'^\s*"?[A-Z][A-Z0-9_]{1,40}"?\s*[=:]\s*', re.MULTILINE)
_ENV_NAMES = {"PATH", "HOME", "USER", "SHELL", "PWD", "LANG", "TERM", "HOSTNAME"}


def _secret_values() -> list[str]:
    """Values of this process's environment that must not leave the machine."""
    out = []
    for name, value in os.environ.items():
        if len(value) < 4:
            continue
        if _SECRET_NAME.search(name) or (name == "PATH" and os.pathsep in value):
            out.append(value)
    return out


def leaks_secret(text: Any, allowed_paths: Iterable[str] = ()) -> bool:
    """Whether `text` holds what the module docstring says never leaves the machine."""
    if not isinstance(text, str):
        text = str(text)
    if not text:
        return False
    if _CREDENTIAL.search(text):
        return True
    if any(value in text for value in _secret_values()):
        return True
    env_lines = _ENV_LINE.findall(text)
    names = set(re.findall(r'\b([A-Z][A-Z0-9_]{1,40})"?\s*[=:]', text))
    if len(env_lines) >= 3 and names & _ENV_NAMES:
        return True  # an environment dump
    home = str(Path.home())
    if home not in ("/", "") and home in text:
        allowed = [p for p in allowed_paths if p.startswith(home)]
        rest = text
        for p in sorted(allowed, key=len, reverse=True):
            rest = rest.replace(p, "")
        return home in rest
    return False


_TIMESTAMP = re.compile(
    r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}|\b\d{1,2}:\d{2}:\d{2}\b|"
    r"\b(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)\w* \w{3} \d{1,2} \d{4} \d{2}:\d{2}"
)
_RANDOM_ID = re.compile(
    r"^(?:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{16,}|"
    r"[A-Za-z0-9_-]{24,})$",
    re.IGNORECASE,
)


def _norm(text: str) -> str:
    return " ".join(str(text).lower().split())


def answer_problem(answer: Any, task: str, arguments: Iterable[Any] = ()) -> str | None:
    """Why `answer` would make a poor reference for `task` (module docstring), or None."""
    if answer is None or isinstance(answer, (dict, list)):
        return "not a single value"
    text = str(answer).strip()
    if not text:
        return "empty"
    if len(text) > 60 or "\n" in text or text.startswith(("{", "[")):
        return "a dump, not a value"
    if _TIMESTAMP.search(text):
        return "a timestamp"
    if _RANDOM_ID.match(text) and not text.isalpha():
        return "a random id"
    if leaks_secret(text):
        return "a secret or a path on this machine"
    said = _norm(task)
    if not isinstance(answer, bool) and re.search(
        rf"(?<![\w.]){re.escape(_norm(text))}(?![\w])", said
    ):
        return "an echo of the task's words"
    if any(_norm(text) == _norm(a) for a in arguments if isinstance(a, (str, int, float))):
        return "an echo of the arguments"
    return None


def server_paths(server: Any) -> tuple[str, ...]:
    """Paths the user gave the server (its command line, its environment): a task may name
    them; other paths on this machine never appear in a task."""
    try:
        spec = ServerSpec.parse(server)
    except Exception:  # an in-process server or a spec this cannot read: no paths given
        return ()
    values = [*spec.command[1:], *(spec.env or {}).values()]
    return tuple(v for v in values if isinstance(v, str) and v.startswith("/"))
