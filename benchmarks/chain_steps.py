"""How often a model makes the call a chain needs next, given the calls before it.

    python benchmarks/chain_steps.py --path RUNS --model base --model NAME@STEP
        [--project learning] [--server example:calculator] [--scenarios FILE] [--split val]
        [--attempts 4] [--seed 1000] [--out FILE.json] [--save GROUPS.jsonl]

For each task of the split whose reference is a chain of 2+ calls, and each step k of it, the
attempts start with the reference's first k calls made for them (`RolloutConfig.guided_calls`)
and end after their own next call (`stop_after_calls`): the attempts `mcprl train --subtasks`
practises, here on held-out tasks and seeds. A success is the reference's call k+1 (same tool,
matching arguments; `mcprl.curriculum.subtask`). It prints, per model, the successes by step
and by kind of chain (the reference's tools in order), so a run that trained chains' steps
shows whether each step got better even where no whole chain finishes.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mcprl.backends import LocalBackend
from mcprl.collect import collect_groups, mark_success, score_groups
from mcprl.curriculum import relabel_subtask
from mcprl.evaluate import backend_models
from mcprl.rewards import Reward
from mcprl.rollout import RolloutConfig
from mcprl.scenarios import ScenarioSet


async def _probe(args: argparse.Namespace, backend: LocalBackend) -> dict:
    scenarios = ScenarioSet.load(args.scenarios)
    pool = [s for s in scenarios if s.split == args.split]
    chains = [s for s in pool if s.reference is not None and len(s.reference.calls) >= 2]
    if not chains:
        raise SystemExit(f"no task of 2+ reference calls in the {args.split} split")
    models = await backend_models(args.model, backend, project=args.project)
    table: dict = {}
    for spec, model in zip(args.model, models, strict=True):
        cells: dict = defaultdict(lambda: [0, 0])
        for k in range(max(len(s.reference.calls) for s in chains)):
            at = [s for s in chains if len(s.reference.calls) > k]
            start = {"guided_calls": k, "stop_after_calls": k + 1}
            groups = await collect_groups(
                model, at, args.server, RolloutConfig(), attempts=args.attempts,
                seed=args.seed, progress=False, starts=[[start] * args.attempts] * len(at),
            )  # fmt: skip
            parts = {}
            for g, s in zip(groups, at, strict=True):
                part = relabel_subtask(g, s, k)
                parts[part.id] = part
            check = Reward.of("reference").scorer(parts)
            groups = await score_groups(groups, check, progress=False)
            mark_success(groups, parts)
            if args.save:
                with Path(args.save).open("a") as f:
                    for g in groups:
                        f.write(json.dumps({"model": spec, **g.model_dump(mode="json")}) + "\n")
            for g, s in zip(groups, at, strict=True):
                right = sum(t.metrics.get("success", 0.0) >= 1.0 for t in g.trajectories)
                kind = " ".join(c.tool for c in s.reference.calls)
                for key in (f"step {k + 1}", f"{kind}, step {k + 1}", "all"):
                    cells[key][0] += right
                    cells[key][1] += len(g.trajectories)
        table[spec] = dict(cells)
        print(json.dumps({spec: {k: f"{a} of {b}" for k, (a, b) in cells.items()}}), flush=True)
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", help="as `mcprl eval --model` (default base)")
    parser.add_argument("--path", default=".mcprl", help="where the runs of --model live")
    parser.add_argument("--project", default="learning")
    parser.add_argument("--server", default="example:calculator")
    parser.add_argument("--scenarios", default="scenarios/calculator.jsonl")
    parser.add_argument("--split", default="val")
    parser.add_argument("--attempts", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1000)
    parser.add_argument("--out", help="write the table here as JSON")
    parser.add_argument("--save", help="append every attempt here (JSONL, a group a line)")
    args = parser.parse_args()
    args.model = args.model or ["base"]
    with LocalBackend(args.path) as backend:
        table = anyio.run(_probe, args, backend)
    for spec, cells in table.items():
        print(f"\n{spec}")
        for key, (right, total) in sorted(cells.items(), key=lambda kv: (kv[0] != "all", kv[0])):
            print(f"  {key}: {right} of {total}")
    if args.out:
        Path(args.out).write_text(json.dumps({"command": sys.argv, "table": table}, indent=2))


if __name__ == "__main__":
    main()
