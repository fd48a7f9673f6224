"""Rewards for groups of attempts: reference checks, RULER, or a weighted mix.

- `reference_reward(trajectory, scenario)`: 0..1 from the scenario's reference, built so that the
  correct answer dominates and the partial credit points toward it (`reward_parts` gives the
  components):

      answer correct                   -> 1
      otherwise                        -> calls_weight  * (share of the reference calls made)
                                        + report_weight * (the answer is a result the agent's
                                                           own tool calls returned: a result's
                                                           text, or a value in a JSON result)

  with `calls_weight` 0.3 and `report_weight` 0.1 by default (their sum must stay below 1, so no
  wrong answer can score as much as a right one). A reference call counts once however often it
  is repeated, so repeating a call earns nothing; the number of repeats is reported. A call of
  the right tool with other arguments counts `tool_only` (0.5) of a matching one, when the
  attempt made no more calls than the reference: on a one-call task, an attempt that picked the
  right tool but garbled a number ranks above one that picked the wrong tool, which is the step
  a small model has to learn first. With `report_any_tool=False`, reporting counts only a
  result of a tool the reference calls: a wrong tool's copied result then earns nothing, so a
  group where no attempt picked the right tool ties instead of training the wrong tools. Over
  three training seeds it changed held-out val gains from +34.7/+19.4/+2.8 to
  +27.8/+15.3/+8.3 points (benchmarks/RESULTS.md): no better on average, so it is
  not the default. A reference with calls and no answer scores the share of calls made.
  The share counts only calls the policy made: a guided attempt's first calls, made for it
  (`RolloutConfig.guided_calls`), move its chain on (the metric `reward_calls` and a chain
  completed count them) but earn it no credit.
  Where the reference `needs_calls` (every grounded task: its answer is the server's data), a
  right answer without a successful call of each tool the reference calls (one whose result is
  no error, flagged or written out as "Database error: …", and not empty, as `[]`) is a guess:
  it scores as a wrong one, and counts in `guessed_answer`. A yes or no, or a small count, is
  otherwise right by luck often enough to train the habit of answering without looking. A
  reference call that writes (`ReferenceCall.match`: a note's title and text, as the task names
  them) counts only from a call that carries those values: a note saved under a made-up title,
  then counted, is no success. So does every call of a reference whose answer is a yes, a no or
  a 0 (`check_named_arguments`): "Do I have any notes about lisbon?" is 0 after a search of
  "lion" too.
- `scorer(...)` builds an `after_each` callback for `gather_groups` that sets each trajectory's
  reward from references, RULER, or both with weights, and records the parts as metrics
  (`reward_answer`, `reward_calls`, `reward_reported`, `repeated_calls`, `reward_ruler`).

- `as_scorer(reward)`: a user's reward, a plain callable on a `TrajectoryGroup` (sync or async)
  that returns the rewards (one number per trajectory), the scored group, or None to drop it,
  made into the same kind of callback.
- `Reward`: the reward a run trains on, as one typed value: named, weighted components
  (`reference`, `ruler`) or a user's own function (`custom`), resolved from a run's `reward`
  setting by `Reward.of`. Its `scorer(...)` is the callback above; its properties say what
  follows from it (whether it checks references, needs a judge, which groups carry signal).
- `ruler_score_group(group, judge)`: ART's function: RULER's scores become the rewards (the
  previous reward is kept as `metrics["independent_reward"]`).

A judge failure is never a zero: with `drop_failed_groups`, the group is dropped with a logged
reason (and `on_drop(group, error)` is told, so that a caller can count and bound the losses);
otherwise the error propagates.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mcprl.errors import UsageError
from mcprl.mcp import looks_like_error
from mcprl.scenarios import (
    Reference,
    ReferenceCall,
    Scenario,
    equals_as_written,
    normalize,
    polarity,
    question_kind,
    same_text,
    written_precision,
)
from mcprl.types import Trajectory, TrajectoryGroup
from ruler import DEFAULT_RUBRIC, Judge, JudgeError

__all__ = [
    "JUDGED_SUCCESS",
    "Informative",
    "ReferenceReward",
    "Reward",
    "RewardFn",
    "RewardParts",
    "answer_matches",
    "as_scorer",
    "call_key",
    "call_turns",
    "calls_matched",
    "is_informative",
    "is_success",
    "made_calls",
    "polarity",
    "reference_hint",
    "reference_reward",
    "result_values",
    "reward_parts",
    "ruler_score_group",
    "scorer",
    "success_key",
    "winning_tool",
]

logger = logging.getLogger(__name__)

Informative = Literal["reward", "success", "judged"]

# a RULER score at or above this is the judge's verdict that the attempt accomplished the task
# (ruler's instructions tell the judge so)
JUDGED_SUCCESS = 0.5


def success_key(by: Informative) -> str:
    """The attempt metric that says it succeeded, for the rule `by`: the judge's verdict
    (`judged_success`) for `"judged"`, else the reference check (`success`)."""
    return "judged_success" if by == "judged" else "success"


def is_informative(group: TrajectoryGroup, by: Informative = "reward") -> bool:
    """GRPO has something to learn from the group.

    `by="reward"`: its rewards are not all equal. `by="success"`: some of its attempts succeeded
    and some did not (DAPO's filter on accuracy), so a group that differs only by partial credit
    teaches nothing; where the attempts carry no success mark (`metrics["success"]`, set for
    scenarios with a reference answer), the rewards decide as with `"reward"`. `by="judged"`:
    the same with the judge's verdict as the success mark (`metrics["judged_success"]`, a RULER
    score of at least `JUDGED_SUCCESS`), the rule for a reward without references.
    """
    scored = [t for t in group.trajectories if t.reward is not None]
    rewards = [t.reward for t in scored]
    if len(rewards) < 2 or max(rewards) - min(rewards) <= 1e-9:
        return False
    if by == "reward":
        return True
    marks = [t.metrics.get(success_key(by)) for t in scored]
    if any(m is None for m in marks):
        return True
    return 0 < sum(m >= 1.0 for m in marks) < len(marks)


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?|-?\.\d+")


def _numbers(text: str) -> list[float]:
    out = []
    for m in _NUMBER.findall(text):
        try:
            out.append(float(m.replace(",", "")))
        except ValueError:
            continue
    return out


def _close(a: float, b: float, tolerance: float) -> bool:
    return math.isclose(a, b, rel_tol=tolerance, abs_tol=tolerance * 1e-3 if b == 0 else 0.0)


def answer_matches(answer: str | None, reference: Reference) -> bool:
    """The expected answer appears in `answer`, as words (`_text_matches`: a yes or no also as
    true or false) or as a number equal to it as written.

    A number is right when it equals the reference to the precision the reference is written
    in: an integer exactly ("49" accepts 49 and 49.0, not 49.5), a decimal to half a unit of
    its last place ("32.8854" accepts 32.88535 to 32.88545, so also the tool's unrounded
    32.885424...). Where the scenario names a `tolerance`, that relative tolerance applies
    instead. Either way a relative 1e-9 absorbs floating-point noise.

    A text answer that also names a rival is wrong: another value that the reference's
    results give in the field where they give the expected one (`_rivals`). On
    mcp-server-git, "Ben Ode (Chloe Park)" named two authors of the log and scored 1.0 for
    Chloe Park, and the model learned to answer every author question so (L258).
    """
    if answer is None or reference.answer is None:
        return False
    expected = reference.answer
    if written_precision(expected) is None:
        if not _text_matches(answer, expected):
            return False
        return not any(_text_matches(answer, rival) for rival in _rivals(reference))
    if reference.tolerance is not None:
        target = float(expected.strip().replace(",", ""))
        return any(_close(x, target, reference.tolerance) for x in _numbers(answer))
    return any(equals_as_written(x, expected) for x in _numbers(answer))


_FIELD = re.compile(r"^[ \t]*([^:\n]{1,40}?)[ \t]*:[ \t]*(\S[^\n]*?)[ \t]*$", re.M)


def _rivals(reference: Reference) -> set[str]:
    """The other values the reference's results give in the field that holds its answer: in
    a JSON result, the values under the key whose value is the answer, wherever that key
    occurs; in a text result, the values of the lines "Key: value" whose key is that of a
    line whose value is the answer ("Author: Ben Ode" in a git log). None where the answer is
    a yes or no, or where no field holds it as its whole value. A rival that contains the
    answer as words, or that the answer contains, is not one."""
    expected = reference.answer
    if expected is None or polarity(expected) is not None:
        return set()
    wanted = normalize(expected)
    values: dict[str, set[str]] = {}  # per field, the values the results give
    for call in reference.calls:
        for key, value in _fields(call.result or ""):
            values.setdefault(key, set()).add(value)
    rivals = set()
    for field in values.values():
        if any(normalize(v) == wanted for v in field):
            rivals |= {v for v in field if normalize(v) and not _overlaps(normalize(v), wanted)}
    return rivals


def _overlaps(a: str, b: str) -> bool:
    return f" {a} " in f" {b} " or f" {b} " in f" {a} "


def _fields(text: str) -> list[tuple[str, str]]:
    """A result's (field, value) pairs: a JSON result's keys and their number or string
    values, at any depth; else its lines that read "Key: value"."""
    try:
        stack = [json.loads(text)]
    except json.JSONDecodeError:
        return [(k.strip().casefold(), v) for k, v in _FIELD.findall(text)]
    out = []
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                if isinstance(value, (dict, list)):
                    stack.append(value)
                elif isinstance(value, (int, float, str)) and not isinstance(value, bool):
                    out.append((str(key), str(value)))
        elif isinstance(item, list):
            stack.extend(item)
    return out


def _text_matches(answer: str, expected: str) -> bool:
    """`expected` appears in `answer` as whole words, case, accents and punctuation aside
    ("Ben Ode" is not in "Ben Oder"). A yes or no (or a true or false) is right when the answer
    says that, as "yes" or "true" (or "no" or "false"), and never the other: "True" answers
    yes, "Yes, or no" does not, and neither does "not" inside another word."""
    words = normalize(answer).split()
    wanted = normalize(expected)
    if (meant := polarity(expected)) is not None:  # a reference "true" takes a "yes" too
        said = {p for w in words if (p := polarity(w)) is not None}
        return said == {meant}
    return f" {wanted} " in f" {' '.join(words)} "


def _args_match(actual: Any, expected: Any, tolerance: float) -> bool:
    if isinstance(expected, (int, float)) and not isinstance(expected, bool):
        return isinstance(actual, (int, float)) and _close(
            float(actual), float(expected), tolerance
        )
    if isinstance(expected, str) and isinstance(actual, str):
        return normalize(actual) == normalize(expected)
    if isinstance(expected, dict) and isinstance(actual, dict):
        return expected.keys() == actual.keys() and all(
            _args_match(actual[k], v, tolerance) for k, v in expected.items()
        )
    if isinstance(expected, list) and isinstance(actual, list):
        return len(actual) == len(expected) and all(
            _args_match(a, e, tolerance) for a, e in zip(actual, expected, strict=True)
        )
    return actual == expected


_Calls = list[tuple[str, Any, str | None]]  # (tool, arguments, result text or None)


def _argument_tolerance(reference: Reference) -> float:
    """How close a call's numbers must come to a reference call's: the scenario's tolerance,
    else 1e-6."""
    return reference.tolerance if reference.tolerance is not None else 1e-6


def _is_call(name: str | None, args: Any, ref: ReferenceCall, tolerance: float) -> bool:
    """A call of the reference call's tool with matching arguments."""
    return name == ref.tool and _args_match(args, ref.arguments, tolerance)


