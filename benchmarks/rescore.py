"""Held-out attempts a `learning.py` run saved, checked again under today's reference check: how
a change to the check moves a run's figures without training again.

    python benchmarks/rescore.py /tmp/runs/L233 [--scenarios scenarios/notes.jsonl]

Each saved attempt (`evals/*/*/MODEL.jsonl`, one group a line) is checked with `is_success`
against its scenario, from `--scenarios` or else the run's own `learning/*/scenarios.jsonl`,
with `match` derived again (`check_named_arguments`; a server's writing tools are not known
here: a tool whose calls the file checks already is taken for one, so a run's own file from
before writes were checked checks none, and the script says so). Per
model (the base, and the trained adapter): successes as saved, and now, by the number of calls
the task takes.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from mcprl.rewards import is_success
from mcprl.scenarios import Scenario, ScenarioSet, check_named_arguments
from mcprl.types import Trajectory


def _scenarios(run: Path, given: Path | None) -> dict[str, Scenario]:
    files = [given] if given else sorted(run.glob("learning/*/scenarios.jsonl"))
    if not files:
        raise SystemExit(f"{run} holds no learning/*/scenarios.jsonl; name one with --scenarios")
    out = {}
    checked = False  # whether any call carries a `match`: a file from before 2026-12-04 doesn't
    for file in files:
        for s in ScenarioSet.load(file):
            if s.reference is not None:  # a call checked already is taken for a write
                writes = {c.tool for c in s.reference.calls if c.match}
                checked = checked or bool(writes)
                ref = check_named_arguments(s.reference, s.task, writes)
                s = s.model_copy(update={"reference": ref})
            out[s.id] = s
    if not checked and given is None:
        print(
            f"note: no call in {run}'s own scenarios names the values it must carry (`match`), "
            "so writes go unchecked; pass --scenarios with today's file (scenarios/notes.jsonl "
            "for example:notes) to check them",
            file=sys.stderr,
        )
    return out


def rescore(run: Path, given: Path | None = None) -> dict[str, dict]:
    scenarios = _scenarios(run, given)
    models: dict[str, dict] = {}
    for file in sorted(run.glob("evals/*/*/*.jsonl")):
        label = "trained" if "@" in file.stem else "base"
        m = models.setdefault(label, {"saved": 0, "now": 0, "n": 0, "by_calls": Counter()})
        for line in file.read_text().splitlines():
            group = json.loads(line)
            scenario = scenarios[group["scenario_id"]]
            calls = len(scenario.reference.calls)
            for t in group["trajectories"]:
                attempt = Trajectory.model_validate(t)
                ok = is_success(attempt, scenario)
                m["n"] += 1
                m["saved"] += attempt.metrics.get("success", 0.0) >= 1.0
                m["now"] += ok
                m["by_calls"][calls] += ok
    return models


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a learning.py --path")
    parser.add_argument("--scenarios", type=Path, help="the scenario file (else the run's own)")
    args = parser.parse_args()
    for label, m in rescore(args.run, args.scenarios).items():
        by = ", ".join(f"{k} call{'s' * (k != 1)} {v}" for k, v in sorted(m["by_calls"].items()))
        print(f"{label}: saved {m['saved']} of {m['n']}, now {m['now']} ({by})")


if __name__ == "__main__":
    main()
