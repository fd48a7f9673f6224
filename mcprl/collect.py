"""Collecting rollouts and their rewards: what the training loop's phases and `mcprl eval`
share.

    groups = await collect_groups(model, scenarios, server, RolloutConfig(), attempts=2, seed=0)
    groups = await score_groups(groups, scorer(...))   # or rewards.as_scorer(your_reward)
    metrics = summarize(groups, scenarios)   # reward, success, completed, turns, tool_errors

Attempt seeds are fixed by (seed, scenario position, attempt), so two models or two checkpoints
collected with the same seed meet the same sampling noise: in float32 their difference is the
policy's; in bfloat16 the rows that happen to share a batch also move the rounding a little
(docs/serving.md, "Reproducible attempts").
`success` is the share of attempts whose answer (or calls) match the scenario's reference; it is
left out where no scenario has one.
"""

from __future__ import annotations

import contextlib
import math
import statistics
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import anyio

from mcprl._progress import progress_bar
from mcprl.gather import AfterEach, gather_groups
from mcprl.mcp import MCPSession, ServerSpec, open_session, tool_info, writing_tools
from mcprl.policy import Policy, policy_client
from mcprl.rewards import is_success, polarity
from mcprl.rollout import RolloutConfig, rollout, sampler
from mcprl.scenarios import Scenario, has_reference
from mcprl.types import TrajectoryGroup

__all__ = [
    "SEED_STRIDE",
    "by_chain_length",
    "chain_length",
    "collect_groups",
    "has_reference",
    "mark_success",
    "score_groups",
    "summarize",
]

# seeds of attempt a at scenario i are spaced so that per-turn seeds (seed + turn) never meet
SEED_STRIDE = 1000


async def collect_groups(
    model: Policy,
    scenarios: Sequence[Scenario],
    server: Any,
    config: RolloutConfig,
    *,
    attempts: int,
    seed: int,
    max_concurrency: int = 8,
    max_exceptions: int | float = 0.25,
    desc: str = "rollouts",
    progress: bool = True,
    starts: Sequence[Sequence[dict[str, Any]]] | None = None,
    after_each: AfterEach | None = None,
    reserve: Sequence[Scenario] = (),
    replace: Callable[[TrajectoryGroup | None], bool] | None = None,
) -> list[TrajectoryGroup]:
    """`attempts` rollouts of each scenario by `model`, grouped by scenario, in order.
    `starts[i]`: how scenario i's first attempts start, one each, as `RolloutConfig` settings
    (`{"first_tool": "add"}`: it must call `add` first; `{"guided_calls": 2}`: the reference's
    first two calls are made for it); the other attempts start as `config` says.

    `after_each` scores each group as it finishes (see `gather_groups`). `reserve`: scenarios
    that start one at a time, in order, each when `replace` says so of a finished group (given
    what `after_each` returned: None when it dropped the group), beside the groups still
    running. The k-th of them is the scenario at index `len(scenarios) + k` for its seeds and
    `starts`, whichever group it replaces, so what each attempt draws does not depend on which
    group finished first."""
    async with policy_client(model) as client, attempt_server(server, config) as server:

        def attempt(scenario: Scenario, i: int, a: int) -> Callable[[], Any]:
            update: dict[str, Any] = {"seed": seed + (i * attempts + a) * SEED_STRIDE}
            start = starts[i] if starts else ()
            if a < len(start):
                update |= start[a]
            cfg = config.model_copy(update=update)
            return lambda: rollout(model, scenario, server, cfg, client=client)

        def group(scenario: Scenario, i: int) -> TrajectoryGroup:
            return TrajectoryGroup(
                [attempt(scenario, i, a) for a in range(attempts)], scenario_id=scenario.id
            )

        waiting = list(reserve)

        def more(result: TrajectoryGroup | None) -> TrajectoryGroup | None:
            if not waiting or replace is None or not replace(result):
                return None
            index = len(scenarios) + len(reserve) - len(waiting)
            return group(waiting.pop(0), index)

        return await gather_groups(
            [group(s, i) for i, s in enumerate(scenarios)],
            max_concurrency=max_concurrency,
            max_exceptions=max_exceptions,
            after_each=after_each,
            desc=desc,
            progress=progress,
            more=more,
        )