def made_calls(trajectory: Trajectory) -> _Calls:
    """(tool, arguments, result text or None for an error) per call, in order. An error is a
    result flagged as one or one that reads as one ("Database error: no tables specified")."""
    results = {
        m.get("tool_call_id"): m.get("content") for m in trajectory.messages if m["role"] == "tool"
    }
    calls = []
    for m in trajectory.messages:
        for c in m.get("tool_calls") or []:
            try:
                args = json.loads(c["function"].get("arguments") or "{}")
            except json.JSONDecodeError:
                args = None
            text = results.get(c.get("id"))
            ok = (
                isinstance(text, str)
                and not text.startswith("Error")
                and not looks_like_error(text)
            )
            calls.append((c["function"]["name"], args, text if ok else None))
    return calls


def winning_tool(group: TrajectoryGroup) -> str | None:
    """The tool that the group's best-rewarded attempt called first (None: it called none, or
    no attempt was scored)."""
    scored = [t for t in group.trajectories if t.reward is not None]
    if not scored:
        return None
    calls = made_calls(max(scored, key=lambda t: t.reward))
    return calls[0][0] if calls else None


def calls_matched(trajectory: Trajectory, reference: Reference, tool_only: float = 0.0) -> float:
    """The share of reference calls the attempt made (same tool, matching arguments), each once.

    With `tool_only` > 0, a reference call that no call matched, but that a call of the same
    tool with other arguments stands for, counts `tool_only`, provided the attempt made no more
    tool calls than the reference has (so calling every tool in turn earns nothing).
    """
    return _calls_credit(made_calls(trajectory), reference, tool_only)


