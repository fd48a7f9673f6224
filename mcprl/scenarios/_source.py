"""Which scenarios a run trains on when no file is given: `scenarios_for(server, info)`.

In order: the curated set of an `example:` server (unless a generator is named); scenarios
written by an LLM (`generator`, or a configured provider, see `mcprl._defaults`); else grounded
scenarios built from the tool schemas and checked on the live server. The set comes back split
into train and val.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from mcprl._defaults import configured_llm
from mcprl.mcp import writing_tools
from mcprl.scenarios._grounded import build_grounded
from mcprl.scenarios._llm import generate_scenarios
from mcprl.scenarios._types import Scenario, ScenarioSet, bundled_scenarios

__all__ = ["grounded_with_notes", "hidden_writers", "scenario_count", "scenarios_for"]

logger = logging.getLogger(__name__)

PER_TOOL = 3  # two to train on and one held out, per tool a task may call
MIN_SCENARIOS = 24
MAX_SCENARIOS = 96


def scenario_count(tools: Iterable[Any], allow_writes: bool = False) -> int:
    """How many scenarios to write for a server when none is asked: `PER_TOOL` per tool a task
    may call (not one that may change the server's data, unless `allow_writes`), from
    `MIN_SCENARIOS` to `MAX_SCENARIOS`. At a flat 24, unit-converter-mcp's 16 tools got 0-3
    tasks each and val held 6 tasks, too few to measure by (training seed 1: +13.9 points); at
    48 every tool is practised and val holds 12 (+29.2 and +30.6 on seeds 0 and 1). On tasks
    neither count trained on, the two teach the same (RESULTS.md, L140-L141)."""
    tools = list(tools)
    callable_ = len(tools) - (0 if allow_writes else len(writing_tools(tools)))
    return min(MAX_SCENARIOS, max(MIN_SCENARIOS, PER_TOOL * callable_))


def hidden_writers(
    tools: Iterable[Any], scenarios: Iterable[Scenario], allow_writes: bool = False
) -> list[str]:
    """The tools an agent practising `scenarios` is not offered: those that may change the
    server's data (`mcprl.mcp.writing_tools`) and that no scenario's reference calls, unless
    `allow_writes`. A writing tool some reference calls is one the set's author asked for; the
    others would only let a model in training change someone's data, and crowd its choices.
    Decided over the whole set (train and val alike), so training and evaluation offer the
    same tools."""
    if allow_writes:
        return []
    called = {c.tool for s in scenarios if s.reference is not None for c in s.reference.calls}
    return [t.name for t in writing_tools(list(tools)) if t.name not in called]


async def grounded_with_notes(
    server: Any,
    n: int,
    *,
    seed: int = 0,
    info: Any = None,
    allow_writes: bool = False,
    fresh_sessions: bool = False,
    say: Callable[[str], None] | None = None,
    progress: bool = True,
) -> ScenarioSet:
    """`build_grounded`, saying what was turned down and why, and when fewer than `n` were
    built."""
    say = say or logger.info
    writers = [t.name for t in writing_tools(info.tools)] if info is not None else []
    if allow_writes and writers:
        say(
            f"  calling tools that may change the server's data ({', '.join(writers)}): run "
            "this against a disposable copy of it"
        )
    scenarios, report = await build_grounded(
        server, n, seed=seed, info=info, allow_writes=allow_writes,
        fresh_sessions=fresh_sessions, progress=progress,
    )  # fmt: skip
    if report.skipped_tools or report.unfillable_tools or report.built < n or report.rejected:
        say(f"  {report.describe()}")
    if report.built < n:
        say(f"  warning: kept the {report.built} scenarios built, fewer than the {n} asked")
    return scenarios


async def scenarios_for(
    server: Any,
    info: Any,
    *,
    n: int | None = None,
    generator: str | None = None,
    seed: int = 0,
    allow_writes: bool = False,
    fresh_sessions: bool = False,
    val_fraction: float = 0.25,
    say: Callable[[str], None] | None = None,
    progress: bool = True,
) -> ScenarioSet:
    """The scenarios of the module docstring, for `server` as `info` (`inspect_server`) lists it:
    `n` of them, or `scenario_count` of its tools when None."""
    say = say or logger.info
    bundled = bundled_scenarios(server)
    if bundled is not None and not generator:
        say(f"  using the curated scenarios for {server} ({bundled})")
        return ScenarioSet.load(bundled)
    if n is None:
        n = scenario_count(info.tools, allow_writes)
    generator = generator or configured_llm()
    if generator is not None:
        say(f"  writing {n} scenarios with {generator} …")
        made = await generate_scenarios(
            info.tools, info.resources, n=n, generator=generator, seed=seed,
            server=server, allow_writes=allow_writes,
        )  # fmt: skip
        verified = sum("verified" in s.tags for s in made)
        say(f"  {verified} verified on the server; {len(made) - verified} without a reference")
    else:
        say(f"  no LLM configured: building {n} grounded scenarios on the server …")
        made = await grounded_with_notes(
            server, n, seed=seed, info=info, allow_writes=allow_writes,
            fresh_sessions=fresh_sessions, say=say, progress=progress,
        )  # fmt: skip
    return made.with_split(val_fraction, seed=seed)
