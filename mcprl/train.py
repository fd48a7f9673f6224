"""The training loop behind `mcprl train` and `mcprl autorl`.

    backend = LocalBackend(".mcprl")          # or RemoteBackend(url): any `Backend`
    run = TrainingRun(RunConfig(project="calc", steps=10), "example:calculator", backend)
    await run.prepare(scenarios="scenarios/calculator.jsonl")   # preflight checks
    summary = await run.run()

`prepare` checks, before any long work, that the server answers and has tools, that the
scenarios are usable (and stores them with the run), that the model loads (resuming the run if it
has checkpoints), and that the judge answers; `run` first checks that the policy's endpoint
returns token ids and log-probabilities (`mcprl.tokens`), without which nothing could be trained,
then repeats, up to `steps`:

1. rollouts: `rollouts_per_group` attempts at each of `groups_per_step` training scenarios,
   drawn by `mcprl.curriculum.ScenarioSampler` (scenarios likely to give differing rewards, from
   the easy end first). At a kind of task tried before that no attempt of the policy's own
   choosing has solved, `explore` of the attempts each start with a tool the loop picks
   (distinct: the reference's first tool, where known and not demonstrated, and a seeded draw
   of the others), so a tool the policy never tries gets tried; with `demonstrate`, some
   attempts before them start with the reference's whole first call, its arguments pinned, so
   an argument the policy never writes (a path, a table's name) gets written and trained on
   where it leads to success;
2. judging: rewards from RULER, the scenarios' references, or both. A group whose rewards tie
   teaches nothing (with `TrainConfig.informative="success"`, the default, and a reward that
   checks references, a group with no success, or no failure, counts as tied): another
   scenario takes its place (dynamic sampling), until the step has `groups_per_step`
   informative groups or has drawn `oversample` times that many. The step draws them all at
   once, in order, and judges each group as it finishes: the next draw starts as soon as a
   group ties, beside the groups still running (started a batch at a time, after the slowest
   group, replacements ran at 8-16 rows and took 41% of a default run's rollout time);
3. training: one GRPO step on the LoRA, checkpointed and served as `name@step`;

and evaluates the val split before the first step (the baseline), every `eval_every` steps and
after the last. Each phase's wall time goes into the step's history row. `request_stop()` (the
CLI calls it on Ctrl-C) abandons rollouts in flight but lets a started training step finish and
record itself, so running again resumes where it stopped.

The run uses only the `mcprl.backends.Backend` methods: its scenarios, settings, history and
trajectories live with the backend. It reads the history once, when the loop starts, and keeps
the rows it appends.

The loop emits events to its `observers` (async callables): `RunStarted` (with the history so
far), `StepStarted`, `GroupsDrawn` (a step's scored groups, before it trains), `RowRecorded`
(each history row a step or an evaluation appends) and `RunEnded`. The console
(`mcprl.console.Console`), the trackers (`mcprl.trackers.TrackerObserver`) and the report
(`mcprl.report.ReportObserver`, written where the backend keeps the run on this machine, else
into `workdir`) subscribe to them; `mcprl train` attaches all three as its settings ask
(`trackers`, `write_report`). The loop itself says only what its preflight checks found (`say`).
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import anyio
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from mcprl._defaults import configured_llm
from mcprl._stats import counts as success_counts
from mcprl._stats import own_counts, split_metrics
from mcprl.backends import Backend
from mcprl.collect import (
    collect_groups,
    has_reference,
    mark_success,
    score_groups,
    summarize,
)
from mcprl.curriculum import (
    Informative,
    Sampling,
    ScenarioSampler,
    is_informative,
    relabel_subtask,
    with_worked_examples,
)
from mcprl.errors import JudgeFailedError, PreflightError, UsageError
from mcprl.hindsight import hindsight_tasks
from mcprl.mcp import ServerInfo, inspect_server, open_session, writing_tools
from mcprl.model import TrainableModel, policy_client
from mcprl.rewards import ReferenceReward, Reward, RewardFn, winning_tool
from mcprl.rollout import RolloutConfig
from mcprl.scenarios import Scenario, ScenarioSet, hidden_writers
from mcprl.tokens import check_token_data
from mcprl.training import LoraConfig, TrainConfig
from mcprl.types import TrajectoryGroup
from ruler import DEFAULT_RUBRIC, Judge, JudgeError, Usage

__all__ = [
    "GroupsDrawn",
    "RowRecorded",
    "RunConfig",
    "RunEnded",
    "RunEvent",
    "RunObserver",
    "RunStarted",
    "RunSummary",
    "StepStarted",
    "TrainingRun",
    "scheduled_lr",
]

logger = logging.getLogger(__name__)

RewardMode = Literal["auto", "ruler", "reference", "both"]


class RunConfig(BaseModel):
    """Everything a training run needs besides the server and the scenarios."""

    model_config = ConfigDict(extra="forbid")
    project: str = "default"
    name: str = "agent"
    base_model: str = "smollm2-135m"
    steps: int = Field(default=10, ge=0, description="train until this step (resumes count)")
    groups_per_step: int = Field(default=4, ge=1)
    rollouts_per_group: int = Field(default=8, ge=2, description="GRPO compares 2+ attempts")
    eval_every: int = Field(default=5, ge=0, description="0: baseline and final only")
    val_attempts: int = Field(default=2, ge=1, description="attempts per val scenario")
    max_val_scenarios: int | None = Field(default=None, ge=1)
    sampling: Sampling = Field(
        default="fresh",
        description="fresh: kinds of task likely to give differing rewards, easy first, each "
        "kind's least-drawn scenarios first; curriculum: the same estimated per scenario; "
        "uniform: every training scenario alike",
    )
    oversample: float = Field(
        default=1.5,
        ge=1.0,
        description="draw up to this many times groups_per_step scenarios to replace groups "
        "whose rewards tie (dynamic sampling); 1 disables",
    )
    redraw: int = Field(
        default=0,
        ge=0,
        description="with fresh sampling, a task the policy's own attempts never solved, at a "
        "kind they have solved, is drawn again, up to this many more times, the next time its "
        "kind is drawn (with demonstrations, see demonstrate) before the kind's fresh tasks; "
        "0 (the default) disables: 1 fixed the calculator's power tasks and no overall figure "
        "(181 against 190 of 288 over three seeds, RESULTS.md)",
    )
    explore: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="at a kind of task tried before and never solved by the policy's own "
        "choice, this share of a group's attempts start with a tool the loop picks (each a "
        "different one: the reference's first tool where the task has reference calls and "
        "no demonstration starts with it, then a seeded draw of the others); 0 disables",
    )
    demonstrate: int = Field(
        default=2,
        ge=0,
        description="at a kind of task tried before and never solved by the policy's own "
        "choice (or a task so tried whose kind is solved), this many of a group's attempts "
        "start with the reference's first call, its "
        "arguments pinned (mcprl's engine; vLLM lets the model choose them), and go on as the "
        "policy chooses: demonstrations, whose call is trained on like the policy's own. Before "
        "the explored attempts; at a guided chain, the first N guided attempts are also shown "
        "the call after the ones made for them (2 of 8: gnomon-mcp 0 -> 50% held out, where "
        "without them no attempt ever succeeded). 0 disables",
    )
    demonstrate_calls: int = Field(
        default=1,
        ge=0,
        description="how many of the reference's calls a demonstration pins, in turn from the "
        "first it shows (each the model's own tokens, trained on); 0: every call left in the "
        "chain",
    )
    demonstrate_answer: bool = Field(
        default=False,
        description="a demonstration that pins every call left in the reference's chain (a "
        "one-call task's, or any with demonstrate_calls 0) pins complete_task's answer after "
        "them too, the reference's (mcprl's engine): the whole attempt shown, trained on",
    )
    demonstrate_answer_after: int = Field(
        default=0,
        ge=0,
        description="at a kind where this many attempts were shown every reference call and "
        "none then answered right, a demonstration that pins every call left pins the "
        "reference's answer too, as demonstrate_answer does for every kind: the policy makes "
        "the calls but cannot read the answer out of their results. 0 disables",
    )
    guide: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="at a chain of two or more calls that no attempt of the policy's own has "
        "solved (from its first draw on), this share of a group's attempts start with the "
        "reference's first calls made for them (how many: a draw that falls as the kind gets "
        "solved), so the policy practises the call after them; such a chain is guided instead "
        "of explored. With guide_groups 2, both defaults since 2026-12-04: see "
        "benchmarks/RESULTS.md, 'The guide capped at two groups a step, by default'. 0 disables",
    )
    guide_groups: int = Field(
        default=2,
        ge=0,
        description="with guide on, at most this many of a step's groups start guided, in "
        "the order drawn (stand-ins included); a chain drawn after them starts as without "
        "the guide (explored, demonstrated), so the kinds that need no guide keep their share "
        "of the step (uncapped, the guide cost the notes server half its held-out successes). "
        "0: no limit",
    )
    hindsight: int = Field(
        default=0,
        ge=0,
        description="after each step, add at most this many hindsight tasks to the training "
        "pool: a failed attempt's chain of 2+ calls, relabelled as the task it solved "
        "(`mcprl.hindsight`); 0 disables",
    )
    retry_repeats: int = Field(
        default=0,
        ge=0,
        le=9,
        description="in training attempts, a reply that repeats a call the attempt made "
        "already (the same tool and arguments) is asked for again, with another seed, up to "
        "this many times (`RolloutConfig.retry_repeats`): the turn goes to some other call. "
        "Evaluations keep the policy's own replies. 0 disables",
    )
    subtasks: int = Field(
        default=0,
        ge=0,
        description="each step, this many more groups practise one step of a chain of two "
        "or more calls whose kind no attempt of the policy's own has solved (`subtask`): the "
        "task as the chain's attempts see it, the reference's calls before that step made for "
        "the attempt, and the attempt ended after its own next call, a success when that call "
        "is the reference's; `demonstrate` of a group's attempts have that call pinned. Their "
        "groups train beside the step's own and are counted apart (`train/subtask_*`). "
        "0 disables",
    )
    reward: RewardMode = "auto"
    reference_reward: ReferenceReward = Field(default_factory=ReferenceReward)
    judge: str | None = Field(default=None, description="LiteLLM model; None: see module doc")
    judge_api_base: str | None = None
    judge_passes: int = Field(
        default=1,
        ge=1,
        le=2,
        description="2: judge each group again with its attempts in reverse order and average "
        "the two (against position bias); the passes' agreement goes to the history",
    )
    judge_hint: bool = Field(
        default=False,
        description="show the judge each scenario's reference, marked as a hint, where it has one",
    )
    judge_budget: float | None = Field(
        default=None,
        gt=0,
        description="USD: stop the run, its last step saved, before the judge spends more",
    )
    judge_price: tuple[float, float] | None = Field(
        default=None,
        description="USD per million prompt and completion tokens of a judge LiteLLM has no "
        "price for ('IN,OUT')",
    )
    rubric: str = DEFAULT_RUBRIC
    seed: int = 0
    max_concurrency: int = Field(
        default=32,
        ge=1,
        description="attempts in flight; 32 runs a default step's rollouts at once (on 2 CPU "
        "cores 13% faster than 16 in waves: decoding costs less per row in bigger batches)",
    )
    max_dropped_groups: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="stop the run, keeping nothing of the step, when the judge fails on more "
        "than this fraction of a step's (or an evaluation's) groups",
    )
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    lora: LoraConfig = Field(default_factory=LoraConfig, description="for a new run only")
    trackers: list[Literal["csv", "tensorboard", "wandb"]] = Field(
        default_factory=list, description="copies of history.jsonl (see mcprl.trackers)"
    )
    train: TrainConfig = Field(
        # a LoRA on the 135M default learns in a few steps only at this rate, decaying linearly
        # (at a constant 2e-3 it collapsed); use 1e-5..5e-5 for billion-parameter
        # models. Only groups with a success beside a failure train (+31.5 points on
        # average over three seeds against +28.7 for any differing rewards, and faster steps).
        # No momentum across steps (adam_beta1 0): over three seeds the calculator's held-out
        # one-call tasks went to 158 of 168 against 75-81% with AdamW's 0.9 (L152-L153).
        # See benchmarks/RESULTS.md, "Does training help?"
        default_factory=lambda: TrainConfig(
            learning_rate=2e-3, informative="success", adam_beta1=0.0
        )
    )
    lr_schedule: Literal["constant", "linear", "cosine"] = Field(
        default="linear",
        description="the learning rate over the run: train.learning_rate at step 1, then "
        "constant, or decaying to 0 at `steps` along a line or a half cosine",
    )
    lr_by_signal: bool = Field(
        default=False,
        description="scale each step's learning rate by the share of `groups_per_step` that "
        "carried a signal (the groups trained): Adam moves every weight by about the learning "
        "rate whatever the gradient, so one group's update is otherwise as large as a full "
        "step's, and it moves the tool choice of every task that reads like that group's "
        "(benchmarks/RESULTS.md, the catalog's first-tool probe)",
    )
    contrast: int = Field(
        default=0,
        ge=0,
        description="hold a step's informative groups back, without an update, until the "
        "groups held have winners that start with two or more different tools, then train on "
        "them together: an update from groups that all won with one tool moves that tool's "
        "prior for every task alike (benchmarks/RESULTS.md, 'What moves the first tool'). "
        "At most this many steps in a row hold; the last step, and a server that offers one "
        "tool, never hold. 0 disables",
    )
    write_report: bool = True

    @field_validator("judge_price", mode="before")
    @classmethod
    def _price(cls, value: Any) -> Any:
        if isinstance(value, str):
            parts = value.replace(" ", "").split(",")
            if len(parts) != 2:
                raise ValueError(f"{value!r}: give two prices, IN,OUT (USD per million tokens)")
            return tuple(parts)
        return value

    @model_validator(mode="after")
    def _check(self) -> RunConfig:
        if self.reward == "ruler" and self.val_attempts < 2:
            raise UsageError("RULER compares attempts: `val_attempts` must be 2 or more")
        return self


def scheduled_lr(lr: float, schedule: str, step: int, steps: int) -> float:
    """The learning rate of training step `step` (from 1) of a run of `steps`.

    "constant" keeps `lr`; "linear" and "cosine" start at `lr` and reach 0 one step after the
    last (the last step still moves: lr/steps with "linear"). A resumed run that raises `steps`
    decays over the new length.
    """
    if schedule == "constant" or steps <= 0:
        return lr
    done = min(max(step - 1, 0), steps) / steps
    if schedule == "linear":
        return lr * (1.0 - done)
    if schedule == "cosine":
        return lr * 0.5 * (1.0 + math.cos(math.pi * done))
    raise UsageError(f"unknown learning-rate schedule {schedule!r}: constant, linear or cosine")


class RunSummary(BaseModel):
    """What a run did, for the closing screen."""

    project: str
    name: str
    run_dir: str
    reward: str
    judge: str | None
    first_step: int
    last_step: int
    target_steps: int
    interrupted: bool = False
    baseline: dict[str, float] = Field(default_factory=dict)
    baseline_step: int | None = None
    final: dict[str, float] = Field(default_factory=dict)
    final_step: int | None = None
    times: dict[str, float] = Field(default_factory=dict)
    steps_without_update: int = Field(default=0, description="every group tied: nothing learned")
    steps_held: int = Field(
        default=0, description="no update: `contrast` held the groups for a later step"
    )
    training: dict[str, float] = Field(
        default_factory=dict,
        description="this run's training attempts, summed over its steps: successes of "
        "checked_attempts, and the policy's own (those the loop did not start): own_successes "
        "of own_attempts",
    )
    judge_spent: dict[str, float] = Field(
        default_factory=dict, description="the judge's tokens and cost, over the whole run"
    )
    stopped: str | None = Field(
        default=None, description="why the run stopped before its last step (a budget)"
    )
    groups_dropped: dict[int, int] = Field(
        default_factory=dict, description="per step: groups lost to judge failures"
    )
    report: str | None = None


@dataclass(frozen=True)
class RunStarted:
    """The loop begins; `rows`: the run's history so far (a resumed run has some)."""

    run: TrainingRun
    rows: list[dict[str, Any]]


