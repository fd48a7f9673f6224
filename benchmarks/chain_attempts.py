"""What a run's own attempts at chains did, step by step.

For every training step of a run (its `trajectories/train/NNNN.jsonl`), the attempts the model
made by itself (not demonstrated: no pinned first call) at scenarios whose reference takes two
or more calls: how many made two or more tool calls, how many wrote a number from an earlier
tool result (one that is not in the task) into a later call's arguments, and how many succeeded.

    python benchmarks/chain_attempts.py RUN_DIR [--split val]

RUN_DIR is a run's directory (`<path>/<project>/<name>`, holding `scenarios.jsonl`).
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


def attempt_row(messages: list[dict], task_numbers: set[float]) -> tuple[int, bool]:
    """(tool calls made, other than complete_task; whether a later call used an earlier result)"""
    seen: set[float] = set()
    calls = 0
    fed = False
    for m in messages:
        if m["role"] == "assistant":
            for call in m.get("tool_calls") or []:
                if call["function"]["name"] == COMPLETE_TASK:
                    continue
                calls += 1
                used = _numbers(call["function"].get("arguments") or "")
                fed = fed or (calls > 1 and bool(used & (seen - task_numbers)))
        elif m["role"] == "tool":
            seen |= _numbers(m.get("content") or "")
    return calls, fed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--split", default="train", choices=["train", "val"])
    args = parser.parse_args()
    scenarios = {s.id: s for s in ScenarioSet.load(args.run / "scenarios.jsonl")}
    totals = [0, 0, 0, 0]
    print("step  own attempts at chains  >=2 calls  fed a result forward  succeeded")
    for path in sorted((args.run / "trajectories" / args.split).glob("*.jsonl")):
        row = [0, 0, 0, 0]
        for line in path.read_text().splitlines():
            group = json.loads(line)
            s = scenarios.get(group["scenario_id"])
            if s is None or s.reference is None or len(s.reference.calls) < 2:
                continue
            task = _numbers(s.task)
            for t in group["trajectories"]:
                if "first_arguments" in t.get("metadata", {}):
                    continue
                calls, fed = attempt_row(t["messages"], task)
                ok = t.get("metrics", {}).get("success", 0) >= 1
                for i, v in enumerate((1, calls >= 2, fed, ok)):
                    row[i] += int(v)
        totals = [a + b for a, b in zip(totals, row, strict=True)]
        print(f"{path.stem:>4}  {row[0]:>22}  {row[1]:>9}  {row[2]:>20}  {row[3]:>9}")
    print(f"{'all':>4}  {totals[0]:>22}  {totals[1]:>9}  {totals[2]:>20}  {totals[3]:>9}")


if __name__ == "__main__":
    main()
