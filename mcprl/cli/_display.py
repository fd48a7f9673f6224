"""What the commands print: servers, progress lines, a run's closing summary."""

from __future__ import annotations

import shutil
import sys
import textwrap
from typing import Any

from mcprl._stats import counts, describe_chains, difference, rate
from mcprl.cli._options import flags_for
from mcprl.mcp import ServerInfo

EXIT_INTERRUPTED = 130  # the shell's code for a process stopped by Ctrl-C (128 + SIGINT)
EXIT_USAGE = 2  # as argparse: the command, a flag or an input it names cannot be used
EXIT_BUDGET = 3  # the run stopped before its last step to keep the judge within --judge-budget


def exit_code(summary: Any) -> int:
    """What `mcprl train` and `autorl` exit with: 0 when the run reached its end."""
    if summary.interrupted:
        return EXIT_INTERRUPTED
    return EXIT_BUDGET if summary.stopped else 0


def say(text: str) -> None:
    """A line for the user on standard error, above any progress bar, with flags for the
    settings it names."""
    from tqdm.auto import tqdm

    tqdm.write(flags_for(text), file=sys.stderr)


def terminal_width() -> int:
    return max(60, min(shutil.get_terminal_size((100, 20)).columns, 140))


def _arguments(schema: dict[str, Any]) -> str:
    required = set(schema.get("required", []))
    parts = []
    for name, prop in (schema.get("properties") or {}).items():
        options = [o for o in prop.get("anyOf", []) if o.get("type") != "null"]
        if len(options) == 1:
            prop = {**prop, **options[0]}
        kind = prop.get("type") or "|".join(
            str(o.get("type")) for o in prop.get("anyOf", []) if o.get("type") != "null"
        )
        if "enum" in prop:
            kind = "|".join(map(str, prop["enum"][:6])) + ("|…" if len(prop["enum"]) > 6 else "")
        parts.append(f"{name}{'' if name in required else '?'}: {kind or 'any'}")
    return ", ".join(parts)


def _count(items: list[Any], noun: str) -> str:
    return f"{len(items)} {noun}{'' if len(items) == 1 else 's'}"


def print_server(info: ServerInfo) -> None:
    width = terminal_width()
    print(f"{info.name}: {_count(info.tools, 'tool')}, {_count(info.resources, 'resource')}")
    if info.instructions:
        print(textwrap.fill(info.instructions, width, initial_indent="  ", subsequent_indent="  "))
    print()
    for tool in info.tools:
        print(f"  {tool.name}({_arguments(tool.input_schema)})")
        description = " ".join(tool.description.split()) or "(no description)"
        indent = " " * 6
        print(textwrap.fill(description, width, initial_indent=indent, subsequent_indent=indent))
    if info.resources:
        print("\nresources:")
        for r in info.resources:
            print(f"  {r.uri}  {r.mime_type or ''}  {r.description or r.name}")


def stop_message(phase: str) -> str:
    if phase == "training":
        what = "the training step in progress finishes and is saved"
    elif phase in ("evaluation", "rollouts"):
        what = f"the {phase} in progress {'is' if phase == 'evaluation' else 'are'} dropped; "
        what += "every finished step is saved"
    else:
        what = "nothing has been trained yet"
    return f"stopping: {what}; Ctrl-C again to abort at once"


def peak_memory_gb() -> float | None:
    """This process's peak resident memory so far (the model, engine and trainer of a local
    run live in it), or None where the OS does not say."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1e9 if sys.platform == "darwin" else peak / 1e6  # bytes there, KiB on Linux


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def _own_attempts(training: dict[str, float]) -> str | None:
    """What the training attempts solved, and the model's own among them, where the loop
    started some (explored, demonstrated, guided): a success the loop set up is not one the
    model can repeat alone."""
    own = int(training.get("own_successes", 0)), int(training.get("own_attempts", 0))
    every = int(training.get("successes", 0)), int(training.get("checked_attempts", 0))
    if own[1] == every[1]:  # the loop started none
        return None
    return (
        f"{every[0]} of {every[1]} solved; the model's own (not started by the loop) "
        f"{own[0]} of {own[1]}"
        + (", so every success in training was the loop's" if every[0] and not own[0] else "")
    )


def print_summary(summary: Any, again: str) -> None:
    done = summary.last_step - summary.first_step
    state = "stopped early" if summary.interrupted or summary.stopped else "done"
    print(
        f"\n{summary.project}/{summary.name}: {state} at step {summary.last_step} of "
        f"{summary.target_steps} ({done} step{'' if done == 1 else 's'} this run); "
        f"reward {summary.reward}" + (f", judge {summary.judge}" if summary.judge else "")
    )
    keys = [
        k
        for k in ("success", "judged_success", "reward", "completed", "turns", "tool_errors")
        if k in summary.baseline or k in summary.final
    ]
    if keys:
        print(
            f"  {'val':<13}{'step ' + str(summary.baseline_step):>12}"
            f"{'step ' + str(summary.final_step):>12}"
        )
        for k in keys:
            cells = []
            for metrics in (summary.baseline, summary.final):
                v = metrics.get(k)
                pct = k in ("success", "judged_success", "completed")
                cells.append("–" if v is None else (f"{v:.0%}" if pct else f"{v:.3f}"))
            print(f"  {k:<13}{cells[0]:>12}{cells[1]:>12}")
    before, after = counts(summary.baseline), counts(summary.final)
    if before and after and summary.final_step != summary.baseline_step:
        print(f"  val success {before[0]} of {before[1]} → {after[0]} of {after[1]}: "
              f"{difference(before, after)}")  # fmt: skip
    elif after:
        print(f"  val success: {rate(*after)}")
    shown = {summary.baseline_step: summary.baseline, summary.final_step: summary.final}
    for step, metrics in shown.items():  # one line per evaluation shown
        if chains := describe_chains(metrics):
            print(f"  by calls needed, step {step}: {chains}")
    if done:
        updated = done - summary.steps_without_update - summary.steps_held
        print(
            f"  {updated} of {done} step{'' if done == 1 else 's'} updated the model"
            + (
                f"; in {summary.steps_without_update} every group tied, so nothing was learned "
                "from them"
                if summary.steps_without_update
                else ""
            )
            + (
                f"; {summary.steps_held} held their groups for a later step (--contrast)"
                if summary.steps_held
                else ""
            )
        )
    if own := _own_attempts(summary.training):
        print(f"  training attempts: {own}")
    if summary.groups_dropped:
        lost = sum(summary.groups_dropped.values())
        where = ", ".join(f"step {k}: {v}" for k, v in sorted(summary.groups_dropped.items()))
        print(f"  the judge failed on {lost} group{'' if lost == 1 else 's'} ({where}); "
              "they were not trained on")  # fmt: skip
    if summary.judge_spent:
        spent = summary.judge_spent
        cost = f", ${spent['cost_usd']:.4f}" if "cost_usd" in spent else " (price unknown)"
        print(f"  judge: {spent['tokens']:,.0f} tokens{cost}")
    if summary.stopped:
        print(f"  stopped: {summary.stopped}")
    if summary.times:
        print("  time: " + ", ".join(f"{k} {_duration(v)}" for k, v in summary.times.items()))
    if (peak := peak_memory_gb()) is not None:
        print(f"  memory: this process peaked at {peak:.2f} GB resident")
    print(f"  checkpoints: {summary.run_dir}/checkpoints")
    if summary.report:
        print(f"  report: {summary.report}")
    if summary.interrupted or summary.last_step < summary.target_steps:
        print(f"  resume: {again}" + (" (with a higher --judge-budget)" if summary.stopped else ""))
