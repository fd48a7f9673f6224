"""Hindsight tasks: a failed attempt's chain of calls, relabelled as the task it did solve.

An attempt that fails its task may still have chained calls: fed what one call returned into
the next. Those calls answer another question, and the attempt is a solved example of it. At
`add(23, 38)` → 61, then `divide(61, 2)` → 30.5, answered 30.5, for "What is the average of 23,
38 and 86?", the question is:

    Call add with a = 23, b = 38. Then call divide with a = that result, b = 2.
    What does the last call return?

`hindsight_task` writes that task, with the attempt's calls as its reference and the value it
answered, read off the chain's last result, as the reference answer. It keeps the task only when
the attempt checks as a success against it with the check every task gets (`is_success`): an
attempt whose answer is not its chain's last result, or one whose result the check cannot read
(written to another precision, a long document), gives none. Calls the loop made for the attempt
(`guided_calls`) are not the policy's, so a guided attempt gives none either.

With `RunConfig.hindsight` on, a training run adds such tasks to its pool after each step (at
most that many a step, new chains only, tag "hindsight"), so the policy practises chaining on
calls it has shown it can make. They are a kind of their own for the sampler (`task_kind`): a
hindsight success never counts as solving the kind of task it came from.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from mcprl.rewards import answer_matches, is_success, made_calls, result_values
from mcprl.scenarios import (
    Reference,
    ReferenceCall,
    Scenario,
    check_named_arguments,
    has_reference,
)
from mcprl.types import Trajectory, TrajectoryGroup

__all__ = ["HINDSIGHT_TAG", "hindsight_task", "hindsight_tasks"]

HINDSIGHT_TAG = "hindsight"
_Call = tuple[str, dict[str, Any], str]  # (tool, arguments, result text)


def _feeds(value: Any, result: str) -> bool:
    """`value`, an argument, is what `result` returned (or a number or string in it)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)) or value == "":
        return False
    values = result_values(result.strip())
    return any(answer_matches(str(value), Reference(answer=v)) for v in values[1:] or values)


def _chain(calls: list[_Call]) -> list[tuple[_Call, set[str]]]:
    """The calls that lead to the last one, each with the arguments fed by the call before it:
    from the last call back, the latest earlier call whose result one of its arguments is."""
    chain = [(calls[-1], set[str]())]
    i = len(calls) - 1
    while True:
        _, args, _ = calls[i]
        fed_by = (
            (j, {k for k, v in args.items() if _feeds(v, calls[j][2])})
            for j in range(i - 1, -1, -1)
        )
        feeder = next(((j, fed) for j, fed in fed_by if fed), None)
        if feeder is None:
            return chain
        j, fed = feeder
        chain[0] = (chain[0][0], fed)
        chain.insert(0, (calls[j], set()))
        i = j


def _value(value: Any) -> str:
    return (
        json.dumps(value, ensure_ascii=False) if not isinstance(value, (int, float)) else str(value)
    )


def _sentence(step: int, tool: str, args: dict[str, Any], fed: set[str]) -> str:
    parts = [f"{k} = {'that result' if k in fed else _value(v)}" for k, v in args.items()]
    with_args = f" with {', '.join(parts)}" if parts else ""
    return f"{'Call' if step == 0 else 'Then call'} {tool}{with_args}."


def hindsight_task(
    trajectory: Trajectory, scenario: Scenario, *, min_calls: int = 2
) -> Scenario | None:
    """The task a failed attempt at `scenario` solved by chaining `min_calls` or more calls, or
    None (module doc): only for an attempt the reference check calls a failure, that was not
    guided, and whose final answer checks against its chain's last result."""
    if not has_reference(scenario) or "guided_calls" in trajectory.metadata:
        return None
    answer = trajectory.final_answer()
    calls = [
        (name, args, text)
        for name, args, text in made_calls(trajectory)
        if text is not None and isinstance(args, dict) and name != "complete_task"
    ]
    if answer is None or len(calls) < min_calls or is_success(trajectory, scenario):
        return None
    chain = _chain(calls)
    if len(chain) < min_calls:
        return None
    last = chain[-1][0][2]
    values = result_values(last.strip())
    expected = next(
        (v for v in values[1:] or values if answer_matches(answer, Reference(answer=v))), None
    )
    if expected is None:
        return None
    steps = [_sentence(i, tool, args, fed) for i, ((tool, args, _), fed) in enumerate(chain)]
    text = " ".join(steps) + " What does the last call return?"
    reference = Reference(
        answer=expected,
        calls=[ReferenceCall(tool=t, arguments=a, result=r) for (t, a, r), _ in chain],
        needs_calls=True,
    )
    # a yes, a no or a 0 counts only from calls carrying the values the task names
    reference = check_named_arguments(reference, text, writes=())
    key = json.dumps([[t, a] for (t, a, _), _ in chain], sort_keys=True, ensure_ascii=False)
    try:
        float(expected)
        kind = "number"
    except ValueError:
        kind = "string"
    task = Scenario(
        id=f"{HINDSIGHT_TAG}-{hashlib.sha1(key.encode()).hexdigest()[:10]}",
        task=text,
        difficulty=min(5, max(3, len(chain))),  # the generators' scale: 3 is two or three calls
        reference=reference,
        tags=[HINDSIGHT_TAG, f"from:{scenario.id}"],
        split="train",
        answer_type=kind,
    )
    return task if is_success(trajectory, task) else None


def hindsight_tasks(
    groups: Iterable[TrajectoryGroup],
    scenarios: Mapping[str, Scenario],
    *,
    limit: int,
    known: Iterable[str] = (),
) -> list[Scenario]:
    """At most `limit` new hindsight tasks from the attempts of `groups`, in their order, one per
    chain (a chain in `known` ids, or one found earlier in the same groups, is skipped)."""
    seen = set(known)
    out: list[Scenario] = []
    for g in groups:
        scenario = scenarios.get(g.scenario_id or "")
        if scenario is None:
            continue
        for t in g.trajectories:
            if len(out) >= limit:
                return out
            task = hindsight_task(t, scenario)
            if task is not None and task.id not in seen:
                seen.add(task.id)
                out.append(task)
    return out
