"""Rolling out scenario sets, scoring them, and summarising the result: what the training loop's
phases and `mcprl eval` share.

    groups = await collect_groups(model, scenarios, server, RolloutConfig(), attempts=2, seed=0)
    groups = await score_groups(groups, scorer(...))
    metrics = summarize(groups, scenarios)   # reward, success, completed, turns, tool_errors

    table = await evaluate_models(
        [Model(...), Model(...)], scenarios, server, RolloutConfig(), judge=None
    )

Attempt seeds are fixed by (seed, scenario position, attempt), so two models or two checkpoints
evaluated with the same seed meet the same sampling noise: their difference is the policy's.
`success` is the share of attempts whose answer (or calls) match the scenario's reference; it is
left out where no scenario has one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio
from pydantic import BaseModel

from mcprl.gather import gather_groups
from mcprl.rewards import ReferenceReward, is_success, reward_parts
from mcprl.rollout import RolloutConfig, rollout
from mcprl.scenarios import Scenario
from mcprl.types import TrajectoryGroup

__all__ = [
    "EvalRow",
    "EvalWriter",
    "collect_groups",
    "eval_scenarios",
    "evaluate_models",
    "format_table",
    "has_reference",
    "mark_success",
    "open_models",
    "save_eval",
    "score_groups",
    "summarize",
]

logger = logging.getLogger(__name__)

# seeds of attempt a at scenario i are spaced so that per-turn seeds (seed + turn) never meet
SEED_STRIDE = 1000


def has_reference(s: Scenario | None) -> bool:
    return bool(s and s.reference and (s.reference.answer is not None or s.reference.calls))


async def collect_groups(
    model: Any,
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
) -> list[TrajectoryGroup]:
    """`attempts` rollouts of each scenario by `model`, grouped by scenario, in order."""
    async with model.openai_client() as client:

        def attempt(scenario: Scenario, i: int, a: int) -> Callable[[], Any]:
            cfg = config.model_copy(update={"seed": seed + (i * attempts + a) * SEED_STRIDE})
            return lambda: rollout(model, scenario, server, cfg, client=client)

        return await gather_groups(
            [[attempt(s, i, a) for a in range(attempts)] for i, s in enumerate(scenarios)],
            max_concurrency=max_concurrency,
            max_exceptions=max_exceptions,
            desc=desc,
            progress=progress,
            scenario_ids=[s.id for s in scenarios],
        )


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
    from tqdm.auto import tqdm

    results: list[TrajectoryGroup | None] = [None] * len(groups)
    errors: list[Exception] = []
    with tqdm(total=len(groups), desc=desc, disable=not progress, leave=False) as bar:

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
    """Set `metrics["success"]` on attempts at scenarios with a reference."""
    for g in groups:
        scenario = scenarios.get(g.scenario_id or "")
        if not has_reference(scenario):
            continue
        for t in g.trajectories:
            t.metrics["success"] = float(is_success(t, scenario))


# per-attempt metrics averaged by `summarize`, where present
_MEANS = (
    "completed",
    "turns",
    "tool_calls",
    "tool_errors",
    "reward_ruler",
    "reward_answer",
    "reward_calls",
    "reward_reported",
    "repeated_calls",
)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def summarize(
    groups: list[TrajectoryGroup], scenarios: Sequence[Scenario] | dict[str, Scenario]
) -> dict[str, float]:
    """Means over all attempts: reward, success (where references exist), turns, errors."""
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
    for key in _MEANS:
        values = [t.metrics[key] for t in attempts if key in t.metrics]
        if values:
            out[key] = _mean(values)
    return out


class EvalRow(BaseModel):
    """One model's results on a scenario set."""

    model: str
    metrics: dict[str, float]
    seconds: float


