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

`--public` asks nine public MCP servers nobody on the team wrote instead (installed from PyPI and
npm by `benchmarks/public_servers.py`), and audits every task: its answer does not appear in the
task's text, is not a dump, is the same over 3 replays in fresh sessions, comes from no meta tool,
and the task reads as a question (ends with "?", names no tool or snake_case identifier). A task
that passes all five is useful.

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


def _audit(s, tool_names: set[str], meta: set[str], replays: list[list[str]]) -> dict[str, bool]:
    """The five checks of the module docstring, for one task."""
    import re

    from mcprl.scenarios._screen import answer_problem

    answer = (s.reference.answer or "").strip()
    words = s.task.lower()
    recorded = [c.result for c in s.reference.calls]
    identifiers = re.findall(r"\b[a-z]+_[a-z_]+\b", re.sub(r'"[^"]*"', "", s.task))
    checks = {
        "no echo": bool(answer) and answer.lower() not in words,
        "no dump": bool(answer) and answer_problem(answer, "") != "a dump, not a value",
        "stable": all(r == recorded for r in replays),
        "no meta tool": not any(c.tool in meta for c in s.reference.calls),
        "a question": s.task.rstrip().endswith("?")
        and not any(t.lower() in words for t in tool_names if len(t) > 3)
        and not identifiers,
    }
    checks["useful"] = all(checks.values())
    return checks


async def measure(server: str, path: Path, sandbox: Path, audit: bool = False) -> dict:
    from mcprl.mcp import inspect_server, looks_like_error, open_session, tool_access
    from mcprl.scenarios import ScenarioSet
    from mcprl.scenarios._screen import is_meta_tool

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
    meta = {t.name for t in info.tools if is_meta_tool(t)}
    names = {t.name for t in info.tools}
    audits = []
    for s in scenarios:
        texts = [c.result or "" for c in s.reference.calls] + [s.reference.answer or ""]
        errors += any(looks_like_error(t) for t in texts)
        if any(c.tool in writers for c in s.reference.calls):
            continue  # replaying a write would change the data again
        replays = []
        for _ in range(3 if audit else 1):
            async with open_session(server) as session:
                replays.append(
                    [(await session.call_tool(c.tool, c.arguments)).text for c in s.reference.calls]
                )
        unstable += replays[0] != [c.result for c in s.reference.calls]
        if audit:
            audits.append(_audit(s, names, meta, replays))
    out = {
        "built": len(scenarios),
        "error_refs": errors,
        "unstable": unstable,
        "writes": writes,
        "tasks": [s.task for s in scenarios[:3]],
        "answers": [s.reference.answer for s in scenarios[:3]],
    }
    if audit:
        out["audit"] = {k: sum(a[k] for a in audits) for k in audits[0]} if audits else {}
        out["all_tasks"] = [[s.task, s.reference.answer] for s in scenarios]
    return out


def run_revision(
    tree: Path | None, n: int, sandbox: Path, tmp: Path, public: bool = False
) -> dict[str, dict]:
    import anyio
    from public_servers import public_servers

    results = {}
    chosen = public_servers() if public else servers(sandbox)
    for name, server in chosen.items():
        if public:
            public_servers()  # the data laid anew: each revision asks the same servers
        _fresh_sandbox(sandbox)
        out = tmp / f"{abs(hash((name, str(tree))))}.jsonl"
        env = {**os.environ, **({"PYTHONPATH": str(tree)} if tree else {})}
        proc = subprocess.run(
            [PY, __file__, "--generate", server, str(n), str(out)],
            env=env, capture_output=True, text=True, cwd=ROOT, check=True,
        )  # fmt: skip
        timing = json.loads(proc.stdout.strip().splitlines()[-1])
        measured = anyio.run(measure, server, out, sandbox, public)
        results[name] = {**measured, **timing}
        print(f"  {name}: {measured['built']} built in {timing['seconds']:.0f} s", file=sys.stderr)
    return results


def audit_table(n: int, runs: dict[str, dict[str, dict]]) -> str:
    keys = ["no echo", "no dump", "stable", "no meta tool", "a question", "useful"]
    lines = [
        "| server | revision | built | " + " | ".join(keys) + " |",
        "| --- | --- | ---: | " + " | ".join("---:" for _ in keys) + " |",
    ]
    names = next(iter(runs.values())).keys()
    for name in names:
        for rev, results in runs.items():
            r = results[name]
            a = r.get("audit") or {}
            cells = " | ".join(str(a.get(k, 0)) for k in keys)
            lines.append(f"| {name} | {rev} | {r['built']}/{n} | {cells} |")
    return "\n".join(lines)


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
    parser.add_argument("--public", action="store_true", help="nine public servers, audited")
    parser.add_argument("--generate", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.generate:
        server, n, out = args.generate
        print(json.dumps(generate(server, int(n), Path(out))))
        return
    with tempfile.TemporaryDirectory() as tmp:
        sandbox = Path(tmp) / "sandbox"
        sandbox.mkdir()
        runs = {"this tree": run_revision(None, args.n, sandbox, Path(tmp), args.public)}
        if args.compare:
            with checkout(args.compare) as tree:
                runs[f"mcprl at {args.compare}"] = run_revision(
                    tree, args.n, sandbox, Path(tmp), args.public
                )
    print(audit_table(args.n, runs) if args.public else table(args.n, runs))
    print("\nThree tasks per server (this tree):")
    for name, r in runs["this tree"].items():
        print(f"- {name}:")
        for task, answer in zip(r["tasks"], r["answers"], strict=True):
            print(f"  - {task} → {answer}")
    kind = "scenarios-public" if args.public else "scenarios"
    out = ROOT / "benchmarks" / "results" / f"{kind}.json"
    out.write_text(json.dumps({"n": args.n, "runs": runs}, indent=2) + "\n")
    print(f"\nwrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
