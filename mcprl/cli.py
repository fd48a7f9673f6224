"""The `mcprl` command line: argument parsing and display only; every command calls the library.

mcprl tools SERVER [--json]
mcprl scenarios SERVER -n 24 -o FILE [--generator MODEL] [--grounded] [--seed N]
mcprl train SERVER [--scenarios FILE] [--steps N] ...      (see `mcprl train -h`)
mcprl eval SERVER --model NAME[@STEP] --model ... [--scenarios FILE]
mcprl report PROJECT/MODEL
mcprl autorl "TASK DESCRIPTION" [--server SERVER]
mcprl serve [--model M] [--port P]

Exit codes: 0 done, 1 an error (the message says what and how to fix it), 2 a usage error,
130 a run stopped by Ctrl-C (what was finished is saved; the same command resumes it).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shlex
import shutil
import signal
import sys
import textwrap
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import anyio
from pydantic import ValidationError

from mcprl import __version__
from mcprl._defaults import configured_llm
from mcprl.errors import MCPRLError, UsageError
from mcprl.mcp import ServerInfo, inspect_server
from mcprl.scenarios import ScenarioSet, generate_scenarios, grounded_with_notes, reword_tasks
from mcprl.trackers import TRACKERS
from ruler import RulerError

SERVER_HELP = (
    "an MCP server: an http(s):// URL (a path ending in /sse means SSE), a command line run "
    "over stdio, an mcpServers config file (file.json or file.json#name), or example:NAME "
    "(calculator, notes, catalog)"
)
DTYPES = ["auto", "bfloat16", "float32"]


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
        if generator is None or args.grounded:
            built = await grounded_with_notes(
                args.server, args.n, seed=args.seed, info=info, allow_writes=args.allow_writes,
                say=_say,
            )  # fmt: skip
            if generator is None:
                return built
            _say(f"  rewording {len(built)} tasks with {generator} (answers stay verified) …")
            built, kept = await reword_tasks(
                built, generator, seed=args.seed, api_base=args.api_base
            )
            if kept:
                _say(f"  {kept} tasks kept their generated text (the rewrite lost a value)")
            return built
        _say(
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
        _say(
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
        text = textwrap.shorten(s.task, _width() - 10, placeholder=" …")
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
    _quiet_libraries()
    _set_threads(args)
    device = pick_device(args.device)  # a wrong --device fails before the model loads
    if args.train:
        return _serve_backend(args, api_key)
    dtype = pick_dtype(args.dtype, device)
    print(f"loading {args.model} ({dtype} on {device}) …", file=sys.stderr)
    loaded = load_model(args.model, dtype=dtype, device=device)
    engine = Engine(loaded, max_batch_size=args.max_batch_size)
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


def _say(text: str) -> None:
    from tqdm.auto import tqdm

    tqdm.write(flags_for(text), file=sys.stderr)


# The library names a setting as `field` or `field=value` (RunConfig's fields, and the
# parameters of the functions the commands call); the CLI says which flag sets it.
_FLAG_OF = {
    "base_model": "--model",
    "name": "--name",
    "scenarios": "--scenarios",
    "judge": "--judge",
    "judge_api_base": "--judge-api-base",
    "reward": "--reward",
    "val_attempts": "--val-attempts",
    "rollouts_per_group": "--rollouts-per-group",
    "oversample": "--oversample",
    "lora.r": "--lora-r",
    "lora.alpha": "--lora-alpha",
    "trackers": "--tracker",
    "trainer": "--trainer",
    "backend": "--backend",
    "api_key": "--api-key",
    "vllm_url": "--vllm-url",
    "device": "--device",
    "dtype": "--dtype",
    "allow_writes=True": "--allow-writes",
    "generator": "--generator",
    "grounded": "--grounded",
    "n": "-n",
    "split": "--split",
    "eval_base_model": "--base-model",
    "rollout.look_before_answer=False": "--early-answer",
}
_SETTING = re.compile(r"`([a-z_][a-z_.]*)(?:=([^`\s]+))?`")


class _FlagsFormatter(logging.Formatter):
    """The library's logged warnings, with the flags that set the settings they name."""

    def format(self, record: logging.LogRecord) -> str:
        return flags_for(super().format(record))


def flags_for(text: str) -> str:
    """`text` with the settings it names (`field`, `field=value`) as the flags that set them."""

    def flag(match: re.Match[str]) -> str:
        field, value = match.group(1), match.group(2)
        whole = f"{field}={value}" if value is not None else field
        if whole in _FLAG_OF:
            return _FLAG_OF[whole]
        if field not in _FLAG_OF:
            return match.group(0)
        return _FLAG_OF[field] + (f" {value}" if value is not None else "")

    return _SETTING.sub(flag, text)


