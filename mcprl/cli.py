"""The `mcprl` command line: argument parsing and display only; every command calls the library.

mcprl tools SERVER [--json]
mcprl scenarios SERVER -n 24 -o FILE [--generator MODEL | --grounded] [--seed N]
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

from mcprl import __version__
from mcprl._defaults import configured_llm
from mcprl.errors import MCPRLError
from mcprl.mcp import ServerInfo, inspect_server
from mcprl.scenarios import ScenarioSet, generate_scenarios, grounded_scenarios
from ruler import RulerError

SERVER_HELP = (
    "an MCP server: an http(s):// URL (a path ending in /sse means SSE), a command line run "
    "over stdio, an mcpServers config file (file.json or file.json#name), or example:NAME "
    "(calculator, notes, catalog)"
)


def _width() -> int:
    return max(60, min(shutil.get_terminal_size((100, 20)).columns, 140))


def _arguments(schema: dict[str, Any]) -> str:
    required = set(schema.get("required", []))
    parts = []
    for name, prop in (schema.get("properties") or {}).items():
        options = [o for o in prop.get("anyOf", []) if o.get("type") != "null"]
        if len(options) == 1:
            prop = {**prop, **options[0]}
        kind = prop.get("type") or "|".join(
            str(o.get("type")) for o in prop.get("anyOf", []) if o.get("type") != "null"
        )
        if "enum" in prop:
            kind = "|".join(map(str, prop["enum"][:6])) + ("|…" if len(prop["enum"]) > 6 else "")
        parts.append(f"{name}{'' if name in required else '?'}: {kind or 'any'}")
    return ", ".join(parts)


def _count(items: list[Any], noun: str) -> str:
    return f"{len(items)} {noun}{'' if len(items) == 1 else 's'}"


def print_server(info: ServerInfo) -> None:
    width = _width()
    print(f"{info.name}: {_count(info.tools, 'tool')}, {_count(info.resources, 'resource')}")
    if info.instructions:
        print(textwrap.fill(info.instructions, width, initial_indent="  ", subsequent_indent="  "))
    print()
    for tool in info.tools:
        print(f"  {tool.name}({_arguments(tool.input_schema)})")
        description = " ".join(tool.description.split()) or "(no description)"
        indent = " " * 6
        print(textwrap.fill(description, width, initial_indent=indent, subsequent_indent=indent))
    if info.resources:
        print("\nresources:")
        for r in info.resources:
            print(f"  {r.uri}  {r.mime_type or ''}  {r.description or r.name}")


def cmd_tools(args: argparse.Namespace) -> int:
    info = anyio.run(lambda: inspect_server(args.server, startup_timeout=args.timeout))
    if args.json:
        print(json.dumps(info.model_dump(mode="json"), indent=2, ensure_ascii=False))
    else:
        print_server(info)
    return 0


def cmd_scenarios(args: argparse.Namespace) -> int:
    out = Path(args.output)
    generator = None if args.grounded else (args.generator or configured_llm())
    if generator is None and not args.grounded:
        print(
            "no LLM provider is configured (set MCPRL_GENERATOR, or OPENAI_API_KEY or another "
            "provider's key, or pass --generator MODEL), so using the grounded generator: tasks "
            "built from the tool schemas and checked on the live server",
            file=sys.stderr,
        )

    async def run() -> ScenarioSet:
        info = await inspect_server(args.server, startup_timeout=args.timeout)
        if generator is None:
            return await grounded_scenarios(args.server, n=args.n, seed=args.seed, info=info)
        return await generate_scenarios(
            info.tools,
            info.resources,
            n=args.n,
            generator=generator,
            instructions=args.instructions,
            seed=args.seed,
            api_base=args.api_base,
        )

    scenarios = anyio.run(run).with_split(args.val_fraction, seed=args.seed)
    scenarios.save(out)
    print(f"wrote {len(scenarios)} scenarios to {out} ", end="")
    print(f"({len(scenarios.train)} train, {len(scenarios.val)} val)")
    print(scenarios.format_histogram())
    print("\nexamples:")
    for s in list(scenarios)[: args.show]:
        text = textwrap.shorten(s.task, _width() - 10, placeholder=" …")
        answer = f"  → {s.reference.answer}" if s.reference and s.reference.answer else ""
        print(f"  [{s.difficulty}] {text}{answer}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from mcprl.serving import Engine, build_app, load_model
    from mcprl.serving._server import check_bind

    check_bind(args.host, args.api_key)
    print(f"loading {args.model} ({args.dtype}) …", file=sys.stderr)
    engine = Engine(load_model(args.model, dtype=args.dtype), max_batch_size=args.max_batch_size)
    for item in args.lora or []:
        name, _, path = item.partition("=")
        if not path:
            raise ValueError(f"--lora takes NAME=PATH, got {item!r}")
        engine.load_adapter(name, path)
    name = args.served_name or args.model
    app = build_app(engine, name, args.api_key)
    print(f"serving {name!r} at http://{args.host}:{args.port}/v1", file=sys.stderr)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    finally:
        engine.close()
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mcprl",
        description="Train open models to use any MCP server's tools. "
        "For judging groups of trajectories, see the `ruler` command.",
    )
    p.add_argument("--version", action="version", version=f"mcprl {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    t = sub.add_parser("tools", help="list a server's tools and resources")
    t.add_argument("server", help=SERVER_HELP)
    t.add_argument("--json", action="store_true", help="print JSON for machines")
    t.add_argument("--timeout", type=float, default=30.0, help="start-up time-out in seconds")
    t.set_defaults(func=cmd_tools)

    s = sub.add_parser("scenarios", help="write practice tasks for a server's tools")
    s.add_argument("server", help=SERVER_HELP)
    s.add_argument("-n", type=int, default=24, help="how many scenarios (default 24)")
    s.add_argument("-o", "--output", required=True, help="JSONL file to write")
    how = s.add_mutually_exclusive_group()
    how.add_argument("--generator", help="LiteLLM model that writes tasks (e.g. openai/gpt-4.1)")
    how.add_argument("--grounded", action="store_true", help="build tasks from schemas, no LLM")
    s.add_argument("--api-base", help="base URL of the generator's OpenAI-compatible endpoint")
    s.add_argument("--instructions", help="extra guidance for the LLM generator")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--val-fraction", type=float, default=0.25, help="share held out for eval")
    s.add_argument("--show", type=int, default=5, help="examples to print")
    s.add_argument("--timeout", type=float, default=30.0, help="start-up time-out in seconds")
    s.set_defaults(func=cmd_scenarios)

    v = sub.add_parser("serve", help="serve a model behind an OpenAI-compatible endpoint")
    v.add_argument("--model", default="smollm2-135m", help="smollm2-135m, a model dir or hub id")
    v.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    v.add_argument("--host", default="127.0.0.1", help="other than loopback needs --api-key")
    v.add_argument("--port", type=int, default=8000)
    v.add_argument("--api-key", help="require this bearer token")
    v.add_argument("--served-name", help="the model name clients use (default: --model)")
    v.add_argument("--max-batch-size", type=int, default=32)
    v.add_argument("--lora", action="append", metavar="NAME=PATH", help="load a LoRA adapter")
    v.set_defaults(func=cmd_serve)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    # The MCP SDK logs each unparsable stdout line with a traceback; mcprl reports it itself.
    logging.getLogger("mcp.client.stdio").setLevel(logging.CRITICAL)
    try:
        return args.func(args)
    except (MCPRLError, RulerError, ValueError) as exc:
        print(f"mcprl: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("mcprl: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