@dataclass(frozen=True)
class StepStarted:
    """Training step `step` begins (its rollouts come first)."""

    run: TrainingRun
    step: int


@dataclass(frozen=True)
class GroupsDrawn:
    """Step `step` rolled out and scored its groups (the informative ones first); it trains
    next. `counts`: what the draw did (groups drawn, tied, trained, dropped; attempts
    explored)."""

    run: TrainingRun
    step: int
    groups: list[TrajectoryGroup]
    counts: dict[str, float]


@dataclass(frozen=True)
class RowRecorded:
    """A training step or an evaluation appended `row` to the run's history."""

    run: TrainingRun
    row: dict[str, Any]


@dataclass(frozen=True)
class RunEnded:
    """The loop is over. `completed`: it ended by itself or was interrupted (Ctrl-C), and the
    summary is filled in; False when an error ended it."""

    run: TrainingRun
    summary: RunSummary
    completed: bool


RunEvent = RunStarted | StepStarted | GroupsDrawn | RowRecorded | RunEnded
RunObserver = Callable[[RunEvent], Awaitable[None]]


class TrainingRun:
    """One run of the loop in the module docstring, on any `Backend`."""

    def __init__(
        self,
        config: RunConfig,
        server: Any,
        backend: Backend,
        *,
        say: Callable[[str], None] | None = None,
        progress: bool = True,
        workdir: str | Path | None = None,
        reward: Judge | RewardFn | None = None,
        observers: Sequence[RunObserver] = (),
    ) -> None:
        """`workdir`: where the report goes when the backend keeps the run elsewhere
        (default: `.mcprl/<project>/<name>`). `reward`: a `ruler.Judge` to rank the groups
        with (instead of `config.judge`), or a callable on a `TrajectoryGroup` returning its
        rewards (see `mcprl.rewards.as_scorer`); None: `config.reward` decides. `observers`:
        what follows the run's events (module docstring)."""
        self.config = config
        self.server = server
        self.backend = backend
        self.workdir = Path(workdir or Path(".mcprl") / config.project / config.name)
        self._local: Path | None = None
        self.say = say or logger.info
        self.progress = progress
        self.model = TrainableModel(
            name=config.name,
            project=config.project,
            base_model=config.base_model,
            config={"lora": config.lora.model_dump()},
        )
        self.observers = list(observers)
        self.rows: list[dict[str, Any]] = []  # the run's history, read once, then kept
        self.scenarios = ScenarioSet()
        self.judge: Judge | None = None
        self.reward = Reward()  # resolved from config.reward by `prepare`
        self.custom_reward = reward
        self.info: ServerInfo | None = None
        self._scope: anyio.CancelScope | None = None
        self._stop = False
        self._dropped: list[Exception] = []  # judge failures since the phase began
        self.hindsight: list[Scenario] = []  # tasks added from failed attempts' chains
        self.held: list[TrajectoryGroup] = []  # informative groups `contrast` holds back
        self._practised: Counter[str] = Counter()  # subtask groups drawn per chain
        self._held_steps = 0  # steps in a row that held them
        # what the judge spent: before this start (a resumed run), at the start, at the last row
        self._spent_before: dict[str, float] = {}
        self._spent_seen = self._spent_start = Usage()
        # what the run is doing: preparing, evaluation, rollouts, training (for messages)
        self.phase = "preparing"

    @property
    def run_dir(self) -> Path:
        """The run's directory on this machine: the backend's own, else `workdir`."""
        return self._local or self.workdir

    @property
    def kept_here(self) -> bool:
        """The backend keeps the run on this machine (else `run_dir` holds only a copy of its
        records, made by whoever needs one: `mcprl.backends.export_run`)."""
        return self._local is not None

    async def _emit(self, event: RunEvent) -> None:
        for observer in self.observers:
            await observer(event)

    # -- preflight -----------------------------------------------------------------------------

    def _offer_tools(self, info: ServerInfo) -> None:
        """Hide the tools that may change the server's data and that no scenario calls (unless
        --allow-writes), and say which the agent may still call."""
        rollout = self.config.rollout
        hidden = hidden_writers(info.tools, self.scenarios, rollout.allow_writes)
        self.config.rollout = rollout.model_copy(update={"hidden_tools": hidden})
        if hidden:
            self.say(
                f"  the agent is not offered {len(hidden)} tools that may change the server's "
                f"data and that no task calls ({', '.join(hidden)}): `allow_writes=True` "
                "offers them"
            )
        writers = writing_tools(info.tools)
        offered = [t.name for t in writers if t.name not in hidden]
        unannotated = [t.name for t in info.tools if "readOnlyHint" not in t.annotations]
        if rollout.share_session == "auto" and not writers and unannotated:
            self.say(
                "  attempts share one server session: by their names, none of its tools "
                f"changes the server's data (not annotated: {', '.join(unannotated[:3])}"
                f"{', …' if len(unannotated) > 3 else ''}); `--fresh-sessions` "
                '(`share_session="never"`) gives each attempt its own'
            )
        if offered:
            self.say(
                f"  note: {len(offered)} of its tools may change the server's data "
                f"({', '.join(offered)}), and the agent may call them while it practises: "
                "train against a disposable copy of the server's data"
            )

    async def prepare(
        self,
        scenarios: ScenarioSet | str | Path | None = None,
        *,
        make_scenarios: Callable[[ServerInfo | None], Any] | None = None,
    ) -> None:
        """Run the preflight checks (module docstring); raise `PreflightError` with the fix."""
        try:  # before anything is written or generated
            await self.backend.check_model(self.config.base_model)
        except ValueError as exc:
            raise PreflightError(str(exc)) from exc
        await self.backend.claim(self.model)  # one writer per run: a second fails here
        self._local = await self.backend.local_dir(self.model)
        if self.server is not None:
            self.info = await inspect_server(self.server)
            self.say(f"✓ server {self.info.name}: {len(self.info.tools)} tools")
        self.scenarios = await self._resolve_scenarios(scenarios, make_scenarios)
        if self.info is not None:
            self._offer_tools(self.info)
            if self.config.rollout.examples:
                await self._show_examples()
        self.reward = self._resolve_reward()
        if self.config.subtasks and not self.reward.checks_references:
            raise PreflightError(
                f"`subtasks={self.config.subtasks}` checks each practised call against the "
                f"scenarios' reference calls, and the reward ({self.reward.name}) does not "
                "check references; use `reward=reference` or `both`, or `subtasks=0`"
            )
        await self.model.register(self.backend)
        step = self.model.step
        resumed = f"resuming at step {step}" if step else "a fresh LoRA at step 0"
        dtype, device = (getattr(self.backend, k, None) for k in ("inference_dtype", "device"))
        where = f" ({dtype} on {device})" if dtype and device else ""
        self.say(f"✓ model {self.config.base_model} loaded{where}; {self.model.name}: {resumed}")
        if self.reward.needs_judge:
            given = self.custom_reward
            self.judge = given if isinstance(given, Judge) else self._make_judge()
            await self._ping_judge()
            self.say(f"✓ judge {self.judge.model} answers")
        self.say(f"  reward: {self.reward.name}")
        self.by_id = {s.id: s for s in self.scenarios}
        self.score = self._scorer()
        self.sampler = await self._sampler()

    async def _show_examples(self) -> None:
        """Solve the worked examples every attempt opens with (`rollout.examples`, as
        `rollout.example_choice` picks them) once, and say which
        (`mcprl.curriculum.with_worked_examples`)."""
        rollout = self.config.rollout
        async with open_session(self.server, max_result_chars=rollout.max_result_chars) as session:
            rollout = await with_worked_examples(self.scenarios, session, rollout)
        self.config.rollout = rollout
        if rollout.example_choice == "similar":
            shown = rollout.worked_examples
            if not shown:
                self._say_no_examples()
                return
            self.say(
                f"  each task opens with the {rollout.examples} train task(s) worded most like "
                f"it, solved ({len(shown)} different ones in all), for example:"
            )
            task_of = {s.id: s.task for s in self.scenarios}
            for sid, ids in list(rollout.examples_by_task.items())[:3]:
                tasks = [task_of[i] for i in ids]
                self.say(f"    {task_of[sid]}  <-  {' | '.join(tasks) or '(none)'}")
            return
        if not rollout.worked_examples:
            self._say_no_examples()
            return
        self.say(f"  {len(rollout.worked_examples)} worked example(s) open every attempt:")
        task_of = {s.id: s.task for s in self.scenarios}
        for i in rollout.worked_examples:
            self.say(f"    {task_of[i]}")

    def _say_no_examples(self) -> None:
        self.say(
            "  no worked examples: no train task has reference calls to tools that only "
            "read, with short results"
        )

    async def _resolve_scenarios(self, given, make) -> ScenarioSet:
        kept = await self.backend.read_file(self.model, "scenarios.jsonl")
        stored = ScenarioSet.loads(kept, "scenarios.jsonl") if kept is not None else None
        if given is not None:
            scenarios = given if isinstance(given, ScenarioSet) else ScenarioSet.load(given)
            where = "given"
            if stored is not None and _ids(stored) != _ids(scenarios):
                raise PreflightError(
                    f"this run ({self.config.project}/{self.config.name}) trained on other "
                    "scenarios, kept with it as scenarios.jsonl; train a new run with another "
                    "`name`, or pass that file as its `scenarios`"
                )
        elif stored is not None:
            scenarios, where = stored, "stored with the run"
        elif make is not None:
            scenarios, where = await make(self.info), "new for this run"
        else:
            raise PreflightError("no scenarios: pass a scenario file")
        if any(s.split is None for s in scenarios):
            scenarios = scenarios.with_split(0.25, seed=self.config.seed)
        if not len(scenarios.train) or not len(scenarios.val):
            raise PreflightError(
                f"the scenarios need a train and a val split (have {len(scenarios.train)} train, "
                f"{len(scenarios.val)} val); give the file more scenarios or fix their 'split'"
            )
        await self.backend.write_file(self.model, "scenarios.jsonl", scenarios.dumps())
        self.say(f"✓ scenarios ({where}): {len(scenarios.train)} train, {len(scenarios.val)} val")
        return scenarios

    def _resolve_reward(self) -> Reward:
        with_refs = all(has_reference(s) for s in self.scenarios)
        mode = self.config.reward
        if self.custom_reward is not None and not isinstance(self.custom_reward, Judge):
            return Reward.of("custom", self.custom_reward)
        if isinstance(self.custom_reward, Judge) and mode == "auto":
            mode = "both" if with_refs else "ruler"
        if mode == "auto":
            external = self.config.judge or configured_llm("MCPRL_JUDGE")
            if not with_refs and not external:
                # the local base model is too weak a judge to train on alone (RESULTS.md)
                raise PreflightError(
                    "some scenarios have no reference answer and no judge is configured; set "
                    "`judge=MODEL` (any LiteLLM model), use scenarios with references "
                    "(`mcprl scenarios --grounded`), or `reward=ruler` to train on the local "
                    "base model's judgement anyway (weak: see benchmarks/RESULTS.md)"
                )
            mode = ("both" if external else "reference") if with_refs else "ruler"
        if mode in ("reference", "both") and not with_refs:
            raise PreflightError(
                f"`reward={mode}` needs a reference answer or calls on every scenario, and some "
                "have none; use `reward=ruler`, or scenarios with references (`grounded`)"
            )
        if mode == "ruler" and self.config.val_attempts < 2:
            raise PreflightError("RULER compares attempts: set `val_attempts` to 2 or more")
        return Reward.of(mode)

    def _make_judge(self) -> Judge:
        model = self.config.judge or configured_llm("MCPRL_JUDGE")
        if model is not None:
            return Judge(
                model,
                api_base=self.config.judge_api_base,
                rubric=self.config.rubric,
                temperature=0.0,
                seed=self.config.seed,
                passes=self.config.judge_passes,
                price=self.config.judge_price,
            )
        # the base model, served without the adapter: the judge is never the policy
        where = self.model.inference
        return local_judge(
            where.base_name,
            where.base_url,
            where.api_key,
            self.config.rubric,
            seed=self.config.seed,
            passes=self.config.judge_passes,
        )

    async def _ping_judge(self) -> None:
        llm = self.judge.llm
        request = llm.request([{"role": "user", "content": "Reply with OK."}], max_tokens=4)
        usage = Usage()
        try:
            await llm.complete(request, usage)
        except JudgeError as exc:
            raise PreflightError(
                f"the judge {llm.model} does not answer: {exc}. Check its API key or "
                "`judge_api_base`, pick another `judge`, or use `reward=reference`"
            ) from exc
        if self.config.judge_budget is not None and usage.cost_usd is None:
            raise PreflightError(
                f"`judge_budget` needs the judge's price, and LiteLLM has none for {llm.model}: "
                "give `judge_price` (USD per million prompt and completion tokens, 'IN,OUT'), "
                "or drop the budget"
            )

    # -- the loop ------------------------------------------------------------------------------

    @property
    def stopping(self) -> bool:
        """A stop was requested (the run ends at the next safe point)."""
        return self._stop

    def request_stop(self) -> None:
        """Stop at the next safe point: rollouts in flight are dropped, training completes."""
        self._stop = True
        if self._scope is not None:
            self._scope.cancel()

    async def run(self) -> RunSummary:
        config = self.config
        start = await self.model.get_step()
        summary = RunSummary(
            project=config.project,
            name=config.name,
            run_dir=str(self.run_dir),
            reward=self.reward.name,
            judge=self.judge.model if self.judge else None,
            first_step=start,
            last_step=start,
            target_steps=config.steps,
        )
        async with policy_client(self.model) as client:  # trainable replies, or stop now
            await check_token_data(client, self.model.served_name)
        # the settings of this start, for the report and for whoever reruns it
        await self.backend.write_file(
            self.model, "run_config.json", self.config.model_dump_json(indent=2)
        )
        self.rows = await self.backend.history(self.model)
        if config.contrast and (held := await self.backend.read_file(self.model, HELD_FILE)):
            state = json.loads(held)
            self.held = [TrajectoryGroup.model_validate(g) for g in state["groups"]]
            self._held_steps = state["steps"]
        self._spent_before = _spent_so_far(self.rows)  # a resumed run's earlier judging
        # a Judge passed in may have spent before this run
        self._spent_seen = self._spent_start = (
            self.judge.spent if self.judge else Usage()
        ).model_copy()
        await self._emit(RunStarted(self, list(self.rows)))
        completed = False
        try:
            with anyio.CancelScope() as self._scope:
                if self._stop:
                    self._scope.cancel()
                if (start == 0 and not self._has_val(0)) or self._eval_due(start):
                    await self._evaluate(summary)
                while self.model.step < config.steps:
                    if (stop := self._over_budget()) is not None:
                        summary.stopped = stop
                        break
                    await self._step(summary)
                    if self._eval_due(self.model.step):
                        await self._evaluate(summary)
            summary.interrupted = self._scope.cancel_called
            summary.last_step = self.model.step
            summary.judge_spent = _spent_so_far(self.rows)
            _fill_baseline(summary, self.rows)
            summary.run_dir = str(self.run_dir)
            completed = True
        finally:
            with anyio.CancelScope(shield=True):
                await self._emit(RunEnded(self, summary, completed))
        return summary

    async def _record(self, row: dict[str, Any]) -> None:
        """Keep a row the backend appended to the history, and tell the observers."""
        self.rows.append(row)
        await self._emit(RowRecorded(self, row))

    def _spending(self) -> dict[str, float]:
        """What the judge spent since the last step or evaluation (`tokens`, `calls`,
        `cost_usd`) and over the whole run, earlier starts of a resumed run included
        (`total_tokens`, `total_cost_usd`); the cost only where the judge's price is known."""
        if self.judge is None:
            return {}
        spent, seen, start = self.judge.spent, self._spent_seen, self._spent_start
        before = self._spent_before
        out = {
            "tokens": float(spent.total_tokens - seen.total_tokens),
            "calls": float(spent.judge_calls - seen.judge_calls),
            "total_tokens": before.get("tokens", 0.0) + spent.total_tokens - start.total_tokens,
        }
        if spent.cost_usd is not None:
            cost = spent.cost_usd
            out["cost_usd"] = cost - (seen.cost_usd or 0.0)
            out["total_cost_usd"] = before.get("cost_usd", 0.0) + cost - (start.cost_usd or 0.0)
        self._spent_seen = spent.model_copy()
        return out

    def _over_budget(self) -> str | None:
        """Why the next step must not start: the judge would spend past `judge_budget`, at the
        cost of the dearest step or evaluation so far. None: go on."""
        budget = self.config.judge_budget
        if budget is None or self.judge is None:
            return None
        costs = [v for r in self.rows for k, v in r.items() if k in _COST_KEYS]
        total = _spent_so_far(self.rows).get("cost_usd", 0.0)
        if total + max(costs, default=0.0) <= budget:
            return None
        return (
            f"the judge has spent ${total:.4f} of the ${budget:.2f} budget (`judge_budget`), and a "
            f"step costs up to ${max(costs):.4f}; the run stopped before step "
            f"{self.model.step + 1}, its step {self.model.step} saved. Raise the budget and run "
            "again to go on"
        )

    def _scorer(self):
        return self.reward.scorer(
            self.by_id,
            judge=self.judge,
            reference=self.config.reference_reward,
            drop_failed_groups=True,
            on_drop=lambda group, exc: self._dropped.append(exc),
            judge_hint=self.config.judge_hint,
        )

    def _check_judge(self, dropped: int, total: int, what: str) -> None:
        """Raise `JudgeFailedError` if the judge lost more of `total` groups than allowed."""
        if total and dropped / total > self.config.max_dropped_groups:
            last = str(self._dropped[-1]) if self._dropped else "unknown"
            raise JudgeFailedError(
                f"the judge failed on {dropped} of {total} groups of {what}, more than "
                f"max_dropped_groups ({self.config.max_dropped_groups:.0%}) allows; nothing of "
                f"it was kept. The judge's last error: {last[:500]}"
            )

    @property
    def informative(self) -> Informative:
        """Which groups carry signal (`Reward.informative`)."""
        return self.reward.informative(self.config.train.informative)

    async def _sampler(self) -> ScenarioSampler:
        """The training-scenario sampler, with the hindsight tasks of the steps so far and the
        groups of every step so far replayed."""
        kept = await self.backend.read_file(self.model, HINDSIGHT_FILE)
        for s in ScenarioSet.loads(kept, HINDSIGHT_FILE) if kept else ():
            if _added_at(s) <= self.model.step:  # not one of a step that did not finish
                self.hindsight.append(s)
                self.by_id[s.id] = s
        sampler = ScenarioSampler(
            [*self.scenarios.train, *self.hindsight],
            seed=self.config.seed,
            mode=self.config.sampling,
            informative=self.informative,
            redraw=self.config.redraw,
        )
        for _, groups in sorted((await self.backend.trajectories(self.model, "train")).items()):
            sampler.observe(groups)
        return sampler

    def _has_val(self, step: int) -> bool:
        return any(r["step"] == step and "val/attempts" in r for r in self.rows)

    def _eval_due(self, step: int) -> bool:
        every = self.config.eval_every
        due = step == self.config.steps or (every > 0 and step % every == 0)
        return step > 0 and due and not self._has_val(step)

    async def _step(self, summary: RunSummary) -> None:
        config, step = self.config, self.model.step + 1
        await self._emit(StepStarted(self, step))
        groups, counts, times = await self._draw_groups(step)
        practice: list[TrajectoryGroup] = []
        if config.subtasks:
            practice = await self._draw_subtasks(step, counts, times)
        if config.hindsight:
            counts["hindsight_added"] = float(await self._add_hindsight(step, groups))
        training = await self._hold(groups, step, counts) if config.contrast else groups
        training = training + practice  # the trainer skips the tied groups among them
        await self._emit(GroupsDrawn(self, step, groups, counts))
        dropped = int(counts["groups_dropped"])
        self._check_judge(dropped, int(counts["groups_drawn"]), f"step {step}")
        if dropped:
            summary.groups_dropped[step] = dropped
        stats = summarize(groups, self.by_id)
        extra = {f"train/{k}": v for k, v in stats.items() if k not in ("reward", "reward_std")}
        extra |= {f"train/{k}": v for k, v in counts.items()}
        extra |= {"time/rollout_s": times["rollout"], "time/judge_s": times["judge"]}
        extra |= {f"judge/{k}": v for k, v in self._spending().items()}
        self.phase = "training"
        with _Bar(f"step {step} training", self.progress) as bar:
            lr = scheduled_lr(config.train.learning_rate, config.lr_schedule, step, config.steps)
            if config.lr_by_signal and (trained := counts["groups_trained"]):
                lr *= min(1.0, trained / config.groups_per_step)
            result = await self.model.train(
                training,
                config.train.model_copy(
                    update={"learning_rate": lr, "informative": self.informative}
                ),
                metrics=extra,
                on_progress=bar.update,
            )
        m = result.metrics
        await self._record(
            {"step": result.step, **{f"train/{k}": v for k, v in m.items()}, **extra}
        )
        times["train"] = m.get("time_train_s", 0.0)
        if (every := success_counts(stats)) and (own := own_counts(stats)):
            tally = zip(("successes", "checked_attempts", "own_successes", "own_attempts"),
                        (*every, *own), strict=True)  # fmt: skip
            for k, v in tally:
                summary.training[k] = summary.training.get(k, 0.0) + v
        for k, v in times.items():
            summary.times[k] = summary.times.get(k, 0.0) + v
        if m.get("skipped_update") and counts.get("groups_held"):
            summary.steps_held += 1
        elif m.get("skipped_update"):
            summary.steps_without_update += 1

    async def _hold(
        self, groups: list[TrajectoryGroup], step: int, counts: dict[str, float]
    ) -> list[TrajectoryGroup]:
        """What step `step` trains on under `contrast`: its tied groups alone (no update) while
        every informative group held so far, its own included, won with the same first tool;
        else those held groups and its own together. Updates `counts` (`groups_trained`,
        `groups_held`: held back at this step, `groups_released`: trained here after being
        held) and keeps the held groups with the run."""
        fresh = [g for g in groups if is_informative(g, self.informative)]
        tied = [g for g in groups if not is_informative(g, self.informative)]
        earlier = len(self.held)
        self.held += fresh
        if not self.held:
            return groups
        hidden = set(self.config.rollout.hidden_tools)
        offered = [t for t in (self.info.tools if self.info else []) if t.name not in hidden]
        release = (
            len({winning_tool(g) for g in self.held}) >= 2
            or self._held_steps >= self.config.contrast
            or step >= self.config.steps
            or (self.info is not None and len(offered) <= 1)
        )
        if release:
            training, self.held, self._held_steps = self.held + tied, [], 0
            counts["groups_trained"] = float(len(training) - len(tied))
            counts["groups_released"] = float(earlier)
        else:
            training, self._held_steps = tied, self._held_steps + 1
            counts["groups_trained"] = 0.0
            counts["groups_held"] = float(len(self.held))
        held = [g.model_dump(mode="json") for g in self.held]
        state = {"steps": self._held_steps, "groups": held}
        await self.backend.write_file(self.model, HELD_FILE, json.dumps(state))
        return training

    async def _draw_groups(
        self, step: int
    ) -> tuple[list[TrajectoryGroup], dict[str, float], dict[str, float]]:
        """Roll out and score groups until `groups_per_step` differ or the draw budget is spent.

        Returns the informative groups followed by the tied ones (kept for the record; the
        trainer skips them), the counts, and the rollout and judge wall times.
        """
        config = self.config
        wanted = config.groups_per_step
        budget = max(wanted, math.floor(wanted * config.oversample))
        self._dropped.clear()
        self.phase = "rollouts"
        # the step's draws in order: the first `wanted` start at once, the rest stand in, one
        # for each group that ties or is dropped, as soon as it does (beside the groups still
        # running): started = wanted + replaced, so the step ends with the groups a batch at a
        # time would give from these draws, and seeds follow each draw's place in the order
        drawn = self.sampler.draw(budget, step=step)
        seed = config.seed + step * 1_000_000  # every attempt of the step has its own seed
        starts: list[list[dict[str, Any]]] = []
        guided = 0  # groups started guided: at most `guide_groups` (0: any number)
        for i, s in enumerate(drawn):
            guide = not config.guide_groups or guided < config.guide_groups
            starts.append(self._starts(s, seed + i, guide=guide))
            guided += any("guided_calls" in start for start in starts[-1])
        judging = {"groups": 0, "since": 0.0, "s": 0.0}  # the time any group is being judged

        async def score(group: TrajectoryGroup) -> TrajectoryGroup | None:
            if not judging["groups"]:
                judging["since"] = time.perf_counter()
            judging["groups"] += 1
            try:
                scored = await score_groups([group], self.score, progress=False)
            finally:
                judging["groups"] -= 1
                if not judging["groups"]:
                    judging["s"] += time.perf_counter() - judging["since"]
            mark_success(scored, self.by_id)  # what `informative="success"` reads
            return scored[0] if scored else None

        replaced = 0

        def replace(group: TrajectoryGroup | None) -> bool:
            nonlocal replaced
            if group is not None and is_informative(group, self.informative):
                return False
            replaced += 1
            return True

        t0 = time.perf_counter()
        groups = await self._collect(
            drawn[:wanted],
            config.rollouts_per_group,
            seed,
            f"step {step} rollouts",
            starts,
            self._training_rollout(),
            after_each=score,
            reserve=drawn[wanted:],
            replace=replace,
        )
        # wall time while some group was judged counts as judging, the rest as rollouts
        times = {"rollout": time.perf_counter() - t0 - judging["s"], "judge": judging["s"]}
        started = min(wanted, len(drawn)) + replaced
        helped = Counter(_help_kind(st) for start in starts[:started] for st in start)
        self.sampler.observe(groups)  # in the order drawn, after the step's last group
        kept = [g for g in groups if is_informative(g, self.informative)]
        tied = [g for g in groups if not is_informative(g, self.informative)]
        counts = {
            "groups_dropped": float(len(self._dropped)),
            "groups_drawn": float(started),
            "groups_tied": float(len(tied)),
            "groups_trained": float(len(kept)),
            "attempts_explored": float(helped["explored"]),
            "attempts_guided": float(helped["guided"]),
            "attempts_demonstrated": float(helped["demonstrated"]),
        }
        return kept + tied, counts | self.sampler.summary(), times

    async def _draw_subtasks(
        self, step: int, counts: dict[str, float], times: dict[str, float]
    ) -> list[TrajectoryGroup]:
        """Roll out and score this step's `subtasks` groups (`subtask`): each at one step of
        a chain whose kind the policy has not solved, the least-practised chains first, the
        step drawn at random. Adds `subtask_groups`, `subtask_groups_trained`,
        `subtask_successes`, `subtask_attempts` and their rate `subtask_success` to `counts`,
        and their time to `times`."""
        config = self.config
        rng = random.Random(f"{config.seed}/subtasks/{step}")
        chains = [
            s
            for s in self.scenarios.train
            if s.reference is not None
            and len(s.reference.calls) >= 2
            and not self.sampler.solved(s)
        ]
        if not chains:
            return []
        rng.shuffle(chains)
        chains.sort(key=lambda s: self._practised[s.id])
        chosen = chains[: config.subtasks]
        due = [rng.randrange(len(s.reference.calls)) for s in chosen]
        for s in chosen:
            self._practised[s.id] += 1
        t0 = time.perf_counter()
        # seeds apart from the step's own draws (at most oversample x groups x attempts)
        seed = config.seed + step * 1_000_000 + 500_000
        starts = [self._subtask_starts(s, k) for s, k in zip(chosen, due, strict=True)]
        groups = await self._collect(
            chosen,
            config.rollouts_per_group,
            seed,
            f"step {step} subtasks",
            starts,
            self._training_rollout(),
        )
        t1 = time.perf_counter()
        for group, scenario, k in zip(groups, chosen, due, strict=True):
            part = relabel_subtask(group, scenario, k)
            self.by_id[part.id] = part
        # a step's call is checked against the reference alone: a judge would rank attempts
        # that stop mid-chain
        check = Reward.of("reference").scorer(self.by_id, reference=config.reference_reward)
        groups = await score_groups(groups, check, desc=f"step {step} subtasks", progress=False)
        times["rollout"] += t1 - t0
        times["judge"] += time.perf_counter() - t1
        mark_success(groups, self.by_id)
        attempts = [t for g in groups for t in g.trajectories if "success" in t.metrics]
        counts |= {
            "subtask_groups": float(len(groups)),
            "subtask_groups_trained": float(
                sum(is_informative(g, self.informative) for g in groups)
            ),
            "subtask_successes": float(sum(t.metrics["success"] >= 1.0 for t in attempts)),
            "subtask_attempts": float(len(attempts)),
        }
        if attempts:
            counts["subtask_success"] = counts["subtask_successes"] / len(attempts)
        return groups

    def _subtask_starts(self, scenario: Scenario, k: int) -> list[dict[str, Any]]:
        """How the attempts of a subtask at step `k` of `scenario`'s chain start: every one
        after the reference's first `k` calls, made for it, and ended after its next call;
        the first `demonstrate` of them with that call pinned (a demonstration of the step,
        trained on, as at any kind the policy has not solved)."""
        ref = scenario.reference
        assert ref is not None  # only chains of reference calls are practised
        start = {"guided_calls": k, "stop_after_calls": k + 1}
        due = ref.calls[k]
        shown = {"first_tool": due.tool, "first_arguments": due.arguments, "next_calls": []}
        attempts = self.config.rollouts_per_group
        n = min(self.config.demonstrate, attempts - 1)
        return [start | shown] * n + [start] * (attempts - n)

    async def _add_hindsight(self, step: int, groups: list[TrajectoryGroup]) -> int:
        """Add this step's hindsight tasks (`mcprl.hindsight`) to the pool and keep them with
        the run (hindsight.jsonl, each tagged with its step, for a resume); how many."""
        new = hindsight_tasks(groups, self.by_id, limit=self.config.hindsight, known=self.by_id)
        if not new:
            return 0
        for s in new:
            s.tags.append(f"step:{step}")
            self.by_id[s.id] = s
        self.hindsight += new
        self.sampler.add(new)
        await self.backend.write_file(
            self.model, HINDSIGHT_FILE, ScenarioSet(self.hindsight).dumps()
        )
        return len(new)

    def _starts(self, scenario: Scenario, seed: int, guide: bool = True) -> list[dict[str, Any]]:
        """How the first attempts at `scenario` start (`collect_groups(starts=)`): at a chain
        of calls with `guide` on (and `guide` here: the step has room for another guided
        group), until an attempt of the policy's own solves its kind (from its first draw),
        after the reference's first calls (`guided_calls`, drawn by the sampler); else as the
        policy chooses unless its kind is unsolved, and then each with a different tool the
        agent is offered (`explore`): the reference's first tool where the scenario has
        reference calls and no demonstration starts with it, the others by a seeded draw; at a
        task drawn before and never solved by the policy's own attempts whose kind is solved
        (`ScenarioSampler.missed`), the demonstrations alone."""
        rng = random.Random(seed)
        attempts = self.config.rollouts_per_group
        chain = scenario.reference.calls if scenario.reference is not None else []
        if guide and self.config.guide > 0 and len(chain) >= 2:
            if self.sampler.solved(scenario):
                return []
            n = math.ceil(self.config.guide * attempts)
            starts = [{"guided_calls": self.sampler.guided_calls(scenario, rng)} for _ in range(n)]
            for start in starts[: self.config.demonstrate]:  # and the calls after them, pinned
                start |= self._demonstration(scenario, chain[start["guided_calls"] :])
            return starts
        unsolved = self.sampler.unsolved(scenario)
        if not unsolved and not self.sampler.missed(scenario):
            return []
        share = self.config.explore
        hidden = self.config.rollout.hidden_tools  # the agent is not offered these
        tools = [t.name for t in self.info.tools if t.name not in hidden] if self.info else []
        shown: list[dict[str, Any]] = []
        if chain and chain[0].tool in tools:
            n = min(self.config.demonstrate, attempts - 1)
            shown = [self._demonstration(scenario, chain)] * n
        # at a solved kind (this task never was), demonstrations only
        if not unsolved or share <= 0 or len(tools) < 2:
            return shown
        # the reference's first tool, where the scenario names one and no demonstration starts
        # with it, is always among them: a random share of git's 7 tools left it out of 3 draws
        # in 7. Beside demonstrations it is left out: its explored attempts write their own
        # arguments, fail, and push the tool down where the demonstrations push it up (the
        # catalog's "books by X", L144-L145)
        first = [chain[0].tool] if chain and chain[0].tool in tools else []
        if shown:
            tools, first = [t for t in tools if t not in first], []
        k = min(len(tools), math.ceil(share * attempts), attempts - len(shown))
        first = first[:k]
        others = rng.sample([t for t in tools if t not in first], k - len(first))
        return shown + [{"first_tool": tool} for tool in first + others]

    def _demonstration(self, scenario: Scenario, calls: list[Any]) -> dict[str, Any]:
        """The start of a demonstration of `calls` (`scenario`'s reference calls, the first
        one due next): the first `demonstrate_calls` of them pinned in turn (0: all), and
        where that is all of them, with `demonstrate_answer` (or at a kind whose answer the
        policy has not read out of calls shown to it, `demonstrate_answer_after`), the
        reference's answer."""
        n = self.config.demonstrate_calls or len(calls)
        first, *rest = calls[:n]
        start = {
            "first_tool": first.tool,
            "first_arguments": first.arguments,
            "next_calls": [{"tool": c.tool, "arguments": c.arguments} for c in rest],
        }
        answer = scenario.reference.answer if scenario.reference is not None else None
        show = self.config.demonstrate_answer or self.sampler.answer_unread(
            scenario, self.config.demonstrate_answer_after
        )
        if show and n >= len(calls) and answer is not None:
            start["pinned_answer"] = answer
        return start

    def _training_rollout(self) -> RolloutConfig:
        """The agent loop of training attempts: the run's, with `retry_repeats`."""
        rollout = self.config.rollout
        retries = max(self.config.retry_repeats, rollout.retry_repeats)
        return rollout.model_copy(update={"retry_repeats": retries})

    async def _collect(
        self,
        scenarios: list[Scenario],
        attempts: int,
        seed: int,
        desc: str,
        starts: list[list[dict[str, Any]]] | None = None,
        rollout: RolloutConfig | None = None,
        **more: Any,
    ):
        """`collect_groups` with the run's model, server and limits; `more`: its other
        keywords (`after_each`, `reserve`, `replace`)."""
        return await collect_groups(
            self.model,
            scenarios,
            self.server,
            rollout or self.config.rollout,
            attempts=attempts,
            seed=seed,
            max_concurrency=self.config.max_concurrency,
            desc=desc,
            progress=self.progress,
            starts=starts,
            **more,
        )

    async def _evaluate(self, summary: RunSummary) -> None:
        config, step = self.config, self.model.step
        val = self.scenarios.val.scenarios[: config.max_val_scenarios]
        self.phase = "evaluation"
        t0 = time.perf_counter()
        # the same seeds at every evaluation: what differs is the policy
        groups = await self._collect(val, config.val_attempts, config.seed + 7, f"eval {step}")
        self._dropped.clear()
        rolled = len(groups)
        groups = await score_groups(groups, self.score, desc="eval judging", progress=False)
        self._check_judge(len(self._dropped), rolled, f"the evaluation at step {step}")
        metrics = summarize(groups, self.by_id)
        metrics["time_s"] = time.perf_counter() - t0
        metrics |= {f"judge_{k}": v for k, v in self._spending().items()}
        summary.times["eval"] = summary.times.get("eval", 0.0) + metrics["time_s"]
        with anyio.CancelScope(shield=True):
            await self.backend.log(self.model, metrics, "val", groups)
            await self._record({"step": step, **{f"val/{k}": v for k, v in metrics.items()}})


