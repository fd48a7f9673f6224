"""Scenario quality from grounded generation (no LLM), on the example servers and on the test
servers that imitate third-party ones (tests/servers: time zones, SQL errors as text, a folder
with writing tools behind an environment variable).

    python benchmarks/scenarios.py [-n 12] [--compare REV]

For each server it asks for `n` scenarios (seed 0) and reports:

- built: scenarios written, of `n` asked (a failed run counts as 0);
- error refs: scenarios with a reference call result or answer that reads as an error
  (`mcprl.mcp.looks_like_error`, the current tree's classifier, applied to both revisions);
- unstable: scenarios whose read-only reference calls give other results in a fresh session
  (replayed here);
- writes: calls of writing tools made during generation, without `--allow-writes` (the files
  server logs every call; elsewhere: writing tools among the reference calls);
- s/scenario: generation wall time per scenario built.

`--compare REV` generates again with mcprl as of git revision REV (a worktree, in a subprocess)
and measures its output the same way. Three generated tasks per server are printed, for a reader
to judge. Results go to benchmarks/results/scenarios.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
# with --generate under --compare, mcprl must come from the worktree on PYTHONPATH
sys.path.insert(len(sys.path) if "PYTHONPATH" in os.environ else 0, str(ROOT))

from _machine import checkout  # noqa: E402

PY = sys.executable
TESTS = ROOT / "tests" / "servers"


def servers(sandbox: Path) -> dict[str, str]:
    # the files server gets its variable from a config file, which every revision reads
    config = sandbox.parent / "files.json"
    entry = {"command": PY, "args": [str(TESTS / "files.py")], "env": {"SANDBOX_DIR": str(sandbox)}}
    config.write_text(json.dumps({"mcpServers": {"files": entry}}))
    return {
        "calculator": "example:calculator",
        "catalog": "example:catalog",
        "notes": "example:notes",
        "clock (time zones)": f"{PY} {TESTS / 'clock.py'}",
        "sqlish (SQL, errors as text)": f"{PY} {TESTS / 'sqlish.py'}",
        "files (writes, env variable)": str(config),
    }


def generate(server: str, n: int, out: Path) -> dict:
    """Run in the revision under test: build scenarios, save them, report the time."""
    import anyio

    from mcprl.errors import MCPRLError
    from mcprl.scenarios import ScenarioSet, grounded_scenarios

    started = time.perf_counter()
    error = None
    try:
        scenarios = anyio.run(lambda: grounded_scenarios(server, n=n, seed=0))
    except MCPRLError as exc:  # a failed run builds nothing; its message is kept
        scenarios, error = ScenarioSet(), str(exc)
    scenarios.save(out)
    return {"seconds": time.perf_counter() - started, "error": error}


def _fresh_sandbox(sandbox: Path) -> None:
    for p in sandbox.iterdir():
        p.unlink()
    (sandbox / "todo.txt").write_text("buy milk\ncall the plumber\n")
    (sandbox / "readme.txt").write_text("A folder of notes.")


async def measure(server: str, path: Path, sandbox: Path) -> dict:
    from mcprl.mcp import inspect_server, looks_like_error, open_session, tool_access
    from mcprl.scenarios import ScenarioSet

    scenarios = list(ScenarioSet.load(path)) if path.stat().st_size else []
    log = sandbox / "calls.log"
    logged = [json.loads(x)["tool"] for x in log.read_text().splitlines()] if log.exists() else []
    info = await inspect_server(server)
    writers = {t.name for t in info.tools if tool_access(t)[0] == "write"}
    if server.endswith("files.json"):
        writes = sum(1 for tool in logged if tool in writers)
    else:
        writes = sum(1 for s in scenarios for c in s.reference.calls if c.tool in writers)
    errors = unstable = 0
    for s in scenarios:
        texts = [c.result or "" for c in s.reference.calls] + [s.reference.answer or ""]
        errors += any(looks_like_error(t) for t in texts)
        if any(c.tool in writers for c in s.reference.calls):
            continue  # replaying a write would change the data again
        async with open_session(server) as session:
            for call in s.reference.calls:
                result = await session.call_tool(call.tool, call.arguments)
                if result.text != call.result:
                    unstable += 1
                    break
    return {
        "built": len(scenarios),
        "error_refs": errors,
        "unstable": unstable,
        "writes": writes,
        "tasks": [s.task for s in scenarios[:3]],
    }


def run_revision(tree: Path | None, n: int, sandbox: Path, tmp: Path) -> dict[str, dict]:
    import anyio

    results = {}
    for name, server in servers(sandbox).items():
        _fresh_sandbox(sandbox)
        out = tmp / f"{abs(hash((name, str(tree))))}.jsonl"
        env = {**os.environ, **({"PYTHONPATH": str(tree)} if tree else {})}
        proc = subprocess.run(
            [PY, __file__, "--generate", server, str(n), str(out)],
            env=env, capture_output=True, text=True, cwd=ROOT, check=True,
        )  # fmt: skip
        timing = json.loads(proc.stdout.strip().splitlines()[-1])
        measured = anyio.run(measure, server, out, sandbox)
        results[name] = {**measured, **timing}
        print(f"  {name}: {measured['built']} built in {timing['seconds']:.0f} s", file=sys.stderr)
    return results


def table(n: int, runs: dict[str, dict[str, dict]]) -> str:
    lines = [
        "| server | revision | built | error refs | unstable | writes | s/scenario |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    names = next(iter(runs.values())).keys()
    for name in names:
        for rev, results in runs.items():
            r = results[name]
            per = f"{r['seconds'] / r['built']:.1f}" if r["built"] else "–"
            lines.append(
                f"| {name} | {rev} | {r['built']}/{n} | {r['error_refs']} | {r['unstable']} | "
                f"{r['writes']} | {per} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=12, help="scenarios asked per server")
    parser.add_argument("--compare", help="also generate with mcprl at this git revision")
    parser.add_argument("--generate", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.generate:
        server, n, out = args.generate
        print(json.dumps(generate(server, int(n), Path(out))))
        return
    with tempfile.TemporaryDirectory() as tmp:
        sandbox = Path(tmp) / "sandbox"
        sandbox.mkdir()
        runs = {"this tree": run_revision(None, args.n, sandbox, Path(tmp))}
        if args.compare:
            with checkout(args.compare) as tree:
                runs[f"mcprl at {args.compare}"] = run_revision(tree, args.n, sandbox, Path(tmp))
    print(table(args.n, runs))
    print("\nThree tasks per server (this tree):")
    for name, r in runs["this tree"].items():
        print(f"- {name}:")
        for task in r["tasks"]:
            print(f"  - {task}")
    out = ROOT / "benchmarks" / "results" / "scenarios.json"
    out.write_text(json.dumps({"n": args.n, "runs": runs}, indent=2) + "\n")
    print(f"\nwrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
