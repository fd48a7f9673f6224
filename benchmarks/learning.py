"""Does training help? The default tiny model on the calculator example, offline, fixed seeds.

    python benchmarks/learning.py --steps 8 --seeds 3

The calculator server runs over HTTP on loopback; the curated scenarios (scenarios/calculator.jsonl,
36 train, 12 val) are the data. The script

1. evaluates the base model on the val split with each of `--seeds` sampling seeds: the mean and
   the seed-to-seed spread (sample standard deviation) of val success and reward;
2. trains with `mcprl train`'s loop (`mcprl.train.TrainingRun`) for `--steps` steps, once with the
   reference reward and once with RULER judged by the local base model (no adapter);
3. evaluates each trained adapter with the same seeds, and prints how far it is from the base
   model in units of the base model's spread, with the wall time of each run.

Results go to `benchmarks/results/learning.json`; `benchmarks/RESULTS.md` keeps the table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._machine import describe_machine  # noqa: E402
from mcprl.backends import LocalBackend  # noqa: E402
from mcprl.evaluate import evaluate_models  # noqa: E402
from mcprl.model import Model  # noqa: E402
from mcprl.rollout import RolloutConfig  # noqa: E402
from mcprl.scenarios import ScenarioSet  # noqa: E402
from mcprl.train import RunConfig, TrainingRun  # noqa: E402
from mcprl.training import TrainConfig  # noqa: E402
from tests.helpers import free_port  # noqa: E402

BASE = "smollm2-135m"


def _spread(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


async def _evaluate(model, val, server, rollout, seeds, attempts) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"success": [], "reward": []}
    for seed in seeds:
        rows, _ = await evaluate_models(
            [model], val, server, rollout, attempts=attempts, seed=seed, progress=False
        )
        for key in out:
            out[key].append(rows[0].metrics.get(key, 0.0))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--seeds", type=int, default=3, help="evaluation seeds (the spread)")
    p.add_argument("--groups-per-step", type=int, default=4)
    p.add_argument("--rollouts-per-group", type=int, default=8)
    p.add_argument("--val-attempts", type=int, default=2)
    p.add_argument("--max-turns", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--rewards", default="reference,ruler")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "learning.json"))
    args = p.parse_args()

    port = free_port()
    server_proc = subprocess.Popen(
        [sys.executable, str(ROOT / "examples" / "servers" / "calculator.py"), "--http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    server = f"http://127.0.0.1:{port}/mcp"
    time.sleep(3)
    scenarios = ScenarioSet.load(ROOT / "scenarios" / "calculator.jsonl")
    val = list(scenarios.val)
    rollout = RolloutConfig(max_turns=args.max_turns, max_tokens=args.max_tokens)
    seeds = [1000 + i for i in range(args.seeds)]
    results: dict = {"machine": describe_machine(), "args": vars(args), "runs": {}}
    try:
        with tempfile.TemporaryDirectory() as tmp, LocalBackend(tmp) as backend:
            for reward in args.rewards.split(","):
                config = RunConfig(
                    project="learning",
                    name=f"calc-{reward}",
                    steps=args.steps,
                    groups_per_step=args.groups_per_step,
                    rollouts_per_group=args.rollouts_per_group,
                    eval_every=0,
                    val_attempts=args.val_attempts,
                    reward=reward,
                    seed=0,
                    max_concurrency=16,
                    rollout=rollout,
                    train=TrainConfig(learning_rate=args.lr),
                    write_report=False,
                )
                run = TrainingRun(config, server, backend, say=print, progress=False)
                started = time.perf_counter()

                async def go(run=run):
                    await run.prepare(scenarios)
                    return await run.run()

                summary = anyio.run(go)
                seconds = time.perf_counter() - started
                if "base" not in results:  # the base model, on the same server and seeds
                    base = Model(name=BASE, base_url=backend.base_url, api_key="local")
                    results["base"] = anyio.run(
                        _evaluate, base, val, server, rollout, seeds, args.val_attempts
                    )
                    print("base:", json.dumps(results["base"]), flush=True)
                trained = Model(
                    name=f"{config.name}@{summary.last_step}",
                    base_url=backend.base_url,
                    api_key="local",
                )
                results["runs"][reward] = {
                    "seconds": seconds,
                    "times": summary.times,
                    "eval": anyio.run(
                        _evaluate, trained, val, server, rollout, seeds, args.val_attempts
                    ),
                }
                print(json.dumps(results["runs"][reward]), flush=True)
                Path(args.out).parent.mkdir(parents=True, exist_ok=True)
                Path(args.out).write_text(json.dumps(results, indent=2))  # so far
    finally:
        server_proc.terminate()
    _report(results)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))


def _report(results: dict) -> None:
    base = results["base"]
    print(f"\n{results['machine']}")
    print("| model | val success (mean ± sd over seeds) | val reward | Δ reward / base sd | time |")
    print("|---|---|---|---|---|")

    def row(name: str, ev: dict, seconds: float | None) -> None:
        s, r = ev["success"], ev["reward"]
        sd = _spread(base["reward"]) or float("nan")
        delta = (statistics.mean(r) - statistics.mean(base["reward"])) / sd
        when = f"{seconds / 60:.1f} min" if seconds else "–"
        print(
            f"| {name} | {statistics.mean(s):.1%} ± {_spread(s):.1%} | "
            f"{statistics.mean(r):.3f} ± {_spread(r):.3f} | {delta:+.1f} | {when} |"
        )

    row("base (SmolLM2-135M)", base, None)
    for reward, run in results["runs"].items():
        row(f"trained, {reward} reward", run["eval"], run["seconds"])


if __name__ == "__main__":
    main()