def _slug(text: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-._")[:64]
    return slug or "default"


def _default_project(server: str | None) -> str:
    from mcprl.mcp import ServerSpec

    if server is None:
        return "autorl"
    spec = ServerSpec.parse(server)
    return _slug(urlparse(spec.url).hostname or spec.name if spec.url else Path(spec.name).stem)


def _loop_flags(p: argparse.ArgumentParser) -> None:
    """The agent-loop switches `mcprl train`, `autorl` and `eval` share."""
    from mcprl.rollout import RolloutConfig

    p.add_argument(
        "--early-answer",
        action="store_const",
        const=False,
        dest="look_before_answer",
        help="let an attempt call complete_task before any other tool (default: only after its "
        "first tool call, sent as OpenAI's allowed_tools tool_choice; use this for an endpoint "
        "that rejects that)",
    )
    p.add_argument(
        "--fresh-sessions",
        action="store_const",
        const="never",
        dest="share_session",
        help="a fresh MCP session (over stdio: a fresh server process) for every attempt, even "
        "when every tool is annotated read-only (by default those attempts share one)",
    )
    p.add_argument(
        "--results-as",
        choices=["json", "text"],
        help="a tool result that comes as structured content and as text saying the same is "
        'shown as JSON ({"result": -160}) or as the text (-160) '
        f"(default {RolloutConfig().results_as})",
    )


def _sampling_flags(p: argparse.ArgumentParser) -> None:
    """How attempts sample tokens; `mcprl train`, `autorl` and `eval` share them."""
    from mcprl.rollout import RolloutConfig

    d = RolloutConfig()
    p.add_argument(
        "--temperature", type=float, help=f"sampling temperature (default {d.temperature:g})"
    )
    p.add_argument(
        "--top-p", type=float, help=f"nucleus sampling; 1 turns it off (default {d.top_p:g})"
    )
    p.add_argument(
        "--min-p",
        type=float,
        help="drop tokens less likely than MIN_P times the likeliest one; 0 turns it off "
        f"(default {d.min_p:g}; sent as `min_p`, which vLLM and `mcprl serve` read)",
    )


def _rollout_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The RolloutConfig fields the flags set (a flag left out keeps the default)."""
    fields = (
        "max_turns",
        "max_tokens",
        "temperature",
        "top_p",
        "min_p",
        "look_before_answer",
        "share_session",
        "results_as",
    )
    return {k: getattr(args, k) for k in fields if getattr(args, k) is not None}


def _run_config(args: argparse.Namespace, **overrides: Any):
    """One RunConfig from the flags; a flag left out keeps the config's own default."""
    from mcprl.train import RunConfig

    def given(**fields: Any) -> dict[str, Any]:
        return {k: v for k, v in fields.items() if v is not None}

    if args.quick:  # a first look: the flags given still win
        for key, value in QUICK.items():
            if getattr(args, key) is None:
                setattr(args, key, value)
    rollout = _rollout_flags(args) | overrides.pop("rollout", {})
    train = given(
        learning_rate=args.lr,
        loss=args.loss,
        beta=args.beta,
        eps_low=args.epsilon,
        eps_high=args.epsilon_high,
        scale_rewards=args.scale_rewards,
        positive_weight=args.positive_weight,
        updates_per_step=args.updates_per_step,
        old_logprobs=args.old_logprobs,
        informative=args.informative,
    )
    if args.loss:
        train |= _loss_defaults(args.loss)
    lora = given(r=args.lora_r, alpha=args.lora_alpha)
    fields = given(
        project=args.project,
        name=args.name,
        base_model=args.model,
        steps=args.steps,
        groups_per_step=args.groups_per_step,
        rollouts_per_group=args.rollouts_per_group,
        eval_every=args.eval_every,
        val_attempts=args.val_attempts,
        max_val_scenarios=args.max_val,
        reward=args.reward,
        judge=args.judge,
        judge_api_base=args.judge_api_base,
        seed=args.seed,
        max_concurrency=args.concurrency,
        sampling=args.sampling,
        oversample=args.oversample,
        explore=args.explore,
        trackers=args.tracker,
        lr_schedule=args.lr_schedule,
    )
    defaults = RunConfig()
    fields |= {
        "rollout": _with_flags(defaults.rollout, rollout),
        "train": _with_flags(defaults.train, train),
        "lora": _with_flags(defaults.lora, lora),
        "write_report": not args.no_report,
    }
    try:
        return RunConfig(**(fields | overrides))
    except ValidationError as exc:
        raise UsageError(_option_error(exc)) from None


def _with_flags(defaults: Any, flags: dict[str, Any]) -> Any:
    """A copy of a config model with the flags' values, validated (`model_copy` would not
    check them); a bad value is one line naming its flag."""
    try:
        return type(defaults)(**(defaults.model_dump() | flags))
    except ValidationError as exc:
        raise UsageError(_option_error(exc)) from None


# `--quick`: a first run that trains real steps in a few minutes on a laptop CPU
QUICK = {
    "steps": 2,
    "groups_per_step": 2,
    "rollouts_per_group": 8,
    "max_val": 4,
    "val_attempts": 2,
    "eval_every": 0,
}

# RunConfig fields (and nested ones) by the command-line option that sets them
_OPTIONS = {
    "max_val_scenarios": "--max-val",
    "max_concurrency": "--concurrency",
    "base_model": "--model",
    "learning_rate": "--lr",
    "judge_api_base": "--judge-api-base",
    "eps_low": "--epsilon",
    "eps_high": "--epsilon-high",
    "r": "--lora-r",
    "alpha": "--lora-alpha",
    "trackers": "--tracker",
}


def _option_error(exc: ValidationError) -> str:
    """One line naming the option, the value given and what it must be."""
    first = exc.errors()[0]
    field = str(first["loc"][-1]) if first["loc"] else ""
    option = _OPTIONS.get(field, "--" + field.replace("_", "-")) if field else "options"
    message = first["msg"].removeprefix("Value error, ").replace("Input should be", "must be")
    if "val_attempts" in message:
        option, message = "--val-attempts", message.replace("val_attempts", "it")
    given = f" {first['input']}" if field and not isinstance(first["input"], dict) else ""
    return f"{option}{given}: {message}"


def _loss_defaults(loss: str) -> dict[str, Any]:
    return {"normalization": "sequence"} if loss == "gspo" else {}


def _stop_message(phase: str) -> str:
    if phase == "training":
        what = "the training step in progress finishes and is saved"
    elif phase in ("evaluation", "rollouts"):
        what = f"the {phase} in progress {'is' if phase == 'evaluation' else 'are'} dropped; "
        what += "every finished step is saved"
    else:
        what = "nothing has been trained yet"
    return f"stopping: {what}; Ctrl-C again to abort at once"


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
                        _say(_stop_message(run.phase))
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


EXIT_INTERRUPTED = 130  # the shell's code for a process stopped by Ctrl-C (128 + SIGINT)


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def print_summary(summary: Any, again: str) -> None:
    done = summary.last_step - summary.first_step
    state = "stopped early" if summary.interrupted else "done"
    print(
        f"\n{summary.project}/{summary.name}: {state} at step {summary.last_step} of "
        f"{summary.target_steps} ({done} step{'' if done == 1 else 's'} this run); "
        f"reward {summary.reward}" + (f", judge {summary.judge}" if summary.judge else "")
    )
    keys = [
        k
        for k in ("success", "reward", "completed", "turns", "tool_errors")
        if k in summary.baseline or k in summary.final
    ]
    if keys:
        print(
            f"  {'val':<13}{'step ' + str(summary.baseline_step):>12}"
            f"{'step ' + str(summary.final_step):>12}"
        )
        for k in keys:
            cells = []
            for metrics in (summary.baseline, summary.final):
                v = metrics.get(k)
                pct = k in ("success", "completed")
                cells.append("–" if v is None else (f"{v:.0%}" if pct else f"{v:.3f}"))
            print(f"  {k:<13}{cells[0]:>12}{cells[1]:>12}")
    if done:
        updated = done - summary.steps_without_update
        print(
            f"  {updated} of {done} step{'' if done == 1 else 's'} updated the model"
            + (
                f"; in {summary.steps_without_update} every group tied, so nothing was learned "
                "from them"
                if summary.steps_without_update
                else ""
            )
        )
    if summary.groups_dropped:
        lost = sum(summary.groups_dropped.values())
        where = ", ".join(f"step {k}: {v}" for k, v in sorted(summary.groups_dropped.items()))
        print(f"  the judge failed on {lost} group{'' if lost == 1 else 's'} ({where}); "
              "they were not trained on")  # fmt: skip
    if summary.times:
        print("  time: " + ", ".join(f"{k} {_duration(v)}" for k, v in summary.times.items()))
    print(f"  checkpoints: {summary.run_dir}/checkpoints")
    if summary.report:
        print(f"  report: {summary.report}")
    if summary.interrupted or summary.last_step < summary.target_steps:
        print(f"  resume: {again}")


def _add_run_options(p: argparse.ArgumentParser) -> None:
    from typing import get_args

    from mcprl.curriculum import Sampling
    from mcprl.train import RunConfig

    d = RunConfig()  # the defaults shown are the library's: one source of truth
    p.add_argument("--model", help=f"base model (default {d.base_model})")
    p.add_argument("--project", help="project directory under --path (default: from the server)")
    p.add_argument("--name", help=f"the run's name in the project (default {d.name})")
    p.add_argument("--path", default=".mcprl", help="where runs live (default .mcprl)")
    p.add_argument("--steps", type=int, help=f"train up to this step (default {d.steps})")
    p.add_argument(
        "--groups-per-step",
        type=int,
        help=f"informative groups (scenarios) per step (default {d.groups_per_step})",
    )
    p.add_argument(
        "--rollouts-per-group",
        type=int,
        help=f"attempts per scenario (default {d.rollouts_per_group})",
    )
    p.add_argument(
        "--sampling",
        choices=get_args(Sampling),
        help="which training scenarios a step draws: fresh (kinds of task likely to teach, easy "
        "first, each kind's least-drawn scenarios first; the default), curriculum (the same, "
        "estimated per scenario) or uniform",
    )
    p.add_argument(
        "--oversample",
        type=float,
        help="draw up to this many times --groups-per-step scenarios to replace groups whose "
        f"rewards tie (default {d.oversample:g}; 1 disables)",
    )
    p.add_argument(
        "--explore",
        type=float,
        help="at a kind of task tried before and never solved by the model's own choice, this "
        "share of a group's attempts each start with a different tool the loop picks (default "
        f"{d.explore:g}; 0 disables)",
    )
    p.add_argument(
        "--max-turns", type=int, help=f"turns per attempt (default {d.rollout.max_turns})"
    )
    _loop_flags(p)
    p.add_argument(
        "--max-tokens", type=int, help=f"tokens per model reply (default {d.rollout.max_tokens})"
    )
    _sampling_flags(p)
    p.add_argument(
        "--reward",
        choices=["auto", "ruler", "reference", "both"],
        help="auto (the default): the references when every scenario has one (plus RULER with "
        "a configured judge), else RULER with a configured judge",
    )
    p.add_argument(
        "--judge",
        help="LiteLLM model for RULER (default: $MCPRL_JUDGE, a provider "
        "key's model, else the local base model)",
    )
    p.add_argument("--judge-api-base", help="OpenAI-compatible base URL for the judge")
    t = p.add_argument_group("training step")
    t.add_argument("--lr", type=float, help=f"learning rate (default {d.train.learning_rate:g})")
    t.add_argument(
        "--lr-schedule",
        choices=["constant", "linear", "cosine"],
        help="the learning rate over the run: constant, or from --lr at step 1 down to 0 after "
        f"--steps, along a line or a half cosine (default {d.lr_schedule})",
    )
    t.add_argument(
        "--loss",
        choices=["ppo", "gspo", "cispo"],
        help="policy loss: ppo (token-level clipped ratio), gspo (sequence-level ratio), cispo "
        f"(clipped importance weights) (default {d.train.loss})",
    )
    t.add_argument(
        "--beta",
        type=float,
        help=f"KL penalty to the base model; 0 computes no KL (default {d.train.beta:g})",
    )
    t.add_argument(
        "--epsilon", type=float, help=f"lower clip range of the ratio (default {d.train.eps_low:g})"
    )
    t.add_argument(
        "--epsilon-high",
        type=float,
        help=f"upper clip range of the ratio (default {d.train.eps_high:g})",
    )
    t.add_argument(
        "--scale-rewards",
        choices=["group", "batch", "none"],
        help="divide advantages by the reward std of their group (GRPO), of the step's groups "
        f"(batch), or not at all (none, Dr. GRPO) (default {d.train.scale_rewards})",
    )
    t.add_argument(
        "--positive-weight",
        type=float,
        help="weight of the attempts that beat their group's mean, in (0, 1]: below 1, "
        "updates mostly push down what failed (W-REINFORCE uses 0.1; on the calculator at lr "
        "2e-3, 0.1 unlearned copying the task's numbers in 4 steps: benchmarks/RESULTS.md) "
        f"(default {d.train.positive_weight:g})",
    )
    t.add_argument(
        "--updates-per-step",
        type=int,
        help="optimizer steps per training step, each on its share of the groups "
        f"(default {d.train.updates_per_step})",
    )
    t.add_argument(
        "--old-logprobs",
        choices=["trainer", "sampler"],
        help="what the clipped ratio divides by: the trainer's own log-probabilities before "
        "the step (the default) or the server's sampling ones",
    )
    t.add_argument(
        "--informative",
        choices=["reward", "success"],
        help="which groups a step trains on and redraws for: those whose rewards differ, or "
        "those where some attempts succeeded and some failed (DAPO's filter; with a reward "
        "that checks the scenarios' reference answers, else the rewards decide) "
        f"(default {d.train.informative})",
    )
    t.add_argument(
        "--no-scale-rewards",
        dest="scale_rewards",
        action="store_const",
        const="none",
        help="the same as --scale-rewards none",
    )
    t.add_argument("--lora-r", type=int, help=f"LoRA rank, new runs only (default {d.lora.r})")
    t.add_argument(
        "--lora-alpha", type=int, help=f"LoRA alpha, new runs only (default {d.lora.alpha})"
    )
    e = p.add_argument_group("evaluation")
    e.add_argument(
        "--eval-every",
        type=int,
        help=f"val evaluation every k steps; 0: before the first step and after the last only "
        f"(default {d.eval_every})",
    )
    e.add_argument(
        "--val-attempts",
        type=int,
        help=f"attempts per val scenario (default {d.val_attempts})",
    )
    e.add_argument(
        "--max-val", type=int, help="evaluate on at most this many val scenarios (default all)"
    )
    p.add_argument("--seed", type=int, help=f"seeds scenario draws and sampling (default {d.seed})")
    p.add_argument(
        "--concurrency", type=int, help=f"attempts in flight (default {d.max_concurrency})"
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a first look that trains in minutes on a laptop CPU: "
        + ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in QUICK.items())
        + " (flags given still win)",
    )
    p.add_argument(
        "--dtype",
        choices=DTYPES,
        default="auto",
        help="inference and training weights; LoRA weights stay float32 (default auto: "
        "bfloat16 on a GPU and on a CPU with native bfloat16, else float32)",
    )
    _add_device(p)
    _add_backend(p)
    p.add_argument(
        "--tracker",
        action="append",
        choices=TRACKERS,
        help="also send the metrics to: csv (RUN/metrics.csv), tensorboard (RUN/tensorboard; "
        "needs tensorboard), wandb (needs wandb); repeatable. history.jsonl is always written",
    )
    p.add_argument("--no-report", action="store_true", help="skip report.html at the end")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")


