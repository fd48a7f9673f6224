"""Rewards for groups of attempts: reference checks, RULER, or a weighted mix.

- `reference_reward(trajectory, scenario)`: does the final answer match the scenario's expected
  answer (exactly, or within its numeric tolerance), and/or did the attempt make the reference
  tool calls? 0..1.
- `scorer(...)` builds an `after_each` callback for `gather_groups` that sets each trajectory's
  reward from references, RULER, or both with weights, and records the parts as metrics.

A judge failure is never a zero: with `drop_failed_groups`, the group is dropped with a logged
reason; otherwise the error propagates.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from mcprl.scenarios import Reference, Scenario, normalize
from mcprl.types import Trajectory, TrajectoryGroup
from ruler import Judge, JudgeError

__all__ = ["answer_matches", "calls_matched", "reference_reward", "scorer"]

logger = logging.getLogger(__name__)

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?|-?\.\d+")


def _numbers(text: str) -> list[float]:
    out = []
    for m in _NUMBER.findall(text):
        try:
            out.append(float(m.replace(",", "")))
        except ValueError:
            continue
    return out


def _close(a: float, b: float, tolerance: float) -> bool:
    return math.isclose(a, b, rel_tol=tolerance, abs_tol=tolerance * 1e-3 if b == 0 else 0.0)


def answer_matches(answer: str | None, reference: Reference) -> bool:
    """The expected answer appears in `answer`: as a number within tolerance, or as text."""
    if answer is None or reference.answer is None:
        return False
    expected = reference.answer
    try:
        target = float(expected)
    except ValueError:
        return normalize(expected) in normalize(answer)
    tolerance = reference.tolerance if reference.tolerance is not None else 1e-9
    return any(_close(x, target, tolerance) for x in _numbers(answer))


def _args_match(actual: Any, expected: Any, tolerance: float) -> bool:
    if isinstance(expected, (int, float)) and not isinstance(expected, bool):
        return isinstance(actual, (int, float)) and _close(
            float(actual), float(expected), tolerance
        )
    if isinstance(expected, str) and isinstance(actual, str):
        return normalize(actual) == normalize(expected)
    if isinstance(expected, dict) and isinstance(actual, dict):
        return expected.keys() == actual.keys() and all(
            _args_match(actual[k], v, tolerance) for k, v in expected.items()
        )
    if isinstance(expected, list) and isinstance(actual, list):
        return len(actual) == len(expected) and all(
            _args_match(a, e, tolerance) for a, e in zip(actual, expected, strict=True)
        )
    return actual == expected


def _made_calls(trajectory: Trajectory) -> list[tuple[str, Any]]:
    calls = []
    for m in trajectory.messages:
        for c in m.get("tool_calls") or []:
            try:
                args = json.loads(c["function"].get("arguments") or "{}")
            except json.JSONDecodeError:
                args = None
            calls.append((c["function"]["name"], args))
    return calls


def calls_matched(trajectory: Trajectory, reference: Reference) -> float:
    """The fraction of reference calls the attempt made (same tool, matching arguments)."""
    if not reference.calls:
        return 0.0
    made = _made_calls(trajectory)
    tolerance = reference.tolerance if reference.tolerance is not None else 1e-6
    hits = sum(
        any(n == ref.tool and _args_match(a, ref.arguments, tolerance) for n, a in made)
        for ref in reference.calls
    )
    return hits / len(reference.calls)


def reference_reward(
    trajectory: Trajectory,
    scenario: Scenario,
    *,
    answer_weight: float = 1.0,
    calls_weight: float = 0.0,
) -> float:
    """0..1 from the scenario's reference; raises if the scenario has none."""
    ref = scenario.reference
    if ref is None or (ref.answer is None and not ref.calls):
        raise ValueError(f"scenario {scenario.id!r} has no reference answer or calls")
    parts = []
    if ref.answer is not None and answer_weight > 0:
        parts.append((answer_weight, float(answer_matches(trajectory.final_answer(), ref))))
    if ref.calls and (calls_weight > 0 or ref.answer is None):
        parts.append((calls_weight or 1.0, calls_matched(trajectory, ref)))
    total = sum(w for w, _ in parts)
    return sum(w * v for w, v in parts) / total


def scorer(
    scenarios: Mapping[str, Scenario],
    *,
    judge: Judge | None = None,
    reference_weight: float = 1.0,
    ruler_weight: float = 0.0,
    calls_weight: float = 0.0,
    drop_failed_groups: bool = False,
) -> Callable[[TrajectoryGroup], Any]:
    """An `after_each` callback for `gather_groups` that sets rewards (see module docstring)."""
    if ruler_weight > 0 and judge is None:
        raise ValueError("ruler_weight > 0 needs a judge")
    if reference_weight <= 0 and ruler_weight <= 0:
        raise ValueError("give reference_weight or ruler_weight a positive weight")

    async def score(group: TrajectoryGroup) -> TrajectoryGroup | None:
        if not group.trajectories:
            return group
        scenario = scenarios.get(group.scenario_id or "")
        if reference_weight <= 0 and len(group.trajectories) < 2:
            logger.info("dropping the group of %r: RULER needs 2+ attempts", group.scenario_id)
            return None
        ref_scores = None
        if reference_weight > 0:
            if scenario is None or scenario.reference is None:
                raise ValueError(f"no reference for scenario {group.scenario_id!r}")
            ref_scores = [
                reference_reward(t, scenario, calls_weight=calls_weight) for t in group.trajectories
            ]
        ruler_scores = None
        if ruler_weight > 0 and len(group.trajectories) >= 2:
            try:
                result = await judge.score(
                    [t.messages for t in group.trajectories], tools=group.trajectories[0].tools
                )
            except JudgeError as exc:
                if not drop_failed_groups:
                    raise
                logger.warning("dropping the group of %r: %s", group.scenario_id, exc)
                return None
            ruler_scores = result.rewards
        for i, t in enumerate(group.trajectories):
            parts = []
            if ref_scores is not None:
                t.metrics["reward_reference"] = ref_scores[i]
                parts.append((reference_weight, ref_scores[i]))
            if ruler_scores is not None:
                t.metrics["reward_ruler"] = ruler_scores[i]
                parts.append((ruler_weight, ruler_scores[i]))
            t.reward = sum(w * v for w, v in parts) / sum(w for w, _ in parts)
        return group

    return score