def _calls_credit(calls: _Calls, reference: Reference, tool_only: float) -> float:
    if not reference.calls:
        return 0.0
    made = [(n, a) for n, a, _ in calls if n != "complete_task"]
    tolerance = _argument_tolerance(reference)
    full = [any(_is_call(n, a, ref, tolerance) for n, a in made) for ref in reference.calls]
    credit = float(sum(full))
    if tool_only > 0 and len(made) <= len(reference.calls):
        # the calls left over after the full matches, each standing for at most one reference
        left = [n for n, a in made]
        for ref, hit in zip(reference.calls, full, strict=True):
            if hit and ref.tool in left:
                left.remove(ref.tool)
        for ref, hit in zip(reference.calls, full, strict=True):
            if not hit and ref.tool in left:
                left.remove(ref.tool)
                credit += tool_only
    return credit / len(reference.calls)


def _own_calls_credit(calls: _Calls, reference: Reference, tool_only: float, guided: int) -> float:
    """`_calls_credit` for the calls the policy made itself: a guided attempt's first `guided`
    calls were made for it (`RolloutConfig.guided_calls`), so only its calls after them count,
    against the reference calls after them (a repeat of a call made for it earns nothing). A
    failed guided attempt credited with calls it never made outscored the group's own attempts
    and pushed its own tokens up, garbage answers included: the catalog's L200, whose answers
    grew into digit strings ("177793657589") until no attempt solved anything at step 5."""
    if not reference.calls:
        return 0.0
    rest = reference.model_copy(update={"calls": reference.calls[guided:]})
    share = len(rest.calls) / len(reference.calls)
    return _calls_credit(calls[guided:], rest, tool_only) * share


