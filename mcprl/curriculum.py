"""Which training scenarios a step draws: the ones whose groups are likely to teach something.

GRPO learns only from groups whose attempts score differently: a scenario the policy always
solves, or never does, gives a group of equal rewards and no update. `ScenarioSampler` tracks
each scenario's groups across steps and draws, for each step, scenarios in proportion to the
estimated chance that their next group differs:

    P(informative) = (informative groups + 2 * prior) / (groups + 2)

a Beta posterior mean whose prior falls with difficulty (0.8 for difficulty 1 down to 0.2 for
difficulty 5), so a run starts from the easy end and moves on as the easy tasks stop teaching.
The policy changes every step, so the counts are of recent groups: each new group of a scenario
(or kind) multiplies the weight of its earlier groups, and of the prior, by `decay` (1/2), and
the estimate follows what the policy does now. (With plain counts, as before, a kind that
taught at its first three or four groups and was solved by every attempt after kept a weight
near 1/2 for the rest of the run: in a seed-0 calculator run, the divisions were drawn
and tied at each of steps 4-10.)
A floor (`min_weight`) keeps every scenario drawable, so one that stopped teaching can come back.
A step draws *kinds* of task (the tools a reference calls, in order, and what a generated task
asks of their results) one at a time, each with chance in proportion to its weight, and a kind
the step drew already counts `repeat_kind` (1/4) times its weight for each time it was drawn:
one kind the policy half-solves cannot fill a step, a redraw after a tie tries another kind
first (in a calculator run that drew scenarios alone, the "Add X and Y" tasks filled half of
every step, and the policy learned to call `add` for everything, multiplications and square
roots included), and a step is not made to spend its draws on kinds that stopped teaching only
because they differ from the rest. (Before, a step
took one scenario of as many different kinds as it drew before any second one: with 4 to 6 draws
from 11 kinds, 17 of the 60 draws of a seed-0 run went to the four kinds of 2-4 calls, which no
attempt ever solved.) Kinds are drawn by weight alone, however many scenarios each has.
`mode="fresh"` (the default, as in `mcprl train`) estimates the chance per kind instead (the
groups of all its scenarios pooled), and draws a kind's least-drawn scenarios before any it has
drawn more often. Per scenario, a task the policy half-solves keeps winning the draw, and the
policy learns that task's numbers: in a calculator run (seed 0), "3 to the power of 2" was
drawn at steps 4 and 5, its attempts that called `power` with base 2 (right tool, wrong numbers)
beat the `add` calls around them, and at step 9 five of eight attempts at "7 to the power of 3"
called `power(base=2, exponent=3)`. Where a kind of grounded question shares answers, its
least-drawn answer comes first (`answer_key`): on mcp-server-git, 2 of the 5 author questions
were Ben Ode's commits and 3 of the 4 yes/no questions were answered no, and the trained
policy gave those answers whatever the question (RESULTS.md, L258). `mode="curriculum"` makes
the estimate per scenario (an earlier default); `mode="uniform"` draws every scenario with the
same weight (the baseline this is measured against).
Draws are weighted, without replacement, and seeded by (seed, step, round): a resumed run that
replays the same history draws the same scenarios.

Subtasks (`subtask`, the loop's `RunConfig.subtasks`): a chain of calls the policy never
solves gives no informative group, so it is seldom drawn and never learned, though each of its
steps is a single call of the kind the policy learns elsewhere. A subtask is one step of such a
chain, practised as a task of its own: the chain's task as its attempts see it, the reference's
calls before the step made for the attempt, and its own next call checked against the
reference's (same tool, matching arguments); the attempt ends there. Scored as a reference
with those calls and no answer, it succeeds only with the call that was due, and the group
compares attempts at the same decision: which call comes next, on what numbers.

The training loop uses it with *dynamic sampling* (DAPO): when a drawn group ties, it draws
another scenario, within `oversample` times the groups a step asks for (see `mcprl.train`).
With `informative="success"` (`TrainConfig.informative`), a group counts only when some of its
attempts succeeded and some failed: a scenario the policy never solves then stops being drawn,
however its attempts differ in partial credit, and such a group is redrawn and not trained.

    sampler = ScenarioSampler(scenarios.train, seed=0)
    sampler.observe(groups)                       # every scored training group, every step
    batch = sampler.draw(4, step=3)                # scenarios for step 3
"""

