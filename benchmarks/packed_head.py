"""The engine with its output layer's weight packed once for oneDNN (the default on CPU), without
(`Engine(packed_weights=False)`), and with every linear layer packed, on agent-shaped requests.

    python benchmarks/packed_head.py [--pairs 3] [--rows 4] [--tokens 64] [--out F]

Each mode runs in a fresh process, the modes taking turns `--pairs` times (this machine's speed
drifts by 20% between minutes, so one run of each says little). A run loads the default model in
the dtype `mcprl train` picks, submits 4 prompts (a system prompt, a calculator question and the
calculator's tool block, ~530 tokens) with `--rows` sampled replies of `--tokens` tokens each,
all at once, and reports the engine's wall time, its prefill and decoding-step time, and the
tokens it drew. Reported per mode: medians, the ratio of wall times to `plain`, the bytes the
packed copies take, and whether every mode drew the same tokens.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODES = ("plain", "head", "all")

PROBE = """
import json, sys, time, torch
from mcprl.serving import Engine, SamplingParams, load_model, resolve_model
from mcprl.serving._chat import render_prompt
from mcprl.serving._packed import pack_linear
from tests.test_serving import CALC_TOOLS

mode, rows, tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
engine = Engine(load_model(resolve_model()), packed_weights=mode != "plain")
extra = 0
if mode == "all":  # on the engine's thread, as the engine packs its own
    layers = [m for m in engine.model.modules() if type(m) is torch.nn.Linear]
    extra = engine.run_exclusive(lambda: sum(pack_linear(m) for m in layers))
system = {"role": "system", "content": "You are a careful agent that uses tools. " * 30}
prompts = [
    render_prompt(engine.tokenizer, [system, {"role": "user", "content": f"What is {i * 37} "
                  f"times {i + 11}? Use the tools."}], CALC_TOOLS)
    for i in range(4)
]
params = SamplingParams(max_tokens=tokens, seed=1, ignore_eos=True, n=rows, temperature=1.0)
engine.generate_blocking(prompts[0], SamplingParams(max_tokens=8, n=2))  # warm up
before, started = dict(engine.stats), time.perf_counter()
futures = [engine.submit(p, params) for p in prompts]
drawn = [[c.token_ids for c in f.result()] for f in futures]
wall = time.perf_counter() - started
stats = {k: engine.stats[k] - before[k] for k in ("steps", "prefill_s", "step_s")}
print(json.dumps({"wall_s": wall, "prefill_s": stats["prefill_s"], "step_s": stats["step_s"],
                  "step_ms": 1e3 * stats["step_s"] / stats["steps"], "prompt": len(prompts[0]),
                  "packed_mb": (engine.packed_bytes + extra) / 1e6, "tokens": drawn}))
engine.close()
"""


def run(mode: str, rows: int, tokens: int) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, mode, str(rows), str(tokens)],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    if done.returncode:
        raise SystemExit(f"{mode}: exited {done.returncode}\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=3, help="rounds of the modes taking turns")
    p.add_argument("--rows", type=int, default=4, help="sampled replies per prompt (4 prompts)")
    p.add_argument("--tokens", type=int, default=64, help="tokens per reply")
    p.add_argument("--out", help="write the results here as JSON")
    args = p.parse_args()
    runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
    for _ in range(args.pairs):
        for mode in MODES:
            runs[mode].append(run(mode, args.rows, args.tokens))
    same = all(r["tokens"] == runs["plain"][0]["tokens"] for rs in runs.values() for r in rs)
    first = runs["plain"][0]
    print(
        f"4 prompts of {first['prompt']} tokens x {args.rows} replies of {args.tokens} "
        f"tokens, {args.pairs} runs a mode, taking turns; same tokens in every run: {same}\n"
    )
    print("| mode | packed copies | wall s (median) | prefill s | decoding step ms | speed |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    plain = statistics.median(r["wall_s"] for r in runs["plain"])
    summary = {}
    for mode, rs in runs.items():
        row = {k: statistics.median(r[k] for r in rs) for k in ("wall_s", "prefill_s", "step_ms")}
        row["packed_mb"], row["walls"] = rs[0]["packed_mb"], [r["wall_s"] for r in rs]
        summary[mode] = row
        print(f"| {mode} | {row['packed_mb']:.0f} MB | {row['wall_s']:.2f} | "
              f"{row['prefill_s']:.2f} | {row['step_ms']:.1f} | "
              f"{plain / row['wall_s']:.2f}x |")  # fmt: skip
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "same_tokens": same, "modes": summary}, f, indent=1)


if __name__ == "__main__":
    main()
