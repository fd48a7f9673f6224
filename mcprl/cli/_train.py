"""`mcprl train` and `mcprl autorl`: a run from the flags, Ctrl-C handled, a summary at the end."""

from __future__ import annotations

import argparse
import re
import shlex
import signal
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import anyio

from mcprl._defaults import configured_llm
from mcprl.cli._display import exit_code, print_summary, say, stop_message
from mcprl.cli._machine import open_backend
from mcprl.cli._options import run_config
from mcprl.mcp import ServerInfo
from mcprl.scenarios import ScenarioSet


def _slug(text: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-._")[:64]
    return slug or "default"


def default_project(server: str | None) -> str:
    from mcprl.mcp import ServerSpec

    if server is None:
        return "autorl"
    spec = ServerSpec.parse(server)
    return _slug(urlparse(spec.url).hostname or spec.name if spec.url else Path(spec.name).stem)


def _train_with_ctrl_c(run: Any, prepare: Callable[[], Any]) -> Any:
    """Prepare and run; the first Ctrl-C stops at a safe point, a second one aborts."""

    async def main() -> Any:
        failure: Exception | None = None
        async with anyio.create_task_group() as tg:

            async def watch() -> None:
                with anyio.open_signal_receiver(signal.SIGINT) as signals:
                    async for _ in signals:
                        if run.stopping:
                            raise KeyboardInterrupt
                        say(stop_message(run.phase))
                        run.request_stop()

            tg.start_soon(watch)
            try:  # errors raised here, not out of the task group (which would wrap them)
                await prepare()
                summary = await run.run()
            except Exception as exc:
                failure = exc
            tg.cancel_scope.cancel()
        if failure is not None:
            raise failure
        return summary

    return anyio.run(main)


def _observers(config: Any) -> list[Any]:
    """What follows a run's events: the console, its trackers, and its report unless
    --no-report."""
    from mcprl.console import Console
    from mcprl.report import ReportObserver
    from mcprl.trackers import TrackerObserver

    observers: list[Any] = [Console(say), TrackerObserver(config.trackers)]
    if config.write_report:
        observers.append(ReportObserver())
    return observers


def cmd_train(args: argparse.Namespace) -> int:
    from mcprl.scenarios import scenarios_for
    from mcprl.train import TrainingRun

    args.project = args.project or default_project(args.server)
    config = run_config(args)

    async def make(info: ServerInfo) -> ScenarioSet:
        return await scenarios_for(
            args.server, info, n=args.n, generator=args.generator, seed=config.seed,
            allow_writes=config.rollout.allow_writes, say=say,
            fresh_sessions=config.rollout.share_session == "never",
        )  # fmt: skip

    with open_backend(args) as backend:
        run = TrainingRun(
            config, args.server, backend, say=say, progress=not args.quiet,
            workdir=Path(args.path) / config.project / config.name,
            observers=_observers(config),
        )  # fmt: skip
        summary = _train_with_ctrl_c(run, lambda: run.prepare(args.scenarios, make_scenarios=make))
    print_summary(summary, "mcprl " + " ".join(shlex.quote(a) for a in sys.argv[1:]))
    return exit_code(summary)


def cmd_autorl(args: argparse.Namespace) -> int:
    from mcprl.autorl import autorl_rubric, prepare_autorl
    from mcprl.train import TrainingRun

    args.project = args.project or default_project(args.server)
    if args.server is None:
        setattr(args, "rollout.max_turns", 1)  # one reply per input
    generator = args.generator or configured_llm()
    with open_backend(args) as backend:
        config = run_config(args, reward="ruler", rubric=autorl_rubric(args.task))
        run = TrainingRun(
            config, args.server, backend, say=say, progress=not args.quiet,
            workdir=Path(args.path) / config.project / config.name,
            observers=_observers(config),
        )  # fmt: skip

        prepare = partial(prepare_autorl, run, args.task, n=args.n, generator=generator)
        summary = _train_with_ctrl_c(run, prepare)
    print_summary(summary, "mcprl " + " ".join(shlex.quote(a) for a in sys.argv[1:]))
    return exit_code(summary)