from __future__ import annotations

import heapq
import math
import random
import re
import zlib
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Any, Literal, get_args

from mcprl.errors import UsageError
from mcprl.mcp import MCPSession, ToolInfo, tool_access, tool_info
from mcprl.rewards import Informative, answer_matches, is_informative, success_key
from mcprl.rollout import RolloutConfig, solve_examples
from mcprl.scenarios import (
    Reference,
    Scenario,
    has_reference,
    normalize,
    polarity,
    question_kind,
)
from mcprl.types import TrajectoryGroup

__all__ = [
    "SUBTASK_TAG",
    "Informative",
    "Sampling",
    "ScenarioSampler",
    "ScenarioStats",
    "example_scenarios",
    "is_informative",
    "relabel_subtask",
    "similar_scenarios",
    "subtask",
    "task_kind",
    "task_wording",
    "with_worked_examples",
]

SUBTASK_TAG = "subtask"

Sampling = Literal["fresh", "curriculum", "uniform"]

# prior chance that a group at each difficulty differs: start easy
_PRIOR = {1: 0.8, 2: 0.6, 3: 0.4, 4: 0.3, 5: 0.2}
_PRIOR_STRENGTH = 2.0


def _reference_calls(scenario: Scenario) -> int:
    return len(scenario.reference.calls) if scenario.reference is not None else 0


def _demonstrated(t: Any) -> int:
    """How many calls the loop pinned for the attempt (`RolloutConfig.next_calls`)."""
    if "first_arguments" not in t.metadata:
        return 0
    return int(t.metadata.get("demonstrated_calls", 1))


def _shown_every_call(t: Any, calls: int) -> bool:
    """The loop made or pinned every one of the reference's `calls` for the attempt, and left
    the answer to the policy (a demonstration without `demonstrated_answer`)."""
    made = int(t.metadata.get("guided_calls", 0)) + _demonstrated(t)
    return _demonstrated(t) > 0 and made >= calls and "demonstrated_answer" not in t.metadata


def task_kind(scenario: Scenario) -> tuple[str, ...]:
    """The tools its reference calls, in order (its own id when it has no reference calls), and
    for a generated task what it asks of their results (`question_kind`): a count and a lookup
    through the same SQL tool are two kinds, and solving one does not end the help the other
    gets. A hindsight task's kind is marked as such (`mcprl.hindsight`): solving one is not
    solving the kind of task it came from."""
    ref = scenario.reference
    if ref is None or not ref.calls:
        return ("id", scenario.id)
    tools = tuple(c.tool for c in ref.calls)
    asks = question_kind(scenario)
    if asks is not None:
        tools = (*tools, f"asks:{asks}")
    return ("hindsight", *tools) if "hindsight" in scenario.tags else tools


def example_scenarios(
    scenarios: Sequence[Scenario], tools: Sequence[ToolInfo], n: int, max_result_chars: int = 2000
) -> list[Scenario]:
    """The train tasks shown as worked examples to every task (`example_choice` kinds): one per
    kind of task (`task_kind`), kinds taken in turn by the number of reference calls (one call,
    two, ..., then again), within a length the most common first; of a kind, the task whose
    reference results are shortest. Only tasks `_showable` among `tools`."""
    kinds: dict[tuple[str, ...], list[Scenario]] = {}
    for s in _showable(scenarios, tools, max_result_chars):
        kinds.setdefault(task_kind(s), []).append(s)
    by_length: dict[int, list[tuple[str, ...]]] = {}
    for kind in sorted(kinds, key=lambda k: (-len(kinds[k]), k)):
        by_length.setdefault(_reference_calls(kinds[kind][0]), []).append(kind)
    queues = [by_length[length] for length in sorted(by_length)]
    order: list[tuple[str, ...]] = []
    while len(order) < n and any(queues):
        order += [q.pop(0) for q in queues if q][: n - len(order)]
    return [min(kinds[k], key=lambda s: (_result_chars(s), s.id)) for k in order]


