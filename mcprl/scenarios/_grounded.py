"""Schema-grounded scenarios: tasks built from the tools' own schemas, with verified answers.

No LLM is involved. For each task, arguments are sampled from a tool's input schema, the tool is
called on the live server (in a fresh session, as an attempt will be), and the task text is
written from the tool's description and the arguments. Chains feed a value from one result (an
id, a number) into the next call, making multi-step tasks. Every scenario carries its reference
calls with the results the server returned, and an expected answer where one can be read off.

    scenarios = await grounded_scenarios("example:catalog", n=40, seed=0)
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from mcprl.errors import ScenarioGenerationError
from mcprl.mcp import ServerInfo, ToolInfo, inspect_server, open_session
from mcprl.mcp._safety import looks_like_error, name_words, tool_access
from mcprl.scenarios._dedupe import Deduper
from mcprl.scenarios._sampling import (
    SchemaSampler,
    ValuePool,
    _is_id_name,
    harvest,
    listed_name,
    singular,
)
from mcprl.scenarios._types import Reference, ReferenceCall, Scenario, ScenarioSet

__all__ = ["GenerationReport", "build_grounded", "grounded_scenarios"]

logger = logging.getLogger(__name__)

_ANSWER_KEYS = ("value", "result", "count", "total")


@dataclass
class _Step:
    tool: ToolInfo
    arguments: dict[str, Any]
    result_text: str
    link: tuple[str, str] | None = None  # (parameter, how the value was taken from the last step)

    @property
    def result(self) -> Any:
        return harvest(self.result_text)


@dataclass
class _Link:
    param: str
    value: Any
    phrase: str


@dataclass
class GenerationReport:
    """What grounded generation did: what it built, and what it turned down and why."""

    asked: int
    built: int = 0
    attempts: int = 0
    seconds: float = 0.0
    first_calls_failed: int = 0
    rejected: Counter = field(default_factory=Counter)  # reason -> candidates
    skipped_tools: list[str] = field(default_factory=list)  # writing tools left uncalled
    last_error: str | None = None

    def describe(self) -> str:
        parts = [f"built {self.built} of {self.asked} scenarios in {self.attempts} attempts"]
        if self.first_calls_failed:
            parts.append(f"{self.first_calls_failed} first calls failed")
        parts += [f"{n} rejected: {why}" for why, n in self.rejected.most_common()]
        text = "; ".join(parts)
        if self.skipped_tools:
            text += (
                f". Not called, as they may change the server's data: "
                f"{', '.join(self.skipped_tools)} (--allow-writes calls them)"
            )
        return text


def _links(result: Any, tool: ToolInfo) -> list[_Link]:
    """Ways to feed a value from `result` into one of `tool`'s parameters."""
    props = tool.input_schema.get("properties") or {}
    out = []
    for name, prop in props.items():
        kind = prop.get("type")
        if "enum" in prop or (kind is None and "anyOf" in prop):
            continue
        if isinstance(result, (int, float)) and not isinstance(result, bool):
            if kind in ("number", "integer") and name not in ("limit", "n"):
                out.append(_Link(name, result, "the result of the previous step"))
        elif isinstance(result, dict):
            out.extend(_links_from_dict(result, name, kind))
    return out


def _links_from_dict(result: dict, name: str, kind: Any) -> list[_Link]:
    out = []
    lists = [(k, v) for k, v in result.items() if isinstance(v, list) and v]
    for key, items in lists:
        ids = [i.get("id") for i in items if isinstance(i, dict) and "id" in i]
        noun = singular(key)
        if ids and kind == "array" and _is_id_name(name.rstrip("s")):
            out.append(_Link(name, ids, f"the ids of all {key} found in the previous step"))
        elif ids and _is_id_name(name) and kind in ("string", "integer"):
            out.append(_Link(name, ids[0], f"the id of the first {noun} found before"))
        if kind == "string" and _names_a(name, noun):
            first = listed_name(items[0])
            if isinstance(first, str):
                out.append(_Link(name, first, f"the first {noun} listed before"))
    if "id" in result and _is_id_name(name) and kind in ("string", "integer"):
        out.append(_Link(name, result["id"], "the id returned by the previous step"))
    for key in _ANSWER_KEYS:
        value = result.get(key)
        numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
        if numeric and kind in ("number", "integer") and name not in ("limit", "n"):
            out.append(_Link(name, value, f"the {key} from the previous step"))
    return out