def _backend(args: argparse.Namespace):
    """The backend `--backend` names: this process (`local`, the default), `vllm`, or the URL
    of `mcprl serve --train`."""
    if args.backend == "vllm":
        _unsloth_before_transformers(args.trainer)
        from mcprl.backends import VLLMBackend

        _quiet_libraries()
        _set_threads(args)
        backend = VLLMBackend(
            args.path, vllm_url=args.vllm_url, api_key=args.api_key, sleep_mode=args.vllm_sleep,
            train_dtype=args.dtype, device=args.device, train_with=args.trainer,
        )  # fmt: skip
        where = args.vllm_url or "a `vllm serve` started here"
        _say(f"  inference on vLLM ({where}), training with {backend.trainer_name} here")
        return backend
    if args.backend and args.backend != "local":
        from mcprl.backends import RemoteBackend

        if args.trainer != "auto":
            raise UsageError(
                f"--trainer {args.trainer}: a remote backend trains with its own trainer; "
                "leave --trainer out with --backend URL"
            )
        _say(f"  training and inference on {args.backend} (runs kept there)")
        return RemoteBackend(args.backend, api_key=args.api_key)
    from mcprl.backends import LocalBackend
    from mcprl.training import pick_trainer

    pick_trainer(args.trainer, args.device, separate_inference=False)  # refuses unsloth here
    _quiet_libraries()
    _set_threads(args)
    return LocalBackend(
        args.path, inference_dtype=args.dtype, train_dtype=args.dtype, device=args.device
    )


