"""Generation throughput of mcprl's server against named baselines, side by side.

    python benchmarks/engine.py [--tokens 64] [--concurrency 1 8 32] [--dtypes bfloat16 float32]
                                [--device auto|cpu|cuda] [--profile TOKENS]
    python benchmarks/engine.py --agent [--compare REV] [--device cuda]

`--agent`: the rollouts of a training step instead of synthetic requests: 16 concurrent
multi-turn attempts (4 calculator scenarios x 4) by the default agent loop, calling the bundled
calculator over real MCP (streamable HTTP), through the official `openai` client to mcprl's
server. It reports wall time, completion tokens/s and the engine's forward passes; with
`--compare REV` the same workload runs again on mcprl as of git revision REV (a worktree, in a
subprocess), and the table gives the ratio.

For each dtype, on the same model (SmolLM2-135M-Instruct) and the same chat prompts:

- baseline "generate per request": transformers' `model.generate` called once per request, one
  request after another (what a simple serving loop does);
- baseline "batched generate": one `model.generate` call on all the requests of a cell,
  left-padded into one batch (HF's offline batching; the ratio to it is the last speed column);
- "mcprl server": requests sent concurrently through the official `openai` client to mcprl's
  in-process OpenAI-compatible server (dynamic batching);
- "transformers serve (CB)": `transformers serve --continuous-batching`, if it runs here (it
  needs fastapi), at the same concurrency.

Every mcprl and generate request produces exactly --tokens tokens (EOS ignored); `transformers
serve` has no such switch, so its rate counts the tokens it actually produced. Each cell is the
median of --repeats runs (this machine's speed varies from run to run). The script also measures
the machine's peak matmul FLOP/s per dtype and reports achieved FLOP/s (2 x parameters x tokens
processed, prompt and completion) as a fraction of that peak.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
# with --compare, mcprl must come from the worktree on PYTHONPATH: this tree goes last
sys.path.insert(len(sys.path) if "PYTHONPATH" in os.environ else 0, str(ROOT))

from _machine import checkout, default_dtypes, peak_gflops, sync  # noqa: E402

from mcprl.serving import LocalServer, load_model, pick_device, resolve_model  # noqa: E402
from mcprl.serving._chat import render_prompt  # noqa: E402
from tests.helpers import free_port  # noqa: E402

MODEL = "smollm2-135m"
PROMPTS = [
    "Explain what a tool call is.",
    "Write a haiku about the sea.",
    "List three uses of a calculator.",
    "What is the capital of Portugal?",
    "Describe a cat in one sentence.",
    "Give me a tip for learning Python.",
    "Why is the sky blue?",
    "Name two planets and a moon.",
]

# (seconds, prompt tokens, completion tokens)
Run = tuple[float, int, int]


def prompts_for(k: int) -> list[str]:
    return [PROMPTS[i % len(PROMPTS)] + f" (request {i})" for i in range(k)]


def median_run(runs: list[Run]) -> Run:
    return sorted(runs, key=lambda r: r[2] / r[0])[len(runs) // 2]


def _generate(loaded, batch: list[list[int]], tokens: int) -> None:
    """transformers' `generate` on `batch` (left-padded), exactly `tokens` new tokens each."""
    model, tok = loaded.model, loaded.tokenizer
    width = max(len(p) for p in batch)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    device = model.device
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=device)
    with torch.inference_mode():
        model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=tokens,
            min_new_tokens=tokens,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            pad_token_id=pad,
        )


def _prompt_ids(loaded, k: int) -> list[list[int]]:
    return [
        render_prompt(loaded.tokenizer, [{"role": "user", "content": text}], None)
        for text in prompts_for(k)
    ]


def bench_generate(loaded, k: int, tokens: int) -> Run:
    """Baseline: `generate` once per request, one request after another."""
    prompts = _prompt_ids(loaded, k)
    device = str(loaded.model.device)
    sync(device)
    start = time.perf_counter()
    for ids in prompts:
        _generate(loaded, [ids], tokens)
    sync(device)
    return time.perf_counter() - start, sum(map(len, prompts)), k * tokens