def call_turns(trajectory: Trajectory, reference: Reference) -> list[list[int]]:
    """Where the attempt stood on the reference's chain of calls at each assistant turn:
    `[message index, the reference call due (0-based), 1 if the turn made it else 0]`.

    Calls count in the reference's order, each once, with `calls_matched`'s test of arguments.
    A turn made while a call is due that makes another call, none, or answers, is a miss.
    Turns after the chain is complete are left out. Calls made for the model (guided attempts)
    move the chain on like its own. The scorer keeps it, as JSON, in `metadata["call_turns"]`,
    where training reads it to give each turn credit for its call (`TrainConfig.call_credit`)."""
    calls = reference.calls
    tolerance = _argument_tolerance(reference)
    due, out = 0, []
    for index, message in enumerate(trajectory.messages):
        if message.get("role") != "assistant" or due >= len(calls):
            continue
        start = due
        for c in message.get("tool_calls") or []:  # several in one turn: each in order counts
            function = c.get("function") or {}
            try:
                args = json.loads(function.get("arguments") or "{}")
            except json.JSONDecodeError:
                break
            if not _is_call(function.get("name"), args, calls[due], tolerance):
                break
            due += 1
            if due == len(calls):
                break
        out.append([index, start, int(due > start)])
    return out


def _reported_result(
    trajectory: Trajectory, calls: _Calls, reference: Reference, any_tool: bool = True
) -> bool:
    """The final answer is what one of the attempt's own (non-error) tool calls returned: a
    call of a tool the reference calls, unless `any_tool` or the reference lists no calls."""
    answer = trajectory.final_answer()
    if answer is None:
        return False
    tolerance = reference.tolerance if reference.tolerance is not None else 1e-9
    tools = None if any_tool or not reference.calls else {c.tool for c in reference.calls}
    for name, _, text in calls:
        if text is None or name == "complete_task" or not text.strip():
            continue
        if tools is not None and name not in tools:
            continue
        for value in result_values(text.strip()):
            if answer_matches(answer, Reference(answer=value, tolerance=tolerance)):
                return True
    return False


def result_values(text: str, limit: int = 64) -> list[str]:
    """A tool result's text, and where it is JSON (`{"result": -160}`, see `results_as`), each
    number and string in it (at most `limit`)."""
    values = [text]
    try:
        stack = [json.loads(text)]
    except json.JSONDecodeError:
        return values
    while stack and len(values) <= limit:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(reversed(item.values()))
        elif isinstance(item, list):
            stack.extend(reversed(item))
        elif isinstance(item, (int, float, str)) and not isinstance(item, bool):
            values.append(str(item))
    return values