def _unsloth_before_transformers(choice: str) -> None:
    """Import Unsloth first where it may train: it patches transformers as it is imported, and
    warns that optimizations are lost when transformers came first."""
    import importlib.util

    if choice == "peft" or importlib.util.find_spec("unsloth") is None:
        return
    import torch

    if torch.cuda.is_available():
        import unsloth  # noqa: F401


def _add_backend(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--backend",
        default="local",
        metavar="local|vllm|URL",
        help="where the model is served and trained: local (this process, the default), vllm "
        "(vLLM serves, peft trains here: a GPU machine), or the URL of `mcprl serve --train` on "
        "another machine (e.g. http://gpu-box:8000); rollouts and MCP sessions stay here",
    )
    p.add_argument(
        "--api-key",
        help="the remote backend's key (default: $MCPRL_API_KEY), or with --backend vllm the "
        "vLLM server's (default: $VLLM_API_KEY); a flag is visible in `ps`",
    )
    p.add_argument(
        "--vllm-url",
        help="with --backend vllm: attach to this running vLLM server (it must read the "
        "adapters under --path at the same absolute path) instead of starting one",
    )
    p.add_argument(
        "--vllm-sleep",
        action="store_true",
        help="with --backend vllm: put vLLM to sleep while a step trains (one shared GPU)",
    )
    p.add_argument(
        "--trainer",
        default="auto",
        choices=("auto", "peft", "unsloth"),
        help="what trains the LoRA with --backend vllm: unsloth (Unsloth's FastLanguageModel, on "
        "a GPU), peft, or auto (the default: Unsloth where it is installed and the device is a "
        "GPU, else peft); the local backend always trains with peft",
    )


