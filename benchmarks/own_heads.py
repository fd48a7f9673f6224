"""A wave of groups whose prompts each open with a long worked example of their own: every
group's prompt prefilled once (`OWN_HEAD_MINIMUM`, the default) against once per row.

    python benchmarks/own_heads.py RUN/trajectories/train/NNNN.jsonl [--tokens 32]

Takes a run's stored groups (a run with `--examples 1 --example-choice similar`, where each
task opens with its own ~1,000-token worked example), renders each group's first-turn prompt as
the engine saw it (the messages up to the task's own request, with the run's tools), and
submits every group's attempts at once, as a training step's rollouts do. Reported per way: the
wave's wall time (greedy, `--tokens` new tokens a row, EOS ignored), the tokens the model ran
for the prompts (prefill tails and prefix-cache builds), and whether the tokens are identical.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import mcprl.serving._engine as engine_module  # noqa: E402
from benchmarks._machine import describe_machine  # noqa: E402
from mcprl.serving import Engine, load_model  # noqa: E402
from mcprl.serving._chat import render_prompt  # noqa: E402
from mcprl.serving._engine import SamplingParams  # noqa: E402


def first_prompts(path: Path, tokenizer) -> list[tuple[list[int], int]]:
    """(first-turn prompt, attempts) per stored group."""
    out = []
    for line in path.read_text().splitlines():
        group = json.loads(line)["trajectories"]
        t = group[0]
        last_user = max(i for i, m in enumerate(t["messages"]) if m["role"] == "user")
        out.append(
            (render_prompt(tokenizer, t["messages"][: last_user + 1], t["tools"]), len(group))
        )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("groups", type=Path)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--dtype", default="auto")
    args = p.parse_args()
    loaded = load_model("smollm2-135m", dtype=args.dtype)
    prompts = first_prompts(args.groups, loaded.tokenizer)
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    built: list[int] = []
    prefix_kv = engine_module.prefix_kv

    def counted(model, ids, **kwargs):
        built.append(len(ids))
        return prefix_kv(model, ids, **kwargs)

    engine_module.prefix_kv = counted
    minimum = engine_module.OWN_HEAD_MINIMUM
    results = {}
    for name, value in (("once per row (before)", 10**9), ("once per group", minimum)):
        engine_module.OWN_HEAD_MINIMUM = value
        built.clear()
        engine = Engine(loaded)
        try:
            started = time.perf_counter()
            with engine.paused():  # one wave, as a step's attempts start together
                futures = [engine.submit(q, params) for q, n in prompts for _ in range(n)]
            tokens = [f.result()[0].token_ids for f in futures]
            seconds = time.perf_counter() - started
            results[name] = (seconds, engine.stats["prefill_tokens"] + sum(built), tokens)
        finally:
            engine.close()
    lengths = [len(q) for q, _ in prompts]
    print(describe_machine())
    rows = sum(n for _, n in prompts)
    print(f"{len(prompts)} groups, {rows} rows, prompts of {min(lengths)}-{max(lengths)} tokens,")
    print(f"{loaded.dtype}, {args.tokens} new tokens a row\n")
    print("| a group's prompt prefilled | prompt tokens run | wave s | speed-up |")
    print("| --- | ---: | ---: | ---: |")
    base = results["once per row (before)"][0]
    for name, (seconds, ran, _) in results.items():
        print(f"| {name} | {ran} | {seconds:.1f} | {base / seconds:.2f}x |")
    pairs = zip(results["once per row (before)"][2], results["once per group"][2], strict=True)
    same = sum(a == b for a, b in pairs)
    print(f"\nrows whose greedy tokens are identical: {same} of {rows} (bfloat16 rounds a")
    print("prefix-cache entry's keys and values otherwise than a batch's rows; float32 agrees:")
    print("tests/test_prefix_cache.py)")


if __name__ == "__main__":
    main()