def bench_batched_generate(loaded, k: int, tokens: int) -> Run:
    """Baseline: one `generate` call on all k requests, left-padded into one batch (what HF
    offers for offline batches; it cannot take requests that arrive later)."""
    prompts = _prompt_ids(loaded, k)
    device = str(loaded.model.device)
    sync(device)
    start = time.perf_counter()
    _generate(loaded, prompts, tokens)
    sync(device)
    return time.perf_counter() - start, sum(map(len, prompts)), k * tokens


async def _fire(
    base_url: str, model: str, k: int, tokens: int, extra: dict, key: str = "local"
) -> Run:
    import openai

    client = openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=3600)

    async def one(text: str) -> tuple[int, int]:
        r = await client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": text}],
            max_tokens=tokens,
            temperature=1.0,
            extra_body=extra,
        )
        if extra.get("ignore_eos"):
            assert r.usage.completion_tokens == tokens, r.usage
        return r.usage.prompt_tokens, r.usage.completion_tokens

    start = time.perf_counter()
    counts = await asyncio.gather(*(one(t) for t in prompts_for(k)))
    seconds = time.perf_counter() - start
    await client.close()
    return seconds, sum(c[0] for c in counts), sum(c[1] for c in counts)


def bench_transformers_serve(dtype: str, ks: list[int], tokens: int, repeats: int):
    try:
        import fastapi  # noqa: F401
    except ImportError:
        return "not run: needs fastapi (pip install fastapi)"
    port, path = free_port(), resolve_model(MODEL)
    cmd = ["transformers", "serve", path, "--continuous-batching", "--port", str(port)]
    cmd += ["--host", "127.0.0.1", "--dtype", dtype]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 180
        while time.time() < deadline:
            if proc.poll() is not None:
                return f"not run: exited ({proc.stderr.read()[-300:].strip()})"
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.5)
        base = f"http://127.0.0.1:{port}/v1"
        try:
            asyncio.run(_fire(base, path, 2, 4, {}))
            return {
                k: median_run(
                    [asyncio.run(_fire(base, path, k, tokens, {})) for _ in range(repeats)]
                )
                for k in ks
            }
        except Exception as exc:
            return f"failed: {type(exc).__name__}: {str(exc)[:200]}"
    finally:
        proc.terminate()
        proc.wait(30)


def agent_workload(dtype: str, device: str, attempts: int, scenarios: int, rounds: int = 1) -> dict:
    """One training step's rollouts against the calculator over HTTP (`rounds` of them, one
    after another, timed together); returns the numbers."""
    import mcprl
    from mcprl.collect import collect_groups
    from mcprl.model import Model
    from mcprl.rollout import RolloutConfig
    from mcprl.scenarios import ScenarioSet
    from tests.helpers import served

    tasks = ScenarioSet.load(ROOT / "scenarios" / "calculator.jsonl").train.scenarios[:scenarios]
    kw = {"device": device} if "device" in LocalServer.__init__.__code__.co_varnames else {}
    with served("calculator") as url, LocalServer(MODEL, dtype=dtype, **kw) as server:
        key = getattr(server, "api_key", "local")
        # as the training loop's model: told that an answer ends the conversation
        model = Model(name=MODEL, base_url=server.base_url, api_key=key,
                      extensions=tuple(getattr(server, "extensions", ())))  # fmt: skip

        async def run(seed: int):
            return await collect_groups(
                model, tasks, url, RolloutConfig(), attempts=attempts, seed=seed,
                max_concurrency=scenarios * attempts, progress=False,
            )  # fmt: skip

        warm = time.time()
        asyncio.run(run(99))  # warm-up: first MCP sessions, grammar compilation
        warm_span = (warm, time.time())
        stats = dict(getattr(server.engine, "stats", {}))
        start = time.perf_counter()
        groups, spans = [], []  # spans: each round's (start, end) in wall-clock time
        for r in range(rounds):
            began = time.time()
            groups += asyncio.run(run(r))
            spans.append((began, time.time()))
        seconds = time.perf_counter() - start
        after = getattr(server.engine, "stats", {})
        governor = getattr(server.engine, "governor", None)
    trajectories = [t for g in groups for t in g.trajectories]
    completion = sum(len(c.token_ids) for t in trajectories for c in t.choices)
    calls = sum(len(t.choices) for t in trajectories)
    passes = sum(after.get(k, 0) - stats.get(k, 0) for k in ("waves", "prefills", "steps"))
    return {
        "mcprl": str(Path(mcprl.__file__).parent.parent),
        "seconds": seconds,
        "round_spans": spans,
        "warmup_span": warm_span,
        "attempts": len(trajectories),
        "model_calls": calls,
        "completion_tokens": completion,
        "forward_passes_or_waves": passes,
        "failed": sum(len(g.exceptions) for g in groups),
        "threads": governor.threads if governor else torch.get_num_threads(),
        "thread_changes": governor.changes if governor else 0,
        "engine": {k: after[k] - stats[k] for k in after if isinstance(after[k], (int, float))},
    }


