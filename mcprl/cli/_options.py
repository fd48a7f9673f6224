"""The run's settings on the command line, each declared once.

A `Setting` names a flag and the `RunConfig` field it sets (a dotted path for nested configs:
`train.learning_rate`). The field gives the type, the choices (a `Literal`) and the default; the
flag's help says what it does, and the default is printed from the field. The same table builds
the parser's options, turns parsed arguments into a `RunConfig` (a flag left out keeps the
config's own default), and says which flag sets a field when the library names it in an error
(`flags_for`). `mcprl eval` shares the agent loop's settings (`ROLLOUT`), relative to
`RolloutConfig`.
"""

from __future__ import annotations

import argparse
import logging
import re
import types
from dataclasses import dataclass
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from mcprl.errors import UsageError
from mcprl.rollout import RolloutConfig
from mcprl.train import RunConfig

_UNSET: Any = object()


@dataclass(frozen=True)
class Setting:
    """A flag that sets the config field `field`.

    `help` may place the default with `{default}`; else " (default X)" is appended, unless
    `default` gives the words to show instead (or "" for none). `const`: the flag takes no
    value and sets the field to this one.
    """

    flag: str
    field: str
    help: str
    default: str | None = None
    const: Any = _UNSET
    group: str | None = None
    metavar: str | None = None

    def within(self, prefix: str) -> Setting:
        """The same setting on the field `prefix.field` (a config nested in another)."""
        return Setting(self.flag, f"{prefix}.{self.field}", self.help, self.default,
                       self.const, self.group, self.metavar)  # fmt: skip


TRAINING, EVALUATION = "training step", "evaluation"

# The agent loop's settings (RolloutConfig): `mcprl train`, `autorl` and `eval` share them.
ROLLOUT = [
    Setting("--max-turns", "max_turns", "turns per attempt"),
    Setting("--max-tokens", "max_tokens", "tokens per model reply"),
    Setting("--temperature", "temperature", "sampling temperature"),
    Setting("--top-p", "top_p", "nucleus sampling; 1 turns it off"),
    Setting(
        "--min-p",
        "min_p",
        "drop tokens less likely than MIN_P times the likeliest one; 0 turns it off (default "
        "{default}; sent as `min_p`, which vLLM and `mcprl serve` read)",
    ),
    Setting(
        "--early-answer",
        "look_before_answer",
        "let an attempt call complete_task before any other tool (default: only after its "
        "first tool call, sent as OpenAI's allowed_tools tool_choice; use this for an endpoint "
        "that rejects that)",
        const=False,
    ),
    Setting(
        "--answer-last",
        "answer_on_last_turn",
        "let an attempt call complete_task on its last turn only: each turn before it is a "
        "tool call (with a reference's turn budget, one per reference call; see RESULTS.md)",
        const=True,
    ),
    Setting(
        "--fresh-sessions",
        "share_session",
        "a fresh MCP session (over stdio: a fresh server process) for every attempt, and for "
        "every chain of calls that builds a task, even when every tool offered only reads (by "
        "default those share one)",
        const="never",
    ),
    Setting(
        "--elicitation",
        "elicitation",
        "how a server's questions to the user are answered: decline, or accept-defaults (the "
        "defaults its schema declares); a scenario's scripted answers come first",
    ),
    Setting(
        "--sampling-model",
        "sampling_model",
        "a LiteLLM model that answers a server's requests for completions (MCP sampling)",
        "refused",
    ),
    Setting(
        "--sampling-api-base",
        "sampling_api_base",
        "OpenAI-compatible base URL for --sampling-model",
        "",
    ),
    Setting(
        "--allow-writes",
        "allow_writes",
        "offer the agent the tools that may change the server's data even where no task "
        "calls them, and let generated tasks call them (by default such a tool is hidden "
        "unless a task's reference calls it); use it against a disposable copy of the data",
        const=True,
    ),
    Setting(
        "--examples",
        "examples",
        "open every attempt with N worked examples: solved tasks of the set's train split, "
        "their reference calls made live, chosen by --example-choice; 0 for none (evaluate a "
        "run with the N it trained with)",
        metavar="N",
    ),
    Setting(
        "--example-choice",
        "example_choice",
        "which train tasks --examples shows: kinds, the same for every task, one per kind of "
        "task; similar, for each task those most like it (a retrieval of solved examples "
        "by the task's words and the tools that list its quoted text, as for a user's "
        "question)",
    ),
    Setting(
        "--results-as",
        "results_as",
        "a tool result that comes as structured content and as text saying the same is "
        'shown as JSON ({{"result": -160}}) or as the text (-160)',
    ),
]