# The tools that may write of servers (by spec) seen to have one, so that later collections do
# not start a process only to list the tools again.
_WRITERS: dict[str, frozenset[str]] = {}


def _server_key(server: Any) -> str | None:
    if isinstance(server, (str, ServerSpec)):
        return ServerSpec.parse(server).model_dump_json()
    return None  # an in-process server object: listing its tools starts nothing


@contextlib.asynccontextmanager
async def attempt_server(server: Any, config: RolloutConfig) -> AsyncIterator[Any]:
    """What each attempt connects to: one session that all share, where every tool the agent
    is offered only reads (nothing an attempt does can change what another sees, and no process
    starts per attempt: a tool in `config.hidden_tools` is never called); otherwise the server
    itself, a fresh session per attempt.

    A tool reads by `mcprl.mcp.tool_access`, the judgement that also decides which tools the
    scenario generator may call: its annotations where it has them, else a conservative reading
    of its name. Starting a process per attempt is not free: a FastMCP server took 1.1-1.5 s of
    CPU to start here, 15 s of every 80-second units rollout phase (benchmarks/RESULTS.md)."""
    key = _server_key(server)
    hidden = set(config.hidden_tools)
    if (
        server is None
        or config.share_session == "never"
        or isinstance(server, MCPSession)
        or (key in _WRITERS and _WRITERS[key] - hidden)
    ):
        yield server
        return
    async with open_session(
        server,
        max_result_chars=config.max_result_chars,
        elicitation=config.elicitation,
        sampling=sampler(config),
    ) as session:
        tools = [tool_info(t) for t in await session.list_tools()]
        writers = frozenset(t.name for t in writing_tools(tools))
        if any(t.name not in hidden for t in tools) and not writers - hidden:
            yield session
            return
    if key is not None and writers:  # the next collection goes straight to a session per attempt
        _WRITERS[key] = writers
    yield server


async def score_groups(
    groups: list[TrajectoryGroup],
    score: Callable[[TrajectoryGroup], Any],
    *,
    desc: str = "judging",
    progress: bool = True,
) -> list[TrajectoryGroup]:
    """Apply a `mcprl.rewards.scorer` to every group at once (a judge's own concurrency limit
    applies; a local judge's requests share the engine's batch), dropping what it drops; the
    groups stay in order."""
    results: list[TrajectoryGroup | None] = [None] * len(groups)
    errors: list[Exception] = []
    with progress_bar(total=len(groups), desc=desc, enabled=progress, leave=False) as bar:

        async def one(i: int) -> None:
            try:
                results[i] = await score(groups[i])
            except Exception as exc:  # raised as itself below, not in an exception group
                errors.append(exc)
            bar.update()

        async with anyio.create_task_group() as tg:
            for i in range(len(groups)):
                tg.start_soon(one, i)
    if errors:
        raise errors[0]
    return [g for g in results if g is not None]


def mark_success(groups: list[TrajectoryGroup], scenarios: dict[str, Scenario]) -> None:
    """Set `metrics["success"]` on attempts at scenarios with a reference, once per attempt:
    from the answer check the reference reward already made where it did, else checked here."""
    for g in groups:
        scenario = scenarios.get(g.scenario_id or "")
        if not has_reference(scenario):
            continue
        checks_answer = scenario.reference.answer is not None
        for t in g.trajectories:
            if "success" in t.metrics:
                continue
            answered = t.metrics.get("reward_answer") if checks_answer else None
            success = answered >= 1.0 if answered is not None else is_success(t, scenario)
            t.metrics["success"] = float(success)


