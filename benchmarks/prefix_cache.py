"""The engine's shared-prefix KV cache on agent prompts, against the same engine without it.

    python benchmarks/prefix_cache.py [--rows 8] [--tokens 32] [--repeats 3]

Agent prompts are what `mcprl train` sends: the rollout system prompt with the calculator's tools
(plus `complete_task`) and a val task, rendered by the engine's own chat formatting, followed by
zero to three earlier turns (tool call and result), as in a wave that mixes attempts at different
turns. One wave of `--rows` such prompts generates `--tokens` tokens each (EOS ignored, greedy).
Reported: the wave's median wall time with the cache off and on (the cache warm, as it is after
the first wave of a step), the ratio, and whether the greedy tokens are identical.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import anyio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._machine import describe_machine  # noqa: E402
from mcprl.mcp import inspect_server, openai_tools  # noqa: E402
from mcprl.rollout import DEFAULT_SYSTEM_PROMPT, complete_task_tool  # noqa: E402
from mcprl.scenarios import ScenarioSet  # noqa: E402
from mcprl.serving import Engine, load_model  # noqa: E402
from mcprl.serving._chat import render_prompt  # noqa: E402
from mcprl.serving._engine import SamplingParams  # noqa: E402


def agent_prompts(tokenizer, rows: int) -> list[list[int]]:
    info = anyio.run(inspect_server, "example:calculator")
    tools = [*openai_tools(info.tools), complete_task_tool("number")]
    tasks = [s.task for s in ScenarioSet.load(ROOT / "scenarios" / "calculator.jsonl").val]
    system = DEFAULT_SYSTEM_PROMPT
    prompts = []
    for i in range(rows):
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": f"Please complete this task: {tasks[i % len(tasks)]}"},
        ]
        for turn in range(i % 4):  # earlier turns: a call and its result
            call = {"name": "add", "arguments": f'{{"a": {turn + 2}, "b": {i}}}'}
            messages.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": f"c{turn}", "type": "function", "function": call}],
                }
            )
            messages.append({"role": "tool", "tool_call_id": f"c{turn}", "content": str(turn + i)})
        prompts.append(render_prompt(tokenizer, messages, tools))
    return prompts


def wave(engine: Engine, prompts: list[list[int]], tokens: int) -> tuple[float, list]:
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    started = time.perf_counter()
    out = [f.result()[0].token_ids for f in [engine.submit(p, params) for p in prompts]]
    return time.perf_counter() - started, out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dtype", default="auto", help="auto, bfloat16 or float32 (default auto)")
    args = p.parse_args()
    loaded = load_model("smollm2-135m", dtype=args.dtype)
    prompts = agent_prompts(loaded.tokenizer, args.rows)
    lengths = [len(x) for x in prompts]
    results = {}
    for use in (False, True):
        engine = Engine(loaded, prefix_cache=use)
        try:
            wave(engine, prompts, args.tokens)  # warm-up (and, with the cache, the first build)
            runs = [wave(engine, prompts, args.tokens) for _ in range(args.repeats)]
        finally:
            engine.close()
        results[use] = (statistics.median(t for t, _ in runs), runs[-1][1])
    off, on = results[False][0], results[True][0]
    same = results[False][1] == results[True][1]
    print(describe_machine())
    print(f"{args.rows} agent prompts of {min(lengths)}-{max(lengths)} tokens, {loaded.dtype}, ")
    print(f"{args.tokens} new tokens each; median of {args.repeats} waves\n")
    print("| engine | wave time | speed-up |")
    print("|---|---|---|")
    print(f"| no prefix cache (baseline) | {off:.2f} s | 1.00x |")
    print(f"| shared-prefix KV cache | {on:.2f} s | {off / on:.2f}x |")
    print(f"\ngreedy tokens identical: {same}")


if __name__ == "__main__":
    main()
