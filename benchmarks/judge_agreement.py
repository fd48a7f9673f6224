"""Does the local judge rank attempts the way the reference answers do?

    python benchmarks/judge_agreement.py RUN_DIR/trajectories/train/*.jsonl \
        --scenarios RUN_DIR/scenarios.jsonl --max-groups 12

Takes recorded training groups (from any run) and, for every group whose reference rewards
differ, asks RULER with the local base model (no adapter, as `mcprl train` uses it when no other
judge is configured) to score the group twice: with the default rubric, and with the rubric plus
the scenario's reference answer ("a correct final answer is …"). For each pair of attempts whose
reference rewards differ, it counts whether the judge orders them the same way (a judge tie
counts one half). 50% is a coin; the reference reward itself is 100%.

Prints the agreement per mode and writes `benchmarks/results/judge_agreement.json`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import anyio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._machine import describe_machine  # noqa: E402
from mcprl.scenarios import ScenarioSet  # noqa: E402
from mcprl.serving import LocalServer  # noqa: E402
from mcprl.train import local_judge  # noqa: E402
from mcprl.types import read_groups  # noqa: E402
from ruler import DEFAULT_RUBRIC  # noqa: E402


def agreement(reference: list[float], judged: list[float]) -> tuple[float, int, int]:
    """Over the pairs whose reference rewards differ: how many the judge orders alike (a judge
    tie counts one half), how many pairs, and how many of them the judge ties."""
    agree, pairs, ties = 0.0, 0, 0
    for i, j in itertools.combinations(range(len(reference)), 2):
        if reference[i] == reference[j]:
            continue
        pairs += 1
        ties += judged[i] == judged[j]
        same = (reference[i] - reference[j]) * (judged[i] - judged[j])
        agree += 1.0 if same > 0 else 0.5 if judged[i] == judged[j] else 0.0
    return agree, pairs, ties


def with_reference(rubric: str, answer: str) -> str:
    return f"{rubric}\n\nA correct final answer to this task is: {answer}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("groups", nargs="+", help="trajectory group files (JSONL)")
    p.add_argument("--scenarios", required=True)
    p.add_argument("--max-groups", type=int, default=12)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "judge_agreement.json"))
    args = p.parse_args()

    by_id = {s.id: s for s in ScenarioSet.load(args.scenarios)}
    groups = [
        g
        for path in args.groups
        for g in read_groups(path)
        if len({t.reward for t in g.trajectories}) > 1 and g.scenario_id in by_id
    ][: args.max_groups]
    modes = {"default rubric": None, "rubric + reference answer": "reference"}
    totals = {m: [0.0, 0, 0] for m in modes}
    scores: list[dict] = []
    started = time.perf_counter()
    with LocalServer("smollm2-135m") as server:
        judge = local_judge("smollm2-135m", server.base_url, server.api_key)
        for g in groups:
            reference = [t.reward for t in g.trajectories]
            answer = by_id[g.scenario_id].reference.answer
            for mode, extra in modes.items():
                rubric = with_reference(DEFAULT_RUBRIC, answer) if extra and answer else None
                result = anyio.run(
                    lambda rubric=rubric, g=g: judge.score(
                        [t.messages for t in g.trajectories], tools=g.trajectories[0].tools,
                        rubric=rubric,
                    )
                )  # fmt: skip
                agree, pairs, ties = agreement(reference, result.rewards)
                for k, v in enumerate((agree, pairs, ties)):
                    totals[mode][k] += v
                scores.append({"scenario": g.scenario_id, "mode": mode, "reference": reference,
                               "judge": list(result.rewards)})  # fmt: skip
                print(
                    f"{g.scenario_id} {mode}: {agree:.1f}/{pairs} ({ties} tied); reference "
                    f"{_short(reference)}, judge {_short(result.rewards)}",
                    flush=True,
                )
    rows = {m: {"agreement": a / max(n, 1), "pairs": n, "judge_ties": t}
            for m, (a, n, t) in totals.items()}  # fmt: skip
    results = {"machine": describe_machine(), "groups": len(groups), "modes": rows,
               "scores": scores, "seconds": time.perf_counter() - started}  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(f"\n{results['machine']}\n{len(groups)} groups with differing reference rewards")
    print("| judge (local SmolLM2-135M) | pairs ordered as the reference reward | pairs | "
          "pairs the judge tied |")  # fmt: skip
    print("|---|---:|---:|---:|")
    for mode, row in rows.items():
        print(f"| {mode} | {row['agreement']:.0%} | {row['pairs']} | {row['judge_ties']} |")


def _short(values) -> str:
    return "[" + ", ".join(f"{v:.2f}" for v in values) + "]"


if __name__ == "__main__":
    main()
