"""Scenarios: practice tasks, their references, and sets of them on disk (JSONL)."""

from __future__ import annotations

import json
import os
import random
import re
import tempfile
from collections import Counter
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from mcprl.errors import ScenarioFileError, UsageError
from mcprl.scenarios._answers import guessable
from mcprl.types import text_lines

__all__ = ["AnswerType", "Reference", "ReferenceCall", "Scenario", "ScenarioSet"]

# what kind of final answer a task wants (`Scenario.answer_type`, `complete_task`'s schema)
AnswerType = Literal["number", "yes/no", "string"]


class ReferenceCall(BaseModel):
    """A tool call that solves (part of) the task, with what the server returned for it."""

    model_config = ConfigDict(extra="forbid")
    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    result: str | None = None
    match: list[str] | None = Field(
        default=None,
        description="arguments whose values an attempt's call of this tool must carry for the "
        "reference's `needs_calls` (strings compared ignoring case and spacing), as the task "
        "names them (`check_named_arguments`): what a write must write (a note's title and "
        "text), or what a call must ask for when the answer is a yes, a no or a 0 (the "
        "query that finds nothing); None: any arguments",
    )

    @model_validator(mode="after")
    def _match_names_arguments(self) -> ReferenceCall:
        unknown = [name for name in self.match or () if name not in self.arguments]
        if unknown:
            raise ValueError(
                f"match names {', '.join(unknown)}, which {self.tool}'s reference arguments "
                f"lack (they are {', '.join(self.arguments) or 'none'}); list only argument "
                "names the call has"
            )
        return self


def _plain(text: str) -> str:
    """Text with case and spacing aside: casefolded, runs of spaces made one, ends stripped."""
    return " ".join(text.casefold().split())


def same_text(a: Any, b: Any) -> bool:
    """Two strings that read the same: equal ignoring case, spacing at either end and runs of
    spaces inside. Anything else: equal."""
    if isinstance(a, str) and isinstance(b, str):
        return _plain(a) == _plain(b)
    return a == b


def named_arguments(task: str, arguments: dict[str, Any]) -> list[str]:
    """The arguments whose string values the task's text names, as whole words (ignoring case
    and spacing): what the task asks a call to carry (`ReferenceCall.match`). A number or a
    list is left out: a note's id is the server's choice, and a list the task names part of is
    not the task's to check."""
    text = _plain(task)
    return [
        name
        for name, value in arguments.items()
        if isinstance(value, str)
        and value.strip()
        and re.search(rf"(?<!\w){re.escape(_plain(value))}(?!\w)", text)
    ]


def check_named_arguments(reference: Reference, task: str, writes: Collection[str]) -> Reference:
    """`reference` with `match` set on the calls whose arguments the check must see: on a call
    of a tool that writes (`writes`: their names), the values the task names, since what it
    writes is the task; on every call when the answer is a yes, a no or a 0 (`guessable`), the
    values the task names, since any search bears out a guess like that. Other calls, and calls
    whose arguments the task does not name, take any arguments."""
    guess = reference.answer is not None and guessable(reference.answer)
    calls = [
        call.model_copy(update={"match": named_arguments(task, call.arguments) or None})
        if guess or call.tool in writes
        else call
        for call in reference.calls
    ]
    return reference.model_copy(update={"calls": calls})


class Reference(BaseModel):
    """What a correct attempt looks like: an expected answer and/or the calls that get there."""

    model_config = ConfigDict(extra="forbid")
    answer: str | None = None
    tolerance: float | None = Field(
        default=None,
        ge=0,
        description="a relative tolerance for a numeric answer, where the task allows one; "
        "None: right to the precision the answer is written in (an integer exactly)",
    )
    calls: list[ReferenceCall] = Field(default_factory=list)
    needs_calls: bool = Field(
        default=False,
        description="a right answer counts only when the attempt also called every tool the "
        "calls name (a result that is not an error; any arguments but those a call's `match` "
        "names): for answers about the server's data, which a guess could hit (a yes or no, a "
        "small count)",
    )


def has_reference(s: Scenario | None) -> bool:
    """The scenario says what a right attempt answers or calls (so success can be checked)."""
    return bool(s and s.reference and (s.reference.answer is not None or s.reference.calls))