async def evaluate_models(
    models: Sequence[Any],
    scenarios: Sequence[Scenario],
    server: Any,
    config: RolloutConfig,
    *,
    attempts: int = 1,
    seed: int = 0,
    judge: Any = None,
    reference: ReferenceReward | None = None,
    max_concurrency: int = 8,
    progress: bool = True,
    on_model: Callable[[EvalRow, list[TrajectoryGroup]], None] | None = None,
) -> tuple[list[EvalRow], dict[str, list[TrajectoryGroup]]]:
    """Evaluate each model on the same scenarios and seeds; `on_model(row, groups)` hears of
    each model as soon as its attempts are done (`EvalWriter` saves them then).

    Rewards come from the references where every scenario has one (the answer, with partial
    credit by `reference`'s weights, as `mcprl train` rewards them). With a `judge`, RULER also
    ranks the models' attempts at each scenario against each other (one group per scenario,
    holding every model's attempts): `reward_ruler` then compares the models directly.
    """
    by_id = {s.id: s for s in scenarios}
    all_groups: dict[str, list[TrajectoryGroup]] = {}
    rows = []
    with_refs = all(has_reference(s) for s in scenarios)
    for model in models:
        started = time.perf_counter()
        groups = await collect_groups(
            model,
            scenarios,
            server,
            config,
            attempts=attempts,
            seed=seed,
            max_concurrency=max_concurrency,
            desc=f"eval {model.served_name}",
            progress=progress,
        )
        for g in groups:
            for t in g.trajectories:
                if with_refs:
                    parts = reward_parts(t, by_id[g.scenario_id], reference)
                    t.reward = parts.reward
                    t.metrics.update(parts.metrics())
        all_groups[model.served_name] = groups
        seconds = time.perf_counter() - started
        row = EvalRow(model=model.served_name, metrics=summarize(groups, by_id), seconds=seconds)
        rows.append(row)
        if on_model is not None:
            on_model(row, groups)
    if judge is not None and len(models) * attempts >= 2:
        await _judge_across(all_groups, judge, progress)
        for row in rows:  # with the judge's scores
            row.metrics = summarize(all_groups[row.model], by_id)
    return rows, all_groups


async def _judge_across(all_groups: dict[str, list[TrajectoryGroup]], judge: Any, progress: bool):
    """RULER over one group per scenario made of every model's attempts."""
    from tqdm.auto import tqdm

    by_scenario: dict[str, list] = {}
    for groups in all_groups.values():
        for g in groups:
            by_scenario.setdefault(g.scenario_id or "", []).extend(g.trajectories)
    for trajectories in tqdm(list(by_scenario.values()), desc="judging", disable=not progress):
        if len(trajectories) < 2:
            continue
        result = await judge.score(
            [t.messages for t in trajectories], tools=trajectories[0].tools or None
        )
        for t, s in zip(trajectories, result.rewards, strict=True):
            t.metrics["reward_ruler"] = s


_COLUMNS = [
    ("success", "success", "{:.0%}"),
    ("reward", "reward", "{:.3f}"),
    ("reward_ruler", "RULER", "{:.3f}"),
    ("completed", "completed", "{:.0%}"),
    ("turns", "turns", "{:.2f}"),
    ("tool_errors", "tool errors", "{:.2f}"),
    ("failed_attempts", "failed", "{:.0f}"),
]


def format_table(rows: Sequence[EvalRow]) -> str:
    """A Markdown table, the models side by side (columns only where some model has a value)."""
    columns = [c for c in _COLUMNS if any(c[0] in r.metrics for r in rows)]
    head = ["model", *(title for _, title, _ in columns), "time"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r.model]
        for key, _, fmt in columns:
            v = r.metrics.get(key)
            cells.append("–" if v is None or math.isnan(v) else fmt.format(v))
        cells.append(f"{r.seconds:.0f} s")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# -- what `mcprl eval` evaluates, and where it writes ------------------------------------------


def _local_run(spec: str, project_dir: Path) -> tuple[str, int | None] | None:
    """`name@step` or `name` naming a training run in `project_dir`, else None."""
    name, _, step = spec.partition("@")
    if not (project_dir / name / "model.json").is_file():
        return None
    if step and not step.isdigit() and step != "latest":
        raise ValueError(f"{spec!r}: the part after @ must be a step number or 'latest'")
    return name, int(step) if step.isdigit() else None


def eval_scenarios(
    given: str | None,
    server: str,
    project_dir: Path,
    specs: Sequence[str],
    *,
    split: str = "val",
) -> list[Scenario]:
    """The scenarios to evaluate on: a file, else the first named run's, else the bundled set."""
    from mcprl.scenarios import ScenarioSet, bundled_scenarios

    path: Path | None = Path(given) if given else None
    for spec in specs if path is None else ():
        run = _local_run(spec, project_dir)
        if run and (project_dir / run[0] / "scenarios.jsonl").is_file():
            path = project_dir / run[0] / "scenarios.jsonl"
            break
    path = path or bundled_scenarios(server)
    if path is None:
        raise ValueError(
            "no scenarios to evaluate on: pass --scenarios FILE (write one with `mcprl scenarios`)"
        )
    scenarios = ScenarioSet.load(path)
    chosen = list(scenarios) if split == "all" else [s for s in scenarios if s.split == split]
    if not chosen:
        raise ValueError(f"{path} has no scenarios in the {split!r} split; try --split all")
    return chosen


