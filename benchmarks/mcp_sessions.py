"""What opening and closing an MCP session costs, per transport, against one tool call.

mcprl opens one session per attempt (servers may keep per-session state), so this is overhead
paid once per rollout. Measured side by side in one run on the calculator example server:

    python benchmarks/mcp_sessions.py [--rounds 20]

Prints, per transport, the median time to open + close a session, the median time of one tool
call inside an open session, and their ratio (how many tool calls one session costs).

    python benchmarks/mcp_sessions.py --server CMD [--concurrent 16]

opens `--concurrent` sessions with a server of your own at once, as a training step's attempts
do when they do not share one (`RolloutConfig.share_session`), against one session alone: wall
time, and the CPU time the server processes took.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import anyio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mcprl.mcp import open_session  # noqa: E402
from tests.helpers import load_example, served  # noqa: E402


async def measure(target, rounds: int) -> tuple[float, float]:
    opens = []
    for _ in range(rounds):
        t = time.perf_counter()
        async with open_session(target) as session:
            await session.list_tools()
        opens.append(time.perf_counter() - t)
    calls = []
    async with open_session(target) as session:
        for i in range(rounds * 5):
            t = time.perf_counter()
            await session.call_tool("add", {"a": i, "b": 1})
            calls.append(time.perf_counter() - t)
    return statistics.median(opens), statistics.median(calls)


async def at_once(server: str, sessions: int) -> float:
    """Seconds until `sessions` sessions, opened together, have each listed the tools."""

    async def one() -> None:
        async with open_session(server) as session:
            await session.list_tools()

    started = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(sessions):
            tg.start_soon(one)
    return time.perf_counter() - started


def concurrent(server: str, sessions: int) -> None:
    print(f"\nserver: {server}\n")
    print("| sessions at once | wall s | server CPU s | server CPU s a session |")
    print("| ---: | ---: | ---: | ---: |")
    for n in (1, sessions):
        before = os.times()
        wall = anyio.run(at_once, server, n)
        after = os.times()
        cpu = sum(
            getattr(after, f) - getattr(before, f) for f in ("children_user", "children_system")
        )
        print(f"| {n} | {wall:.1f} | {cpu:.1f} | {cpu / n:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--server", help="a server command: sessions opened at once")
    parser.add_argument("--concurrent", type=int, default=16)
    args = parser.parse_args()
    cpu = platform.processor() or platform.machine()
    print(f"machine: {cpu}, {os.cpu_count()} cores, Python {platform.python_version()}")
    if args.server:
        concurrent(args.server, args.concurrent)
        return
    rows = []
    stdio = f"{sys.executable} {ROOT / 'examples/servers/calculator.py'}"
    rows.append(("in-process", anyio.run(measure, load_example("calculator").server, args.rounds)))
    rows.append(("stdio", anyio.run(measure, stdio, args.rounds)))
    with served("calculator") as url:
        rows.append(("streamable HTTP", anyio.run(measure, url, args.rounds)))
    with served("calculator", transport="sse") as url:
        rows.append(("SSE", anyio.run(measure, url, args.rounds)))
    base_open = rows[0][1][0]
    print(
        "\n| transport | open+list+close (ms) | one tool call (ms) | session / call | "
        "session / in-process session |"
    )
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, (open_s, call_s) in rows:
        print(
            f"| {name} | {open_s * 1000:.1f} | {call_s * 1000:.2f} | {open_s / call_s:.0f}x | "
            f"{open_s / base_open:.1f}x |"
        )


if __name__ == "__main__":
    main()
