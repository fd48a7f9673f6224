"""Two mcprl processes on one machine: each one's speed beside the other, against alone.

    python benchmarks/sharing.py [--rounds 3] [--modes adaptive fixed]

The workload is `engine.py --agent`'s: the rollouts of a training step (4 calculator scenarios
x 4 attempts, all concurrent, the default agent loop, MCP over streamable HTTP), `--rounds` of
them in a row. For each mode it runs the workload once alone, then twice at the same time in two
processes, and reports each one's speed beside the other as a ratio of its speed alone.

Modes:
- adaptive: the default; the engine sizes torch's threads to the cores other processes leave
  free (`mcprl.serving._threads`);
- fixed: `--threads` set to this machine's cores in each process, which is what every process
  did before: torch's default of one thread per core, whatever else runs.

Sharing N cores between two equal processes should cost each about half its speed (0.5x).
A pair still running `--cap` times as long as the process alone took (start to end) is stopped,
and its ratio is given as an upper bound.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def workload(mode: str, rounds: int) -> subprocess.Popen:
    cmd = [sys.executable, str(HERE / "engine.py"), "--agent-json", "--rounds", str(rounds),
           "--device", "cpu"]  # fmt: skip
    if mode == "fixed":
        cmd += ["--threads", str(len(os.sched_getaffinity(0)))]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)


def result(proc: subprocess.Popen, timeout: float | None = None) -> dict | None:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return None
    if proc.returncode:
        raise SystemExit(f"the workload failed (exit {proc.returncode})")
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3, help="timed rounds of rollouts per process")
    p.add_argument("--cap", type=float, default=6.0,
                   help="stop a pair after this many times the alone run's wall time")  # fmt: skip
    p.add_argument("--modes", nargs="+", default=["adaptive", "fixed"],
                   choices=["adaptive", "fixed"])  # fmt: skip
    args = p.parse_args()
    cores = len(os.sched_getaffinity(0))
    print(f"machine: {platform.processor() or platform.machine()}, {cores} cores in this CPU set")
    print(f"workload: {args.rounds} rounds of 16 concurrent calculator attempts per process\n")
    print("| mode | alone s | beside another s (two processes) | speed beside / alone | "
          "threads at the end | thread changes |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for mode in args.modes:
        started = time.perf_counter()
        alone = result(workload(mode, args.rounds))
        cap = args.cap * (time.perf_counter() - started)
        pair = [workload(mode, args.rounds), workload(mode, args.rounds)]
        started = time.perf_counter()
        both = [result(q, max(1.0, cap - (time.perf_counter() - started))) for q in pair]
        if None in both:
            print(
                f"| {mode} | {alone['seconds']:.1f} | stopped after {cap:.0f} s | "
                f"< {1 / args.cap:.2f}x | {alone['threads']}; - | {alone['thread_changes']}; - |",
                flush=True,
            )
            continue
        ratios = " / ".join(f"{alone['seconds'] / b['seconds']:.2f}x" for b in both)
        beside = " / ".join(f"{b['seconds']:.1f}" for b in both)
        print(
            f"| {mode} | {alone['seconds']:.1f} | {beside} | {ratios} | "
            f"{alone['threads']}; {' / '.join(str(b['threads']) for b in both)} | "
            f"{alone['thread_changes']}; {' / '.join(str(b['thread_changes']) for b in both)} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