# The settings of a training run (RunConfig), in the order `mcprl train -h` lists them.
RUN = [
    Setting("--model", "base_model", "base model"),
    Setting("--project", "project", "project directory under --path", "from the server"),
    Setting("--name", "name", "the run's name in the project"),
    Setting("--steps", "steps", "train up to this step"),
    Setting("--groups-per-step", "groups_per_step", "informative groups (scenarios) per step"),
    Setting("--rollouts-per-group", "rollouts_per_group", "attempts per scenario"),
    Setting(
        "--sampling",
        "sampling",
        "which training scenarios a step draws: fresh (kinds of task likely to teach, easy "
        "first, each kind's least-drawn scenarios first), curriculum (the same, estimated per "
        "scenario) or uniform",
    ),
    Setting(
        "--oversample",
        "oversample",
        "draw up to this many times --groups-per-step scenarios to replace groups whose "
        "rewards tie (default {default}; 1 disables)",
    ),
    Setting(
        "--redraw",
        "redraw",
        "a task the model's own attempts never solved, at a kind they solved, is drawn again "
        "up to N more times, with demonstrations (default {default}: off; 1 measured in "
        "RESULTS.md)",
    ),
    Setting(
        "--explore",
        "explore",
        "at a kind of task tried before and never solved by the model's own choice, this "
        "share of a group's attempts each start with a different tool the loop picks (default "
        "{default}; 0 disables)",
    ),
    Setting(
        "--demonstrate",
        "demonstrate",
        "at such a kind, this many attempts start with the reference's first call, its "
        "arguments pinned by mcprl's engine, and go on as the model chooses (default "
        "{default}; 0 disables; see RESULTS.md)",
    ),
    Setting(
        "--demonstrate-calls",
        "demonstrate_calls",
        "how many of the reference's calls a demonstration pins, in turn (default {default}: "
        "the first; 0: the whole chain; see RESULTS.md)",
    ),
    Setting(
        "--demonstrate-answer",
        "demonstrate_answer",
        "a demonstration that pins every call left in the chain pins the reference's answer "
        "after them too: the whole attempt shown (see RESULTS.md)",
        const=True,
    ),
    Setting(
        "--demonstrate-answer-after",
        "demonstrate_answer_after",
        "at a kind where N attempts were shown every reference call and none answered "
        "right, demonstrations pin the reference's answer too (default {default}: off; see "
        "RESULTS.md)",
    ),
    Setting(
        "--guide",
        "guide",
        "at a chain of 2+ calls the model's own attempts have not solved (from its first "
        "draw), this share of a group's attempts start with the reference's first calls made "
        "for them, fewer as the chain gets solved (default {default}; 0 turns it off; see "
        "RESULTS.md)",
    ),
    Setting(
        "--guide-groups",
        "guide_groups",
        "with --guide, at most N of a step's groups start guided; chains drawn after them "
        "start as without it (default {default}; 0: no limit; see RESULTS.md)",
    ),
    Setting(
        "--hindsight",
        "hindsight",
        "after each step, add at most this many tasks that a failed attempt's chain of 2+ "
        "calls solved, relabelled as such (default {default}: off; see RESULTS.md)",
    ),
    Setting(
        "--subtasks",
        "subtasks",
        "each step, N more groups practise one step of a chain of 2+ calls the model's own "
        "attempts have not solved: the calls before it made for them, the attempt ended after "
        "its own next call, a success when that is the reference's (default {default}: off; "
        "see RESULTS.md)",
    ),
    Setting(
        "--retry-repeats",
        "retry_repeats",
        "in training attempts, ask again (another seed, up to N times) for a reply that "
        "repeats a call the attempt made already, same tool and arguments (default "
        "{default}: off; see RESULTS.md)",
    ),
    *(s.within("rollout") for s in ROLLOUT),
    Setting(
        "--reward",
        "reward",
        "auto: the references when every scenario has one (plus RULER with a configured "
        "judge), else RULER with a configured judge",
    ),
    Setting(
        "--judge",
        "judge",
        "LiteLLM model for RULER",
        "$MCPRL_JUDGE, a provider key's model, else the local base model",
    ),
    Setting("--judge-api-base", "judge_api_base", "OpenAI-compatible base URL for the judge", ""),
    Setting(
        "--judge-passes",
        "judge_passes",
        "2: judge each group again, its attempts in reverse order, and average the two "
        "(against position bias; their agreement goes to the history)",
    ),
    Setting(
        "--judge-hint",
        "judge_hint",
        "show the judge each scenario's reference, marked as a hint, where it has one",
        const=True,
    ),
    Setting(
        "--judge-budget",
        "judge_budget",
        "USD: stop before the judge spends more (the last step is saved; rerun to go on)",
        "none",
        metavar="USD",
    ),
    Setting(
        "--judge-price",
        "judge_price",
        "USD per million prompt and completion tokens, for a judge LiteLLM has no price for",
        "LiteLLM's price list",
        metavar="IN,OUT",
    ),
    Setting("--lr", "train.learning_rate", "learning rate", group=TRAINING),
    Setting(
        "--lr-schedule",
        "lr_schedule",
        "the learning rate over the run: constant, or from --lr at step 1 down to 0 after "
        "--steps, along a line or a half cosine",
        group=TRAINING,
    ),
    Setting(
        "--lr-by-signal",
        "lr_by_signal",
        "scale each step's learning rate by the share of --groups-per-step that trained (a "
        "step where one group of four had a signal moves a quarter as far; see RESULTS.md)",
        const=True,
        group=TRAINING,
    ),
    Setting(
        "--contrast",
        "contrast",
        "hold a step's groups back, with no update, until the groups held won with two or "
        "more different first tools, then train on them together (at most N steps in a row "
        "hold; see RESULTS.md, 'What moves the first tool')",
        "0: off",
        metavar="N",
        group=TRAINING,
    ),
    Setting(
        "--loss",
        "train.loss",
        "policy loss: ppo (token-level clipped ratio), gspo (sequence-level ratio), cispo "
        "(clipped importance weights)",
        group=TRAINING,
    ),
    Setting(
        "--beta", "train.beta", "KL penalty to the base model; 0 computes no KL", group=TRAINING
    ),
    Setting("--epsilon", "train.eps_low", "lower clip range of the ratio", group=TRAINING),
    Setting("--epsilon-high", "train.eps_high", "upper clip range of the ratio", group=TRAINING),
    Setting(
        "--scale-rewards",
        "train.scale_rewards",
        "divide advantages by the reward std of their group (GRPO), of the step's groups "
        "(batch), or not at all (none, Dr. GRPO)",
        group=TRAINING,
    ),
    Setting(
        "--no-scale-rewards",
        "train.scale_rewards",
        "the same as --scale-rewards none",
        const="none",
        group=TRAINING,
    ),
    Setting(
        "--positive-weight",
        "train.positive_weight",
        "weight of the attempts that beat their group's mean, in (0, 1]: below 1, updates "
        "mostly push down what failed (W-REINFORCE uses 0.1; on the calculator at lr 2e-3, 0.1 "
        "unlearned copying the task's numbers in 4 steps: benchmarks/RESULTS.md)",
        group=TRAINING,
    ),
    Setting(
        "--negative-weight",
        "train.negative_weight",
        "weight of the attempts below their group's mean, in [0, 1]: below 1, updates mostly "
        "pull up what won, and push less of the probability freed by failures onto the "
        "policy's likeliest choice (benchmarks/RESULTS.md)",
        group=TRAINING,
    ),
    Setting(
        "--no-cap-failures",
        "train.cap_failures",
        "push a group's failures down as hard as GRPO's advantages say; by default, in a "
        "group that mostly won, each failure's advantage shrinks to the winners' size, so a "
        "solved kind's few failures cannot swing the update (benchmarks/RESULTS.md)",
        const=False,
        group=TRAINING,
    ),
    Setting(
        "--solved-failure-weight",
        "train.solved_failure_weight",
        "weight of the failures of a group that mostly won, in [0, 1] (default {default}): "
        "0 trains such a group on its winners alone, so a solved kind's slips cannot squeeze "
        "the policy, while groups that mostly failed keep their full push "
        "(benchmarks/RESULTS.md)",
        group=TRAINING,
        metavar="W",
    ),
    Setting(
        "--push-down-below",
        "train.push_down_below",
        "a failed attempt's token the policy gives p < P is pushed down with weight p/P (the "
        "gradient of p, not log p): tokens sampled by chance, at p=1e-4, then hardly move "
        "the update and cannot squeeze the mass onto the likeliest tokens (default {default}: "
        "every token by log p; 1: every token by p; benchmarks/RESULTS.md)",
        group=TRAINING,
        metavar="P",
    ),
    Setting(
        "--adam-beta1",
        "train.adam_beta1",
        "AdamW's momentum across training steps (default {default}); 0: each update follows "
        "its own step's groups alone",
        group=TRAINING,
    ),
    Setting(
        "--call-credit",
        "train.call_credit",
        "credit per call: each turn also gets this weight x (made the reference call that was "
        "due - how often the group's turns did), so the right calls of a chain that failed "
        "later are not pushed down with it (default {default}: off; benchmarks/RESULTS.md)",
        group=TRAINING,
    ),
    Setting(
        "--updates-per-step",
        "train.updates_per_step",
        "optimizer steps per training step, each on its share of the groups",
        group=TRAINING,
    ),
    Setting(
        "--old-logprobs",
        "train.old_logprobs",
        "what the clipped ratio divides by: the trainer's own log-probabilities before the "
        "step, or the server's sampling ones",
        group=TRAINING,
    ),
    Setting(
        "--informative",
        "train.informative",
        "which groups a step trains on and redraws for: those whose rewards differ, or those "
        "where some attempts succeeded and some failed (DAPO's filter; with a reward that "
        "checks the scenarios' reference answers, else the rewards decide)",
        group=TRAINING,
    ),
    Setting("--lora-r", "lora.r", "LoRA rank, new runs only", group=TRAINING),
    Setting("--lora-alpha", "lora.alpha", "LoRA alpha, new runs only", group=TRAINING),
    Setting(
        "--eval-every",
        "eval_every",
        "val evaluation every k steps; 0: before the first step and after the last only",
        group=EVALUATION,
    ),
    Setting("--val-attempts", "val_attempts", "attempts per val scenario", group=EVALUATION),
    Setting(
        "--max-val",
        "max_val_scenarios",
        "evaluate on at most this many val scenarios",
        "all",
        group=EVALUATION,
    ),
    Setting("--seed", "seed", "seeds scenario draws and sampling"),
    Setting("--concurrency", "max_concurrency", "attempts in flight"),
    Setting(
        "--tracker",
        "trackers",
        "also send the metrics to: csv (RUN/metrics.csv), tensorboard (RUN/tensorboard; needs "
        "tensorboard), wandb (needs wandb); repeatable. history.jsonl is always written",
        "",
    ),
    Setting("--no-report", "write_report", "skip report.html at the end", const=False),
]

