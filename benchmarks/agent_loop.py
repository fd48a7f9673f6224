"""What the agent loop's defaults do for the base model: val success before any training.

    python benchmarks/agent_loop.py --attempts 4 --turns 2,3,4

The base SmolLM2-135M model attempts the curated calculator scenarios (`--split`, default val)
under loop variants, all with the same sampling seeds, side by side in one run:

- `plain`: every turn `tool_choice="required"`, `complete_task(summary)` (the loop before issue 11);
- `forced`: the last turn constrained to `complete_task` (`force_final_answer`);
- `forced+typed`: that, plus `complete_task(answer)` typed by the expected answer (`typed_answer`);
- `forced+typed+budget`: that, plus one turn per reference call and one to answer, at most
  `--turns` (`turn_budget="reference"`): today's defaults.

The first three give every scenario exactly `--turns` turns (`turn_budget="fixed"`).

It prints success, completion, mean reference reward and the share of groups whose rewards differ
(what GRPO can learn from), per variant and turn budget, and writes
`benchmarks/results/agent_loop.json`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import anyio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._machine import describe_machine  # noqa: E402
from mcprl.evaluate import evaluate_models  # noqa: E402
from mcprl.model import Model  # noqa: E402
from mcprl.rollout import RolloutConfig  # noqa: E402
from mcprl.scenarios import ScenarioSet  # noqa: E402
from mcprl.serving import LocalServer  # noqa: E402

VARIANTS = {
    "plain": {"force_final_answer": False, "typed_answer": False, "turn_budget": "fixed"},
    "forced": {"force_final_answer": True, "typed_answer": False, "turn_budget": "fixed"},
    "forced+typed": {"force_final_answer": True, "typed_answer": True, "turn_budget": "fixed"},
    "forced+typed+budget": {"force_final_answer": True, "typed_answer": True},
}


def informative_share(groups) -> float:
    """Groups whose rewards are not all equal, of all groups."""
    differ = [len({round(t.reward, 9) for t in g.trajectories}) > 1 for g in groups]
    return sum(differ) / max(len(differ), 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--server", default="example:calculator")
    p.add_argument("--scenarios", default=str(ROOT / "scenarios" / "calculator.jsonl"))
    p.add_argument("--split", choices=["train", "val"], default="val")
    p.add_argument("--attempts", type=int, default=4)
    p.add_argument("--turns", default="2,3,4")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "agent_loop.json"))
    args = p.parse_args()

    scenarios = getattr(ScenarioSet.load(args.scenarios), args.split).scenarios
    results: dict = {"machine": describe_machine(), "args": vars(args), "rows": []}
    with LocalServer("smollm2-135m") as server:
        model = Model(name="smollm2-135m", base_url=server.base_url, api_key=server.api_key)
        for turns in [int(t) for t in args.turns.split(",")]:
            for variant in args.variants.split(","):
                config = RolloutConfig(
                    max_turns=turns, max_tokens=args.max_tokens, **VARIANTS[variant]
                )
                started = time.perf_counter()
                rows, groups = anyio.run(
                    lambda c=config: evaluate_models(
                        [model],
                        scenarios,
                        args.server,
                        c,
                        attempts=args.attempts,
                        seed=args.seed,
                        max_concurrency=16,
                        progress=False,
                    )
                )
                m = rows[0].metrics
                row = {
                    "variant": variant,
                    "turns": turns,
                    "success": m.get("success", 0.0),
                    "completed": m.get("completed", 0.0),
                    "reward": m.get("reward", 0.0),
                    "informative_groups": informative_share(groups[model.served_name]),
                    "seconds": time.perf_counter() - started,
                }
                results["rows"].append(row)
                print(json.dumps(row), flush=True)
                Path(args.out).parent.mkdir(parents=True, exist_ok=True)
                Path(args.out).write_text(json.dumps(results, indent=2))
    print(f"\n{results['machine']}")
    print(f"{len(scenarios)} {args.split} scenarios x {args.attempts} attempts, seed {args.seed}")
    print("| variant | turns | success | completed | reward | groups that differ | time |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in results["rows"]:
        print(
            f"| {r['variant']} | {r['turns']} | {r['success']:.0%} | {r['completed']:.0%} | "
            f"{r['reward']:.3f} | {r['informative_groups']:.0%} | {r['seconds']:.0f} s |"
        )


if __name__ == "__main__":
    main()
