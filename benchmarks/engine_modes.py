"""The engine's CPU settings compared on agent-shaped requests: its output layer's weight packed
once for oneDNN or not (`Engine(packed_weights=...)`), every linear layer packed beside its plain
weight or in place of it (`Engine(swapped_weights=...)`), and its keys and values kept in
float32 or in the model's bfloat16 (`Engine(kv_dtype=...)`).

    python benchmarks/engine_modes.py [--modes plain head all] [--pairs 3] [--rows 4]
        [--tokens 64] [--out F]

Modes: `plain` (nothing packed, float32 cache), `head` (the output layer packed, float32 cache),
`all` (every linear layer packed, float32 cache), `bf16kv` (the output layer packed, bfloat16
cache), `swapped` (bfloat16 cache, the output layer packed and the other linear layers decoding
from packed weights alone: today's default). Each mode runs in a fresh process, the modes
taking turns `--pairs` times (this machine's speed drifts by 20% between minutes, so one run of
each says little). A
run loads the default model in the dtype `mcprl train` picks, submits 4 prompts (a system
prompt, a calculator question and the calculator's tool block, ~530 tokens) with `--rows`
sampled replies of `--tokens` tokens each, all at once, and reports the engine's wall time, its
prefill and decoding-step time, the peak of its batch's keys and values, and the tokens it drew.
Reported per mode: medians, the ratio of wall times to the first mode, the bytes the packed
copies take, and whether the mode drew the first mode's tokens.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# mode: (packed_weights, every linear layer packed too, the cache's dtype, swapped_weights)
MODES = {
    "plain": (False, False, "float32", False),
    "head": (True, False, "float32", False),
    "all": (True, True, "float32", False),
    "bf16kv": (True, False, None, False),
    "swapped": (True, False, None, True),
}

PROBE = """
import json, sys, time, torch
from mcprl.serving import Engine, SamplingParams, load_model, resolve_model
from mcprl.serving._chat import render_prompt
from mcprl.serving._packed import pack_linear
from tests.test_serving import CALC_TOOLS

packed, every, kv, swapped = json.loads(sys.argv[1])
rows, tokens = int(sys.argv[2]), int(sys.argv[3])
kv_dtype = getattr(torch, kv) if kv else None
engine = Engine(load_model(resolve_model()), packed_weights=packed, swapped_weights=swapped,
                kv_dtype=kv_dtype)
extra = 0
if every:  # on the engine's thread, as the engine packs its own
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
peak_kv = 0
while not all(f.done() for f in futures):
    batch = engine._batch
    if batch is not None:
        peak_kv = max(peak_kv, sum(t.nbytes for layer in batch.cache.layers
                                   for t in (layer._k, layer._v) if t is not None))
    time.sleep(0.05)
drawn = [[c.token_ids for c in f.result()] for f in futures]
wall = time.perf_counter() - started
stats = {k: engine.stats[k] - before[k] for k in ("steps", "prefill_s", "step_s")}
print(json.dumps({"wall_s": wall, "prefill_s": stats["prefill_s"], "step_s": stats["step_s"],
                  "step_ms": 1e3 * stats["step_s"] / stats["steps"], "prompt": len(prompts[0]),
                  "packed_mb": (engine.packed_bytes + extra) / 1e6, "kv_mb": peak_kv / 1e6,
                  "tokens": drawn}))
engine.close()
"""


def run(mode: str, rows: int, tokens: int) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(MODES[mode]), str(rows), str(tokens)],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    if done.returncode:
        raise SystemExit(f"{mode}: exited {done.returncode}\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modes", nargs="+", choices=MODES, default=["plain", "head", "all"])
    p.add_argument("--pairs", type=int, default=3, help="rounds of the modes taking turns")
    p.add_argument("--rows", type=int, default=4, help="sampled replies per prompt (4 prompts)")
    p.add_argument("--tokens", type=int, default=64, help="tokens per reply")
    p.add_argument("--out", help="write the results here as JSON")
    args = p.parse_args()
    runs: dict[str, list[dict]] = {mode: [] for mode in args.modes}
    for _ in range(args.pairs):
        for mode in args.modes:
            runs[mode].append(run(mode, args.rows, args.tokens))
    first = runs[args.modes[0]]
    same = {mode: all(r["tokens"] == first[0]["tokens"] for r in rs) for mode, rs in runs.items()}
    print(
        f"4 prompts of {first[0]['prompt']} tokens x {args.rows} replies of {args.tokens} "
        f"tokens, {args.pairs} runs a mode, taking turns\n"
    )
    print("| mode | packed copies | batch keys and values | wall s (median) | prefill s "
          f"| decoding step ms | speed | {args.modes[0]}'s tokens |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    base = statistics.median(r["wall_s"] for r in first)
    summary = {}
    for mode, rs in runs.items():
        row = {k: statistics.median(r[k] for r in rs) for k in ("wall_s", "prefill_s", "step_ms")}
        row["packed_mb"], row["kv_mb"] = rs[0]["packed_mb"], max(r["kv_mb"] for r in rs)
        row["walls"], row["same_tokens"] = [r["wall_s"] for r in rs], same[mode]
        summary[mode] = row
        print(f"| {mode} | {row['packed_mb']:.0f} MB | {row['kv_mb']:.0f} MB | "
              f"{row['wall_s']:.2f} | {row['prefill_s']:.2f} | {row['step_ms']:.1f} | "
              f"{base / row['wall_s']:.2f}x | {'yes' if same[mode] else 'no'} |")  # fmt: skip
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "modes": summary}, f, indent=1)


if __name__ == "__main__":
    main()
