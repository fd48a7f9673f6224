"""Decoding speed after a training step in the same process: where the step runs matters.

    python benchmarks/decode_after_training.py [--rows 16] [--tokens 48] [--steps 2]

`LocalBackend` keeps the engine and the trainer in one process. torch runs CPU operations in an
OpenMP team per calling thread; once a second thread (the one a training step ran on) has a
team, the process has more OpenMP threads than cores and OpenMP stops spinning between parallel
regions, which a decoding step of many small operations pays for. This measures a decoding step
(`--rows` concurrent requests of a 900-token prompt, `--tokens` tokens each, EOS ignored, served
with the trainer's LoRA adapter as rollouts are) before and after real training steps
(`LoraTrainer.step` on a synthetic group), with the step run two ways, each in a fresh process:

- "own thread": under `engine.paused()` in a thread of its own (what `LocalBackend` did before);
- "engine thread": through `engine.run_exclusive` (what it does now).

It reports the median milliseconds per decoding step (the engine's own counters) and the ratio
after/before. The numbers are this machine's; compare the ratios.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODEL = "smollm2-135m"


def _group(tokenizer):
    from mcprl.types import Choice, Trajectory, TrajectoryGroup

    prompt = tokenizer.encode("Add 12 and 30 with the calculator, then report the sum. " * 20)
    attempts = []
    for i, reward in enumerate([1.0, 0.0, 0.5, 0.25, 0.0, 1.0]):
        tokens = tokenizer.encode(f' {{"name": "add", "arguments": {{"a": {i}, "b": 30}}}}' * 3)
        logprobs = [-1.0] * len(tokens)
        choice = Choice(
            message_index=0, prompt_token_ids=prompt, token_ids=tokens, logprobs=logprobs
        )
        attempts.append(Trajectory(reward=reward, choices=[choice]))
    return TrajectoryGroup(scenario_id="s", trajectories=attempts)


def measure(mode: str, rows: int, tokens: int, steps: int) -> dict:
    from mcprl.serving import Engine, SamplingParams, load_model, resolve_model
    from mcprl.training import LoraConfig, LoraTrainer, TrainConfig

    engine = Engine(load_model(MODEL, dtype="float32"))
    prompt = engine.tokenizer.encode("Hello " * 1000)[:900]
    pool = concurrent.futures.ThreadPoolExecutor(1)

    def decode() -> float:
        times = []
        for _ in range(3):
            before = dict(engine.stats)
            futures = [
                engine.submit(
                    prompt[: len(prompt) - i],
                    SamplingParams(max_tokens=tokens, ignore_eos=True, seed=i),
                    adapter="agent@0",
                )
                for i in range(rows)
            ]
            for f in futures:
                f.result()
            steps_run = engine.stats["steps"] - before["steps"]
            times.append((engine.stats["step_s"] - before["step_s"]) / steps_run * 1000)
        return statistics.median(times)

    def in_own_thread(fn):
        def held():
            with engine.paused():
                return fn()

        return pool.submit(held).result()

    run = engine.run_exclusive if mode == "engine thread" else in_own_thread
    try:
        trainer = run(lambda: LoraTrainer(resolve_model(MODEL), LoraConfig(), dtype="float32"))
        group = _group(trainer.tokenizer)
        with tempfile.TemporaryDirectory() as adapter:
            trainer.save(adapter)
            engine.load_adapter("agent@0", adapter)
        before = decode()
        after, train_s = [], []
        for _ in range(steps):
            out = run(lambda: trainer.step([group], TrainConfig(learning_rate=1e-3)))
            train_s.append(out["time_train_s"])
            after.append(decode())
    finally:
        engine.close()
        pool.shutdown()
    return {"mode": mode, "before_ms": before, "after_ms": after, "train_s": train_s}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--steps", type=int, default=2, help="training steps, each followed by a run")
    p.add_argument("--mode", help=argparse.SUPPRESS)  # one measurement, in this process
    args = p.parse_args()
    if args.mode:
        print(json.dumps(measure(args.mode, args.rows, args.tokens, args.steps)))
        return
    results = []
    for mode in ("own thread", "engine thread"):  # each in a fresh process: teams persist
        out = subprocess.run(
            [sys.executable, __file__, "--mode", mode, "--rows", str(args.rows),
             "--tokens", str(args.tokens), "--steps", str(args.steps)],
            check=True, capture_output=True, text=True, cwd=ROOT,
        )  # fmt: skip
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(
        f"decoding step with a LoRA adapter, {args.rows} rows of a 900-token prompt, "
        f"{args.tokens} tokens each (ms, median of 3 runs), before and after each of "
        f"{args.steps} training steps\n"
    )
    print("| training step runs on | before | after each step | after / before | train s |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for r in results:
        after = ", ".join(f"{a:.0f}" for a in r["after_ms"])
        ratio = max(r["after_ms"]) / r["before_ms"]
        train = ", ".join(f"{t:.1f}" for t in r["train_s"])
        print(f"| {r['mode']} | {r['before_ms']:.0f} | {after} | {ratio:.2f}x | {train} |")


if __name__ == "__main__":
    main()
