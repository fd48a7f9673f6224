"""The `mcprl` argument parser: every command, its options and its help."""

from __future__ import annotations

import argparse
import difflib
from typing import Any

from mcprl import __version__
from mcprl.cli._commands import cmd_login, cmd_logout, cmd_scenarios, cmd_serve, cmd_tools
from mcprl.cli._eval import cmd_eval, cmd_report
from mcprl.cli._machine import DTYPES, add_backend_flags, add_device_flags
from mcprl.cli._options import FLAG_OF, QUICK, ROLLOUT, RUN, add_settings
from mcprl.cli._train import cmd_autorl, cmd_train
from mcprl.scenarios import MAX_SCENARIOS, MIN_SCENARIOS, PER_TOOL
from mcprl.train import RunConfig

N_HELP = f"{PER_TOOL} per tool a task may call, {MIN_SCENARIOS} to {MAX_SCENARIOS}"
SERVER_HELP = (
    "an MCP server: an http(s):// URL (a path ending in /sse means SSE), a command line run "
    "over stdio, an mcpServers config file (file.json or file.json#name), or example:NAME "
    "(calculator, notes, catalog)"
)


def _add_server_auth(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--header",
        action="append",
        metavar="'NAME: VALUE'",
        help="an HTTP header for a server reached by URL, e.g. 'Authorization: Bearer TOKEN' "
        "(repeatable; kept out of logs and run records; a flag is visible in `ps`: an MCP "
        "config file with ${VAR} keeps the token in the environment)",
    )
    p.add_argument(
        "--oauth-client-id",
        metavar="ID",
        help="authorize with OAuth client credentials as this client of the server's "
        "authorization server; the secret comes from $MCPRL_OAUTH_CLIENT_SECRET (without it: "
        "the tokens of `mcprl login URL`, if any)",
    )
    p.add_argument("--oauth-scope", metavar="SCOPES", help="OAuth scopes to ask for")
    p.add_argument(
        "--oauth-issuer",
        metavar="URL",
        help="the authorization server the client belongs to (its credentials go nowhere else)",
    )


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
    message = f"unrecognized arguments: {' '.join(extra)}"
    flags = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
    for word in extra:
        if word.startswith("-"):
            near = difflib.get_close_matches(word.split("=", 1)[0], flags, n=1, cutoff=0.6)
            if near:
                return f"{message} (did you mean {near[0]}?)"
    return message


