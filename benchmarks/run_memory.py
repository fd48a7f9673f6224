"""A training run's memory and time, per bound on the engine's batch (`max_batch_kv_bytes`).

    python benchmarks/run_memory.py --budgets-mb 0 1024 512 --out results/run-memory.json \\
        -- train example:catalog --steps 1 --eval-every 0 --no-report

Each budget runs the `mcprl` command after `--` in a process of its own (0: no bound, as before
the bound existed), with a thread that samples every 0.5 s the process's RSS and the engine's
running batch: its rows, its width (positions per row, padding included), the share of those
positions that are not padding, and the bytes its keys and values take. Reported per budget:
peak RSS (and at that moment, glibc's heap in use and freed but kept), the peak while the
engine runs no batch (a training step's, in a run that trains), wall time, the
console's lines on rollouts and evaluations, and the batch figures. Environment variables
(`MALLOC_ARENA_MAX`, ...) pass through to the runs.
`--path` is set to a fresh temporary folder per run, unless the command gives one: a copy of a
run to resume from a step, e.g. `-- train example:catalog --path COPY --project learning --name
default --steps 7 --eval-every 0 --no-report` after deleting COPY's step 7 onwards.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _rss_gb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1e6
    return float("nan")


def _heap_gb() -> dict[str, float]:
    """glibc's view of the heap: in use, and freed but kept (not handed back to the OS)."""
    import ctypes

    class MallInfo2(ctypes.Structure):
        _fields_ = [
            (name, ctypes.c_size_t)
            for name in (
                "arena",
                "ordblks",
                "smblks",
                "hblks",
                "hblkhd",
                "usmblks",
                "fsmblks",
                "uordblks",
                "fordblks",
                "keepcost",
            )
        ]

    try:
        mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return {}
    mallinfo2.restype = MallInfo2
    info = mallinfo2()
    return {
        "heap_used_gb": (info.uordblks + info.hblkhd) / 1e9,
        "heap_free_gb": info.fordblks / 1e9,
    }


def _held_gb(engine) -> dict[str, float]:
    """What the engine holds, by part: its running batch's key and value buffers as allocated
    (headroom included), the cached prompt heads (`PrefixCache`), then the kept replies
    (`ConversationCache`) without the heads counted before. Each storage counts once."""
    seen: set[int] = set()

    def count(tensors) -> float:
        total = 0
        for t in tensors:
            storage = t.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
        return total / 1e9

    held = {}
    try:
        batch = engine._batch
        buffers = [b for layer in batch.cache.layers for b in (layer._k, layer._v)]
        held["kv_buffers_gb"] = count(b for b in buffers if b is not None)
    except AttributeError:
        pass
    if engine.prefix_cache is not None:  # first: kept replies share these heads
        held["prefix_gb"] = count(
            t for kv in list(engine.prefix_cache.entries.values()) for p in kv for t in p
        )
    if engine.conversations is not None:
        entries = list(engine.conversations.entries.values())
        held["kept_gb"] = count(
            t for e in entries for kv in (e.own, e.head.kv if e.head else []) for p in kv for t in p
        )
    return held


def child(budget_mb: int, log: str, argv: list[str]) -> int:
    sys.path.insert(0, str(ROOT))
    from mcprl.cli import main
    from mcprl.serving import _engine

    engines = []
    init = _engine.Engine.__init__

    def patched(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.max_batch_kv_bytes = budget_mb << 20 if budget_mb else None
        engines.append(self)

    _engine.Engine.__init__ = patched

    def sample() -> None:
        with open(log, "w") as out:
            while True:
                time.sleep(0.5)
                row = {"rss_gb": _rss_gb(), **_heap_gb()}
                for engine in engines:
                    row.update(_held_gb(engine))
                    batch = engine._batch
                    try:
                        mask = batch.mask
                        row.update(
                            rows=len(batch.rows),
                            width=mask.shape[1],
                            used=float(mask.float().mean()),
                            kv_gb=mask.numel() * (engine.kv_bytes_per_token or 0) / 1e9,
                        )
                    except AttributeError:  # no batch running
                        pass
                out.write(json.dumps(row) + "\n")
                out.flush()

    threading.Thread(target=sample, daemon=True).start()
    sys.argv = ["mcprl", *argv]
    return main()


def run(budget_mb: int, argv: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "samples.jsonl")
        command = [sys.executable, __file__, "--child", str(budget_mb), log, "--", *argv]
        if "--path" not in argv:
            command += ["--path", os.path.join(tmp, "run")]
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
        wall = time.perf_counter() - started
        if done.returncode:
            raise SystemExit(f"budget {budget_mb} MB failed:\n{done.stderr[-3000:]}")
        samples = [json.loads(line) for line in Path(log).read_text().splitlines()]
    busy = [s for s in samples if "rows" in s]
    idle = [s for s in samples if "rows" not in s]
    console = (done.stdout + done.stderr).replace("\r", "\n").splitlines()
    lines = [ln for ln in console if " attempts in " in ln or "time:" in ln]
    top = max(samples, key=lambda s: s["rss_gb"])
    return {
        "budget_mb": budget_mb or None,
        "peak_rss_gb": round(top["rss_gb"], 2),
        "at_peak": {k: round(v, 2) for k, v in top.items()},
        "wall_s": round(wall, 1),
        "batch_peak_kv_gb": round(max((s["kv_gb"] for s in busy), default=0.0), 2),
        "peak_gb": {
            part: round(max((s.get(part, 0.0) for s in samples), default=0.0), 2)
            for part in ("kv_buffers_gb", "prefix_gb", "kept_gb")
        },
        "batch_mean_rows": round(sum(s["rows"] for s in busy) / max(len(busy), 1), 1),
        "batch_mean_not_padding": round(sum(s["used"] for s in busy) / max(len(busy), 1), 3),
        # no batch in the engine: loading, training steps, writing checkpoints
        "peak_rss_no_batch_gb": round(max((s["rss_gb"] for s in idle), default=0.0), 2),
        "console": lines,
    }


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        budget, log, rest = int(sys.argv[2]), sys.argv[3], sys.argv[5:]
        sys.exit(child(budget, log, rest))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets-mb", type=int, nargs="+", default=[0, 1024])
    parser.add_argument("--out", help="write the results here as JSON")
    parser.add_argument("argv", nargs="+", help="the mcprl command, after --")
    args = parser.parse_args()
    results = []
    for budget in args.budgets_mb:
        result = run(budget, args.argv)
        print(json.dumps(result), flush=True)
        results.append(result)
    report = {
        "command": ["mcprl", *args.argv],
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        # settings that change the runs' memory: glibc's, the threads' (passed through)
        "environment": {
            k: v for k, v in os.environ.items() if k.startswith(("MALLOC_", "MCPRL_", "OMP_"))
        },
        "runs": results,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