def similar_scenarios(
    scenarios: Sequence[Scenario],
    tools: Sequence[ToolInfo],
    n: int,
    max_result_chars: int = 2000,
) -> dict[str, list[Scenario]]:
    """Each scenario's worked examples (`example_choice` similar), by id: the `n` train tasks
    `_showable` among `tools` other than itself or one worded the same, first those whose
    tools list the most of its quoted text among their choices (`_listed_choices`), then
    those worded most like it (`task_wording`, compared as sequences of words), then those with
    shorter results. Only the task and the tools decide, as they would for a question a user
    asks: a conversion from "grain" to "pound" is shown one made with the tool whose units
    list both, where every conversion task reads alike. Except that of those alike, a train
    task is shown one whose answer tells nothing of its own (`_answer_teller`): on git, 6 of
    13 train tasks were shown their own answer and none of the 5 held out, and the trained
    model answered every held-out task with its example's answer (RESULTS.md, L256)."""
    pool = _showable(scenarios, tools, max_result_chars)
    if n <= 0 or not pool:
        return {}
    wording = {s.id: task_wording(s.task) for s in scenarios}
    chars = {c.id: _result_chars(c) for c in pool}
    choices = {t.name: _listed_choices(t.input_schema) for t in tools}
    literals = {s.id: _quoted_literals(s.task) for s in scenarios}
    accepts = {c.id: set().union(*(choices.get(x.tool, set()) for x in c.reference.calls))
               for c in pool}  # fmt: skip
    likeness: dict[tuple[tuple[str, ...], tuple[str, ...]], float] = {}
    coins = _yes_no_coins(scenarios)
    tells = {s.id: _answer_teller(s, coins.get(s.id)) for s in scenarios}

    def alike(a: tuple[str, ...], b: tuple[str, ...]) -> float:
        if (a, b) not in likeness:
            likeness[a, b] = SequenceMatcher(None, a, b, autojunk=False).ratio()
        return likeness[a, b]

    out: dict[str, list[Scenario]] = {}
    for s in scenarios:
        others = (c for c in pool if c.id != s.id and c.task != s.task)
        out[s.id] = heapq.nsmallest(  # the n best, not a sort of the pool per scenario
            n,
            others,
            key=lambda c: (
                -sum(q in accepts[c.id] for q in literals[s.id]),
                -alike(wording[s.id], wording[c.id]),
                tells[s.id](c),
                chars[c.id],
                c.id,
            ),
        )
    return out


def _yes_no_coins(scenarios: Sequence[Scenario]) -> dict[str, str]:
    """For each train task answered yes or no, the answer its example should give: of the
    tasks answered yes, half (taken in the order of their ids, hashed) are shown a yes and half
    a no, and so are the tasks answered no. So the example's answer says nothing of the task's,
    and neither copying it nor answering the opposite earns more than a guess."""
    sides: dict[str, list[str]] = {}
    for s in scenarios:
        answer = s.reference.answer if s.split == "train" and s.reference is not None else None
        if answer is not None and (side := polarity(answer)) is not None:
            sides.setdefault(side, []).append(s.id)
    out = {}
    for ids in sides.values():
        for i, sid in enumerate(sorted(ids, key=lambda x: (zlib.crc32(x.encode()), x))):
            out[sid] = ("yes", "no")[i % 2]
    return out


