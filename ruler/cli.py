"""`ruler score INPUT.jsonl --judge MODEL`: score groups of trajectories from the command line.

Each input line is one group: a JSON list of trajectories, or an object with `trajectories` and
optional `tools`. Every line is validated before the judge is called; scored groups are written in
input order as soon as they are ready, so an interrupted run keeps what it finished.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio

from ruler import __version__
from ruler._judge import Judge, RetryPolicy, _coerce_group
from ruler._rubric import DEFAULT_RUBRIC
from ruler._types import JudgeResult
from ruler.errors import InvalidGroupError, JudgeError

_GROUP_SHAPE = (
    'each line must be one group: a JSON list of trajectories, or {"trajectories": [...], '
    '"tools": [...]}, where a trajectory is a list of OpenAI-format messages'
)


class InputFileError(Exception):
    """The input file cannot be used; the message names the line and the fix."""


def read_groups(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(line number, {"trajectories", "tools"}) for every non-blank line, validated."""
    if not path.is_file():
        raise InputFileError(f"{path}: no such file")
    groups = []
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputFileError(
                    f"{path} line {lineno}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at column "
                    f"{exc.start + 1}); save the file as UTF-8"
                ) from None
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputFileError(
                    f"{path} line {lineno}: not valid JSON ({exc.msg} at column {exc.colno}); "
                    f"the file must be JSON Lines: {_GROUP_SHAPE}"
                ) from None
            if isinstance(obj, dict) and "trajectories" in obj:
                group = {"trajectories": obj["trajectories"], "tools": obj.get("tools")}
            elif isinstance(obj, list):
                group = {"trajectories": obj, "tools": None}
            else:
                raise InputFileError(f"{path} line {lineno}: not a group; {_GROUP_SHAPE}")
            try:
                _coerce_group(group["trajectories"], group["tools"])
            except InvalidGroupError as exc:
                raise InputFileError(f"{path} line {lineno}: {exc}") from None
            groups.append((lineno, group))
    if not groups:
        raise InputFileError(f"{path}: no groups found (the file is empty); {_GROUP_SHAPE}")
    return groups


def _print_result(lineno: int, result: JudgeResult) -> None:
    width = max(60, min(shutil.get_terminal_size((100, 20)).columns, 140))
    id_w = max(2, *(len(s.trajectory_id) for s in result.scores))
    agreement = (
        "" if result.agreement is None else f"  (2 passes, agreement {result.agreement:.2f})"
    )
    print(f"line {lineno}" + ("  (cached)" if result.usage.cached else "") + agreement)
    print(f"  {'id':<{id_w}}  score  explanation")
    for s in result.scores:
        text = textwrap.shorten(s.explanation, width=width - id_w - 12, placeholder=" …")
        print(f"  {s.trajectory_id:<{id_w}}  {s.score:5.2f}  {text}")


async def score_file(
    groups: list[tuple[int, dict[str, Any]]], judge: Judge, out: Path
) -> tuple[int, list[JudgeResult]]:
    """Score every group concurrently; write finished groups to `out` in input order."""
    results: dict[int, JudgeResult] = {}
    written = 0
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:

        def flush() -> None:
            nonlocal written
            while written in results:
                lineno, group = groups[written]
                result = results[written]
                row = {"line": lineno, **group, **result.model_dump(mode="json")}
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
                f.flush()
                _print_result(lineno, result)
                written += 1

        failures: list[JudgeError] = []

        async def one(i: int) -> None:
            group = groups[i][1]
            try:
                result = await judge.score(group["trajectories"], tools=group["tools"])
            except JudgeError as exc:
                exc.add_note(f"while scoring line {groups[i][0]}")
                failures.append(exc)
                tg.cancel_scope.cancel()
                return
            assert result is not None
            results[i] = result
            flush()

        async with anyio.create_task_group() as tg:
            for i in range(len(groups)):
                tg.start_soon(one, i)
    if failures:
        raise failures[0]
    return written, [results[i] for i in range(len(groups))]


