"""Evaluating models side by side on a scenario set: what `mcprl eval` does.

    models = await backend_models(["agent@3", "base"], LocalBackend(), project="calc")
    rows, groups = await evaluate_models(models, scenarios, server, RolloutConfig())
    print(format_table(rows))

Every model meets the same scenarios and the same sampling seeds (`mcprl.collect`), so their
difference is the policy's. Collecting and scoring rollouts live in `mcprl.collect`; their
names are re-exported here.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from mcprl._stats import counts, describe_chains, difference, rate
from mcprl.backends import Backend
from mcprl.collect import (
    collect_groups,
    has_reference,
    mark_success,
    score_groups,
    summarize,
)
from mcprl.errors import UsageError
from mcprl.rewards import ReferenceReward, reward_parts
from mcprl.rollout import RolloutConfig
from mcprl.scenarios import Scenario, ScenarioSet
from mcprl.types import TrajectoryGroup

__all__ = [
    "EvalRow",
    "EvalWriter",
    "backend_models",
    "collect_groups",
    "eval_scenarios",
    "evaluate_models",
    "format_table",
    "has_reference",
    "mark_success",
    "save_eval",
    "score_groups",
    "summarize",
]

logger = logging.getLogger(__name__)


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
    from mcprl._progress import progress_bar

    by_scenario: dict[str, list] = {}
    for groups in all_groups.values():
        for g in groups:
            by_scenario.setdefault(g.scenario_id or "", []).extend(g.trajectories)
    for trajectories in progress_bar(list(by_scenario.values()), desc="judging", enabled=progress):
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
    """A Markdown table, the models side by side (columns only where some model has a value):
    success as a count with its 95% interval, then each model's success against the first's."""
    columns = [c for c in _COLUMNS if any(c[0] in r.metrics for r in rows)]
    head = ["model", *(title for _, title, _ in columns), "time"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r.model]
        for key, _, fmt in columns:
            v = r.metrics.get(key)
            counted = counts(r.metrics) if key == "success" else None
            if counted is not None:
                cells.append(rate(*counted))
            else:
                cells.append("–" if v is None or math.isnan(v) else fmt.format(v))
        cells.append(f"{r.seconds:.0f} s")
        lines.append("| " + " | ".join(cells) + " |")
    first = counts(rows[0].metrics) if rows else None
    compared = [  # each model against the first, so that a gap within the noise says so
        f"{r.model} vs {rows[0].model}: success {difference(first, other)}"
        for r in rows[1:]
        if first and (other := counts(r.metrics))
    ]
    if rows and "constant_yes_no" in rows[0].metrics:  # the same questions for every model
        m = rows[0].metrics
        said = ", ".join(
            f"{r.model} {r.metrics['successes_yes_no']:.0f} of {m['checked_attempts_yes_no']:.0f}"
            for r in rows
            if "successes_yes_no" in r.metrics
        )
        compared.append(
            f"yes/no questions: {said}; always the same answer would score "
            f"{m['constant_yes_no']:.0f}"
        )
    chains = [f"{r.model}: {c}" for r in rows if (c := describe_chains(r.metrics))]
    if chains:
        compared += ["success by calls needed:", *(f"  {c}" for c in chains)]
    return "\n".join(lines + (["", *compared] if compared else []))


# -- what `mcprl eval` evaluates, and where it writes ------------------------------------------


async def _run_of(spec: str, backend: Backend, project: str) -> tuple[Any, str] | None:
    """(TrainableModel, the part after @) if `spec` names a run the backend keeps, else None."""
    import json

    from pydantic import ValidationError

    from mcprl.model import TrainableModel

    name, _, step = spec.partition("@")
    try:
        model = TrainableModel(name=name, project=project)
    except ValidationError:
        return None
    info = await backend.read_file(model, "model.json")
    if info is None:
        return None
    if step and not step.isdigit() and step != "latest":
        raise UsageError(f"{spec!r}: the part after @ must be a step number or 'latest'")
    model.base_model = json.loads(info).get("base_model", model.base_model)
    return model, step


async def trained_examples(
    specs: Sequence[str], backend: Backend, project: str
) -> dict[str, tuple[int, str]]:
    """The worked examples each run among `specs` trained with, as its run_config.json says:
    how many (`RolloutConfig.examples`) and how they were chosen (`example_choice`)."""
    import json

    out: dict[str, tuple[int, str]] = {}
    for spec in specs:
        run = await _run_of(spec, backend, project)
        text = await backend.read_file(run[0], "run_config.json") if run else None
        if text is not None:
            rollout = json.loads(text).get("rollout", {})
            out[spec] = (int(rollout.get("examples", 0)), rollout.get("example_choice", "kinds"))
    return out


async def eval_scenarios(
    given: str | None,
    server: str,
    specs: Sequence[str],
    *,
    backend: Backend,
    project: str,
    split: str = "val",
) -> tuple[list[Scenario], ScenarioSet]:
    """The scenarios to evaluate on, and the whole set they come from (which decides the tools
    offered, `hidden_writers`): a file, else the first named run's, else the bundled set."""
    from mcprl.scenarios import ScenarioSet, bundled_scenarios

    scenarios = ScenarioSet.load(given) if given else None
    where = given
    for spec in specs if scenarios is None else ():
        run = await _run_of(spec, backend, project)
        text = await backend.read_file(run[0], "scenarios.jsonl") if run else None
        if text is not None:
            where = f"{project}/{run[0].name}/scenarios.jsonl"
            scenarios = ScenarioSet.loads(text, where)
            break
    if scenarios is None and (bundled := bundled_scenarios(server)) is not None:
        scenarios, where = ScenarioSet.load(bundled), str(bundled)
    if scenarios is None:
        raise UsageError(
            "no scenarios to evaluate on: give `scenarios=FILE` (write one with `mcprl scenarios`)"
        )
    chosen = list(scenarios) if split == "all" else [s for s in scenarios if s.split == split]
    if not chosen:
        raise UsageError(f"{where} has no scenarios in the {split!r} split; try `split=all`")
    return chosen, scenarios