def _names_a(param: str, noun: str) -> bool:
    """Whether a parameter takes the name of a `noun` (table, table_name, tableName)."""
    words = name_words(param)
    return words == [noun] or words == [noun, "name"]


def _fmt(value: Any) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    return json.dumps(value)


# asides that name another tool (list_tables), give examples or defaults: not for a user's words
_ASIDE = re.compile(
    r"\s*\((?=[^()]*(?:\b\w+_\w+\b|e\.g\.|i\.e\.|default|optional))[^()]*\)", re.IGNORECASE
)


def _sentence(description: str) -> str:
    """The first sentence of a tool's description, without its asides in parentheses (they
    often name other tools: "a name from list_tables")."""
    first = " ".join(description.split())
    first = first.split(". ")[0].rstrip(".")
    first = _ASIDE.sub("", first).strip()
    return first or "Use the right tool"


def _given(name: str, value: Any) -> str:
    """One argument in words: `a = 15` for one-letter names, else `source timezone "UTC"`."""
    if len(name) == 1:
        return f"{name} = {_fmt(value)}"
    return f"{' '.join(name_words(name))} {_fmt(value)}"


def _listed(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _instruction(step: _Step) -> str:
    parts = [_given(k, v) for k, v in step.arguments.items() if not step.link or k != step.link[0]]
    text = _sentence(step.tool.description)
    if parts:
        text += f", with {_listed(parts)}"
    if step.link:
        param, phrase = step.link
        noun = " ".join(name_words(param))
        text += f", for {phrase}" if noun in phrase else f", using {phrase} as {noun}"
    return text


def _question(result: Any, rng: random.Random) -> tuple[str, str | None]:
    """What to ask about the final result, and the expected answer."""
    if isinstance(result, bool) or result is None:
        return "What was the result?", None
    if isinstance(result, (int, float, str)):
        return "What is the result?", str(result)
    if isinstance(result, dict):
        for key in _ANSWER_KEYS:
            if isinstance(result.get(key), (int, float, str)) and not isinstance(
                result.get(key), bool
            ):
                label = "How many are there?" if key == "count" else f"What is the {key}?"
                return label, str(result[key])
        fields = [
            k
            for k, v in result.items()
            if isinstance(v, (int, float, str)) and not isinstance(v, bool) and not _is_id_name(k)
        ]
        if fields:
            key = rng.choice(fields)
            return f"What is its {' '.join(name_words(key))}?", str(result[key])
    return "What did you find?", None


def _difficulty(steps: list[_Step]) -> int:
    if len(steps) == 1:
        return 2 if len(steps[0].arguments) >= 3 else 1
    distinct = len({s.tool.name for s in steps})
    return min(5, 2 * len(steps) - 1 + (distinct >= 3))


def _task_text(steps: list[_Step], question: str) -> str:
    """The calls as a request: First, …. Then …. Finally …, and the question."""
    if len(steps) == 1:
        return f"{_instruction(steps[0])}. {question}"
    lines = []
    for i, step in enumerate(steps):
        lead = "First, " if i == 0 else ("Finally, " if i == len(steps) - 1 > 1 else "Then ")
        lines.append(lead + _lower_first(_instruction(step)))
    return ". ".join(lines) + f". {question}"


def _lower_first(text: str) -> str:
    """ "Add two numbers" -> "add two numbers"; an acronym ("SQL query") stays."""
    return text[:1].lower() + text[1:] if text[1:2].islower() else text


def _render(steps: list[_Step], rng: random.Random, seed: int) -> Scenario:
    question, answer = _question(steps[-1].result, rng)
    text = _task_text(steps, question)
    numeric = answer is not None and _is_number(answer)
    reference = Reference(
        answer=answer,
        tolerance=1e-3 if numeric else None,
        calls=[
            ReferenceCall(tool=s.tool.name, arguments=s.arguments, result=s.result_text)
            for s in steps
        ],
    )
    digest = hashlib.sha256(f"{seed}:{text}".encode()).hexdigest()[:10]
    tags = ["grounded", *dict.fromkeys(s.tool.name for s in steps)]
    return Scenario(
        id=f"grounded-{digest}",
        task=text,
        difficulty=_difficulty(steps),
        reference=reference,
        tags=tags,
    )


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _failed(result: Any) -> bool:
    """An error, flagged or worded as one: never a reference."""
    return bool(result.is_error or looks_like_error(result.text))


async def _attempt_chain(
    server: Any,
    tools: list[ToolInfo],
    sampler: SchemaSampler,
    rng: random.Random,
    length: int,
    report: GenerationReport,
    session_options: dict[str, Any],
) -> list[_Step]:
    steps: list[_Step] = []
    async with open_session(server, **session_options) as session:
        # A failed call rarely changes state, so the first step may be retried in this session.
        for _ in range(4):
            tool = rng.choice(tools)
            args = sampler.for_tool(tool)
            result = await session.call_tool(tool.name, args)
            if not _failed(result):
                break
            report.last_error = f"{tool.name}({_fmt(args)[:200]}): {result.text[:300]}"
            if not result.is_error:
                report.rejected["an error reported as ordinary text"] += 1
        else:
            return []
        sampler.pool.learn(harvest(result.text))
        steps.append(_Step(tool, args, result.text))
        while len(steps) < length:
            options = [
                (t, link)
                for t in tools
                if t.name != steps[-1].tool.name
                for link in _links(steps[-1].result, t)
            ]
            if not options:
                break
            tool, link = rng.choice(options)
            args = sampler.for_tool(tool, fixed={link.param: link.value})
            result = await session.call_tool(tool.name, args)
            if _failed(result):
                if not result.is_error:
                    report.rejected["an error reported as ordinary text"] += 1
                break
            sampler.pool.learn(harvest(result.text))
            steps.append(_Step(tool, args, result.text, link=(link.param, link.phrase)))
    return steps


async def _stable(server: Any, steps: list[_Step], session_options: dict[str, Any]) -> bool:
    """Whether the calls give the same results again in a fresh session (a reference that
    holds the current time or a fresh id would mark every later attempt wrong)."""
    async with open_session(server, **session_options) as session:
        for step in steps:
            result = await session.call_tool(step.tool.name, step.arguments)
            if result.is_error or result.text != step.result_text:
                return False
    return True


async def _warm_up(
    server: Any, tools: list[ToolInfo], sampler: SchemaSampler, session_options: dict[str, Any]
) -> None:
    """Call every tool a few times to learn what values the server deals in."""
    async with open_session(server, **session_options) as session:
        for _ in range(3):
            for tool in tools:
                args = sampler.for_tool(tool)
                result = await session.call_tool(tool.name, args)
                if not _failed(result):
                    sampler.pool.learn(harvest(result.text))


def _checkable(scenario: Scenario) -> bool:
    """Answers a person could check: no astronomically large numbers."""
    answer = scenario.reference.answer if scenario.reference else None
    return answer is None or not _is_number(answer) or abs(float(answer)) < 1e9


async def grounded_scenarios(server: Any, n: int = 24, **options: Any) -> ScenarioSet:
    """The scenarios of `build_grounded` (same options), with what was turned down logged."""
    scenarios, report = await build_grounded(server, n, **options)
    if report.built < n:
        logger.warning("%s", report.describe())
    return scenarios


async def build_grounded(
    server: Any,
    n: int = 24,
    *,
    seed: int = 0,
    chain_fraction: float = 0.5,
    max_steps: int = 3,
    max_attempts: int | None = None,
    info: ServerInfo | None = None,
    allow_writes: bool = False,
    progress: bool = False,
    **session_options: Any,
) -> tuple[ScenarioSet, GenerationReport]:
    """Build up to `n` distinct scenarios with verified references from a live server.

    Only tools that read (`mcprl.mcp.tool_access`) are called unless `allow_writes`. A result
    that is an error (flagged, or worded as one) never becomes a reference, and a scenario whose
    calls give other results in a fresh session (the time, a new id) is dropped. Returns what
    was built, even when short of `n`, with a report of what was turned down; raises
    `ScenarioGenerationError` only when nothing could be built.
    """
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    started = time.perf_counter()
    info = info or await inspect_server(server, **session_options)
    report = GenerationReport(asked=n)
    tools = info.tools
    if not allow_writes:
        report.skipped_tools = [t.name for t in tools if tool_access(t)[0] == "write"]
        tools = [t for t in tools if t.name not in report.skipped_tools]
        if not tools:
            names = ", ".join(report.skipped_tools)
            raise ScenarioGenerationError(
                f"every tool of {info.name!r} may change its data ({names}), so none was "
                "called; pass --allow-writes (allow_writes=True) to call them, against a "
                "disposable copy of the server's data"
            )
    rng = random.Random(seed)
    sampler = SchemaSampler(rng, ValuePool.from_server(info))
    deduper = Deduper(threshold=0.95)
    await _warm_up(server, tools, sampler, session_options)
    out: list[Scenario] = []
    budget = max_attempts if max_attempts is not None else 12 * n
    give_up = max(24, 2 * n)  # attempts without one working first call: the sampler cannot help
    since_new = 0  # attempts since the last scenario kept: the server has no new ones to give
    bar = _bar(n, info.name, progress)
    try:
        for _ in range(budget):
            report.attempts += 1
            since_new += 1
            if out and since_new > give_up:
                break
            if bar is not None:
                bar.set_postfix_str(_postfix(report), refresh=True)
            length = 1 if rng.random() >= chain_fraction else rng.randint(2, max_steps)
            steps = await _attempt_chain(
                server, tools, sampler, rng, length, report, session_options
            )
            if not steps:
                report.first_calls_failed += 1
                if not out and report.first_calls_failed >= give_up:
                    break
                continue
            if length > 1 and len(steps) == 1 and rng.random() < 0.5:
                continue  # a chain that could not continue; keep some as single steps
            scenario = _render(steps, rng, seed)
            if not _checkable(scenario):
                report.rejected["an answer no one could check"] += 1
            elif not deduper.add(scenario.task):
                report.rejected["a duplicate"] += 1
            elif not await _stable(server, steps, session_options):
                report.rejected["results that change between sessions (time, random ids)"] += 1
            else:
                out.append(scenario)
                since_new = 0
                if bar is not None:
                    bar.update(1)
                if len(out) == n:
                    break
    finally:
        if bar is not None:
            bar.close()
    report.built = len(out)
    report.seconds = time.perf_counter() - started
    if not out:
        example = f" The last failure: {report.last_error}." if report.last_error else ""
        raise ScenarioGenerationError(
            f"{report.describe()}.{example} The server may need arguments this sampler cannot "
            "guess: use an LLM generator (--generator), or write scenarios by hand"
        )
    return ScenarioSet(out), report


def _bar(n: int, name: str, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(
        total=n,
        desc=f"scenarios for {name}",
        leave=False,
        bar_format="{desc}: {n}/{total} |{bar}| [{elapsed}{postfix}]",
    )


def _postfix(report: GenerationReport) -> str:
    turned_down = sum(report.rejected.values())
    return f"{report.attempts} tried, {report.first_calls_failed} failed, {turned_down} rejected"
