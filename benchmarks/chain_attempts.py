"""What a run's own attempts at chains did, step by step.

For every training step of a run (its `trajectories/train/NNNN.jsonl`), the attempts the model
made by itself (not demonstrated: no pinned first call) at scenarios whose reference takes two
or more calls: how many made two or more tool calls, how many wrote a number from an earlier
tool result (one that is not in the task) into a later call's arguments, how many of the
reference's calls they made in order on average (a call counts when its tool and its result match
the reference's next call: `add(49, 576)` and `add(576, 49)` both do), and how many succeeded.

    python benchmarks/chain_attempts.py RUN_DIR [--split val]
    python benchmarks/chain_attempts.py RUN_DIR --evals EVAL.jsonl ...

RUN_DIR is a run's directory (`<path>/<project>/<name>`, holding `scenarios.jsonl`); `--evals`
reads the attempts of `mcprl eval` files (`<eval dir>/<model>.jsonl`) instead of the run's steps.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from mcprl.rollout import COMPLETE_TASK
from mcprl.scenarios import ScenarioSet

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def _numbers(text: str) -> set[float]:
    return {round(float(v), 4) for v in _NUMBER.findall(text)}


def attempt_row(messages: list[dict], task: str, reference: list) -> tuple[int, bool, int]:
    """(tool calls made, other than complete_task; whether a later call used an earlier result
    that is not in the `task`; how many of the `reference` calls it made, in order)"""
    task_numbers = _numbers(task)
    seen: set[float] = set()
    calls = done = 0
    fed = False
    tool = None
    for m in messages:
        if m["role"] == "assistant":
            for call in m.get("tool_calls") or []:
                tool = call["function"]["name"]
                if tool == COMPLETE_TASK:
                    continue
                calls += 1
                used = _numbers(call["function"].get("arguments") or "")
                fed = fed or (calls > 1 and bool(used & (seen - task_numbers)))
        elif m["role"] == "tool":
            result = _numbers(m.get("content") or "")
            seen |= result
            if done < len(reference) and tool == reference[done].tool:
                done += int(bool(result) and result == _numbers(reference[done].result or ""))
    return calls, fed, done


def _rows(path: Path, scenarios: dict, own: bool = True) -> list[float]:
    """[attempts, >=2 calls, fed forward, reference calls made, reference calls, succeeded]
    over the attempts in one file at chains (demonstrated ones left out where `own`)."""
    row = [0.0] * 6
    for line in path.read_text().splitlines():
        group = json.loads(line)
        s = scenarios.get(group["scenario_id"])
        if s is None or s.reference is None or len(s.reference.calls) < 2:
            continue
        for t in group["trajectories"]:
            if own and "first_arguments" in t.get("metadata", {}):
                continue
            calls, fed, done = attempt_row(t["messages"], s.task, s.reference.calls)
            ok = t.get("metrics", {}).get("success", 0) >= 1
            for i, v in enumerate((1, calls >= 2, fed, done, len(s.reference.calls), ok)):
                row[i] += float(v)
    return row


def _print(label: str, row: list[float]) -> None:
    steps = f"{row[3] / row[4]:.0%}" if row[4] else "-"
    cells = (row[0], row[1], row[2], steps, row[5])
    print(
        f"{label:>12}  {cells[0]:>8.0f}  {cells[1]:>9.0f}  {cells[2]:>8.0f}  {cells[3]:>15}"
        f"  {cells[4]:>9.0f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--split", default="train", choices=["train", "val"])
    parser.add_argument("--evals", type=Path, nargs="+", help="mcprl eval files to read instead")
    args = parser.parse_args()
    scenarios = {s.id: s for s in ScenarioSet.load(args.run / "scenarios.jsonl")}
    paths = args.evals or sorted((args.run / "trajectories" / args.split).glob("*.jsonl"))
    totals = [0.0] * 6
    print("  step/file  attempts  >=2 calls  fed fwd  reference calls  succeeded")
    for path in paths:
        row = _rows(path, scenarios, own=not args.evals)
        totals = [a + b for a, b in zip(totals, row, strict=True)]
        _print(path.stem[:12], row)
    _print("all", totals)


if __name__ == "__main__":
    main()