def question_kind(s: Scenario) -> str | None:
    """What a generated task asks of the data it reads (count, lookup, extreme, total, exists,
    field), from its tags (`grounded_scenarios` writes "grounded" and the kind first); None for
    any other task."""
    return s.tags[1] if len(s.tags) > 1 and s.tags[0] == "grounded" else None


class Scenario(BaseModel):
    """One practice task."""

    model_config = ConfigDict(extra="forbid")
    id: str = Field(min_length=1)
    task: str = Field(min_length=1)
    difficulty: int = Field(ge=1, le=5)
    reference: Reference | None = None
    tags: list[str] = Field(default_factory=list)
    split: Literal["train", "val"] | None = None
    answer_type: AnswerType | None = Field(
        default=None,
        description="what kind of final answer the task wants, where no reference answer shows "
        "it (a task for RULER): number, yes/no or string; None: read off the reference answer "
        "(a number, a yes or no), else a string",
    )
    elicitation: list[dict[str, Any]] | None = Field(
        default=None,
        description="answers to the server's questions to the user (MCP elicitation), in the "
        "order asked: a content object (accepted) or {'action': ..., 'content': ...}",
    )


class ScenarioSet:
    """An ordered set of scenarios with unique ids, a train/val split and JSONL I/O."""

    def __init__(self, scenarios: Iterable[Scenario] = ()) -> None:
        self.scenarios: list[Scenario] = list(scenarios)
        seen: set[str] = set()
        for s in self.scenarios:
            if s.id in seen:
                raise UsageError(f"duplicate scenario id {s.id!r}")
            seen.add(s.id)

    def __len__(self) -> int:
        return len(self.scenarios)

    def __iter__(self) -> Iterator[Scenario]:
        return iter(self.scenarios)

    def __getitem__(self, i: int) -> Scenario:
        return self.scenarios[i]

    def __repr__(self) -> str:
        return f"ScenarioSet({len(self)} scenarios, histogram={self.histogram()})"

    # -- splits and filters --------------------------------------------------------------------

    def with_split(self, val_fraction: float = 0.25, seed: int = 0) -> ScenarioSet:
        """Assign train/val to scenarios that have no split yet, reproducibly (by seed).

        The split is stratified by difficulty so both sides see every level, and within a level
        by kind (the tags: the question and the tools, for generated tasks): val draws from each
        kind in proportion to its size and never takes the last of a kind (across all levels)
        from train, so val asks what training practised (new instances of it), not kinds
        training never saw. Where too few kinds have two, val is smaller than `val_fraction`
        (seed 1's 24 sqlite tasks held one lookup, and val took it: L115); only a set whose
        every kind has one task gets a val of kinds training lacks, as it has no other.
        """
        if not 0 <= val_fraction < 1:
            raise UsageError(f"val_fraction must be in [0, 1), got {val_fraction}")
        rng = random.Random(seed)
        out = [s.model_copy() for s in self.scenarios]
        by_level: dict[int, list[Scenario]] = {}
        for s in out:
            if s.split is None:
                by_level.setdefault(s.difficulty, []).append(s)
        for level in sorted(by_level):
            rng.shuffle(by_level[level])
        for allow_last in (False, True):
            in_train = Counter(_split_kind(s) for g in by_level.values() for s in g)
            carry, picked = 0.0, []
            for level in sorted(by_level):
                group = by_level[level]
                exact = len(group) * val_fraction + carry
                drawn = _spread(group, int(exact + 0.5), in_train, allow_last=allow_last)
                carry = exact - len(drawn)  # a level short of kinds leaves its share to the next
                picked += drawn
            if picked or carry < 0.5:
                break
        val = {id(s) for s in picked}
        for s in out:
            if s.split is None:
                s.split = "val" if id(s) in val else "train"
        return ScenarioSet(out)

    @property
    def train(self) -> ScenarioSet:
        return ScenarioSet(s for s in self.scenarios if s.split != "val")

    @property
    def val(self) -> ScenarioSet:
        return ScenarioSet(s for s in self.scenarios if s.split == "val")

    def filter(self, min_difficulty: int = 1, max_difficulty: int = 5) -> ScenarioSet:
        return ScenarioSet(
            s for s in self.scenarios if min_difficulty <= s.difficulty <= max_difficulty
        )

    def histogram(self) -> dict[int, int]:
        counts = Counter(s.difficulty for s in self.scenarios)
        return {level: counts.get(level, 0) for level in range(1, 6)}

    def format_histogram(self, width: int = 30) -> str:
        hist = self.histogram()
        top = max(hist.values(), default=0) or 1
        lines = [
            f"  difficulty {level}: {'█' * round(width * n / top):<{width}} {n}"
            for level, n in hist.items()
        ]
        return "\n".join(lines)

    # -- files ---------------------------------------------------------------------------------

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ScenarioSet:
        """Read a JSONL file; a bad line raises `ScenarioFileError` naming it and the problem."""
        p = Path(path)
        try:
            lines = text_lines(p)
        except OSError as exc:
            raise ScenarioFileError(f"cannot read scenario file {p}: {exc}") from exc
        except ValueError as exc:
            raise ScenarioFileError(str(exc)) from None
        return cls._parse(lines, p)

    @classmethod
    def loads(cls, text: str, name: str = "<scenarios>") -> ScenarioSet:
        """Parse JSONL text; errors name `name` and the line."""
        return cls._parse(text.splitlines(), name)

    def dumps(self) -> str:
        """The set as JSONL text (what `save` writes)."""
        return "".join(s.model_dump_json(exclude_none=True) + "\n" for s in self.scenarios)

    @classmethod
    def _parse(cls, lines: list[str], p: str | os.PathLike[str]) -> ScenarioSet:
        scenarios: list[Scenario] = []
        seen: dict[str, int] = {}
        for n, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                s = Scenario.model_validate_json(line)
            except ValidationError as exc:
                raise ScenarioFileError(f"{p} line {n}: {_describe(exc)}") from None
            if s.id in seen:
                raise ScenarioFileError(
                    f"{p} line {n}: scenario id {s.id!r} is already used on line {seen[s.id]}"
                )
            seen[s.id] = n
            scenarios.append(s)
        if not scenarios:
            raise ScenarioFileError(f"{p} has no scenarios (one JSON object per line expected)")
        return cls(scenarios)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write JSONL atomically: a crash mid-write leaves the old file intact."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(self.dumps())
            os.replace(tmp, p)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return p