def _called_tools(calls: _Calls, reference: Reference) -> bool:
    """The attempt called each tool the reference calls at least once, with a result that is
    no error (any arguments, but those a reference call's `match` names: a write counts only
    when it wrote what the task asks, and a call behind a yes, a no or a 0 only when it asked
    for what the task names, each such call by a call of its own). An empty result
    (`[]`) found nothing: it bears out a "no" or a 0, and no other answer, and only from the
    reference's own call (same tool and arguments): `describe_table` of a table that does not
    exist returns `[]`, and a "yes" after it is still a guess, as is a "no" after asking about
    some other table."""
    nothing = _finds_nothing(reference.answer or "")
    tolerance = _argument_tolerance(reference)

    def looked(name: str, args: Any, text: str) -> bool:
        if not _empty(text):
            return True
        return nothing and any(_is_call(name, args, ref, tolerance) for ref in reference.calls)

    ok = [(n, a) for n, a, text in calls if text is not None and looked(n, a, text)]
    called = {name for name, _ in ok}
    if not all(c.tool in called for c in reference.calls):
        return False
    left = list(ok)  # each matched write stands for one reference call
    for ref in (c for c in reference.calls if c.match):
        hit = next((i for i, (n, a) in enumerate(left) if _carries(n, a, ref)), None)
        if hit is None:
            return False
        left.pop(hit)
    return True


def _carries(name: str, args: Any, ref: ReferenceCall) -> bool:
    """A call of the reference call's tool with the values of the arguments its `match` names."""
    return (
        name == ref.tool
        and isinstance(args, dict)
        and all(same_text(args.get(key), ref.arguments[key]) for key in ref.match)
    )


def _finds_nothing(answer: str) -> bool:
    """The answer is a "no" or a 0: what an empty result says."""
    return polarity(answer) == "no" or equals_as_written(0.0, answer)


def _empty(text: str) -> bool:
    """A result with nothing in it: blank, or JSON for an empty list, object, string or null."""
    try:
        return json.loads(text) in ([], {}, "", None)
    except ValueError:
        return not text.strip()


def call_key(name: str, args: Any) -> tuple[str, str]:
    """A call as (tool, its arguments in one canonical spelling): two calls are the same call,
    a repeat, when their keys are equal (here and in the agent loop's `retry_repeats`)."""
    return name, json.dumps(args, sort_keys=True)


def _repeats(calls: _Calls) -> int:
    seen, repeats = set(), 0
    for name, args, _ in calls:
        key = call_key(name, args)
        repeats += key in seen
        seen.add(key)
    return repeats


class ReferenceReward(BaseModel):
    """The weights of the reference reward's partial credit (module docstring)."""

    model_config = ConfigDict(extra="forbid")
    calls_weight: float = Field(default=0.3, ge=0, description="share of reference calls made")
    report_weight: float = Field(default=0.1, ge=0, description="the answer is a tool result")
    report_any_tool: bool = Field(
        default=True,
        description="False: report_weight only for a result of a tool the reference calls",
    )
    tool_only: float = Field(
        default=0.5, ge=0, le=1, description="a reference call's credit for the right tool alone"
    )

    @model_validator(mode="after")
    def _answer_dominates(self) -> ReferenceReward:
        if self.calls_weight + self.report_weight >= 1:
            raise UsageError(
                f"calls_weight + report_weight is {self.calls_weight + self.report_weight:g}; "
                "keep it below 1 so that a wrong answer never scores like a right one"
            )
        return self


class RewardParts(BaseModel):
    """The components of one attempt's reference reward."""

    answer: float = Field(description="1 if the final answer matches the reference")
    calls: float = Field(description="share of the reference calls made")
    reported: float = Field(description="1 if the answer is one of the agent's tool results")
    repeated_calls: float = Field(description="calls identical to an earlier one")
    guessed: float = Field(
        default=0.0,
        description="1 if the answer was right but the reference `needs_calls` the attempt "
        "did not make (it then scores as wrong)",
    )
    stock: float = Field(
        default=0.0,
        description="1 if the answer was right but is a stock answer (`StockAnswers`): "
        "counted, still right",
    )
    reward: float

    def metrics(self) -> dict[str, float]:
        """The components as an attempt's metrics (`reward_answer`, ...)."""
        return {
            "reward_answer": self.answer,
            "reward_calls": self.calls,
            "reward_reported": self.reported,
            "repeated_calls": self.repeated_calls,
            "guessed_answer": self.guessed,
            "stock_answer": self.stock,
        }