# `--quick`: a first run that trains real steps in a few minutes on a laptop CPU (by field)
QUICK = {
    "steps": 2,
    "groups_per_step": 2,
    "rollouts_per_group": 8,
    "max_val_scenarios": 4,
    "val_attempts": 2,
    "eval_every": 0,
}


def _field(model: type[BaseModel] | BaseModel, path: str) -> tuple[Any, Any]:
    """The annotation and the default value of the field at `path` in `model` (an instance
    gives the defaults it holds, which for nested configs may differ from the class's)."""
    head, _, rest = path.partition(".")
    cls = model if isinstance(model, type) else type(model)
    info = cls.model_fields[head]
    value = (
        getattr(model, head)
        if not isinstance(model, type)
        else info.get_default(call_default_factory=True)
    )
    if rest:
        return _field(value, rest)
    return info.annotation, value


def _kind(annotation: Any) -> tuple[Any, tuple[Any, ...] | None, bool]:
    """(type, choices, repeatable) of a field's annotation, for argparse."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        (inner,) = [a for a in get_args(annotation) if a is not type(None)]
        return _kind(inner)
    if origin is list:
        kind, choices, _ = _kind(get_args(annotation)[0])
        return kind, choices, True
    if origin is Literal:
        choices = get_args(annotation)
        return type(choices[0]), choices, False
    return annotation, None, False


def _shown(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def add_settings(
    parser: argparse.ArgumentParser,
    settings: list[Setting],
    config: BaseModel,
    groups: dict[str, Any] | None = None,
) -> None:
    """Add an option for each setting; types, choices and defaults come from `config`'s
    fields. Every option's own default is None: a flag left out keeps the config's value."""
    groups = {} if groups is None else groups
    for s in settings:
        where = parser
        if s.group:
            where = groups.setdefault(s.group, parser.add_argument_group(s.group))
        annotation, default = _field(config, s.field)
        shown = _shown(default) if s.default is None else s.default
        if "{default}" in s.help:
            help_text = s.help.format(default=shown)
        else:
            help_text = s.help + (f" (default {shown})" if shown and s.const is _UNSET else "")
        if s.const is not _UNSET:
            where.add_argument(s.flag, dest=s.field, action="store_const", const=s.const,
                               help=help_text)  # fmt: skip
            continue
        kind, choices, repeatable = _kind(annotation)
        where.add_argument(
            s.flag,
            dest=s.field,
            type=kind if kind in (int, float) else None,
            choices=choices,
            action="append" if repeatable else "store",
            metavar=s.metavar
            or (None if choices else s.flag.lstrip("-").upper().replace("-", "_")),
            help=help_text,
        )


def given(args: argparse.Namespace, settings: list[Setting]) -> dict[str, Any]:
    """The fields the flags set (dotted paths), leaving out the flags not given."""
    out = {}
    for s in settings:
        value = getattr(args, s.field, None)
        if value is not None:
            out[s.field] = value
    return out


def configured(defaults: BaseModel, fields: dict[str, Any]) -> Any:
    """A copy of `defaults` with `fields` (dotted paths) set, validated; a bad value is one
    line naming its flag."""
    data = defaults.model_dump()
    for path, value in fields.items():
        *parents, leaf = path.split(".")
        node = data
        for key in parents:
            node = node[key]
        node[leaf] = value
    try:
        return type(defaults).model_validate(data)
    except ValidationError as exc:
        raise UsageError(_option_error(exc)) from None


def headers(values: list[str] | None) -> dict[str, str]:
    """`--header 'Name: value'` flags as a dict (a later flag of the same name wins)."""
    out: dict[str, str] = {}
    for item in values or []:
        name, sep, value = item.partition(":")
        if not sep or not name.strip() or any(c.isspace() for c in name.strip()):
            raise UsageError(
                f"--header {item!r}: write it as 'Name: value', e.g. 'Authorization: Bearer TOKEN'"
            )
        out[name.strip()] = value.strip()
    return out


def server_of(args: argparse.Namespace) -> Any:
    """The server the command names, with the headers its `--header` flags add and the OAuth
    client its `--oauth-client-id` names (the secret from the environment)."""
    import os

    from mcprl.mcp import SECRET_ENV, OAuthClient, ServerSpec

    server = getattr(args, "server", None)
    extra = headers(getattr(args, "header", None))
    client_id = getattr(args, "oauth_client_id", None)
    if not client_id and (
        getattr(args, "oauth_scope", None) or getattr(args, "oauth_issuer", None)
    ):
        raise UsageError("--oauth-scope and --oauth-issuer go with --oauth-client-id")
    if not extra and not client_id:
        return server
    if server is None:
        raise UsageError("--header and --oauth-client-id go with a server reached by URL: give "
                         "--server URL")  # fmt: skip
    client = None
    if client_id:
        secret = os.environ.get(SECRET_ENV)
        if not secret:
            raise UsageError(f"--oauth-client-id {client_id}: set its secret in ${SECRET_ENV}")
        client = OAuthClient(client_id=client_id, client_secret=secret,
                             scope=args.oauth_scope, issuer=args.oauth_issuer)  # fmt: skip
    return ServerSpec.parse(server).with_headers(extra).with_oauth(client)


def run_config(args: argparse.Namespace, **overrides: Any) -> RunConfig:
    """One RunConfig from the flags; a flag left out keeps the config's own default.
    `overrides`: fields a command sets itself (`mcprl autorl`'s reward and rubric)."""
    if args.quick:  # a first look: the flags given still win
        for field, value in QUICK.items():
            if getattr(args, field) is None:
                setattr(args, field, value)
    fields = given(args, RUN)
    if fields.get("train.loss") == "gspo":  # GSPO's ratio is per sequence
        fields.setdefault("train.normalization", "sequence")
    return configured(RunConfig(), fields | overrides)


def rollout_config(args: argparse.Namespace) -> RolloutConfig:
    """The agent loop's settings from the flags `mcprl eval` shares with `mcprl train`."""
    return configured(RunConfig().rollout, given(args, ROLLOUT))


# Settings the library names that are not RunConfig fields: the parameters of the functions
# the commands call, by the flag that sets them.
_OTHER_FLAGS = {
    "scenarios": "--scenarios",
    "headers": "--header",
    "oauth_client_id": "--oauth-client-id",
    "oauth_scope": "--oauth-scope",
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
}


def _flag_of() -> dict[str, str]:
    flags = dict(_OTHER_FLAGS)
    for s in RUN:
        key = s.field if s.const is _UNSET else f"{s.field}={s.const!r}".replace("'", "")
        flags.setdefault(key, s.flag)
    return flags


FLAG_OF = _flag_of()
_SETTING = re.compile(r"`([a-z_][a-z_.]*)(?:=([^`\s]+))?`")


def flags_for(text: str) -> str:
    """`text` with the settings it names (`field`, `field=value`) as the flags that set them."""

    def flag(match: re.Match[str]) -> str:
        field, value = match.group(1), match.group(2)
        whole = f"{field}={value}" if value is not None else field
        if whole in FLAG_OF:
            return FLAG_OF[whole]
        if field not in FLAG_OF:
            return match.group(0)
        return FLAG_OF[field] + (f" {value}" if value is not None else "")

    return _SETTING.sub(flag, text)


class FlagsFormatter(logging.Formatter):
    """The library's logged warnings, with the flags that set the settings they name."""

    def format(self, record: logging.LogRecord) -> str:
        return flags_for(super().format(record))


def _option_error(exc: ValidationError) -> str:
    """One line naming the option, the value given and what it must be."""
    first = exc.errors()[0]
    path = ".".join(str(p) for p in first["loc"])
    message = first["msg"].removeprefix("Value error, ").replace("Input should be", "must be")
    named = _SETTING.search(message)
    if not path and named and named.group(1) in FLAG_OF:  # a check across fields names one
        return f"{FLAG_OF[named.group(1)]}: {message.replace(named.group(0), 'it', 1)}"
    if not path:
        return flags_for(message)
    flag = FLAG_OF.get(path) or next(
        (f for key, f in FLAG_OF.items() if key.rsplit(".", 1)[-1] == path.rsplit(".", 1)[-1]),
        "--" + path.rsplit(".", 1)[-1].replace("_", "-"),
    )
    given_value = "" if isinstance(first["input"], dict) else f" {first['input']}"
    return f"{flag}{given_value}: {message}"
