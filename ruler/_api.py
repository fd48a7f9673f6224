"""`score_group`: the one-call way to use RULER."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

from ruler._judge import Judge, run_sync
from ruler._types import JudgeResult

__all__ = ["score_group", "score_group_sync"]


async def score_group(
    trajectories: Sequence[Any],
    judge: str | Judge,
    rubric: str | None = None,
    *,
    tools: Sequence[Any] | None = None,
    swallow_exceptions: bool = False,
    **judge_options: Any,
) -> JudgeResult | None:
    """Score `trajectories` against each other; a thin wrapper over `Judge.score`.

    `judge` is a LiteLLM model string (other keyword arguments build the `Judge`) or a `Judge`.
    Returns a `JudgeResult` whose `scores` follow the order of `trajectories`, or None when
    `swallow_exceptions` is set and the judge failed (the reason is logged).
    """
    if isinstance(judge, Judge):
        if judge_options:
            raise TypeError(f"pass options to Judge(...), not score_group: {sorted(judge_options)}")
        j = judge
    else:
        j = Judge(judge, **judge_options)
    return await j.score(
        trajectories, tools=tools, rubric=rubric, swallow_exceptions=swallow_exceptions
    )


def score_group_sync(trajectories: Sequence[Any], **kwargs: Any) -> JudgeResult | None:
    """`score_group` for scripts that have no event loop."""
    return run_sync(partial(score_group, trajectories, **kwargs))
