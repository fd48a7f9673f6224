"""Checking an LLM's proposed task on the live server: run the calls it expects, take the answer
from the result.

    reference, why = await verify_proposal(server, info, task, calls, answer_from)

A proposal is verified when each call names a tool of the server that reads (or any tool, with
`allow_writes`) and is no meta tool, every call succeeds, the same calls give the same results in
a second fresh session, nothing in them is secret, and the last result holds a value that answers
the task: the result itself, the field `answer_from` names, or the count of its records for
`answer_from="count"`. The reference carries the calls with the results the server returned.
Otherwise `why` says what failed, and the task is kept without a reference (RULER scores it).
"""

from __future__ import annotations

from typing import Any

from mcprl.mcp import ServerInfo, looks_like_error, name_words, open_session, tool_access
from mcprl.scenarios._answers import computed_number, is_number, number_answer
from mcprl.scenarios._parse import parse_result
from mcprl.scenarios._screen import answer_problem, is_meta_tool, leaks_secret
from mcprl.scenarios._types import Reference, ReferenceCall, check_named_arguments

__all__ = ["verify_proposal"]


def _check_tools(info: ServerInfo, calls: list[dict[str, Any]], allow_writes: bool) -> str | None:
    names = {t.name: t for t in info.tools}
    for call in calls:
        tool = names.get(call.get("tool", ""))
        if tool is None:
            return f"a call names no tool of the server ({call.get('tool')!r})"
        if is_meta_tool(tool):
            return f"{tool.name} is a meta tool (a log, an echo, a demo)"
        if not allow_writes and tool_access(tool)[0] == "write":
            return f"{tool.name} may change the server's data (`allow_writes=True` calls it)"
        if not isinstance(call.get("arguments", {}), dict):
            return f"the arguments of {tool.name} are not an object"
    return None


async def _run(server: Any, calls: list[dict[str, Any]], options: dict[str, Any]) -> list[Any]:
    async with open_session(server, **options) as session:
        return [await session.call_tool(c["tool"], c.get("arguments") or {}) for c in calls]


def _field(data: Any, hint: str) -> Any:
    """The one value under a key that `hint` names, anywhere in the result."""
    wanted = name_words(hint)
    found: list[Any] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                if name_words(str(k)) == wanted and isinstance(v, (str, int, float, bool)):
                    found.append(v)
                else:
                    walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    walk(data)
    return found[0] if len(set(map(str, found))) == 1 else None


def _record_named(data: Any, task: str) -> dict[str, Any] | None:
    """The one record of a listing that the task names by one of its values."""
    said = task.lower()
    found = []

    def walk(value: Any) -> None:
        if isinstance(value, list):
            for v in value:
                if isinstance(v, dict) and any(
                    isinstance(x, str) and len(x) > 2 and x.lower() in said for x in v.values()
                ):
                    found.append(v)
                walk(v)
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)

    walk(data)
    return found[0] if len(found) == 1 else None


def answer_from_result(
    data: Any, hint: str | None, arguments: list[Any], task: str = ""
) -> str | None:
    """The answer a result holds (see the module docstring), as text; None where it holds none
    or more than one. Of a listing, `hint` reads the field of the record the task names."""
    if hint and hint.strip().lower() in ("count", "number", "how many"):
        items = data if isinstance(data, list) else None
        if isinstance(data, dict):
            lists = [v for v in data.values() if isinstance(v, list)]
            items = lists[0] if len(lists) == 1 else None
        return str(len(items)) if items is not None else None
    if hint and not isinstance(data, (str, int, float)):
        value = _field(data, hint)
        named = _record_named(data, task) if value is None else None
        if named is not None:
            value = _field(named, hint)
        if value is None:
            return None
        if isinstance(value, bool):
            return "yes" if value else "no"
        return number_answer(float(value)) if is_number(value) else str(value)
    number = computed_number(data, arguments)
    if number is not None:
        return number_answer(number)
    if isinstance(data, str) and len(data) <= 60 and "\n" not in data:
        return data.strip()
    return None


async def verify_proposal(
    server: Any,
    info: ServerInfo,
    task: str,
    calls: list[dict[str, Any]],
    answer_from: str | None = None,
    *,
    allow_writes: bool = False,
    paths: tuple[str, ...] = (),
    **session_options: Any,
) -> tuple[Reference | None, str]:
    """A verified reference for the proposal, or None and why not (module docstring)."""
    if not calls:
        return None, "no calls were proposed"
    problem = _check_tools(info, calls, allow_writes)
    if problem:
        return None, problem
    first = await _run(server, calls, session_options)
    for call, result in zip(calls, first, strict=True):
        if result.is_error or looks_like_error(result.text):
            return None, f"{call['tool']} failed: {result.text[:120]}"
        if leaks_secret(result.text, paths):
            return None, f"{call['tool']} returned the environment, a secret or a path"
    again = await _run(server, calls, session_options)
    if [r.text for r in again] != [r.text for r in first]:
        return None, "the results change between sessions"
    arguments = [v for c in calls for v in (c.get("arguments") or {}).values()]
    data = parse_result(first[-1].text, first[-1].structured)
    answer = answer_from_result(data, answer_from, arguments, task)
    if answer is None:
        return None, "the last result holds no single answer"
    why = answer_problem(answer, task, arguments)
    if why:
        return None, f"the answer would be {why}"
    writes = {t.name for t in info.tools if tool_access(t)[0] == "write"}
    reference = Reference(
        answer=answer,
        calls=[
            ReferenceCall(tool=c["tool"], arguments=c.get("arguments") or {}, result=r.text)
            for c, r in zip(calls, first, strict=True)
        ],
    )
    return check_named_arguments(reference, task, writes), ""