async def backend_models(
    specs: Sequence[str],
    backend: Backend,
    *,
    project: str,
    base_model: str = "smollm2-135m",
    api_base: str | None = None,
) -> list[Any]:
    """Models for `specs`, served by `backend` (any `mcprl.backends.Backend`) where it can.

    A spec is `NAME[@STEP]` (a run of `project` the backend keeps, latest step by default),
    `base` or the base model's name (the base model, no adapter), or else a LiteLLM model string
    (`openai/gpt-4.1-mini`, `hosted_vllm/x` with `api_base`, ...).
    """
    from mcprl.model import LiteLLMModel

    models: list[Any] = []
    for spec in specs:
        run = await _run_of(spec, backend, project)
        if run is not None:
            model, step = run
            if model.base_model != base_model:
                raise UsageError(
                    f"{spec} was trained on {model.base_model!r}; give it as `eval_base_model`"
                )
            await backend.register(model)
            steps = await backend.list_checkpoints(model)
            if step.isdigit() and int(step) not in steps:
                raise UsageError(
                    f"{spec}: no checkpoint for that step in {project}/{model.name} (it has "
                    f"{', '.join(map(str, steps))})"
                )
            served = await backend.serve_checkpoint(
                model, int(step) if step.isdigit() else steps[-1]
            )
            where = await backend.inference(model)
            models.append(_endpoint_model(served, where))
        elif spec in ("base", base_model):
            where = await backend.base_inference(base_model)
            models.append(_endpoint_model(where.base_name, where))
        elif "/" in spec:
            models.append(LiteLLMModel(name=spec, api_base=api_base))
        else:
            raise UsageError(
                f"{spec!r} is neither a run of project {project!r} nor a LiteLLM model string "
                "(provider/model, e.g. openai/gpt-4.1-mini)"
            )
    return models


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


def _endpoint_model(name: str, where: Any) -> Any:
    """A model served by a backend (`Inference` `where`), as a plain endpoint."""
    from mcprl.model import Model

    return Model(
        name=name, base_url=where.base_url, api_key=where.api_key,
        extensions=tuple(where.extensions),
    )  # fmt: skip


def save_eval(
    out_dir: Path,
    rows: Sequence[EvalRow],
    groups: dict[str, list[TrajectoryGroup]],
    table: str,
) -> Path:
    """Write the table, the rows as JSON and each model's attempts into a new directory."""
    return EvalWriter(out_dir).finish(rows, groups, table)
