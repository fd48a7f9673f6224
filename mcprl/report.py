"""A run's metrics history as PNG plots and one HTML page.

    path = write_report(".mcprl/calc/agent")     # -> .mcprl/calc/agent/report.html

Reads what the run wrote (`history.jsonl`, `model.json`, `trajectories/`) and writes, next to it:
`val.png` (val reward and success over steps), `train_reward.png` (train reward mean and spread),
`scores.png` (distribution of judge scores, or rewards when no judge ran), `reward_parts.png`
(the reference reward's components per step), `signal.png` (groups drawn, tied and trained per
step), `behaviour.png` (turns and tool errors per step), `time.png` (wall time per phase per
step), and `report.html` with the plots, a summary table, the steps that made no update, and the
best and worst attempts of the latest step.
"""

from __future__ import annotations

import html
import json
import logging
import math
from datetime import datetime
from pathlib import Path
from typing import Any

from mcprl._stats import (
    counts,
    describe_chains,
    describe_yes_no,
    difference,
    own_counts,
    rate,
    split_metrics,
)
from mcprl.backends import RunStore, export_run
from mcprl.types import Trajectory, read_groups

__all__ = ["ReportObserver", "write_report"]

logger = logging.getLogger(__name__)

_PHASES = [
    ("val/time_s", "evaluation"),
    ("time/rollout_s", "rollouts"),
    ("time/judge_s", "judging"),
    ("train/time_train_s", "training"),
    ("train/time_checkpoint_s", "checkpoint"),
]