@contextlib.contextmanager
def open_models(
    specs: Sequence[str],
    *,
    path: Path,
    base_model: str = "smollm2-135m",
    api_base: str | None = None,
    dtype: str = "bfloat16",
    device: str | None = "auto",
) -> Iterator[tuple[list[Any], Any]]:
    """Models for `specs`; yields (models, the local `LocalServer` or None).

    A spec is `NAME[@STEP]` (a training run in the project directory `path`, latest step by
    default), `base` or the base model's name (the local base model, no adapter), or else a
    LiteLLM model string (`openai/gpt-4.1-mini`, `hosted_vllm/x` with `api_base`, ...). Local
    ones share one in-process server, started only if one is named.
    """
    from mcprl.backends import RunStore
    from mcprl.model import LiteLLMModel, Model

    # per spec: (served name, adapter checkpoint or None) for a local model, None for LiteLLM
    plan: list[tuple[str, Path | None] | None] = []
    for spec in specs:
        run = _local_run(spec, path)
        if run is not None:
            store = RunStore(path.parent, path.name, run[0], read_only=True)
            info = store.read_model_info() or {}
            if info.get("base_model") != base_model:
                raise ValueError(
                    f"{spec} was trained on {info.get('base_model')!r}; pass --base-model with it"
                )
            step = run[1] if run[1] is not None else store.latest_step()
            if step is None or not store.checkpoint_path(step).is_dir():
                raise ValueError(f"{spec}: no checkpoint for that step in {store.dir}")
            plan.append((f"{run[0]}@{step}", store.checkpoint_path(step)))
        elif spec in ("base", base_model):
            plan.append((base_model, None))
        elif "/" in spec:
            plan.append(None)
        else:
            raise ValueError(
                f"{spec!r} is neither a run in {path} nor a LiteLLM model string "
                "(provider/model, e.g. openai/gpt-4.1-mini)"
            )
    server = None
    if any(plan):
        from mcprl.serving import LocalServer

        server = LocalServer(
            base_model, dtype=dtype, served_name=base_model, device=device, adapter_dirs=[path]
        )
    try:
        from mcprl.serving._server import adapter_request

        models: list[Any] = []
        loaded: set[str] = set()
        for spec, local in zip(specs, plan, strict=True):
            if local is None:
                models.append(LiteLLMModel(name=spec, api_base=api_base))
                continue
            name, adapter = local
            if adapter is not None and name not in loaded:
                body = {"lora_name": name, "lora_path": str(adapter)}
                adapter_request(server.base_url, server.api_key, "load", body)
                loaded.add(name)
            models.append(Model(name=name, base_url=server.base_url, api_key=server.api_key))
        yield models, server
    finally:
        if server is not None:
            server.close()


class EvalWriter:
    """An evaluation's results, written as they come into a new directory under `out_dir`:
    each model's attempts and the table so far as soon as that model is done (a stopped
    evaluation keeps what it finished), the final table at the end."""

    def __init__(self, out_dir: Path) -> None:
        self.dir = out_dir / datetime.now().strftime("%Y%m%d-%H%M%S")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rows: list[EvalRow] = []

    def add(self, row: EvalRow, groups: list[TrajectoryGroup]) -> None:
        self._groups(row.model, groups)
        self.rows.append(row)
        self._tables(self.rows, format_table(self.rows) + "\n\n(in progress)")

    def finish(
        self, rows: Sequence[EvalRow], groups: dict[str, list[TrajectoryGroup]], table: str
    ) -> Path:
        for name, model_groups in groups.items():
            self._groups(name, model_groups)  # with the judge's scores, where one ran
        self._tables(rows, table)
        return self.dir

    def _groups(self, name: str, groups: list[TrajectoryGroup]) -> None:
        from mcprl.types import write_groups

        write_groups(self.dir / f"{re.sub(r'[^A-Za-z0-9._@-]+', '_', name)}.jsonl", groups)

    def _tables(self, rows: Sequence[EvalRow], table: str) -> None:
        (self.dir / "table.md").write_text(table + "\n", encoding="utf-8")
        (self.dir / "results.json").write_text(
            json.dumps([r.model_dump() for r in rows], indent=2), encoding="utf-8"
        )


def save_eval(
    out_dir: Path,
    rows: Sequence[EvalRow],
    groups: dict[str, list[TrajectoryGroup]],
    table: str,
) -> Path:
    """Write the table, the rows as JSON and each model's attempts into a new directory."""
    return EvalWriter(out_dir).finish(rows, groups, table)