def _add_device(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--device",
        default="auto",
        help="where the model runs: auto (a GPU where present, the default), cpu, cuda, cuda:N",
    )
    p.add_argument(
        "--threads",
        type=int,
        help="CPU threads for the model (default: $MCPRL_THREADS, else one per physical core); "
        "on a machine busy with other work, give the cores that are free (e.g. 1)",
    )


def _set_threads(args: argparse.Namespace) -> None:
    """Apply --threads (or MCPRL_THREADS) before a model loads."""
    threads = args.threads
    if threads is None and os.environ.get("MCPRL_THREADS"):
        try:
            threads = int(os.environ["MCPRL_THREADS"])
        except ValueError:
            raise UsageError(
                f"MCPRL_THREADS={os.environ['MCPRL_THREADS']!r}: must be a whole number"
            ) from None
    if threads is None:
        return
    if threads < 1:
        raise UsageError(f"--threads {threads}: must be 1 or more")
    import torch

    torch.set_num_threads(threads)


def _observers(config: Any) -> list[Any]:
    """What follows a run's events: the console, its trackers, and its report unless
    --no-report."""
    from mcprl.console import Console
    from mcprl.report import ReportObserver
    from mcprl.trackers import TrackerObserver

    observers: list[Any] = [Console(_say), TrackerObserver(config.trackers)]
    if config.write_report:
        observers.append(ReportObserver())
    return observers