def reward_parts(
    trajectory: Trajectory,
    scenario: Scenario,
    weights: ReferenceReward | None = None,
    stock: Callable[[str | None], bool] | None = None,
) -> RewardParts:
    """The reference reward and its components; raises if the scenario has no reference.
    `stock`: whether a final answer is a stock answer (`StockAnswers.of`), counted in `stock`
    (the answer is still right)."""
    ref = scenario.reference
    if ref is None or (ref.answer is None and not ref.calls):
        raise UsageError(f"scenario {scenario.id!r} has no reference answer or calls")
    w = weights or ReferenceReward()
    made = made_calls(trajectory)  # read once for every part below
    calls = _calls_credit(made, ref, w.tool_only)
    guided = int(trajectory.metadata.get("guided_calls", 0))
    own = _own_calls_credit(made, ref, w.tool_only, guided) if guided else calls
    repeats = float(_repeats(made))
    if ref.answer is None:  # calls are all there is to check
        reward = 1.0 if calls >= 1.0 else own
        return RewardParts(
            answer=0.0, calls=calls, reported=0.0, repeated_calls=repeats, reward=reward
        )
    answer = float(answer_matches(trajectory.final_answer(), ref))
    guessed = float(bool(answer) and ref.needs_calls and not _called_tools(made, ref))
    answer -= guessed
    stocked = float(bool(answer) and stock is not None and stock(trajectory.final_answer()))
    reported = float(_reported_result(trajectory, made, ref, any_tool=w.report_any_tool))
    reward = 1.0 if answer else w.calls_weight * own + w.report_weight * reported
    return RewardParts(
        answer=answer,
        calls=calls,
        reported=reported,
        repeated_calls=repeats,
        guessed=guessed,
        stock=stocked,
        reward=reward,
    )


STOCK_SHARE = 0.5
STOCK_WINDOW = 4  # groups of a kind remembered


@dataclass
class _Seen:
    scenario_id: str
    reference: Reference
    answers: list[str]  # each attempt's final answer ("" for none)


class StockAnswers:
    """What a run's policy answered, per kind of grounded task (`question_kind` and the
    reference's tools), over the latest `window` groups of each kind: an answer that most
    attempts (`STOCK_SHARE`) at the other tasks of a kind gave where it was wrong is a stock
    answer, given whatever the task, and is no evidence of having read the result. On
    mcp-server-git (L258) the trained policy answered "Ben Ode" to every author question and
    "no" to every yes/no: right on 2 of 5 and 3 of 4 train tasks, so from step 4 on 85-90% of
    its training successes were answers it gave, in the same step, to a task of the kind where
    they were wrong, and it never read the log. Counted (`stock_answer` in a run's history),
    not penalised: scored as wrong, they left a git run with no group to train on in its
    first three steps, demonstrations included (L260). Stateful: one per `scorer`, fed every
    scored group in order; the first groups of a kind have nothing to compare with."""

    def __init__(self, window: int = STOCK_WINDOW) -> None:
        self.window = window
        self._seen: dict[tuple[str, ...], deque[_Seen]] = {}

    @staticmethod
    def kind(scenario: Scenario) -> tuple[str, ...] | None:
        asks, ref = question_kind(scenario), scenario.reference
        if asks is None or ref is None or ref.answer is None:
            return None
        return (asks, *(c.tool for c in ref.calls))

    def of(self, scenario: Scenario) -> Callable[[str | None], bool] | None:
        """Whether an answer to `scenario` is a stock answer; None where nothing is known."""
        kind = self.kind(scenario)
        others = [g for g in self._seen.get(kind, ()) if g.scenario_id != scenario.id]
        if kind is None or not others:
            return None

        def stock(answer: str | None) -> bool:
            if not answer:
                return False
            said = Reference(answer=answer)
            wrong = [g for g in others if not answer_matches(answer, g.reference)]
            tries = sum(len(g.answers) for g in wrong)
            gave = sum(answer_matches(a, said) for g in wrong for a in g.answers)
            return tries > 0 and gave >= STOCK_SHARE * tries

        return stock

    def add(self, scenario: Scenario, answers: list[str | None]) -> None:
        """Remember a scored group's final answers."""
        kind = self.kind(scenario)
        if kind is None:
            return
        seen = self._seen.setdefault(kind, deque(maxlen=self.window))
        seen.append(_Seen(scenario.id, scenario.reference, [a or "" for a in answers]))


def reference_reward(
    trajectory: Trajectory, scenario: Scenario, weights: ReferenceReward | None = None
) -> float:
    """0..1 from the scenario's reference (module docstring); raises if it has none."""
    return reward_parts(trajectory, scenario, weights).reward


def is_success(trajectory: Trajectory, scenario: Scenario) -> bool:
    """The answer matches the reference (or, with no reference answer, every call was made)."""
    parts = reward_parts(trajectory, scenario)
    return (parts.answer if scenario.reference.answer is not None else parts.calls) >= 1.0