def _help_kind(start: dict[str, Any]) -> str:
    if "first_arguments" in start:
        return "demonstrated"
    return "guided" if "guided_calls" in start else "explored"


def local_judge(
    base_model: str,
    base_url: str,
    api_key: str,
    rubric: str = DEFAULT_RUBRIC,
    *,
    seed: int = 0,
    passes: int = 1,
) -> Judge:
    """RULER with the local base model: greedy, with short explanations (a small model
    rambles), and free (its price is 0, so a budget never stops it)."""
    return Judge(
        f"openai/{base_model}",
        api_base=base_url,
        api_key=api_key,
        rubric=rubric,
        temperature=0.0,
        explanation_max_chars=160,
        # the 135M default reads 8,192 tokens: keep a group's prompt well inside that
        max_prompt_chars=18_000,
        seed=seed,
        passes=passes,
        price=(0.0, 0.0),
    )


# where a step's row (`judge/…`) and an evaluation's (`val/judge_…`) record the judge's spending
_COST_KEYS = ("judge/cost_usd", "val/judge_cost_usd")
HINDSIGHT_FILE = "hindsight.jsonl"  # a run's hindsight tasks, kept with it
HELD_FILE = "held_groups.json"  # the groups `contrast` holds, so that a resumed run keeps them


def _spent_so_far(rows: list[dict[str, Any]]) -> dict[str, float]:
    """The judge's total tokens and cost (where known) by the last row that records them."""
    for row in reversed(rows):
        for prefix in ("judge/", "val/judge_"):
            if f"{prefix}total_tokens" in row:
                out = {"tokens": row[f"{prefix}total_tokens"]}
                if f"{prefix}total_cost_usd" in row:
                    out["cost_usd"] = row[f"{prefix}total_cost_usd"]
                return out
    return {}