def _describe(exc: ValidationError) -> str:
    first = exc.errors()[0]
    if first["type"] == "json_invalid":
        return f"not valid JSON ({first['msg']}); each line must be one scenario object"
    where = ".".join(str(p) for p in first["loc"]) or "the line"
    value = first.get("input")
    shown = "" if isinstance(value, dict) else f" (got {json.dumps(value, default=str)[:60]})"
    more = f" and {len(exc.errors()) - 1} more problem(s)" if len(exc.errors()) > 1 else ""
    return f"{where}: {first['msg']}{shown}{more}"


def bundled_scenarios(server: str) -> Path | None:
    """The curated scenario file shipped for an `example:NAME` server, if there is one."""
    if not isinstance(server, str) or not server.startswith("example:"):
        return None
    name = server.removeprefix("example:")
    here = Path(__file__).resolve().parent.parent
    for root in (here / "_examples" / "scenarios", here.parent / "scenarios"):
        if (root / f"{name}.jsonl").is_file():
            return root / f"{name}.jsonl"
    return None


def _split_kind(s: Scenario) -> tuple[str, ...]:
    """The kind `with_split` keeps on both sides: the tags, less the mark of a reworded task."""
    return tuple(t for t in s.tags if t != "reworded")


def _spread(
    group: list[Scenario], n: int, in_train: Counter[tuple[str, ...]], *, allow_last: bool
) -> list[Scenario]:
    """At most `n` of `group` (already shuffled), drawn one at a time from the kind with the
    smallest share of this group drawn so far among those with two or more still in train
    (`in_train`, across levels, updated); with `allow_last`, when none has, from any."""
    kinds: dict[tuple[str, ...], list[Scenario]] = {}
    for s in group:
        kinds.setdefault(_split_kind(s), []).append(s)
    taken = dict.fromkeys(kinds, 0)
    out: list[Scenario] = []
    for _ in range(min(n, len(group))):
        left = [k for k in kinds if taken[k] < len(kinds[k])]
        spare = [k for k in left if in_train[k] >= 2]
        if not spare and not allow_last:
            break
        # ties: the kind first seen in the shuffled group (min keeps the first)
        kind = min(spare or left, key=lambda k: taken[k] / len(kinds[k]))
        out.append(kinds[kind][taken[kind]])
        taken[kind] += 1
        in_train[kind] -= 1
    return out
