"""What one shared session saves grounded task generation, on public servers (no LLM).

    python benchmarks/generation_sessions.py [--servers git sqlite units] [-n 24]

For each server (a word of its name in `benchmarks/public_servers.py`), `build_grounded` asks
for `n` tasks (seed 0) twice in one process: its default, where the chains of calls share one
session (one server process over stdio) when no tool it calls may write, and with
`fresh_sessions=True`, a session per chain (the behaviour before 2026-12-01). It reports both
wall times, their ratio, and whether the two wrote the same tasks (they should: the calls and
their results do not change, only how many processes answer them).
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--servers", nargs="+", default=["git", "sqlite", "units"])
    p.add_argument("-n", type=int, default=24)
    args = p.parse_args()

    from public_servers import public_servers

    from mcprl.scenarios import build_grounded

    servers = public_servers()
    print("| server | tries | shared s | fresh s | fresh / shared | same tasks |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for word in args.servers:
        name, spec = next((k, v) for k, v in servers.items() if word in k)
        seconds, tasks = {}, {}
        for fresh in (False, True):
            started = time.perf_counter()
            run = partial(build_grounded, spec, args.n, seed=0, fresh_sessions=fresh)
            built, report = anyio.run(run)
            seconds[fresh] = time.perf_counter() - started
            tasks[fresh] = [s.task for s in built]
        print(
            f"| {name} | {report.attempts} | {seconds[False]:.1f} | {seconds[True]:.1f} | "
            f"{seconds[True] / seconds[False]:.2f}x | {tasks[False] == tasks[True]} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