def _series(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of `key`, the last value per step winning (a resumed run may repeat)."""
    by_step = {r["step"]: r[key] for r in rows if key in r and r[key] is not None}
    steps = sorted(by_step)
    return steps, [float(by_step[s]) for s in steps]


def _own_success(row: dict[str, Any]) -> float:
    """A step's success among the attempts the loop did not start (all of them where it
    started none)."""
    own = own_counts(split_metrics(row, "train"))
    if own is None:  # an older record: the rate alone
        return float(row["train/success"])
    return own[0] / own[1] if own[1] else math.nan


_PARTS = [
    ("train/reward_answer", "answer correct (= success)"),
    ("train/reward_calls", "reference calls made"),
    ("train/reward_reported", "answer is a tool result"),
    ("train/repeated_calls", "repeated calls"),
    ("train/repeats_retried", "repeats asked again (--retry-repeats)"),
    ("train/subtask_success", "steps of chains made right (--subtasks)"),
    ("train/guessed_answer", "right answer without the needed calls"),
]


_TRAINER = [
    ("train/loss", "loss"),
    ("train/grad_norm", "grad norm"),
    ("train/kl", "KL"),
    ("train/clip_fraction", "clip fraction"),
    ("train/abs_logprob_drift", "log-prob drift"),
]


def _updates(rows: list[dict[str, Any]]) -> str:
    """ "N of M steps updated the model", and which did not."""
    trained = sorted({r["step"] for r in rows if "train/reward_mean" in r})
    if not trained:
        return ""
    steps = sorted({r["step"] for r in rows if r.get("train/skipped_update")})
    held = sorted({r["step"] for r in rows if r.get("train/groups_held")} & set(steps))
    tied = [s for s in steps if s not in held]
    text = (
        f"<p><b>{len(trained) - len(steps)} of {len(trained)} step"
        f"{'' if len(trained) == 1 else 's'} updated the model.</b>"
    )
    if tied:
        text += (
            f" No update at {_steps(tied)}: every group tied "
            "(equal rewards or, with <code>informative: success</code>, no success beside a "
            "failure), so there was nothing to learn from (the adapter did not change; marked ✕ "
            "on the training reward plot)."
        )
    if held:
        text += (
            f" No update at {_steps(held)}: <code>contrast</code> held the groups until they "
            "had won with two different first tools; a later step trained them."
        )
    return text + "</p>"


def _steps(steps: list[int]) -> str:
    """ "step 3" or "steps 3, 4" (escaped)."""
    return f"step{'s' if len(steps) > 1 else ''} {html.escape(', '.join(map(str, steps)))}"


def _settings(run_dir: Path, info: dict[str, Any]) -> str:
    """The run's settings (`run_config.json`, written when a run starts) as a table."""
    path = run_dir / "run_config.json"
    if not path.is_file():
        return ""
    config = json.loads(path.read_text(encoding="utf-8"))
    rollout, train = config.get("rollout", {}), config.get("train", {})
    lora = info.get("lora") or config.get("lora", {})  # model.json: the adapter as made
    shown = [
        ("base model", config.get("base_model")),
        ("steps", config.get("steps")),
        (
            "groups per step × attempts",
            f"{config.get('groups_per_step')} × {config.get('rollouts_per_group')}",
        ),
        (
            "sampling",
            f"{config.get('sampling')}, oversample {config.get('oversample')}, "
            f"explore {config.get('explore', 0)}",
        ),
        ("reward", config.get("reward")),
        ("judge", config.get("judge") or "–"),
        (
            "learning rate",
            f"{train.get('learning_rate')}, {config.get('lr_schedule', 'constant')}",
        ),
        (
            "loss",
            f"{train.get('loss')}, clip {train.get('eps_low')}/{train.get('eps_high')}, "
            f"KL beta {train.get('beta')}, scale rewards {train.get('scale_rewards')}, "
            f"positive weight {train.get('positive_weight', 1.0)}, "
            f"push down below {train.get('push_down_below', 0.0)}, "
            f"cap failures {train.get('cap_failures', False)}, "
            f"solved failures x{train.get('solved_failure_weight', 1.0)}",
        ),
        ("LoRA", f"r {lora.get('r')}, alpha {lora.get('alpha')}"),
        (
            "turns, tokens per reply",
            f"{rollout.get('max_turns')} "
            f"({rollout.get('turn_budget')}), {rollout.get('max_tokens')}",
        ),
        ("temperature", rollout.get("temperature")),
        (
            "forced final answer, typed",
            f"{rollout.get('force_final_answer')}, {rollout.get('typed_answer')}",
        ),
        (
            "evaluation",
            f"every {config.get('eval_every')} steps, "
            f"{config.get('val_attempts')} attempts × "
            f"{config.get('max_val_scenarios') or 'all'} val scenarios",
        ),
        ("seed", config.get("seed")),
    ]
    body = "".join(
        f"<tr><td>{html.escape(k)}</td><td>{html.escape(str(v))}</td></tr>" for k, v in shown
    )
    summary = "<summary>Settings of the latest start</summary>"
    return f"<details>{summary}<table>{body}</table></details>"


def _judge_spending(rows: list[dict[str, Any]]) -> str:
    """What the judge cost, step by step, and how well its two passes agreed (if it ran two)."""
    steps = [r for r in rows if "judge/tokens" in r]
    if not steps:
        return ""
    last = steps[-1]
    total = f"{last['judge/total_tokens']:,.0f} tokens"
    if "judge/total_cost_usd" in last:
        total += f", ${last['judge/total_cost_usd']:.4f}"
    else:
        total += " (LiteLLM has no price for this judge: give --judge-price to see a cost)"
    has_agreement = any("train/judge_agreement" in r for r in steps)
    head = "<tr><th>step</th><th>tokens</th><th>cost (USD)</th>" + (
        "<th>passes' rank agreement</th>" if has_agreement else ""
    )
    body = ""
    for r in steps:
        cost = f"{r['judge/cost_usd']:.4f}" if "judge/cost_usd" in r else "–"
        cells = [str(r["step"]), f"{r['judge/tokens']:,.0f}", cost]
        if has_agreement:
            a = r.get("train/judge_agreement")
            cells.append("–" if a is None else f"{a:.2f}")
        body += "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>"
    note = (
        "<p>Agreement is the rank correlation of the two passes' scores (1: the same order; "
        "near 0: the judge is guessing).</p>"
        if has_agreement
        else ""
    )
    return (
        f"<details><summary>The judge spent {html.escape(total)} up to step {last['step']} "
        f"(evaluations included)</summary><table>{head}</tr>{body}</table>{note}</details>"
    )


