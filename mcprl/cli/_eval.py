"""`mcprl eval`: models side by side on a scenario set, and `mcprl report`."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import anyio

from mcprl.cli._display import say
from mcprl.cli._machine import open_backend
from mcprl.cli._options import rollout_config
from mcprl.cli._train import default_project
from mcprl.errors import UsageError


def cmd_eval(args: argparse.Namespace) -> int:
    from mcprl.curriculum import with_worked_examples
    from mcprl.evaluate import (
        EvalWriter,
        backend_models,
        eval_scenarios,
        evaluate_models,
        format_table,
        trained_examples,
    )
    from mcprl.mcp import inspect_server, open_session
    from mcprl.model import LiteLLMModel
    from mcprl.scenarios import hidden_writers
    from mcprl.train import local_judge
    from ruler import Judge

    project = args.project or default_project(args.server)
    config = rollout_config(args)

    async def run(backend: Any) -> tuple[str, Path]:
        nonlocal config
        scenarios, whole = await eval_scenarios(
            args.scenarios, args.server, args.models, backend=backend, project=project,
            split=args.split,
        )  # fmt: skip
        info = await inspect_server(args.server)  # the tools a training run on the set offers
        hidden = hidden_writers(info.tools, whole, config.allow_writes)
        config = config.model_copy(update={"hidden_tools": hidden})
        for spec, (n, choice) in (await trained_examples(args.models, backend, project)).items():
            if n != config.examples:
                say(
                    f"  note: {spec} trained with {n} worked examples and this evaluation shows "
                    f"{config.examples}: `--examples {n}` evaluates it as it trained"
                )
            elif n and choice != config.example_choice:
                say(
                    f"  note: {spec} trained with worked examples chosen by {choice} and this "
                    f"evaluation chooses by {config.example_choice}: `--example-choice "
                    f"{choice}` evaluates it as it trained"
                )
        if config.examples:  # as `mcprl train --examples` shows them: from the set's train split
            async with open_session(args.server, max_result_chars=config.max_result_chars) as s:
                config = await with_worked_examples(whole, s, config)
        models = await backend_models(
            args.models, backend, project=project, base_model=args.base_model,
            api_base=args.api_base,
        )  # fmt: skip
        judge = None
        if args.judge == "local":
            if all(isinstance(m, LiteLLMModel) for m in models):
                raise UsageError("--judge local needs a local model (a run or 'base') to serve")
            where = await backend.base_inference(args.base_model)
            judge = local_judge(where.base_name, where.base_url, where.api_key)
        elif args.judge:
            judge = Judge(args.judge, api_base=args.judge_api_base, temperature=0.0)
        out = Path(args.output) if args.output else Path(args.path) / project / "evals"
        writer = EvalWriter(out)
        say(f"evaluating {len(models)} model(s) on {len(scenarios)} scenarios into {writer.dir} …")
        rows, groups = await evaluate_models(
            models, scenarios, args.server, config, attempts=args.attempts, seed=args.seed,
            judge=judge, max_concurrency=args.concurrency, progress=not args.quiet,
            on_model=writer.add,
        )  # fmt: skip
        table = format_table(rows)
        return table, writer.finish(rows, groups, table)

    with open_backend(args) as backend:
        table, out = anyio.run(run, backend)
    print(table)
    print(f"\nsaved to {out}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from mcprl.report import write_report

    target = Path(args.run)
    if args.backend != "local":
        target = anyio.run(lambda: _export_remote(args))
    elif not (target / "model.json").is_file():
        target = Path(args.path) / args.run
    out = write_report(target)
    print(f"wrote {out}")
    return 0


async def _export_remote(args: argparse.Namespace) -> Path:
    """Copy a run kept by a remote backend into --path (records, not checkpoints)."""
    from mcprl.backends import RemoteBackend, export_run
    from mcprl.model import TrainableModel

    project, _, name = args.run.partition("/")
    if not name:
        raise UsageError(f"{args.run!r}: with --backend URL, name the run as PROJECT/NAME")
    model = TrainableModel(name=name, project=project)
    backend = RemoteBackend(args.backend, api_key=args.api_key)
    if await backend.read_file(model, "model.json") is None:
        raise UsageError(f"the backend at {backend.url} has no run {args.run}")
    return await export_run(backend, model, Path(args.path) / project / name)
