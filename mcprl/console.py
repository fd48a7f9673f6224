"""The console's account of a training run: one line per step and per evaluation.

`Console(say)` is a run observer (`TrainingRun(..., observers=[Console(print)])`): it turns the
run's events into sentences and hands each to `say`. `mcprl train` attaches one that writes to
standard error; a program that wants the same lines in its log attaches `Console(logger.info)`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from mcprl._stats import counts, describe_chains, describe_yes_no, rate, split_metrics
from mcprl.rewards import Informative, Reward
from mcprl.train import GroupsDrawn, RowRecorded, RunEvent
from mcprl.types import TrajectoryGroup

__all__ = ["Console", "describe_eval"]

_NO_SIGNAL: dict[Informative, str] = {
    "reward": "no group had differing rewards",
    "success": "no group had both a success and a failure",
    "judged": "the judge saw no group with both a success and a failure",
}


class Console:
    """Says a line when a step trained or an evaluation ended, and a warning when a step's
    attempts all scored alike (nothing could be learned from them)."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say
        self._warning: str | None = None

    async def __call__(self, event: RunEvent) -> None:
        if isinstance(event, GroupsDrawn):
            self._warning = alike_warning(event.groups, event.run.reward)
        elif isinstance(event, RowRecorded):
            row = event.row
            if "val/attempts" in row:
                val = split_metrics(row)
                self.say(f"eval at step {row['step']}: {describe_eval(val)}")
                return
            self.say(_step_line(row, event.run.config.steps, event.run.informative))
            if self._warning:
                self.say(f"  warning: {self._warning}")
            self._warning = None


def _step_line(row: dict[str, Any], steps: int, informative: str) -> str:
    def train(key: str, default: float = math.nan) -> float:
        return row.get(f"train/{key}", default)

    dropped, explored = train("groups_dropped", 0), train("attempts_explored", 0)
    guided, hindsight = train("attempts_guided", 0), train("hindsight_added", 0)
    shown = train("attempts_demonstrated", 0)
    released = train("groups_released", 0)
    success = row.get("train/success")
    notes = []
    if "train/own_attempts" in row:  # the loop started some attempts: what the model did alone
        notes.append(
            f"its own attempts {train('own_successes'):.0f} of {train('own_attempts'):.0f}"
        )
    if stock := round(train("stock_answer", 0) * train("attempts", 0)):  # `StockAnswers`
        notes.append(f"{stock} by an answer it also gave to other tasks, where wrong")
    own = f" ({'; '.join(notes)})" if notes else ""
    return (
        f"step {row['step']}/{steps}: reward {train('reward_mean'):.3f} "
        f"± {train('reward_std'):.3f}"
        + (f", success {success:.0%}{own}" if success is not None else "")
        + f", {_plural(train('groups_trained', 0), 'group')} trained of "
        + f"{train('groups_drawn', 0):.0f} drawn ({train('groups_tied', 0):.0f} tied"
        + (f", {dropped:.0f} lost to the judge" if dropped else "")
        + (f"; {released:.0f} held from earlier steps" if released else "")
        + ")"
        + (f", {_plural(shown, 'attempt')} demonstrated" if shown else "")
        + (f", {_plural(explored, 'attempt')} explored" if explored else "")
        + (f", {_plural(guided, 'attempt')} guided" if guided else "")
        + (f", {_plural(hindsight, 'hindsight task')} added" if hindsight else "")
        + _subtasks(row)
        + _no_update(row, informative)
        + f" | rollouts {row.get('time/rollout_s', 0):.0f} s, "
        f"judge {row.get('time/judge_s', 0):.0f} s{_judging(row)}, "
        f"train {train('time_train_s', 0):.0f} s"
    )


def _subtasks(row: dict[str, Any]) -> str:
    """What the step's subtask groups did (`--subtasks`), where it drew any."""
    drawn = row.get("train/subtask_groups")
    if not drawn:
        return ""
    right, tried = row.get("train/subtask_successes", 0), row.get("train/subtask_attempts", 0)
    trained = row.get("train/subtask_groups_trained", 0)
    return (
        f"; subtasks: {right:.0f} of {tried:.0f} steps of chains made right, "
        f"{trained:.0f} of {_plural(drawn, 'group')} trained"
    )


def _no_update(row: dict[str, Any], informative: Informative) -> str:
    """Why a step made no update, where it made none."""
    if not row.get("train/skipped_update"):
        return ""
    if held := row.get("train/groups_held"):
        return (
            f"; no update: {_plural(held, 'group')} held until the held groups' best "
            "attempts start with two different tools (--contrast)"
        )
    return f"; no update: {_NO_SIGNAL[informative]}"


def _judging(row: dict[str, Any]) -> str:
    """What the step's judging spent, and how well two passes agreed (when it ran them)."""
    if "judge/tokens" not in row:
        return ""
    parts = [f"{row['judge/tokens'] / 1000:.1f}k tokens"]
    if "judge/cost_usd" in row:
        parts.append(f"${row['judge/cost_usd']:.4f}")
    if "train/judge_agreement" in row:
        parts.append(f"passes agree {row['train/judge_agreement']:.2f}")
    return f" ({', '.join(parts)})"


def alike_warning(groups: list[TrajectoryGroup], reward: Reward) -> str | None:
    """What to tell the user when a step's attempts all scored alike (nothing can be learned)."""
    rewards = {round(t.reward, 6) for g in groups for t in g.trajectories if t.reward is not None}
    if len(rewards) != 1:
        return None
    (value,) = rewards
    if reward.custom is not None:
        return (
            f"your reward gave every attempt of this step the same value ({value:.2f}), so "
            "there is nothing to learn from it; a reward that tells attempts apart is needed"
        )
    if reward.needs_judge:
        return (
            f"the judge gave every attempt of this step the same score ({value:.2f}), so there "
            "is nothing to learn from it; a judge that cannot tell attempts apart needs a "
            "stronger model (`judge`) or a clearer rubric"
        )
    return (
        f"every attempt of this step scored {value:.2f}: the scenarios drawn are all too easy or "
        "all too hard for the model now (more `rollouts_per_group` or `oversample` find "
        "differing groups more often)"
    )


def describe_eval(metrics: dict[str, float]) -> str:
    """An evaluation's metrics as the console shows them."""
    parts = []
    counted = counts(metrics)
    if counted is not None:
        parts.append(f"success {rate(*counted)}")
    elif "success" in metrics:
        parts.append(f"success {metrics['success']:.0%}")
    if "judged_success" in metrics:  # the judge's verdict (RULER): with no reference, the only one
        parts.append(f"judged a success {metrics['judged_success']:.0%}")
    if "reward" in metrics:
        parts.append(f"reward {metrics['reward']:.3f}")
    if "completed" in metrics:
        parts.append(f"completed {metrics['completed']:.0%}")
    if "tool_errors" in metrics:
        parts.append(f"tool errors/attempt {metrics['tool_errors']:.2f}")
    chains = describe_chains(metrics)
    yes_no = describe_yes_no(metrics)  # a constant answer scores there without reading
    return (
        ", ".join(parts)
        + f"; {_plural(metrics.get('attempts', 0), 'attempt')}"
        + (f"; by calls needed: {chains}" if chains else "")
        + (f"; yes/no {yes_no}" if yes_no else "")
    )


def _plural(count: float, noun: str) -> str:
    return f"{count:.0f} {noun}{'' if round(count) == 1 else 's'}"