def agent_main(args: argparse.Namespace) -> None:
    import json

    here = agent_workload(args.dtypes[0], args.device, args.attempts, args.scenarios)
    rows = [("this tree", here)]
    if args.compare:
        with checkout(args.compare) as tree:
            env = {**os.environ, "PYTHONPATH": str(tree)}
            out = subprocess.run(
                [sys.executable, __file__, "--agent-json", "--dtypes", args.dtypes[0],
                 "--device", args.device, "--attempts", str(args.attempts),
                 "--scenarios", str(args.scenarios)],
                env=env, check=True, capture_output=True, text=True, cwd=ROOT,
            )  # fmt: skip
            old = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append((f"mcprl at {args.compare}", old))
    print(
        f"agent workload: {args.scenarios} calculator scenarios x {args.attempts} attempts, all "
        f"concurrent, default agent loop, MCP over HTTP; {args.dtypes[0]} on {args.device}\n"
    )
    print("| engine | wall s | attempts | model calls | completion tokens | tokens/s | speed-up |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    base = rows[-1][1]
    for name, r in rows:
        rate = r["completion_tokens"] / r["seconds"]
        ratio = base["seconds"] / r["seconds"]
        print(
            f"| {name} | {r['seconds']:.1f} | {r['attempts']} | {r['model_calls']} | "
            f"{r['completion_tokens']} | {rate:.1f} | {ratio:.2f}x |"
        )
        print(f"  {name}: engine {r.get('engine')}")
        if r["failed"]:
            print(f"  ({name}: {r['failed']} attempts failed)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agent", action="store_true", help="the agent workload (module docstring)")
    p.add_argument("--agent-json", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--compare", metavar="REV", help="--agent: also run mcprl at this revision")
    p.add_argument("--attempts", type=int, default=4, help="--agent: attempts per scenario")
    p.add_argument("--scenarios", type=int, default=4, help="--agent: scenarios")
    p.add_argument("--rounds", type=int, default=1, help="--agent: timed rounds, in a row")
    p.add_argument("--threads", type=int,
                   help="fix torch's CPU threads (default: sized to the free cores)")  # fmt: skip
    p.add_argument("--device", default="auto", help="auto (a GPU where present), cpu or cuda")
    p.add_argument("--profile", type=int, default=0, metavar="TOKENS",
                   help="also profile the server's decode steps (torch.profiler) at the highest "
                   "concurrency, TOKENS tokens a request")  # fmt: skip
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--dtypes", nargs="+", default=default_dtypes())
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--skip-transformers-serve", action="store_true")
    args = p.parse_args()
    if args.threads:
        from mcprl.serving import fix_threads

        fix_threads(args.threads)
    if args.agent_json:
        import json

        print(json.dumps(agent_workload(args.dtypes[0], args.device, args.attempts,
                                        args.scenarios, args.rounds)))  # fmt: skip
        return
    if args.agent:
        agent_main(args)
        return
    device = pick_device(args.device)
    params = sum(t.numel() for t in load_model(MODEL, "float32", "cpu").model.parameters())
    gpu = f", {torch.cuda.get_device_name()}" if device.startswith("cuda") else ""
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; device {device}{gpu}; model {MODEL} "
        f"({params / 1e6:.0f}M parameters)"
    )
    peaks = {d: peak_gflops(getattr(torch, d), device=device) for d in args.dtypes}
    for d, g in peaks.items():
        print(f"peak matmul ({d}, 2048x2048): {g:.0f} GFLOP/s")
    print(f"\n{args.tokens} tokens per request; median of {args.repeats} runs per cell.\n")
    print(
        "| dtype | system | concurrent requests | tokens/s | vs generate | "
        "vs batched generate | achieved GFLOP/s | of peak |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")

    def row(dtype: str, system: str, k: int, run: Run, base: float | None,
            batched: float | None = None) -> float:  # fmt: skip
        seconds, prompt_tokens, completion_tokens = run
        rate = completion_tokens / seconds
        flops = 2 * params * (prompt_tokens + completion_tokens) / seconds / 1e9
        ratio = f"{rate / base:.1f}x" if base else "1.0x"
        vs_batched = f"{rate / batched:.2f}x" if batched else ""
        print(
            f"| {dtype} | {system} | {k} | {rate:.1f} | {ratio} | {vs_batched} | {flops:.1f} | "
            f"{flops / peaks[dtype]:.1%} |",
            flush=True,
        )
        return rate

    for dtype in args.dtypes:
        loaded = load_model(MODEL, dtype=dtype, device=device)
        bench_generate(loaded, 1, 8)  # warm up
        runs = [bench_generate(loaded, 4, args.tokens) for _ in range(args.repeats)]
        base = row(dtype, "generate per request", 1, median_run(runs), None)
        batched = {}
        for k in args.concurrency:
            bench_batched_generate(loaded, k, 8)  # warm up this batch shape
            runs = [bench_batched_generate(loaded, k, args.tokens) for _ in range(args.repeats)]
            batched[k] = row(dtype, "batched generate", k, median_run(runs), base)
        del loaded
        with LocalServer(MODEL, dtype=dtype, device=device) as server:
            url, key = server.base_url, server.api_key
            asyncio.run(_fire(url, MODEL, 8, 8, {"ignore_eos": True}, key))  # warm up
            for k in args.concurrency:
                runs = [
                    asyncio.run(_fire(url, MODEL, k, args.tokens, {"ignore_eos": True}, key))
                    for _ in range(args.repeats)
                ]
                row(dtype, "mcprl server", k, median_run(runs), base, batched[k])
            if args.profile:
                try:
                    profile_steps(server, max(args.concurrency), args.profile, device)
                except Exception as exc:  # the throughput table stands without it
                    print(f"profile failed: {type(exc).__name__}: {exc}")
        if not args.skip_transformers_serve:
            result = bench_transformers_serve(dtype, args.concurrency, args.tokens, args.repeats)
            if isinstance(result, str):
                print(f"| {dtype} | transformers serve (CB) | - | {result} | | | | |")
            else:
                for k, run in result.items():
                    row(dtype, "transformers serve (CB)", k, run, base, batched.get(k))


def profile_steps(server, k: int, tokens: int, device: str) -> None:
    """torch.profiler over k concurrent requests of `tokens` tokens on a running server: the
    engine's decode steps, what each costs on the host and on the device, and its host syncs."""
    from torch.profiler import ProfilerActivity, profile

    url, key, engine = server.base_url, server.api_key, server.engine
    activities = [ProfilerActivity.CPU]
    if device.startswith("cuda"):
        activities.append(ProfilerActivity.CUDA)
    before = dict(engine.stats)
    # the profiler records the thread that starts it: start and stop it on the engine's thread
    prof = profile(activities=activities)
    engine.run_exclusive(prof.__enter__)
    start = time.perf_counter()
    asyncio.run(_fire(url, MODEL, k, tokens, {"ignore_eos": True}, key))
    seconds = time.perf_counter() - start
    engine.run_exclusive(lambda: prof.__exit__(None, None, None))
    steps = engine.stats["steps"] - before["steps"]
    events = prof.key_averages()
    device_us = sum(e.self_device_time_total for e in events if e.device_type.name != "CPU")
    kernels = sum(e.count for e in events if e.device_type.name != "CPU")
    syncs = {
        e.key: e.count
        for e in events
        if any(s in e.key for s in ("Synchronize", "aten::item", "_local_scalar_dense", "Memcpy"))
    }
    print(
        f"\nprofile: {k} requests x {tokens} tokens on {device}: {steps} decode steps, "
        f"{seconds / max(steps, 1) * 1e3:.1f} ms wall a step, device busy "
        f"{device_us / 1e6 / seconds:.0%} of the wall time, {kernels / max(steps, 1):.0f} device "
        f"ops a step; host syncs and copies: {syncs}"
    )
    sort = "self_cuda_time_total" if device.startswith("cuda") else "self_cpu_time_total"
    print(events.table(sort_by=sort, row_limit=25, max_name_column_width=60))


if __name__ == "__main__":
    main()