def _answer_teller(task: Scenario, coin: str | None) -> Callable[[Scenario], bool]:
    """For a train task with a reference answer, whether an example would tell its answer away,
    so that one is shown only where no other is alike: a yes or no is told by an example whose
    answer is not `coin` (`_yes_no_coins`), any other answer by an example scored right for it
    (`answer_matches`). A val task is a question as a user asks it: its answer, unknown, picks
    nothing."""
    ref = task.reference
    if task.split != "train" or ref is None or ref.answer is None:
        return lambda example: False
    if coin is not None:
        return lambda example: polarity(example.reference.answer or "") != coin
    return lambda example: answer_matches(example.reference.answer, ref)


def _quoted_literals(task: str) -> list[str]:
    """The task's quoted texts, without their quotes, case-folded: what it names exactly."""
    return [q[1:-1].strip().casefold() for q in _QUOTED.findall(task)]


def _listed_choices(schema: Any) -> set[str]:
    """Every string a JSON schema lists as a choice (`enum`, `const`), at any depth (inside
    `anyOf`, `items` or `$defs`), case-folded: the values the tool names as its own."""
    out: set[str] = set()
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key == "enum" and isinstance(value, list):
                out.update(v.casefold() for v in value if isinstance(v, str))
            elif key == "const" and isinstance(value, str):
                out.add(value.casefold())
            else:
                out |= _listed_choices(value)
    elif isinstance(schema, list):
        for item in schema:
            out |= _listed_choices(item)
    return out


_QUOTED = re.compile(r'"[^"]*"|\u201c[^\u201d]*\u201d')
_NUMBER = re.compile(r"[-+]?\d+(?:[.,]\d+)*")
_JOINERS = {"of", "the", "a", "an"}  # inside a name: "The Call of the Wild"


def task_wording(task: str) -> tuple[str, ...]:
    """A task's words with what varies from one task of a family to the next set aside: quoted
    text (Q), numbers (N), and names (a capitalised word after the first, with the small words
    inside one, as one E; not a sentence's first word), the rest lower-cased. "How much does The
    Call of the Wild cost?" and "How much does Dracula cost?" read the same."""
    text = _NUMBER.sub(" NNN ", _QUOTED.sub(" QQQ ", task))
    out: list[str] = []
    for match in re.finditer(r"\w+", text):
        word = match.group()
        if word in ("QQQ", "NNN"):
            out.append(word[0])
        elif not _starts_sentence(text[: match.start()]) and word[0].isupper():
            j = len(out)
            while j > 0 and out[j - 1] in _JOINERS:
                j -= 1
            if j > 0 and out[j - 1] == "E":  # "E", or "E of the", then a capitalised word
                del out[j:]
                continue
            out.append("E")
        else:
            out.append(word.lower())
    return tuple(out)


def _starts_sentence(before: str) -> bool:
    """Whether a word after `before` opens a sentence: the first word, or one after ".", "?",
    "!" or ":" (not after an initial: "H. G. Wells")."""
    before = before.rstrip()
    if not before or before[-1] in "?!:":
        return True
    return before[-1] == "." and re.search(r"(?:^|\W)[A-Z]\.$", before) is None


def _showable(
    scenarios: Sequence[Scenario], tools: Sequence[ToolInfo], max_result_chars: int
) -> list[Scenario]:
    """Train tasks with a reference answer whose calls all go to offered `tools` that only read
    (`tool_access`), with results of at most `max_result_chars` in all: an example costs the
    server nothing and the prompt little."""
    reads = {t.name for t in tools if tool_access(t)[0] == "read"}
    out = []
    for s in scenarios:
        calls = s.reference.calls if s.reference is not None else []
        if s.split != "train" or not calls or s.reference.answer is None or s.elicitation:
            continue
        if _result_chars(s) <= max_result_chars and {c.tool for c in calls} <= reads:
            out.append(s)
    return out


def _result_chars(scenario: Scenario) -> int:
    """How long the results of the scenario's reference calls are, together."""
    calls = scenario.reference.calls if scenario.reference is not None else []
    return sum(len(c.result or "") for c in calls)


