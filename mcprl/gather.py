"""Running groups of attempts concurrently, with progress and an explicit failure policy.

    groups = await gather_groups(
        [[lambda: rollout(model, s, server) for _ in range(4)] for s in scenarios],
        max_concurrency=8, max_exceptions=0.25, after_each=score_with_ruler,
    )

Each attempt is a zero-argument async callable (or an awaitable). Attempts run under one
concurrency limit. An attempt that raises becomes an `AttemptError` in its group, and the rest
of the group carries on; `max_exceptions` (a count, or a fraction of all attempts) says how many
failures abort the whole batch with `GatherError`. `after_each` receives each group as soon as
its attempts are done: it can score it (RULER, references) and return it, or return None to drop
it (the reason should be logged by the callback). `more` then receives what `after_each`
returned and may return another group to run, beside the groups still running: a tied group's
replacement starts as soon as it ties, instead of after the slowest group of the batch.
"""

from __future__ import annotations

import inspect
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from contextvars import ContextVar

import anyio

from mcprl.errors import GatherError
from mcprl.types import AttemptError, Trajectory, TrajectoryGroup, first_error

__all__ = ["GatherError", "gather_groups", "gather_trajectory_groups", "note_turn"]

logger = logging.getLogger(__name__)

Attempt = Callable[[], Awaitable[Trajectory]] | Awaitable[Trajectory]
AfterEach = Callable[[TrajectoryGroup], Awaitable[TrajectoryGroup | None]]
Group = Sequence[Attempt] | TrajectoryGroup
More = Callable[[TrajectoryGroup | None], Group | None]


def _limit(max_exceptions: int | float, total: int) -> int:
    if isinstance(max_exceptions, float) and max_exceptions < 1:
        return math.floor(max_exceptions * total)
    return int(max_exceptions)


class _Progress:
    """The attempts bar: it moves per model turn (turns, tokens/s) and per finished attempt,
    and redraws every second so its clock shows that work goes on."""

    def __init__(self, total: int, desc: str, enabled: bool) -> None:
        self.bar = None
        self.total = total
        if enabled:
            from mcprl._progress import progress_bar

            self.bar = progress_bar(
                total=total,
                desc=desc,
                unit="attempt",
                leave=False,
                bar_format="{desc}: {n}/{total} attempts |{bar}| [{elapsed}{postfix}]",
            )
        self.done = self.errors = self.turns = self.tokens = 0
        self.rewards: list[float] = []
        self.started = time.perf_counter()

    def grow(self, attempts: int) -> None:
        self.total += attempts
        if self.bar is not None:
            self.bar.total = self.total
            self.bar.refresh()

    def turn(self, tokens: int) -> None:
        self.turns += 1
        self.tokens += tokens
        self._postfix()

    def update(self, errors: int = 0, reward: float | None = None) -> None:
        self.done += 1
        self.errors += errors
        if reward is not None:
            self.rewards.append(reward)
        if self.bar is not None:
            self._postfix(refresh=False)
            self.bar.update(1)

    def _postfix(self, refresh: bool = True) -> None:
        if self.bar is None:
            return
        seconds = max(time.perf_counter() - self.started, 1e-9)
        turns = f"{self.turns} turn{'' if self.turns == 1 else 's'}"
        parts = [turns, f"{self.tokens / seconds:.0f} tok/s"]
        if self.errors:
            parts.append(f"{self.errors} failed")
        if self.rewards:
            parts.append(f"reward {sum(self.rewards) / len(self.rewards):.3f}")
        self.bar.set_postfix_str(", ".join(parts), refresh=refresh)

    async def tick(self) -> None:
        while self.bar is not None:
            await anyio.sleep(1.0)
            self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


_progress: ContextVar[_Progress | None] = ContextVar("mcprl_progress", default=None)


def note_turn(tokens: int) -> None:
    """Count one model turn of `tokens` generated tokens on the progress bar of the
    `gather_groups` call this attempt runs in (rollouts call it; elsewhere it does nothing)."""
    bar = _progress.get()
    if bar is not None:
        bar.turn(tokens)


