"""`mcprl tools`, `mcprl scenarios` and `mcprl serve`: a server's tools, practice tasks for
them, and a model behind an OpenAI-compatible endpoint."""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from pathlib import Path

import anyio

from mcprl._defaults import configured_llm
from mcprl.cli._display import print_server, say, terminal_width
from mcprl.cli._machine import quiet_libraries, set_threads
from mcprl.errors import UsageError
from mcprl.mcp import inspect_server
from mcprl.scenarios import (
    ScenarioSet,
    generate_scenarios,
    grounded_with_notes,
    reword_tasks,
    scenario_count,
)


def cmd_login(args: argparse.Namespace) -> int:
    from mcprl.mcp import SECRET_ENV, login

    options = {"scope": args.scope, "open_browser": not args.no_browser, "port": args.port,
               "timeout": args.timeout, "client_id": args.client_id,
               "client_secret": os.environ.get(SECRET_ENV) if args.client_id else None,
               "client_metadata_url": args.client_metadata_url}  # fmt: skip
    anyio.run(lambda: login(args.server, **options))
    return 0


def cmd_logout(args: argparse.Namespace) -> int:
    from mcprl.mcp import ServerSpec, TokenFile

    spec = ServerSpec.parse(args.server)
    if spec.url is None:
        raise UsageError(f"{spec.describe()} runs as a command: only servers at a URL log in")
    stored = TokenFile(spec.url)
    if not stored.path.exists():
        print(f"no login kept for {spec.url}")
        return 0
    stored.path.unlink()
    print(f"forgot the login for {spec.url} ({stored.path})")
    return 0


def cmd_tools(args: argparse.Namespace) -> int:
    info = anyio.run(lambda: inspect_server(args.server, startup_timeout=args.timeout))
    if args.json:
        print(json.dumps(info.model_dump(mode="json"), indent=2, ensure_ascii=False))
    else:
        print_server(info)
    return 0


def cmd_scenarios(args: argparse.Namespace) -> int:
    out = Path(args.output)
    generator = args.generator or (None if args.grounded else configured_llm())
    if generator is None and not args.grounded:
        print(
            "no LLM provider is configured (set MCPRL_GENERATOR, or OPENAI_API_KEY or another "
            "provider's key, or pass --generator MODEL), so using the grounded generator: tasks "
            "built from the tool schemas and checked on the live server",
            file=sys.stderr,
        )

    async def run() -> ScenarioSet:
        info = await inspect_server(args.server, startup_timeout=args.timeout)
        if args.n is None:
            args.n = scenario_count(info.tools, args.allow_writes)
        if generator is None or args.grounded:
            built = await grounded_with_notes(
                args.server, args.n, seed=args.seed, info=info, allow_writes=args.allow_writes,
                say=say,
            )  # fmt: skip
            if generator is None:
                return built
            say(f"  rewording {len(built)} tasks with {generator} (answers stay verified) …")
            built, kept = await reword_tasks(
                built, generator, seed=args.seed, api_base=args.api_base
            )
            if kept:
                say(f"  {kept} tasks kept their generated text (the rewrite lost a value)")
            return built
        say(
            f"  {generator} proposes {args.n} tasks with their calls; checking them on the server …"
        )
        made = await generate_scenarios(
            info.tools,
            info.resources,
            n=args.n,
            generator=generator,
            instructions=args.instructions,
            seed=args.seed,
            api_base=args.api_base,
            server=args.server,
            allow_writes=args.allow_writes,
        )
        verified = sum("verified" in s.tags for s in made)
        say(
            f"  {verified} verified on the server (reference answers from its results); "
            f"{len(made) - verified} kept without a reference, for RULER (tag 'unverified')"
        )
        return made

    scenarios = anyio.run(run).with_split(args.val_fraction, seed=args.seed)
    scenarios.save(out)
    print(f"wrote {len(scenarios)} scenarios to {out} ", end="")
    print(f"({len(scenarios.train)} train, {len(scenarios.val)} val)")
    print(scenarios.format_histogram())
    print("\nexamples:")
    for s in list(scenarios)[: args.show]:
        text = textwrap.shorten(s.task, terminal_width() - 10, placeholder=" …")
        answer = f"  → {s.reference.answer}" if s.reference and s.reference.answer else ""
        print(f"  [{s.difficulty}] {text}{answer}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from mcprl.serving import (
        Engine,
        allowed_hosts,
        build_app,
        check_bind,
        load_model,
        pick_device,
        pick_dtype,
    )

    api_key = args.api_key or os.environ.get("MCPRL_API_KEY") or None
    check_bind(args.host, api_key)
    dirs = [Path(d).expanduser() for d in args.allow_adapter_dir or []]
    for d in dirs:
        if not d.is_dir():
            raise UsageError(f"--allow-adapter-dir {d}: no such directory")
    quiet_libraries()
    set_threads(args)
    device = pick_device(args.device)  # a wrong --device fails before the model loads
    if args.train:
        return _serve_backend(args, api_key)
    dtype = pick_dtype(args.dtype, device)
    print(f"loading {args.model} ({dtype} on {device}) …", file=sys.stderr)
    loaded = load_model(args.model, dtype=dtype, device=device)
    engine = Engine(
        loaded, max_batch_size=args.max_batch_size, max_batch_kv_bytes=args.max_batch_kv_mb
    )
    for item in args.lora or []:
        name, _, path = item.partition("=")
        if not path:
            raise UsageError(f"--lora takes NAME=PATH, got {item!r}")
        engine.load_adapter(name, path)
    name = args.served_name or args.model
    app = build_app(engine, name, api_key, hosts=allowed_hosts(args.host), adapter_dirs=dirs)
    print(f"serving {name!r} at http://{args.host}:{args.port}/v1", file=sys.stderr)
    if not api_key:
        print(
            "  no API key: any program on this machine may use it (browser pages may not); "
            "set MCPRL_API_KEY to require one",
            file=sys.stderr,
        )
    where = ", ".join(map(str, dirs)) if dirs else "nowhere (--allow-adapter-dir DIR to allow)"
    print(f"  adapters load over HTTP from: {where}", file=sys.stderr)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    finally:
        engine.close()
    return 0


def _serve_backend(args: argparse.Namespace, api_key: str | None) -> int:
    """`mcprl serve --train`: the OpenAI API and the backend API on one port, until Ctrl-C."""
    import signal
    import threading

    from mcprl.backends import LocalBackend, backend_routes

    if args.lora or args.allow_adapter_dir or args.served_name:
        raise UsageError(
            "--train serves the runs under --path: --lora, --allow-adapter-dir and "
            "--served-name do not apply"
        )
    backend = LocalBackend(
        args.path,
        inference_dtype=args.dtype,
        train_dtype=args.dtype,
        device=args.device,
        host=args.host,
        port=args.port,
        api_key=api_key or "",
        max_batch_size=args.max_batch_size,
        max_batch_kv_bytes=args.max_batch_kv_mb,
    )
    print(
        f"loading {args.model} ({backend.inference_dtype} on {backend.device}) …", file=sys.stderr
    )
    backend.start(args.model, routes=backend_routes(backend))
    print(
        f"serving {args.model!r} at http://{args.host}:{args.port}/v1 and the backend API at "
        f"http://{args.host}:{args.port}/backend; runs under {Path(args.path).resolve()}",
        file=sys.stderr,
    )
    print(
        f"  train from another machine: mcprl train SERVER --backend http://HOST:{args.port}"
        + ("" if api_key else " (no API key: loopback only)"),
        file=sys.stderr,
        flush=True,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        backend.close()
    return 0