# per-attempt metrics averaged by `summarize`, where present
_MEANS = (
    "completed",
    "turns",
    "tool_calls",
    "tool_errors",
    "reward_ruler",
    "judged_success",
    "judge_agreement",
    "reward_answer",
    "reward_calls",
    "reward_reported",
    "repeated_calls",
    "repeats_retried",
    "guessed_answer",
    "stock_answer",
)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def summarize(
    groups: list[TrajectoryGroup], scenarios: Sequence[Scenario] | dict[str, Scenario]
) -> dict[str, float]:
    """Means over all attempts: reward, success (where references exist), turns, errors; and
    the counts behind the success rate (`successes` of `checked_attempts`). Where the training
    loop started some of them (`Trajectory.helped`: explored, demonstrated, guided), also the
    policy's own: `own_successes` of `own_attempts` (a step's success can be all the loop's)."""
    by_id = scenarios if isinstance(scenarios, dict) else {s.id: s for s in scenarios}
    mark_success(groups, by_id)
    attempts = [t for g in groups for t in g.trajectories]
    rewards = [t.reward for t in attempts if t.reward is not None]
    out: dict[str, float] = {"attempts": float(len(attempts))}
    out["failed_attempts"] = float(sum(len(g.exceptions) for g in groups))
    if rewards:
        out["reward"] = _mean(rewards)
        out["reward_std"] = statistics.pstdev(rewards)
    success = [t.metrics["success"] for t in attempts if "success" in t.metrics]
    if success:
        out["success"] = _mean(success)
        out["successes"] = float(sum(s >= 1.0 for s in success))
        out["checked_attempts"] = float(len(success))  # those with a reference to check
        own = [t.metrics["success"] for t in attempts if "success" in t.metrics and not t.helped]
        if len(own) < len(success):  # the loop started some: what the policy solved alone
            out["own_successes"] = float(sum(s >= 1.0 for s in own))
            out["own_attempts"] = float(len(own))
    for key in _MEANS:
        values = [t.metrics[key] for t in attempts if key in t.metrics]
        if values:
            out[key] = _mean(values)
    out |= by_chain_length(groups, by_id)
    out |= yes_no_against_constant(groups, by_id)
    return out


def yes_no_against_constant(
    groups: list[TrajectoryGroup], by_id: dict[str, Scenario]
) -> dict[str, float]:
    """Successes on the questions whose answer is a yes or a no (`successes_yes_no` of
    `checked_attempts_yes_no`), and what the better of a constant "yes" and a constant "no"
    would score on the same attempts (`constant_yes_no`): a policy that always says "yes"
    scores there without reading anything, so a gain on these questions counts only above it."""
    tally = {"yes": [0, 0], "no": [0, 0]}
    for g in groups:
        scenario = by_id.get(g.scenario_id or "")
        reference = scenario.reference if scenario else None
        said = polarity(reference.answer or "") if reference else None
        if said is None:
            continue
        for t in g.trajectories:
            if "success" in t.metrics:
                tally[said][0] += t.metrics["success"] >= 1.0
                tally[said][1] += 1
    checked = tally["yes"][1] + tally["no"][1]
    if not checked:
        return {}
    return {
        "successes_yes_no": float(tally["yes"][0] + tally["no"][0]),
        "checked_attempts_yes_no": float(checked),
        "constant_yes_no": float(max(tally["yes"][1], tally["no"][1])),
    }


def chain_length(scenario: Scenario | None) -> int | None:
    """How many calls the scenario's reference makes (None without reference calls)."""
    if scenario is None or scenario.reference is None or not scenario.reference.calls:
        return None
    return len(scenario.reference.calls)


def by_chain_length(groups: list[TrajectoryGroup], by_id: dict[str, Scenario]) -> dict[str, float]:
    """Successes and checked attempts per length of the reference's chain of calls
    (`successes_calls_2`, `checked_attempts_calls_2`, ...), where there is more than one
    length: whether tasks of several calls are solved, which the overall rate hides."""
    tally: dict[int, list[int]] = {}
    for g in groups:
        n = chain_length(by_id.get(g.scenario_id or ""))
        if n is None:
            continue
        for t in g.trajectories:
            if "success" in t.metrics:
                done, checked = tally.setdefault(n, [0, 0])
                tally[n] = [done + (t.metrics["success"] >= 1.0), checked + 1]
    if len(tally) < 2:
        return {}
    out = {}
    for n, (done, checked) in sorted(tally.items()):
        out[f"successes_calls_{n}"] = float(done)
        out[f"checked_attempts_calls_{n}"] = float(checked)
    return out