def cmd_train(args: argparse.Namespace) -> int:
    from mcprl.scenarios import scenarios_for
    from mcprl.train import TrainingRun

    args.project = args.project or _default_project(args.server)
    config = _run_config(args)

    async def make(info: ServerInfo) -> ScenarioSet:
        return await scenarios_for(
            args.server, info, n=args.n, generator=args.generator, seed=config.seed,
            allow_writes=args.allow_writes, say=_say,
        )  # fmt: skip

    with _backend(args) as backend:
        run = TrainingRun(
            config, args.server, backend, say=_say, progress=not args.quiet,
            workdir=Path(args.path) / config.project / config.name,
            observers=_observers(config),
        )  # fmt: skip
        summary = _train_with_ctrl_c(run, lambda: run.prepare(args.scenarios, make_scenarios=make))
    print_summary(summary, "mcprl " + " ".join(shlex.quote(a) for a in sys.argv[1:]))
    return EXIT_INTERRUPTED if summary.interrupted else 0


def cmd_autorl(args: argparse.Namespace) -> int:
    from mcprl.autorl import autorl_rubric, prepare_autorl
    from mcprl.train import TrainingRun

    args.project = args.project or _default_project(args.server)
    if args.server is None:
        args.max_turns = 1  # one reply per input
    generator = args.generator or configured_llm()
    with _backend(args) as backend:
        config = _run_config(args, reward="ruler", rubric=autorl_rubric(args.task))
        run = TrainingRun(
            config, args.server, backend, say=_say, progress=not args.quiet,
            workdir=Path(args.path) / config.project / config.name,
            observers=_observers(config),
        )  # fmt: skip

        prepare = partial(prepare_autorl, run, args.task, n=args.n, generator=generator)
        summary = _train_with_ctrl_c(run, prepare)
    print_summary(summary, "mcprl " + " ".join(shlex.quote(a) for a in sys.argv[1:]))
    return EXIT_INTERRUPTED if summary.interrupted else 0


def cmd_eval(args: argparse.Namespace) -> int:
    from mcprl.evaluate import (
        EvalWriter,
        backend_models,
        eval_scenarios,
        evaluate_models,
        format_table,
    )
    from mcprl.model import LiteLLMModel
    from mcprl.train import RunConfig, local_judge
    from ruler import Judge

    project = args.project or _default_project(args.server)
    config = _with_flags(RunConfig().rollout, _rollout_flags(args))

    async def run(backend: Any) -> tuple[str, Path]:
        scenarios = await eval_scenarios(
            args.scenarios, args.server, args.models, backend=backend, project=project,
            split=args.split,
        )  # fmt: skip
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
        _say(f"evaluating {len(models)} model(s) on {len(scenarios)} scenarios into {writer.dir} …")
        rows, groups = await evaluate_models(
            models, scenarios, args.server, config, attempts=args.attempts, seed=args.seed,
            judge=judge, max_concurrency=args.concurrency, progress=not args.quiet,
            on_model=writer.add,
        )  # fmt: skip
        table = format_table(rows)
        return table, writer.finish(rows, groups, table)

    with _backend(args) as backend:
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