def reference_hint(scenario: Scenario | None) -> str | None:
    """A scenario's reference as a hint for the judge (its calls and answer); None without."""
    ref = scenario.reference if scenario is not None else None
    if ref is None or (not ref.calls and ref.answer is None):
        return None
    lines = [
        f"call {i}: {c.tool}({json.dumps(c.arguments, ensure_ascii=False, sort_keys=True)})"
        + (f" -> {c.result}" if c.result is not None else "")
        for i, c in enumerate(ref.calls, 1)
    ]
    if ref.answer is not None:
        lines.append(f"answer: {ref.answer}")
    return "\n".join(lines)


def scorer(
    scenarios: Mapping[str, Scenario],
    *,
    judge: Judge | None = None,
    reference_weight: float = 1.0,
    ruler_weight: float = 0.0,
    reference: ReferenceReward | None = None,
    drop_failed_groups: bool = False,
    on_drop: Callable[[TrajectoryGroup, Exception], None] | None = None,
    judge_hint: bool = False,
) -> Callable[[TrajectoryGroup], Any]:
    """An `after_each` callback for `gather_groups` that sets rewards (see module docstring).
    `judge_hint`: show the judge the scenario's reference (`reference_hint`), marked as a hint.
    """
    if ruler_weight > 0 and judge is None:
        raise UsageError("ruler_weight > 0 needs a judge")
    if reference_weight <= 0 and ruler_weight <= 0:
        raise UsageError("give reference_weight or ruler_weight a positive weight")

    stock_answers = StockAnswers()

    async def score(group: TrajectoryGroup) -> TrajectoryGroup | None:
        if not group.trajectories:
            return group
        scenario = scenarios.get(group.scenario_id or "")
        if reference_weight <= 0 and len(group.trajectories) < 2:
            logger.info("dropping the group of %r: RULER needs 2+ attempts", group.scenario_id)
            return None
        ref_scores = None
        if reference_weight > 0:
            if scenario is None or scenario.reference is None:
                raise UsageError(f"no reference for scenario {group.scenario_id!r}")
            stock = stock_answers.of(scenario)
            stock_answers.add(scenario, [t.final_answer() for t in group.trajectories])
            ref_parts = [reward_parts(t, scenario, reference, stock) for t in group.trajectories]
            ref_scores = [p.reward for p in ref_parts]
            for t, p in zip(group.trajectories, ref_parts, strict=True):
                t.metrics.update(p.metrics())
                if scenario.reference.calls:
                    # metadata holds scalars (as ART's does): the rows go as JSON text
                    t.metadata["call_turns"] = json.dumps(call_turns(t, scenario.reference))
        ruler_scores = None
        if ruler_weight > 0 and len(group.trajectories) >= 2:
            try:
                result = await judge.score(
                    [t.messages for t in group.trajectories],
                    tools=group.trajectories[0].tools,
                    hint=reference_hint(scenario) if judge_hint else None,
                )
            except JudgeError as exc:
                if not drop_failed_groups:
                    raise
                logger.warning("dropping the group of %r: %s", group.scenario_id, exc)
                if on_drop is not None:
                    on_drop(group, exc)
                return None
            ruler_scores = result.rewards
            if result.agreement is not None:  # two passes: how well they agreed on the group
                for t in group.trajectories:
                    t.metrics["judge_agreement"] = result.agreement
        for i, t in enumerate(group.trajectories):
            parts = []
            if ref_scores is not None:
                t.metrics["reward_reference"] = ref_scores[i]
                parts.append((reference_weight, ref_scores[i]))
            if ruler_scores is not None:
                t.metrics["reward_ruler"] = ruler_scores[i]
                t.metrics["judged_success"] = float(ruler_scores[i] >= JUDGED_SUCCESS)
                parts.append((ruler_weight, ruler_scores[i]))
            t.reward = sum(w * v for w, v in parts) / sum(w for w, _ in parts)
        return group

    return score


async def ruler_score_group(
    group: TrajectoryGroup,
    judge_model: str | Judge = "openai/o3",
    *,
    extra_litellm_params: Mapping[str, Any] | None = None,
    rubric: str = DEFAULT_RUBRIC,
    swallow_exceptions: bool = False,
    debug: bool = False,
) -> TrajectoryGroup | None:
    """A copy of `group` with RULER's scores as rewards (ART's `ruler_score_group`).

    `judge_model` is a LiteLLM model string or a `ruler.Judge`. Each trajectory keeps its
    previous reward as `metrics["independent_reward"]` and the score as
    `metrics["ruler_score"]`; with `debug`, the judge's explanation goes into its logs. If the
    judge fails, the error propagates, or with `swallow_exceptions` the result is None (logged):
    never a reward of 0. A group of fewer than 2 attempts cannot be ranked: ValueError.
    """
    if len(group.trajectories) < 2:
        raise UsageError(
            f"RULER ranks 2 or more attempts; this group has {len(group.trajectories)}"
        )
    judge = (
        judge_model
        if isinstance(judge_model, Judge)
        else Judge(judge_model, rubric=rubric, extra_params=extra_litellm_params)
    )
    result = await judge.score(
        [t.messages for t in group.trajectories],
        tools=group.trajectories[0].tools or None,
        rubric=rubric if rubric != DEFAULT_RUBRIC else None,
        swallow_exceptions=swallow_exceptions,
    )
    if result is None:
        return None
    scored = group.model_copy(deep=True)
    for t, s in zip(scored.trajectories, result.scores, strict=True):
        if t.reward is not None:
            t.metrics["independent_reward"] = t.reward
        t.metrics["ruler_score"] = s.score
        t.reward = s.score
        if debug:
            t.log(f"RULER ({judge.model}): {s.score:.2f}: {s.explanation}")
    return scored