def _parser() -> argparse.ArgumentParser:
    # flags are exact: no prefix matching (`--judg` is an error, not `--judge`)
    p = argparse.ArgumentParser(
        prog="ruler", description="RULER: relative LLM-judge scoring.", allow_abbrev=False
    )
    p.add_argument("--version", action="version", version=f"ruler {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser(
        "score", help="score groups of trajectories from a JSONL file", allow_abbrev=False
    )
    s.add_argument("input", type=Path, help="JSON Lines file, one group per line")
    s.add_argument("--judge", required=True, help="LiteLLM model string, e.g. openai/gpt-4.1-mini")
    s.add_argument("--rubric", type=Path, help="text file with the rubric (default: built-in)")
    s.add_argument("--api-base", help="base URL of an OpenAI-compatible endpoint")
    s.add_argument("--api-key", help="API key (default: the provider's environment variable)")
    s.add_argument("--temperature", type=float)
    s.add_argument("--out", type=Path, help="output JSONL (default: INPUT.scored.jsonl)")
    s.add_argument("--max-concurrency", type=int, default=4)
    s.add_argument("--retries", type=int, default=4, help="attempts per call on transient errors")
    s.add_argument("--no-cache", action="store_true", help="do not read or write the judge cache")
    s.add_argument("--cache", type=Path, help="cache file (default: ~/.cache/ruler/…)")
    s.add_argument(
        "--passes",
        type=int,
        choices=(1, 2),
        default=1,
        help="2: judge each group again with the attempts in reverse order and average the two "
        "(against position bias); the output's `agreement` is their rank correlation",
    )
    s.add_argument(
        "--seed", type=int, default=0, help="seed of the order the attempts are shown in"
    )
    s.add_argument(
        "--no-shuffle",
        action="store_true",
        help="show the attempts in the file's order (default: a seeded shuffle)",
    )
    s.add_argument("-v", "--verbose", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s"
    )
    try:
        groups = read_groups(args.input)
        rubric = args.rubric.read_text(encoding="utf-8") if args.rubric else DEFAULT_RUBRIC
    except (InputFileError, OSError) as exc:
        print(f"ruler: {exc}", file=sys.stderr)
        return 2
    out = args.out or args.input.with_name(args.input.stem + ".scored.jsonl")
    judge = Judge(
        args.judge,
        rubric=rubric,
        api_base=args.api_base,
        api_key=args.api_key,
        temperature=args.temperature,
        max_concurrency=args.max_concurrency,
        retry=RetryPolicy(max_attempts=max(1, args.retries)),
        cache=False if args.no_cache else (args.cache or True),
        shuffle=not args.no_shuffle,
        seed=args.seed,
        passes=args.passes,
    )
    try:
        written, results = anyio.run(score_file, groups, judge, out)
    except JudgeError as exc:
        hint = " (is the judge running and is --api-base right?)" if args.api_base else ""
        where = "; ".join(getattr(exc, "__notes__", []))
        print(f"ruler: {where}: {exc}{hint}", file=sys.stderr)
        done = written_lines(out)
        print(f"ruler: {done} of {len(groups)} groups written to {out}", file=sys.stderr)
        return 1
    calls = sum(r.usage.judge_calls for r in results)
    tokens = sum(r.usage.total_tokens for r in results)
    costs = [r.usage.cost_usd for r in results if r.usage.cost_usd is not None]
    cost = f", ${sum(costs):.4f}" if costs else ""
    print(f"\n{written} groups scored with {args.judge}: {calls} calls, {tokens} tokens{cost}")
    print(f"wrote {out}")
    return 0


def written_lines(path: Path) -> int:
    try:
        with path.open(encoding="utf-8") as f:
            return sum(1 for line in f if line.strip())
    except OSError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