def _fill_baseline(summary: RunSummary, rows: list[dict[str, Any]]) -> None:
    vals = [r for r in rows if "val/attempts" in r]
    if vals:
        first, last = vals[0], vals[-1]
        summary.baseline_step, summary.final_step = first["step"], last["step"]
        summary.baseline = split_metrics(first)
        summary.final = split_metrics(last)


def _added_at(scenario: Scenario) -> int:
    """The step whose attempts a hindsight task came from (its "step:N" tag)."""
    return next((int(t[5:]) for t in scenario.tags if t.startswith("step:")), 0)


def _ids(scenarios: ScenarioSet) -> set[str]:
    return {s.id for s in scenarios}


class _Bar:
    """A progress bar fed from the training thread (micro-batches done / total)."""

    def __init__(self, desc: str, enabled: bool) -> None:
        self.desc, self.enabled, self.bar = desc, enabled, None

    def update(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            from mcprl._progress import progress_bar

            # no rate: micro-batches differ in size, and the first arrives after a long wait
            self.bar = progress_bar(
                total=total,
                desc=self.desc,
                leave=False,
                bar_format="{desc}: {n}/{total} micro-batches |{bar}| [{elapsed}]",
            )
        self.bar.n = done
        self.bar.refresh()

    def __enter__(self) -> _Bar:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()