RewardFn = Callable[[TrajectoryGroup], Any]


def as_scorer(reward: RewardFn) -> Callable[[TrajectoryGroup], Any]:
    """`reward(group)` (module docstring) as an async scorer that sets `trajectory.reward`."""
    import inspect

    name = getattr(reward, "__name__", type(reward).__name__)

    async def score(group: TrajectoryGroup) -> TrajectoryGroup | None:
        if not group.trajectories:
            return group
        out = reward(group)
        if inspect.isawaitable(out):
            out = await out
        if out is None:
            logger.info("the reward %s dropped the group of %r", name, group.scenario_id)
            return None
        if isinstance(out, TrajectoryGroup):
            return out
        values = list(out)
        if len(values) != len(group.trajectories):
            raise UsageError(
                f"the reward {name} returned {len(values)} values for a group of "
                f"{len(group.trajectories)} attempts; return one number per attempt"
            )
        for t, v in zip(group.trajectories, values, strict=True):
            t.reward = float(v)
        return group

    return score


_WEIGHTS = {"reference": (1.0, 0.0), "ruler": (0.0, 1.0), "both": (0.5, 0.5)}


@dataclass(frozen=True)
class Reward:
    """What a run's attempts are scored by: weighted components, or a user's function.

    `reference` and `ruler` weigh the reference check and the judge's score (a mix of both is
    their weighted mean); `custom`, when set, replaces both (`as_scorer`).
    """

    reference: float = 0.0
    ruler: float = 0.0
    custom: RewardFn | None = None

    @classmethod
    def of(cls, mode: str, custom: RewardFn | None = None) -> Reward:
        """The reward a resolved `reward` setting names: reference, ruler, both, or custom."""
        if custom is not None:
            return cls(custom=custom)
        if mode not in _WEIGHTS:
            raise UsageError(f"unknown reward {mode!r}: reference, ruler or both")
        reference, ruler = _WEIGHTS[mode]
        return cls(reference=reference, ruler=ruler)

    @property
    def name(self) -> str:
        """`reference`, `ruler`, `both` or `custom` (for summaries and messages)."""
        if self.custom is not None:
            return "custom"
        if self.reference > 0 and self.ruler > 0:
            return "both"
        return "reference" if self.reference > 0 else "ruler"

    @property
    def checks_references(self) -> bool:
        """Part of the reward is the scenarios' reference check."""
        return self.custom is None and self.reference > 0

    @property
    def needs_judge(self) -> bool:
        return self.custom is None and self.ruler > 0

    def informative(self, wanted: Informative) -> Informative:
        """Which groups carry signal (`is_informative`). With `wanted="success"`: by the
        reference check when the reward checks references; with RULER alone, by the judge's
        verdict (`"judged"`), references or not; with a custom reward, the rewards decide."""
        if wanted == "reward" or self.checks_references:
            return wanted
        return "judged" if self.needs_judge else "reward"

    def scorer(
        self,
        scenarios: Mapping[str, Scenario],
        *,
        judge: Judge | None = None,
        reference: ReferenceReward | None = None,
        drop_failed_groups: bool = False,
        on_drop: Callable[[TrajectoryGroup, Exception], None] | None = None,
        judge_hint: bool = False,
    ) -> Callable[[TrajectoryGroup], Any]:
        """The async callback that scores a group with this reward (`scorer`, `as_scorer`)."""
        if self.custom is not None:
            return as_scorer(self.custom)
        return scorer(
            scenarios,
            judge=judge,
            reference_weight=self.reference,
            ruler_weight=self.ruler,
            reference=reference,
            drop_failed_groups=drop_failed_groups,
            on_drop=on_drop,
            judge_hint=judge_hint,
        )