async def gather_groups(
    groups: Sequence[Group],
    *,
    max_concurrency: int = 8,
    max_exceptions: int | float = 0,
    after_each: AfterEach | None = None,
    desc: str = "rollouts",
    progress: bool = True,
    scenario_ids: Sequence[str | None] | None = None,
    more: More | None = None,
) -> list[TrajectoryGroup]:
    """Run every attempt of every group; return the groups (dropped ones left out), in order.

    A group may be a `TrajectoryGroup` holding awaitables (`TrajectoryGroup(items)`): its
    attempts run and join it, and it is the group returned. `more(result)`, called with each
    finished group's `after_each` result (None: dropped), may return a group to run next; it
    joins the groups in the order `more` returned it. `max_exceptions` as a fraction counts the
    attempts of the groups started so far."""
    groups = list(groups)
    total = sum(len(_items(g)) for g in groups)
    limiter = anyio.CapacityLimiter(max(1, max_concurrency))
    results: list[TrajectoryGroup | None] = [None] * len(groups)
    errors: list[AttemptError] = []
    bar = _Progress(total, desc, progress)
    token = _progress.set(bar)  # the attempts' tasks inherit it: they report their turns

    async def attempt(item: Attempt, group: TrajectoryGroup) -> None:
        async with limiter:
            try:
                awaitable = item() if callable(item) and not inspect.isawaitable(item) else item
                trajectory = await awaitable
            except Exception as exc:
                error = AttemptError.of(exc)
                logger.warning("an attempt failed: %s: %s", error.type, error.message)
                group.exceptions.append(error)
                errors.append(error)
                bar.update(errors=1)
                allowed = _limit(max_exceptions, bar.total)
                if len(errors) > allowed:
                    raise GatherError(
                        f"{len(errors)} of {bar.total} attempts failed (allowed: {allowed}); "
                        f"first: {errors[0].type}: {errors[0].message}",
                        errors,
                    ) from exc
                return
            group.trajectories.append(trajectory)
            bar.update(reward=trajectory.reward)

    async def run_group(i: int) -> None:
        given, items = groups[i], _items(groups[i])
        if isinstance(given, TrajectoryGroup):
            group = given
            given.pending.clear()  # each awaitable runs once
        else:
            sid = scenario_ids[i] if scenario_ids is not None and i < len(scenario_ids) else None
            group = TrajectoryGroup(scenario_id=sid)
        async with anyio.create_task_group() as tg:
            for item in items:
                tg.start_soon(attempt, item, group)
        if group.scenario_id is None and group.trajectories:
            group.scenario_id = _scenario_id(group.trajectories[0])
        results[i] = await after_each(group) if after_each is not None else group
        following = more(results[i]) if more is not None else None
        if following is not None:
            groups.append(following)
            results.append(None)
            bar.grow(len(_items(following)))
            running.start_soon(run_group, len(groups) - 1)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(bar.tick)  # the clock moves while nothing finishes
            async with anyio.create_task_group() as running:
                for i in range(len(groups)):
                    running.start_soon(run_group, i)
            tg.cancel_scope.cancel()
    except BaseExceptionGroup as eg:
        raise first_error(eg) from None
    finally:
        _progress.reset(token)
        bar.close()
    return [g for g in results if g is not None]


async def gather_trajectory_groups(
    groups: Iterable[TrajectoryGroup],
    *,
    pbar_desc: str = "gather",
    max_exceptions: int | float = 0,
    after_each: AfterEach | None = None,
    max_concurrency: int = 32,
    progress: bool = True,
) -> list[TrajectoryGroup]:
    """ART's name for `gather_groups` over groups built as `TrajectoryGroup(awaitables)`:

    groups = await gather_trajectory_groups(
        (TrajectoryGroup(rollout(model, s) for _ in range(8)) for s in scenarios),
        pbar_desc="gather", max_exceptions=4,
    )
    """
    return await gather_groups(
        list(groups),
        max_concurrency=max_concurrency,
        max_exceptions=max_exceptions,
        after_each=after_each,
        desc=pbar_desc,
        progress=progress,
    )


def _items(group: Sequence[Attempt] | TrajectoryGroup) -> list[Attempt]:
    return list(group.pending) if isinstance(group, TrajectoryGroup) else list(group)


def _scenario_id(trajectory: Trajectory) -> str | None:
    value = trajectory.metadata.get("scenario_id")
    return value if isinstance(value, str) else None