def _judge_losses(rows: list[dict[str, Any]]) -> str:
    lost = {
        r["step"]: r["train/groups_dropped"]
        for r in rows
        if isinstance(r.get("train/groups_dropped"), (int, float)) and r["train/groups_dropped"]
    }
    if not lost:
        return ""
    listed = html.escape(", ".join(f"step {k}: {v:.0f}" for k, v in lost.items()))
    return (
        f"<p><b>The judge failed on {sum(lost.values()):.0f} groups</b> ({listed}); they were "
        "not trained on.</p>"
    )


def _trajectory_files(run_dir: Path, split: str) -> list[Path]:
    return sorted((run_dir / "trajectories" / split).glob("*.jsonl"))


def _plots(run_dir: Path, rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    made: list[tuple[str, str]] = []

    def save(fig, name: str, caption: str) -> None:
        for ax in fig.axes:
            if ax.get_xlabel() == "step":
                low, high = ax.get_xlim()
                if high - low < 2:  # one or two steps: whole-step ticks, not 0.95 … 1.05
                    middle = (low + high) / 2
                    ax.set_xlim(math.floor(middle) - 1, math.ceil(middle) + 1)
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        fig.tight_layout()
        fig.savefig(run_dir / name, dpi=100)
        plt.close(fig)
        made.append((name, caption))

    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    for key, label in (("val/reward", "reward"), ("val/success", "success")):
        steps, values = _series(rows, key)
        if steps:
            ax.plot(steps, values, marker="o", label=label)
    ax.set(xlabel="step", ylabel="mean reward · share solved", ylim=(-0.05, 1.05))
    ax.set(title="Validation")
    _legend(ax)
    ax.grid(alpha=0.3)
    save(fig, "val.png", "Val reward and success rate over steps (step 0 is the base model).")

    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    steps, mean = _series(rows, "train/reward_mean")
    _, std = _series(rows, "train/reward_std")
    if steps:
        ax.plot(steps, mean, marker="o", label="mean")
        if len(std) == len(mean):
            ax.fill_between(
                steps,
                [m - s for m, s in zip(mean, std, strict=False)],
                [m + s for m, s in zip(mean, std, strict=False)],
                alpha=0.25,
                label="± std",
            )
        skipped = sorted({r["step"] for r in rows if r.get("train/skipped_update")})
        if skipped:
            by_step = dict(zip(steps, mean, strict=False))
            ax.scatter(
                skipped,
                [by_step.get(x, 0.0) for x in skipped],
                marker="x",
                s=80,
                color="#c62828",
                zorder=3,
                label="no update",
            )
        _legend(ax)
    ax.set(xlabel="step", ylabel="reward", title="Training reward")
    ax.grid(alpha=0.3)
    save(fig, "train_reward.png", "Reward of the training attempts: mean and spread per step.")

    steps, every = _series(rows, "train/success")
    if steps:
        fig, ax = plt.subplots(figsize=(6.4, 3.4))
        ax.plot(steps, every, marker="o", label="every attempt")
        by_step = {r["step"]: r for r in rows if "train/success" in r}
        own = [_own_success(by_step[s]) for s in steps]
        if own != every:
            ax.plot(steps, own, marker="s", label="the model's own (not started by the loop)")
        ax.set(xlabel="step", ylabel="share solved", ylim=(-0.05, 1.05))
        ax.set(title="Training success")
        _legend(ax)
        ax.grid(alpha=0.3)
        save(
            fig,
            "train_success.png",
            "Share of the training attempts solved per step, and of the model's own: the "
            "attempts whose start the loop chose (explored, demonstrated, guided) left out.",
        )

    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    files = _trajectory_files(run_dir, "train")
    label = "judge score"
    samples, names = [], []
    for path in [files[0], files[-1]] if len(files) > 1 else files:
        trajs = [t for g in read_groups(path) for t in g.trajectories]
        scores = [t.metrics["reward_ruler"] for t in trajs if "reward_ruler" in t.metrics]
        if not scores:
            scores, label = [t.reward for t in trajs if t.reward is not None], "reward"
        samples.append(scores)
        names.append(f"step {int(path.stem)}")
    if samples:  # side by side, not overlaid: two colours that never blend
        colors = ["#90a4ae", "#1565c0"][: len(samples)]
        ax.hist(samples, bins=10, range=(0, 1), label=names, color=colors)
        _legend(ax)
    ax.set(xlabel=label, ylabel="attempts", title=f"Distribution of {label}s")
    save(fig, "scores.png", f"Distribution of {label}s, first and latest training step.")

    parts = [(k, n) for k, n in _PARTS if _series(rows, k)[0]]
    if parts:
        fig, ax = plt.subplots(figsize=(6.4, 3.4))
        for key, name in parts:
            steps, values = _series(rows, key)
            ax.plot(steps, values, marker="o", label=name)
        ax.set(xlabel="step", ylabel="mean per attempt", ylim=(-0.05, 1.05))
        ax.set(title="Reward components (training attempts)")
        _legend(ax, fontsize="small")
        ax.grid(alpha=0.3)
        save(fig, "reward_parts.png", "Components of the reference reward, per training step.")

    steps, drawn = _series(rows, "train/groups_drawn")
    if steps:
        _, trained = _series(rows, "train/groups_trained")
        fig, ax = plt.subplots(figsize=(6.4, 3.4))
        ax.bar(steps, trained, label="trained (rewards differ)")
        tied = [d - t for d, t in zip(drawn, trained, strict=False)]
        ax.bar(steps, tied, bottom=trained, label="tied (no signal)", color="#bbb")
        ax.set(xlabel="step", ylabel="groups", title="Groups per step")
        _legend(ax)
        save(fig, "signal.png", "Groups drawn per step: trained, and tied (replaced, no signal).")

    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    for key, name in (("train/turns", "turns"), ("train/tool_errors", "tool errors")):
        steps, values = _series(rows, key)
        if steps:
            ax.plot(steps, values, marker="o", label=f"{name} per attempt")
    ax.set(xlabel="step", title="Agent behaviour (training attempts)")
    _legend(ax)
    ax.grid(alpha=0.3)
    save(fig, "behaviour.png", "Turns and tool errors per attempt, per training step.")

    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    bottom: dict[int, float] = {}
    for key, name in _PHASES:
        steps, values = _series(rows, key)
        if steps:
            ax.bar(steps, values, bottom=[bottom.get(s, 0.0) for s in steps], label=name)
            for s, v in zip(steps, values, strict=False):
                bottom[s] = bottom.get(s, 0.0) + v
    ax.set(xlabel="step", ylabel="seconds", title="Wall time per phase")
    if bottom:  # beside the plot: a legend inside hides a bar
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    save(
        fig,
        "time.png",
        "Where each step's time went (step 0's and each evaluated step's evaluation included).",
    )

    trainer = [(k, n) for k, n in _TRAINER if _series(rows, k)[0]]
    if trainer:
        fig, axes = plt.subplots(1, len(trainer), figsize=(2.6 * len(trainer), 2.6))
        for ax, (key, name) in zip(list(getattr(axes, "flat", [axes])), trainer, strict=False):
            steps, values = _series(rows, key)
            ax.plot(steps, values, marker="o", markersize=3)
            ax.set(xlabel="step", title=name)
            ax.title.set_fontsize("small")
            ax.grid(alpha=0.3)
        save(
            fig,
            "trainer.png",
            "The trainer per step: loss, gradient norm (before clipping), KL to the base model "
            "(0 without a KL term), the share of tokens whose ratio was clipped, and how far "
            "log-probabilities moved from the rollout's (mean absolute).",
        )
    return made


_COUNTS = ("attempts", "failed_attempts", "turns", "tool_calls", "tool_errors")


def _fmt(value: Any, key: str = "") -> str:
    if isinstance(value, float) and math.isnan(value):
        return "–"
    if isinstance(value, float) and key in ("success", "judged_success", "completed"):
        return f"{value:.0%}"
    if isinstance(value, float) and key in _COUNTS and value.is_integer():
        return str(int(value))  # counts are whole numbers: "2", not "2.000"
    if isinstance(value, float):
        return f"{value:.2f}" if key in _COUNTS else f"{value:.3f}"
    return html.escape(str(value))


def _summary_table(rows: list[dict[str, Any]]) -> str:
    vals = [r for r in rows if "val/attempts" in r]
    if not vals:
        return "<p>No evaluation yet.</p>"
    first, last = vals[0], vals[-1]
    keys = ["success", "judged_success", "reward", "completed", "turns", "tool_errors",
            "reward_ruler", "judge_agreement", "attempts"]  # fmt: skip
    head = (
        f"<tr><th>val</th><th>step {html.escape(str(first['step']))}</th>"
        f"<th>step {html.escape(str(last['step']))}</th></tr>"
    )
    before, after = (counts(split_metrics(r)) for r in (first, last))

    def cell(row: dict[str, Any], key: str, counted: tuple[int, int] | None) -> str:
        if key == "success" and counted is not None:
            return html.escape(rate(*counted))
        return _fmt(row.get("val/" + key), key)

    labels = {"judged_success": "judged a success", "judge_agreement": "judge's passes agree"}
    body = "".join(
        f"<tr><td>{labels.get(k, k)}</td><td>{cell(first, k, before)}</td>"
        f"<td>{cell(last, k, after)}</td></tr>"
        for k in keys
        if f"val/{k}" in first or f"val/{k}" in last
    )
    # by calls needed, and the yes/no questions beside a constant answer (which scores there
    # without reading)
    for label, describe in (("success by calls needed", describe_chains),
                            ("yes/no questions", describe_yes_no)):  # fmt: skip
        cells = [describe(split_metrics(r)) for r in (first, last)]
        if any(cells):
            body += (
                f"<tr><td>{label}</td>"
                + "".join(f"<td>{html.escape(c or '–')}</td>" for c in cells)
                + "</tr>"
            )
    moved = ""
    if before and after and first is not last:
        steps = f"from step {first['step']} to {last['step']}"
        moved = (
            f"<p>Val success {html.escape(steps)}: {html.escape(difference(before, after))}.</p>"
        )
    return f"<table>{head}{body}</table>{moved}"


def _legend(ax: Any, fontsize: str | None = None) -> None:
    """A legend, where something is labelled (an empty one only warns)."""
    if ax.get_legend_handles_labels()[1]:
        ax.legend(loc="best", fontsize=fontsize)


def _clip(text: str, limit: int = 1500) -> str:
    return text if len(text) <= limit else text[:limit] + f" … [{len(text) - limit} more chars]"


def _stop_reason(t: Trajectory) -> str:
    calls = any(m.get("tool_calls") for m in t.messages)
    if not t.tools and not calls:  # one reply, no tools (AutoRL): "completed" = it ended itself
        if t.choices and t.choices[-1].finish_reason == "length":
            return "the reply was cut at the token limit"
        return "the reply ended on its own"
    if t.metrics.get("completed"):
        return "called complete_task"
    if t.metrics.get("hit_context_limit"):
        return "the conversation outgrew the context"
    if t.choices and t.choices[-1].finish_reason == "length":
        return "the reply was cut at the token limit"
    if t.metrics.get("ran_out_of_turns"):
        return "ran out of turns"
    return "replied without a tool call"


def _render(t: Trajectory, reference: str | None = None) -> str:
    parts = []
    for m in t.messages:
        role = html.escape(str(m.get("role", "?")))
        body = html.escape(_clip(str(m.get("content") or "")))
        for call in m.get("tool_calls") or []:
            fn = call.get("function", {})
            body += (
                f'<div class="call">→ {html.escape(str(fn.get("name", "?")))}'
                f"({html.escape(_clip(str(fn.get('arguments') or ''), 400))})</div>"
            )
        block = f'<div class="msg {role}"><b>{role}</b><pre>{body}</pre></div>'
        if role == "system":  # the same long text in every attempt: folded
            block = f"<details><summary>system prompt</summary>{block}</details>"
        parts.append(block)
    shown = ("success", "completed", "turns", "tool_errors", "reward_reference", "reward_ruler")
    metrics = ", ".join(f"{k} {_fmt(t.metrics[k], k)}" for k in shown if k in t.metrics)
    metrics = metrics.replace("tool_errors", "tool errors")
    reward = _fmt(t.reward) if t.reward is not None else "–"
    answer = t.metadata.get("final_answer")
    outcome = f"stop: {_stop_reason(t)} · answer {answer if answer is not None else '–'}"
    if reference is not None:
        outcome += f" · reference {reference}"
    if t.metadata.get("first_arguments") is not None:  # the loop made the whole first call
        call = f"{t.metadata['first_tool']}({t.metadata['first_arguments']})"
        pinned = int(t.metadata.get("demonstrated_calls", 1))
        more = f" and the {pinned - 1} after it" if pinned > 1 else ""
        outcome += f" · demonstrated: first call {call}{more}, pinned by the loop"
    elif t.metadata.get("first_tool") is not None:  # the loop chose the first call (exploring)
        outcome += f" · exploring: first call {t.metadata['first_tool']}, chosen by the loop"
    return (
        f'<div class="traj"><p><b>reward {reward}</b> · scenario '
        f"{html.escape(str(t.metadata.get('scenario_id')))} · {metrics}<br>"
        f"{html.escape(_clip(outcome, 400))}</p>" + "".join(parts) + "</div>"
    )


def _references(run_dir: Path) -> dict[str, str]:
    """Reference answers by scenario id, from the scenarios stored with the run (its own and
    its hindsight tasks)."""
    from mcprl.scenarios import ScenarioSet

    out: dict[str, str] = {}
    for name in ("scenarios.jsonl", "hindsight.jsonl"):
        path = run_dir / name
        try:
            scenarios = ScenarioSet.load(path) if path.is_file() else ScenarioSet()
        except Exception:  # the report shows what it can
            continue
        out |= {
            s.id: str(s.reference.answer)
            for s in scenarios
            if s.reference is not None and s.reference.answer is not None
        }
    return out


def _best_and_worst(run_dir: Path) -> tuple[int | None, list[Trajectory], list[Trajectory]]:
    files = _trajectory_files(run_dir, "train")
    if not files:
        return None, [], []
    trajs = [t for g in read_groups(files[-1]) for t in g.trajectories if t.reward is not None]
    ranked = sorted(trajs, key=lambda t: t.reward, reverse=True)
    k = min(2, len(ranked) // 2) or len(ranked)
    return int(files[-1].stem), ranked[:k], ranked[::-1][:k] if len(ranked) > 1 else []


_WIDE_PLOTS = ("trainer.png",)  # several panels side by side: the page's full width
_WIDE = ' class="wide"'

_CSS = """
body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
h1{margin-bottom:0}.sub{color:#666;margin-top:.3em}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:.3em .8em}
.plots{display:grid;grid-template-columns:repeat(auto-fill,minmax(480px,1fr));gap:1em}
figure{margin:0}figure.wide{grid-column:1/-1}
figure img{width:100%;border:1px solid #eee}figcaption{color:#555;font-size:.9em}
.cols{display:grid;grid-template-columns:1fr 1fr;gap:1.5em}
.traj{border:1px solid #ddd;border-radius:6px;padding:.5em;margin-bottom:1em;font-size:.85em}
.msg{margin:.3em 0;padding:.3em .5em;border-radius:4px}.msg pre{white-space:pre-wrap;margin:.2em 0}
.system{background:#f3f3f3}.user{background:#e8f0fe}.assistant{background:#e6f4ea}
.tool{background:#fef7e0}.call{font-family:monospace;color:#1a5e20}
"""


def write_report(run_dir: str | Path) -> Path:
    """Write the plots and `report.html` into `run_dir`; return the HTML's path."""
    run_dir = Path(run_dir)
    if not (run_dir / "model.json").is_file():
        raise FileNotFoundError(
            f"{run_dir} is not a training run (no model.json); give PROJECT/MODEL under .mcprl "
            "or the run's directory"
        )
    info = json.loads((run_dir / "model.json").read_text(encoding="utf-8"))
    rows = RunStore(
        run_dir.parent.parent, run_dir.parent.name, run_dir.name, read_only=True
    ).history()
    plots = _plots(run_dir, rows)
    step, best, worst = _best_and_worst(run_dir)
    steps = [str(r["step"]) for r in rows]
    span = html.escape(f"{steps[0]}–{steps[-1]}" if steps else "0–0")
    figures = "".join(
        f"<figure{_WIDE if name in _WIDE_PLOTS else ''}>"
        f'<img src="{html.escape(name)}" alt="{html.escape(caption)}">'
        f"<figcaption>{html.escape(caption)}</figcaption></figure>"
        for name, caption in plots
    )
    refs = _references(run_dir)

    def card(t: Trajectory) -> str:
        return _render(t, refs.get(str(t.metadata.get("scenario_id"))))

    trajectories = (
        f"<h2>Attempts at step {html.escape(str(step))}</h2><div class='cols'><div><h3>Best</h3>"
        + "".join(map(card, best))
        + "</div><div><h3>Worst</h3>"
        + "".join(map(card, worst))
        + "</div></div>"
        if step is not None
        else "<p>No training step yet.</p>"
    )
    page = f"""<!doctype html><html><head><meta charset="utf-8">
<title>mcprl report: {html.escape(run_dir.parent.name)}/{html.escape(run_dir.name)}</title>
<style>{_CSS}</style></head><body>
<h1>{html.escape(run_dir.parent.name)}/{html.escape(run_dir.name)}</h1>
<p class="sub">base model {html.escape(str(info.get("base_model")))} · steps
{span} · written {datetime.now():%Y-%m-%d %H:%M}</p>
<h2>Validation: first and latest evaluation</h2>{_summary_table(rows)}
{_updates(rows)}
{_judge_losses(rows)}
{_judge_spending(rows)}
{_settings(run_dir, info)}
<div class="plots">{figures}</div>
{trajectories}
</body></html>"""
    out = run_dir / "report.html"
    out.write_text(page, encoding="utf-8")
    return out


class ReportObserver:
    """Writes a `TrainingRun`'s report when the run ends (or is interrupted), into the run's
    directory, or beside a copy of its records when the backend keeps it elsewhere; sets
    `summary.report`. A report that cannot be written is said, and the run's data is kept."""

    async def __call__(self, event: Any) -> None:
        from mcprl.train import RunEnded

        if not isinstance(event, RunEnded) or not event.completed:
            return
        run = event.run
        try:
            if not run.kept_here:  # copy the run's records here
                await export_run(run.backend, run.model, run.workdir)
            event.summary.report = str(write_report(run.run_dir))
        except Exception as exc:  # the run's data is safe; only the report is missing
            logger.warning("could not write the report: %s", exc)
            run.say(f"(no report: {exc})")