async def with_worked_examples(
    scenarios: Sequence[Scenario], session: MCPSession, config: RolloutConfig
) -> RolloutConfig:
    """`config` with its `examples` worked examples (as `example_choice` picks them among the
    tools `session` offers an attempt) solved once through `session`
    (`mcprl.rollout.solve_examples`), each kept once in `worked_examples`: in order as
    `example_messages` for kinds, named per task by `examples_by_task` for similar. Unchanged
    when `examples` is 0."""
    if not config.examples:
        return config
    tools = await session.list_tools()
    offered = [tool_info(t) for t in tools if t.name not in config.hidden_tools]
    if config.example_choice == "kinds":
        picked = example_scenarios(scenarios, offered, config.examples)
        solved = {s.id: await solve_examples([s], session, config) for s in picked}
        messages = [m for ms in solved.values() for m in ms]
        return config.model_copy(update={"example_messages": messages, "worked_examples": solved})
    by_task = similar_scenarios(scenarios, offered, config.examples)
    solved = {}
    for picked in by_task.values():
        for s in picked:
            if s.id not in solved:
                solved[s.id] = await solve_examples([s], session, config)
    ids = {sid: [s.id for s in picked] for sid, picked in by_task.items()}
    return config.model_copy(update={"worked_examples": solved, "examples_by_task": ids})


def subtask(scenario: Scenario, step: int) -> Scenario:
    """Step `step` (0-based) of `scenario`'s chain of reference calls as a task of its own
    (module docstring): the same task, scored by the reference's calls up to and including
    that step and no answer. Its attempts are rolled out at `scenario` itself, with the calls
    before the step made for them (`RolloutConfig.guided_calls`) and an end after the step's
    call (`stop_after_calls`), so they see what the chain's own attempts see."""
    ref = scenario.reference
    calls = ref.calls if ref is not None else []
    if not 0 <= step < len(calls):
        raise UsageError(
            f"scenario {scenario.id!r} has {len(calls)} reference calls; a subtask is one of "
            f"them, 0 to {len(calls) - 1}, not {step}"
        )
    return scenario.model_copy(
        update={
            "id": f"{scenario.id}#step{step + 1}",
            "reference": Reference(calls=calls[: step + 1], tolerance=ref.tolerance),
            "tags": [*scenario.tags, SUBTASK_TAG],
            "split": "train",
        }
    )


def relabel_subtask(group: TrajectoryGroup, scenario: Scenario, step: int) -> Scenario:
    """Make `group`, rolled out at `scenario` with the calls before `step` made for it, the
    group of that step's subtask: its id and each attempt's (`subtask_step`, 1-based, marks
    the attempt as one the loop helped). Returns the subtask, which scores it."""
    part = subtask(scenario, step)
    group.scenario_id = part.id
    for t in group.trajectories:
        t.metadata["scenario_id"] = part.id
        t.metadata["subtask_step"] = step + 1
    return part


def answer_key(scenario: Scenario) -> str:
    """What a grounded question's answer is, for drawing a kind's answers evenly: "yes" or
    "no", else the number it is, else its words (case, accents and punctuation aside). Other
    tasks (no `question_kind`, or no reference answer) are keyed by their own id: a written
    task set such as the calculator's picks each task's numbers, and only questions asked of
    one server's data keep coming back to the same few answers."""
    ref = scenario.reference
    if ref is None or ref.answer is None or question_kind(scenario) is None:
        return f"id:{scenario.id}"
    try:
        return f"number:{float(ref.answer.strip().replace(',', ''))!r}"
    except ValueError:
        return polarity(ref.answer) or normalize(ref.answer)