class _Parser(argparse.ArgumentParser):
    """Flags are exact: `--step 3` is refused, not taken as `--steps 3` (argparse's prefix
    matching). An unknown flag is reported with its own command's usage and the nearest flag."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.commands: dict[str, argparse.ArgumentParser] = {}

    def add_subparsers(self, **kwargs: Any) -> Any:
        action = super().add_subparsers(**kwargs)
        self.commands = action.choices
        return action

    def parse_args(self, args: Any = None, namespace: Any = None) -> argparse.Namespace:
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            command = self.commands.get(getattr(parsed, "command", None) or "", self)
            command.error(_unrecognized(command, extra))
        return parsed


def _unrecognized(parser: argparse.ArgumentParser, extra: list[str]) -> str:
    import difflib

    message = f"unrecognized arguments: {' '.join(extra)}"
    flags = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
    for word in extra:
        if word.startswith("-"):
            near = difflib.get_close_matches(word.split("=", 1)[0], flags, n=1, cutoff=0.6)
            if near:
                return f"{message} (did you mean {near[0]}?)"
    return message


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="mcprl",
        description="Train open models to use any MCP server's tools. "
        "For judging groups of trajectories, see the `ruler` command.",
        epilog="exit codes: 0 done, 1 error, 2 usage error, 130 stopped by Ctrl-C (resumable)",
    )
    p.add_argument("--version", action="version", version=f"mcprl {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    t = sub.add_parser("tools", help="list a server's tools and resources")
    t.add_argument("server", help=SERVER_HELP)
    t.add_argument("--json", action="store_true", help="print JSON for machines")
    t.add_argument(
        "--timeout", type=float, default=30.0, help="start-up time-out in seconds (default 30)"
    )
    t.set_defaults(func=cmd_tools)

    s = sub.add_parser("scenarios", help="write practice tasks for a server's tools")
    s.add_argument("server", help=SERVER_HELP)
    s.add_argument("-n", type=int, default=24, help="how many scenarios (default 24)")
    s.add_argument("-o", "--output", required=True, help="JSONL file to write")
    s.add_argument(
        "--generator",
        help="LiteLLM model that writes tasks (e.g. openai/gpt-4.1); with --grounded it only "
        "rewords the grounded tasks, whose calls and answers stay the verified ones",
    )
    s.add_argument(
        "--grounded",
        action="store_true",
        help="build tasks from the tool schemas and check them on the live server (no LLM "
        "unless --generator)",
    )
    s.add_argument("--api-base", help="base URL of the generator's OpenAI-compatible endpoint")
    s.add_argument(
        "--allow-writes",
        action="store_true",
        help="let --grounded call tools that may change the server's data (by default only "
        "tools that read are called); use it against a disposable copy of the data",
    )
    s.add_argument("--instructions", help="extra guidance for the LLM generator")
    s.add_argument("--seed", type=int, default=0, help="(default 0)")
    s.add_argument(
        "--val-fraction",
        type=float,
        default=0.25,
        help="share held out for evaluation (default 0.25)",
    )
    s.add_argument("--show", type=int, default=5, help="examples to print (default 5)")
    s.add_argument(
        "--timeout", type=float, default=30.0, help="start-up time-out in seconds (default 30)"
    )
    s.set_defaults(func=cmd_scenarios)

    tr = sub.add_parser("train", help="train a model to use a server's tools (resumes a run)")
    tr.add_argument("server", help=SERVER_HELP)
    tr.add_argument(
        "--scenarios",
        help="JSONL scenario file (default: the run's, the curated "
        "set of an example server, or generated)",
    )
    tr.add_argument("-n", type=int, default=24, help="scenarios to generate (default 24)")
    tr.add_argument("--generator", help="LiteLLM model that writes scenarios")
    tr.add_argument(
        "--allow-writes",
        action="store_true",
        help="when scenarios are built on the server, also call tools that may change its "
        "data (by default only tools that read)",
    )
    _add_run_options(tr)
    tr.set_defaults(func=cmd_train)

    au = sub.add_parser("autorl", help="train from nothing but a task description")
    au.add_argument("task", help="what the model should learn to do, in words")
    au.add_argument("--server", help="optional: " + SERVER_HELP)
    au.add_argument("-n", type=int, default=24, help="inputs to write (default 24)")
    au.add_argument(
        "--generator",
        help="LiteLLM model that writes the inputs and system "
        "prompt (default: a configured provider, else the local model)",
    )
    _add_run_options(au)
    au.set_defaults(func=cmd_autorl)

    ev = sub.add_parser("eval", help="evaluate models side by side on a scenario set")
    ev.add_argument("server", help=SERVER_HELP)
    ev.add_argument(
        "--model",
        dest="models",
        action="append",
        required=True,
        metavar="NAME[@STEP]",
        help="a run in the project (latest step unless "
        "@STEP), 'base' for the base model, or a LiteLLM model string; repeat",
    )
    ev.add_argument(
        "--scenarios",
        help="JSONL file (default: the first run's, or the curated set of an example server)",
    )
    ev.add_argument(
        "--split",
        choices=["val", "train", "all"],
        default="val",
        help="which scenarios of the set (default val)",
    )
    ev.add_argument("--project", help="project of the runs (default: from the server)")
    ev.add_argument("--path", default=".mcprl", help="where runs live (default .mcprl)")
    _add_backend(ev)
    ev.add_argument(
        "--base-model",
        default="smollm2-135m",
        help="the model 'base' means, and the runs' base (default smollm2-135m)",
    )
    ev.add_argument(
        "--dtype",
        choices=DTYPES,
        default="auto",
        help="the local models' weights, as the run trained them (default auto: bfloat16 on a "
        "GPU and on a CPU with native bfloat16, else float32)",
    )
    _add_device(ev)
    ev.add_argument("--api-base", help="base URL for LiteLLM models (e.g. a vLLM server)")
    ev.add_argument(
        "--attempts", type=int, default=1, help="attempts per scenario and model (default 1)"
    )
    ev.add_argument(
        "--judge",
        help="also rank the models' attempts with RULER: a LiteLLM "
        "model, or 'local' for the local base model",
    )
    ev.add_argument("--judge-api-base", help="OpenAI-compatible base URL for the judge")
    ev.add_argument("--max-turns", type=int, help="default: as `mcprl train`")
    ev.add_argument("--max-tokens", type=int, help="default: as `mcprl train`")
    _sampling_flags(ev)
    _loop_flags(ev)
    ev.add_argument(
        "--seed",
        type=int,
        default=0,
        help="sampling seed; the same seed gives every model the same noise (default 0)",
    )
    ev.add_argument("--concurrency", type=int, default=8, help="attempts in flight (default 8)")
    ev.add_argument("--output", help="directory for the results (default PROJECT/evals)")
    ev.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    ev.set_defaults(func=cmd_eval)

    rp = sub.add_parser("report", help="write report.html and plots for a run")
    rp.add_argument("run", help="PROJECT/MODEL under --path, or a run directory")
    rp.add_argument("--path", default=".mcprl", help="where runs live (default .mcprl)")
    _add_backend(rp)
    rp.set_defaults(func=cmd_report)

    v = sub.add_parser("serve", help="serve a model behind an OpenAI-compatible endpoint")
    v.add_argument(
        "--model",
        default="smollm2-135m",
        help="smollm2-135m (the default), a model directory or a hub id",
    )
    v.add_argument(
        "--dtype",
        choices=DTYPES,
        default="auto",
        help="(default auto: bfloat16 where the hardware has it, else float32)",
    )
    _add_device(v)
    v.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1); other than loopback needs an API key",
    )
    v.add_argument("--port", type=int, default=8000, help="(default 8000)")
    v.add_argument(
        "--api-key",
        help="require this bearer token (visible to other users in `ps`: prefer the "
        "MCPRL_API_KEY environment variable)",
    )
    v.add_argument(
        "--allow-adapter-dir",
        action="append",
        metavar="DIR",
        help="let /v1/load_lora_adapter load adapters from under DIR (repeatable; default none)",
    )
    v.add_argument("--served-name", help="the model name clients use (default: --model)")
    v.add_argument(
        "--max-batch-size",
        type=int,
        default=32,
        help="requests decoded together (default 32)",
    )
    v.add_argument("--lora", action="append", metavar="NAME=PATH", help="load a LoRA adapter")
    v.add_argument(
        "--train",
        action="store_true",
        help="also serve the backend API, so that `mcprl train --backend URL` on another "
        "machine trains here (runs kept under --path)",
    )
    v.add_argument(
        "--path", default=".mcprl", help="with --train: where runs live (default .mcprl)"
    )
    v.set_defaults(func=cmd_serve)
    return p


def _quiet_libraries() -> None:
    """Loading bars and deprecation notes from transformers say nothing to a user of mcprl."""
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning, module=r"transformers\.")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
    except ImportError:
        pass


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    root = logging.getLogger()
    if not root.handlers:  # as logging.basicConfig: only where nothing is set up yet
        handler = logging.StreamHandler()
        handler.setFormatter(_FlagsFormatter("%(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
        root.setLevel(logging.INFO if args.verbose else logging.WARNING)
    # The MCP SDK logs each unparsable stdout line with a traceback; mcprl reports it itself.
    logging.getLogger("mcp.client.stdio").setLevel(logging.CRITICAL)
    try:
        return args.func(args)
    except (MCPRLError, RulerError, OSError) as exc:  # the error tree: one line
        print(f"mcprl: error: {flags_for(str(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("mcprl: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