def _add_run_options(p: argparse.ArgumentParser) -> None:
    """The options of a training run: its settings (declared once, in `_options.RUN`), then
    where it runs and what it shows."""
    d = RunConfig()  # the defaults shown are the library's: one source of truth
    groups: dict[str, Any] = {}
    p.add_argument("--path", default=".mcprl", help="where runs live (default .mcprl)")
    add_settings(p, RUN, d, groups)
    p.add_argument(
        "--quick",
        action="store_true",
        help="a first look that trains in minutes on a laptop CPU: "
        + ", ".join(f"{FLAG_OF[field]} {value}" for field, value in QUICK.items())
        + " (flags given still win)",
    )
    p.add_argument(
        "--dtype",
        choices=DTYPES,
        default="auto",
        help="inference and training weights; LoRA weights stay float32 (default auto: "
        "bfloat16 on a GPU and on a CPU with native bfloat16, else float32)",
    )
    add_device_flags(p)
    add_backend_flags(p)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="mcprl",
        description="Train open models to use any MCP server's tools. "
        "For judging groups of trajectories, see the `ruler` command.",
        epilog="exit codes: 0 done, 1 error, 2 usage error, 3 stopped by --judge-budget, 130 "
        "stopped by Ctrl-C (both resumable)",
    )
    p.add_argument("--version", action="version", version=f"mcprl {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    t = sub.add_parser("tools", help="list a server's tools and resources")
    t.add_argument("server", help=SERVER_HELP)
    _add_server_auth(t)
    t.add_argument("--json", action="store_true", help="print JSON for machines")
    t.add_argument(
        "--timeout", type=float, default=30.0, help="start-up time-out in seconds (default 30)"
    )
    t.set_defaults(func=cmd_tools)

    s = sub.add_parser("scenarios", help="write practice tasks for a server's tools")
    s.add_argument("server", help=SERVER_HELP)
    _add_server_auth(s)
    s.add_argument("-n", type=int, help=f"how many scenarios (default {N_HELP})")
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
        help="share held out for evaluation, at most: a kind of task keeps one in training "
        "(default 0.25)",
    )
    s.add_argument("--show", type=int, default=5, help="examples to print (default 5)")
    s.add_argument(
        "--timeout", type=float, default=30.0, help="start-up time-out in seconds (default 30)"
    )
    s.set_defaults(func=cmd_scenarios)

    li = sub.add_parser(
        "login",
        help="log in to a server's OAuth authorization server and keep the tokens",
        description="Log in with the OAuth authorization-code flow (PKCE): your browser opens "
        "the server's login page and the redirect comes back to 127.0.0.1. The tokens are kept "
        "(mode 0600) under $MCPRL_CONFIG_DIR, $XDG_CONFIG_HOME/mcprl or ~/.config/mcprl, and "
        "every later command for the URL sends and refreshes them.",
    )
    li.add_argument("server", help="the server's URL")
    li.add_argument("--scope", help="OAuth scopes to ask for (default: what the server names)")
    li.add_argument(
        "--no-browser", action="store_true", help="print the login URL instead of opening it"
    )
    li.add_argument(
        "--port", type=int, default=0, help="loopback port for the redirect (default: any free)"
    )
    li.add_argument(
        "--timeout", type=float, default=300.0, help="seconds to wait for the login (default 300)"
    )
    li.add_argument(
        "--client-id",
        help="a client registered beforehand with the server's authorization server (default: "
        "mcprl registers itself); a confidential client's secret comes from "
        "$MCPRL_OAUTH_CLIENT_SECRET, and --port must match its redirect URI",
    )
    li.add_argument(
        "--client-metadata-url",
        metavar="URL",
        help="an HTTPS URL of mcprl's client ID metadata document, for servers that take one "
        "instead of registration",
    )
    li.set_defaults(func=cmd_login)

    lo = sub.add_parser("logout", help="forget the tokens `mcprl login` kept for a server")
    lo.add_argument("server", help="the server's URL")
    lo.set_defaults(func=cmd_logout)

    tr = sub.add_parser("train", help="train a model to use a server's tools (resumes a run)")
    tr.add_argument("server", help=SERVER_HELP)
    _add_server_auth(tr)
    tr.add_argument(
        "--scenarios",
        help="JSONL scenario file (default: the run's, the curated "
        "set of an example server, or generated)",
    )
    tr.add_argument("-n", type=int, help=f"scenarios to generate (default {N_HELP})")
    tr.add_argument("--generator", help="LiteLLM model that writes scenarios")
    _add_run_options(tr)
    tr.set_defaults(func=cmd_train)

    au = sub.add_parser("autorl", help="train from nothing but a task description")
    au.add_argument("task", help="what the model should learn to do, in words")
    au.add_argument("--server", help="optional: " + SERVER_HELP)
    _add_server_auth(au)
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
    _add_server_auth(ev)
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
    add_backend_flags(ev)
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
    add_device_flags(ev)
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
    add_settings(ev, ROLLOUT, RunConfig().rollout)  # as `mcprl train`
    ev.add_argument(
        "--seed",
        type=int,
        default=0,
        help="sampling seed; the same seed gives every model the same noise (exactly, with "
        "--dtype float32; in bfloat16 the batch's rounding adds a little) (default 0)",
    )
    ev.add_argument("--concurrency", type=int, default=8, help="attempts in flight (default 8)")
    ev.add_argument("--output", help="directory for the results (default PROJECT/evals)")
    ev.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    ev.set_defaults(func=cmd_eval)

    rp = sub.add_parser("report", help="write report.html and plots for a run")
    rp.add_argument("run", help="PROJECT/MODEL under --path, or a run directory")
    rp.add_argument("--path", default=".mcprl", help="where runs live (default .mcprl)")
    add_backend_flags(rp)
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
    add_device_flags(v)
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