@dataclass
class ScenarioStats:
    """What the training groups of one scenario (or kind) did so far.

    `recent_groups` and `recent_informative` count the same groups with the older ones
    discounted (`ScenarioSampler(decay=...)`), for the estimate that draws. `own_successes`
    leaves out the attempts the loop helped start: a first tool it chose
    (`RolloutConfig.first_tool`), or reference calls it made for them (`guided_calls`).
    """

    groups: int = 0
    informative: int = 0
    attempts: int = 0
    successes: int = 0
    own_successes: int = 0
    recent_groups: float = 0.0
    recent_informative: float = 0.0
    guided_solved: int | None = None  # the fewest calls made for a guided attempt that succeeded
    # attempts shown every reference call (made or pinned for them), left to answer alone
    shown_all: int = 0
    shown_all_solved: int = 0

    @property
    def success_rate(self) -> float:
        return self.successes / self.attempts if self.attempts else math.nan


class ScenarioSampler:
    """Draws training scenarios by their chance of giving an informative group (module doc)."""

    def __init__(
        self,
        scenarios: Iterable[Scenario],
        *,
        seed: int = 0,
        min_weight: float = 0.05,
        mode: Sampling = "fresh",
        informative: Informative = "reward",
        repeat_kind: float = 0.25,
        decay: float = 0.5,
        redraw: int = 0,
    ) -> None:
        self.scenarios = list(scenarios)
        if not self.scenarios:
            raise UsageError("the sampler needs at least one scenario")
        if mode not in get_args(Sampling):
            choices = ", ".join(get_args(Sampling))
            raise UsageError(f"sampling mode {mode!r}: choose one of {choices}")
        self.seed = seed
        self.min_weight = min_weight
        self.mode = mode
        self.informative = informative
        self._mark = success_key(informative)  # what counts as solved
        if not 0.0 < repeat_kind <= 1.0:
            raise UsageError(f"repeat_kind={repeat_kind}: it must be in (0, 1]")
        self.repeat_kind = repeat_kind
        if not 0.0 < decay <= 1.0:
            raise UsageError(f"decay={decay}: it must be in (0, 1]")
        self.decay = decay
        if redraw < 0:
            raise UsageError(f"redraw={redraw}: it must be 0 or more")
        self.redraw = redraw
        self.stats = {s.id: ScenarioStats() for s in self.scenarios}
        self._kind = {s.id: task_kind(s) for s in self.scenarios}
        self._by_kind = {kind: ScenarioStats() for kind in self._kind.values()}
        self._calls = {s.id: _reference_calls(s) for s in self.scenarios}
        self._answer = {s.id: answer_key(s) for s in self.scenarios}

    def add(self, scenarios: Iterable[Scenario]) -> None:
        """Put more scenarios in the pool (hindsight tasks); ids it has already are skipped."""
        for s in scenarios:
            if s.id in self.stats:
                continue
            self.scenarios.append(s)
            self.stats[s.id] = ScenarioStats()
            self._kind[s.id] = task_kind(s)
            self._by_kind.setdefault(self._kind[s.id], ScenarioStats())
            self._calls[s.id] = _reference_calls(s)
            self._answer[s.id] = answer_key(s)

    def observe(self, groups: Iterable[TrajectoryGroup]) -> None:
        """Record scored groups (unknown scenario ids are ignored)."""
        for g in groups:
            stats = self.stats.get(g.scenario_id or "")
            if stats is None or not g.trajectories:
                continue
            kind = self._by_kind[self._kind[g.scenario_id or ""]]
            informative = is_informative(g, self.informative)
            solved = [t for t in g.trajectories if t.metrics.get(self._mark, 0.0) >= 1.0]
            own = sum(not t.helped for t in solved)
            # calls made for a success: the demonstrated calls after the guided ones count too
            guided = [
                int(t.metadata["guided_calls"]) + _demonstrated(t)
                for t in solved
                if "guided_calls" in t.metadata
            ]
            calls = self._calls[g.scenario_id or ""]
            shown = [t for t in g.trajectories if calls and _shown_every_call(t, calls)]
            shown_solved = sum(t.metrics.get(self._mark, 0.0) >= 1.0 for t in shown)
            for s in (stats, kind):
                s.groups += 1
                s.informative += informative
                s.attempts += len(g.trajectories)
                s.successes += len(solved)
                s.own_successes += own
                s.recent_groups = self.decay * s.recent_groups + 1
                s.recent_informative = self.decay * s.recent_informative + informative
                s.shown_all += len(shown)
                s.shown_all_solved += shown_solved
                if guided:
                    fewest = min(guided)
                    s.guided_solved = min(fewest, s.guided_solved or fewest)

    def guided_calls(self, scenario: Scenario, rng: random.Random) -> int:
        """How many of the reference's calls to make for a guided attempt at `scenario`: a draw
        from 1 to one fewer than the calls of its chain, and from 1 to one fewer than the
        fewest with which a guided attempt of its kind succeeded, once one has: the help falls
        as the kind gets solved (a curriculum over the chain). 0 for a single call."""
        n = _reference_calls(scenario)
        kind = self._kind_stats(scenario)
        most = n - 1
        if kind is not None and kind.guided_solved is not None:
            most = min(most, max(1, kind.guided_solved - 1))
        return rng.randint(1, most) if most >= 1 else 0

    def unsolved(self, scenario: Scenario) -> bool:
        """Its kind was tried and no attempt of the policy's own choosing solved it: where some
        attempts should explore (`TrainConfig.explore`). Success is the judge's verdict with
        `informative="judged"`; else the reference check, and a scenario with no reference is
        never unsolved (its success is unknown)."""
        if not self._success_known(scenario):
            return False
        kind = self._kind_stats(scenario)
        return kind is not None and kind.groups > 0 and kind.own_successes == 0

    def missed(self, scenario: Scenario) -> bool:
        """It was drawn before and no attempt of the policy's own choosing solved it, whatever
        its kind did: a task its kind's solved ones do not teach (sqlite's "lowest stock",
        answered like "highest price" with `ORDER BY ... DESC`), where a demonstration still
        gives its group a success to learn from. Success as in `unsolved`."""
        if not self._success_known(scenario):
            return False
        stats = self.stats.get(scenario.id)
        return stats is not None and stats.groups > 0 and stats.own_successes == 0

    def answer_unread(self, scenario: Scenario, after: int) -> bool:
        """At least `after` (> 0) attempts of its kind were shown every reference call, with
        the results, and none answered right: the policy cannot read the answer out of what
        the calls return (git's log, a table's description), where a demonstration of the
        calls alone teaches nothing more."""
        kind = self._kind_stats(scenario)
        if after <= 0 or kind is None:
            return False
        return kind.shown_all >= after and kind.shown_all_solved == 0

    def solved(self, scenario: Scenario) -> bool:
        """An attempt of the policy's own choosing has solved its kind (helped ones, explored
        or guided, do not count)."""
        kind = self._kind_stats(scenario)
        return kind is not None and kind.own_successes > 0

    def _success_known(self, scenario: Scenario) -> bool:
        """Whether an attempt's success is known: the judge's verdict with
        `informative="judged"`, else a reference to check against."""
        return self.informative == "judged" or has_reference(scenario)

    def _kind_stats(self, scenario: Scenario) -> ScenarioStats | None:
        """The pooled stats of the scenario's kind; None for a scenario the sampler lacks."""
        return self._by_kind.get(self._kind.get(scenario.id, ()))

    def weight(self, scenario: Scenario) -> float:
        """The estimated chance that the scenario's next group is informative (floored)."""
        if self.mode == "uniform":
            return 1.0
        prior = _PRIOR.get(scenario.difficulty, 0.5)
        if self.mode == "fresh":
            s = self._by_kind[self._kind[scenario.id]]
        else:
            s = self.stats[scenario.id]
        strength = _PRIOR_STRENGTH * self.decay**s.groups  # the prior fades as the data does
        p = (s.recent_informative + strength * prior) / (s.recent_groups + strength)
        return max(p, self.min_weight)

    def draw(
        self, k: int, *, step: int, round_index: int = 0, exclude: Sequence[str] = ()
    ) -> list[Scenario]:
        """`k` distinct scenarios (fewer if fewer remain), weighted; seeded by step and round.

        One draw at a time: a kind of task, with chance in proportion to its weight times
        `repeat_kind` for each time the step drew it already (`exclude` counts as this step's
        draws), then one of its scenarios (`fresh`: one it has drawn least; `curriculum`: by
        weight). `uniform` ignores kinds and weights. With `redraw`, `fresh` draws a kind's
        missed tasks again first (`_missed_again`).
        """
        rng = random.Random(f"{self.seed}/{step}/{round_index}")
        excluded = set(exclude)
        pool = [s for s in self.scenarios if s.id not in excluded]
        if self.mode == "uniform":
            return sorted(pool, key=lambda s: rng.random(), reverse=True)[:k]
        repeats = Counter(self._kind[sid] for sid in excluded if sid in self._kind)
        out: list[Scenario] = []
        while pool and len(out) < k:
            kinds: dict[tuple[str, ...], list[Scenario]] = {}
            for s in pool:
                kinds.setdefault(self._kind[s.id], []).append(s)
            names = list(kinds)
            odds = [
                max(self.weight(s) for s in kinds[kind]) * self.repeat_kind ** repeats[kind]
                for kind in names
            ]
            kind = rng.choices(names, weights=odds)[0]
            options = kinds[kind]
            if self.mode == "fresh":
                chosen = rng.choice(self._missed_again(options) or self._least_drawn(options))
            else:
                chosen = rng.choices(options, weights=[self.weight(s) for s in options])[0]
            out.append(chosen)
            pool.remove(chosen)
            repeats[kind] += 1
        return out

    def _missed_again(self, options: list[Scenario]) -> list[Scenario]:
        """Of one kind's `options`, at a kind the policy's own attempts have solved, the
        tasks they never solved (`missed`) and drawn at most `redraw` times, least drawn
        first: such a task comes back the next time its kind is drawn, where a fresh draw
        would leave it for the rest of a run (a calculator run draws each task about once),
        and the loop gives its group demonstrations (`mcprl.train`). In a seed-0 calculator
        run the power tasks solved were 2², 5⁵ and 3³, the ones failed (9⁵, 7³, 3²) were
        each drawn once, and the policy learned to copy the base into the exponent. Empty
        with `redraw=0`."""
        if self.redraw <= 0 or not self.solved(options[0]):
            return []
        again = [s for s in options if self.missed(s) and self.stats[s.id].groups <= self.redraw]
        return self._fewest_drawn(again)

    def _least_drawn(self, options: list[Scenario]) -> list[Scenario]:
        """Of one kind's `options`, those whose answer the kind's groups gave least often, and
        of those the least drawn: a kind's answers come up evenly (`answer_key`), so always
        giving one of them earns no more than any other. Where every task of the kind has its
        own answer (or none), the least-drawn tasks, as before."""
        kind = self._kind[options[0].id]
        answers: Counter[str] = Counter()
        for s in self.scenarios:
            if self._kind[s.id] == kind:
                answers[self._answer[s.id]] += self.stats[s.id].groups
        least = min(answers[self._answer[s.id]] for s in options)
        return self._fewest_drawn([s for s in options if answers[self._answer[s.id]] == least])

    def _fewest_drawn(self, options: list[Scenario]) -> list[Scenario]:
        """Those of `options` drawn the fewest times (empty for none)."""
        fewest = min((self.stats[s.id].groups for s in options), default=0)
        return [s for s in options if self.stats[s.id].groups == fewest]

    def summary(self) -> dict[str, float]:
        """Scenarios seen, and how many of them look solved, unsolved or informative so far."""
        seen = [s for s in self.stats.values() if s.groups]
        return {
            "scenarios_seen": float(len(seen)),
            "scenarios_always_solved": float(sum(s.success_rate == 1.0 for s in seen)),
            "scenarios_never_solved": float(sum(s.success_rate == 0.0 for s in seen)),
        }
