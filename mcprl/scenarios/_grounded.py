"""Schema-grounded scenarios: tasks built from the tools' own schemas, with verified answers.

No LLM is involved. For each task, arguments are sampled from a tool's input schema, the tool is
called on the live server (in a fresh session, as an attempt will be), and the task text is
written from the tool's description and the arguments. Chains feed a value from one result (an
id, a number) into the next call, making multi-step tasks. Every scenario carries its reference
calls with the results the server returned, and an expected answer where one can be read off.

    scenarios = await grounded_scenarios("example:catalog", n=40, seed=0)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import random
import re
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import date, timedelta
from typing import Any

from mcprl.errors import ScenarioGenerationError, UsageError
from mcprl.mcp import (
    ServerInfo,
    ToolInfo,
    inspect_server,
    looks_like_error,
    name_words,
    open_session,
    tool_access,
)
from mcprl.scenarios._answers import (
    ANSWER_KEYS,
    computed_number,
    is_number,
    number_answer,
    rounded,
)
from mcprl.scenarios._dedupe import Deduper
from mcprl.scenarios._direct import direct_query, reads_answer
from mcprl.scenarios._parse import parse_result
from mcprl.scenarios._questions import Question, ask_field, records_questions
from mcprl.scenarios._sampling import (
    SQL_ROWS,
    SchemaSampler,
    ValuePool,
    _is_id_name,
    free_text_kind,
    listed_name,
    singular,
)
from mcprl.scenarios._screen import (
    answer_problem,
    is_meta_tool,
    leaks_secret,
    server_paths,
    undescribed_arguments,
)
from mcprl.scenarios._types import (
    Reference,
    ReferenceCall,
    Scenario,
    ScenarioSet,
    check_named_arguments,
)

__all__ = ["GenerationReport", "build_grounded", "grounded_scenarios"]

logger = logging.getLogger(__name__)


@dataclass
class _Step:
    tool: ToolInfo
    arguments: dict[str, Any]
    result_text: str
    structured: Any = None
    link: _Link | None = None  # how a value was taken from the step before

    @property
    def result(self) -> Any:
        return parse_result(self.result_text, self.structured)


@dataclass
class _Link:
    param: str
    value: Any
    phrase: str
    item: dict[str, Any] | None = None  # the listed record the value names, where there is one
    noun: str | None = None  # what the listing lists


@dataclass
class GenerationReport:
    """What grounded generation did: what it built, and what it turned down and why."""

    asked: int
    built: int = 0
    attempts: int = 0
    seconds: float = 0.0
    first_calls_failed: int = 0
    rejected: Counter = field(default_factory=Counter)  # reason -> candidates
    skipped_tools: list[str] = field(default_factory=list)  # writing tools left uncalled
    meta_tools: list[str] = field(default_factory=list)  # about the server, not the user's data
    # tools whose required arguments are objects the schema does not describe
    unfillable_tools: list[str] = field(default_factory=list)
    last_error: str | None = None

    def describe(self) -> str:
        parts = [f"built {self.built} of {self.asked} scenarios in {self.attempts} attempts"]
        if self.first_calls_failed:
            parts.append(f"{self.first_calls_failed} first calls failed")
        parts += [f"{n} rejected: {why}" for why, n in self.rejected.most_common()]
        text = "; ".join(parts)
        if self.meta_tools:
            text += (
                f". Not practice material (logs, echoes, demos, the environment, results that "
                f"change with each call): {', '.join(self.meta_tools)}"
            )
        if self.unfillable_tools:
            text += (
                f". Not called, as their arguments are objects whose fields the schema does not "
                f"name: {', '.join(self.unfillable_tools)}"
            )
        if self.skipped_tools:
            text += (
                f". Not called, as they may change the server's data: "
                f"{', '.join(self.skipped_tools)} (`allow_writes=True` calls them)"
            )
        return text


def _links(result: Any, tool: ToolInfo) -> list[_Link]:
    """Ways to feed a value from `result` into one of `tool`'s parameters."""
    props = tool.input_schema.get("properties") or {}
    out = []
    for name, prop in props.items():
        kind = prop.get("type")
        if "enum" in prop or (kind is None and "anyOf" in prop):
            continue
        if isinstance(result, (int, float)) and not isinstance(result, bool):
            if kind in ("number", "integer") and name not in ("limit", "n"):
                out.append(_Link(name, result, "the result of the previous step"))
        elif isinstance(result, dict):
            out.extend(_links_from_dict(result, name, kind))
    return out


def _links_from_dict(result: dict, name: str, kind: Any) -> list[_Link]:
    out = []
    lists = [(k, v) for k, v in result.items() if isinstance(v, list) and v]
    for key, items in lists:
        ids = [i.get("id") for i in items if isinstance(i, dict) and "id" in i]
        noun = singular(key)
        if ids and kind == "array" and _is_id_name(name.rstrip("s")):
            out.append(_Link(name, ids, f"the ids of all {key} found in the previous step"))
        elif ids and _is_id_name(name) and kind in ("string", "integer"):
            item = next(i for i in items if isinstance(i, dict) and "id" in i)
            out.append(_Link(name, ids[0], f"the id of the first {noun} found before", item, noun))
        if kind == "string" and _names_a(name, noun):
            first = listed_name(items[0])
            if isinstance(first, str):
                item = items[0] if isinstance(items[0], dict) else None
                out.append(_Link(name, first, f"the first {noun} listed before", item, noun))
    if "id" in result and _is_id_name(name) and kind in ("string", "integer"):
        out.append(_Link(name, result["id"], "the id returned by the previous step"))
    for key in ANSWER_KEYS:
        value = result.get(key)
        numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
        if numeric and kind in ("number", "integer") and name not in ("limit", "n"):
            out.append(_Link(name, value, f"the {key} from the previous step"))
    return out


def _names_a(param: str, noun: str) -> bool:
    """Whether a parameter takes the name of a `noun` (table, table_name, tableName)."""
    words = name_words(param)
    return words == [noun] or words == [noun, "name"]


def _fmt(value: Any) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    return json.dumps(value)


# asides that name another tool (list_tables), give examples or defaults: not for a user's words
_ASIDE = re.compile(
    r"\s*\((?=[^()]*(?:\b\w+_\w+\b|e\.g\.|i\.e\.|default|optional))[^()]*\)", re.IGNORECASE
)


def _sentence(description: str) -> str:
    """The first sentence of a tool's description, without its asides in parentheses (they
    often name other tools: "a name from list_tables")."""
    first = " ".join(description.split())
    first = first.split(". ")[0].rstrip(".")
    first = _ASIDE.sub("", first).strip()
    return first or "Use the right tool"


def _given(name: str, value: Any) -> str:
    """One argument in words: `a = 15` for one-letter names, else `source timezone "UTC"`."""
    if len(name) == 1:
        return f"{name} = {_fmt(value)}"
    return f"{' '.join(name_words(name))} {_fmt(value)}"


def _listed(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


_VERB_FORMS = {
    "returns": "find", "return": "find", "gets": "get", "calculates": "calculate",
    "computes": "compute", "converts": "convert", "lists": "list", "shows": "show",
    "finds": "find", "looks": "look", "retrieves": "retrieve", "fetches": "fetch",
    "evaluates": "evaluate", "searches": "search", "reads": "read",
}  # fmt: skip


def _imperative(sentence: str) -> str:
    """ "Returns the sum of two numbers" -> "Find the sum of two numbers"."""
    first, _, rest = sentence.partition(" ")
    verb = _VERB_FORMS.get(first.lower().split("/")[0])
    if verb is None:
        return sentence
    return f"{verb.capitalize()} {rest}".strip()


def _instruction(step: _Step) -> str:
    link = step.link
    parts = [_given(k, v) for k, v in step.arguments.items() if not link or k != link.param]
    props = step.tool.input_schema.get("properties") or {}
    # a default the call relied on is part of the task ("the n-th root of x" states n)
    parts += [
        _given(k, p["default"])
        for k, p in props.items()
        if k not in step.arguments
        and isinstance(p.get("default"), (int, float, str))
        and not isinstance(p.get("default"), bool)
        and p.get("default") != ""
    ]
    text = _imperative(_sentence(step.tool.description))
    if parts:
        text += f", with {_listed(parts)}"
    if link:
        noun = " ".join(name_words(link.param))
        phrase = link.phrase
        text += f", for {phrase}" if noun in phrase else f", using {phrase} as {noun}"
    return text


# parameters that narrow what a call returns: a question about its whole result (a count, the
# highest) would not say how it was narrowed, so only lookups are asked of such calls
_FILTERS = {
    "query", "q", "search", "keyword", "keywords", "filter", "limit", "max", "count", "offset",
    "page", "top", "sort", "order", "contains", "since", "until", "start", "end", "pattern",
    "names", "ids", "tail", "head",
}  # fmt: skip
_CONTAINERS = {"directory", "folder", "dir", "tree", "repository", "repo", "database", "db"}
_DOCUMENTS = {"file", "text", "content", "contents", "document", "page"}
# verbs of a tool that returns what a file or a folder holds (not "count": count_lines computes)
_READS = {"get", "list", "read", "show", "view", "open", "fetch", "cat"}
_VERBS = {
    "get", "list", "read", "search", "show", "find", "query", "fetch", "describe", "lookup",
    "view", "open", "check", "count", "all", "with", "by", "info", "details", "detail",
}  # fmt: skip


def _is_filter(name: str) -> bool:
    return bool(set(name_words(name)) & _FILTERS)


def _free_text(step: _Step) -> tuple[str, str] | None:
    """The argument that holds the call's SQL or expression, and which of them it is."""
    props = step.tool.input_schema.get("properties") or {}
    for name, value in step.arguments.items():
        kind = isinstance(value, str) and free_text_kind(step.tool, name, props.get(name, {}))
        if kind:
            return name, kind
    return None


def _sql(step: _Step) -> str | None:
    found = _free_text(step)
    return step.arguments[found[0]] if found else None


def _sql_param(step: _Step) -> str | None:
    """The argument that holds the call's SQL, if it takes SQL."""
    found = _free_text(step)
    return found[0] if found and found[1] == "sql" else None


def _noun(step: _Step, prefix: str | None) -> str | None:
    """What the records of a call are: the table a query reads, else the tool's noun
    (git_branch: branch; list_directory: entry; read_text_file: line)."""
    sql = _sql(step)
    if sql is not None:
        m = re.search(r"\bFROM\s+[\"`\[]?(\w+)", sql, re.IGNORECASE)
        return singular(m.group(1).lower()) if m else None
    words = [w for w in name_words(step.tool.name) if w not in _VERBS and w != prefix]
    if not words:
        return None
    noun = singular(words[-1])
    if noun in _CONTAINERS:
        return "entry"
    if noun in _DOCUMENTS:
        return "line"
    if noun == "table" and "describe" in name_words(step.tool.name):
        return "column"
    return noun


def _whole(step: _Step, data: Any) -> bool:
    """Whether the call returned all there is (no filter; a query without WHERE or LIMIT hit)."""
    sql = _sql(step)
    if sql is not None:
        rows = len(data) if isinstance(data, list) else 0
        return not re.search(r"\bWHERE\b", sql, re.IGNORECASE) and rows < SQL_ROWS
    return not any(_is_filter(k) for k in step.arguments)


def _scope(step: _Step) -> list[str]:
    """The arguments a question must state: not filters, not SQL, not a linked value."""
    sql = _sql(step)
    return [
        _given(k, v)
        for k, v in step.arguments.items()
        if not _is_filter(k) and v != sql and not (step.link and k == step.link.param)
    ]


def _with_scope(question: str, scope: list[str]) -> str:
    if not scope:
        return question
    return f"For {_listed(scope)}, {_lower_first(question)}"


def _arg_values(steps: list[_Step]) -> list[Any]:
    out: list[Any] = []
    for s in steps:
        for v in s.arguments.values():
            out.extend(v if isinstance(v, list) else [v])
    return out


_DATE_DEPENDENT = {
    "yes", "no", "true", "false", "monday", "tuesday", "wednesday", "thursday", "friday",
    "saturday", "sunday",
}  # fmt: skip


def _dated(text: str) -> bool:
    """Whether a result holds today's date (within a day: another time zone's today): its
    weekday or daylight-saving flag is the clock's."""
    today = date.today()
    return any((today + timedelta(days=d)).isoformat() in text for d in (-1, 0, 1))


_NOTHING = re.compile(r"^(?:no|none|nothing|empty|n/a)\b", re.IGNORECASE)


def _short_answer(data: Any) -> bool:
    """A short text that answers a call ("04:30"), not a header ("Staged changes:") or a
    report of nothing found ("No matches found")."""
    if not isinstance(data, str):
        return False
    text = data.strip()
    short = 0 < len(text.split()) <= 4 and "\n" not in text
    return short and not text.endswith(":") and not _NOTHING.match(text)


def _computation(step: _Step, value: float) -> Question:
    props = step.tool.input_schema.get("properties") or {}
    kinds = {k: free_text_kind(step.tool, k, props.get(k, {})) for k in step.arguments}
    expressions = [
        v for k, v in step.arguments.items() if kinds[k] in ("expression", "expressions")
    ]
    if expressions:
        expr = expressions[0][0] if isinstance(expressions[0], list) else expressions[0]
        return Question("compute", f"What is {expr}?", number_answer(value))
    asked = _of_numbers(step)
    if asked:
        return Question("compute", asked, number_answer(value))
    return Question("compute", f"{_instruction(step)}. What is the result?", number_answer(value))


_OF_NUMBERS = re.compile(
    r"^(?:returns?|computes?|calculates?|gets?|finds?)\s+(the\s+[a-z]+(?:\s+[a-z]+)?)\s+of\s+"
    r"(?:two|the\s+two|the\s+given|given)?\s*(?:numbers|values|integers)\b",
    re.IGNORECASE,
)


def _of_numbers(step: _Step) -> str | None:
    """ "Returns the sum of two numbers" with a = 31, b = 25: "What is the sum of 31 and 25?"."""
    m = _OF_NUMBERS.match(_sentence(step.tool.description))
    values = list(step.arguments.values())
    if not m or len(values) != 2 or not all(is_number(v) for v in values):
        return None
    return f"What is {m.group(1).lower()} of {_fmt(values[0])} and {_fmt(values[1])}?"


def _single(step: _Step, rng: random.Random, prefix: str | None) -> list[Question]:
    data = step.result
    args = _arg_values([step])
    noun = _noun(step, prefix)
    # what a reader of files or folders returns is their contents, not a computed result: the
    # last line of a CSV file ("travel,110") is no answer to "what is the result?" (110)
    reads = noun in ("line", "entry") and bool(set(name_words(step.tool.name)) & _READS)
    value = None if reads else computed_number(data, args)
    if value is not None:
        question = _computation(step, value)
        if isinstance(data, dict) and is_number(data.get("count")):
            question = Question("count", question.text.replace("What is the result?",
                                "How many are there?"), question.answer)  # fmt: skip
        return [question]
    if not reads and _short_answer(data):
        short = Question("compute", f"{_instruction(step)}. What is the result?", data.strip())
        if answer_problem(short.answer, short.text, args) is None:
            return [short]  # "04:30": a short text that answers the call
    found = records_questions(data, noun=noun, whole=_whole(step, data), rng=rng)
    scope = _scope(step)
    out = [replace(q, text=_with_scope(q.text, scope), answer=rounded(q.answer)) for q in found]
    if _dated(step.result_text):  # a clock: what follows from today's date changes tomorrow
        out = [q for q in out if q.answer.lower() not in _DATE_DEPENDENT]
    fields = [q for q in out if q.kind == "field"]
    numeric = [q for q in fields if is_number(q.answer)]
    if numeric:  # of one object, its numbers are what a call computed (converted_value)
        out = [q for q in out if q.kind != "field"] + numeric
    # a count of what the task itself lists: "For expressions ["31 * 11", "17 * 4"], how many
    # calcs are there?" (2) asks the user's own input back, not what the server knows
    given = {str(len(v)) for v in step.arguments.values() if isinstance(v, list)}
    out = [q for q in out if not (q.kind == "count" and q.answer in given)]
    return [q for q in out if answer_problem(q.answer, q.text, args) is None]


def _chain_lookup(steps: list[_Step], rng: random.Random) -> list[Question]:
    """A field of a detail, for an item a listing named: 'What is the price of the product
    "Desk lamp"?' takes the listing (for its id) and the detail (for the price)."""
    link = steps[-1].link
    data = steps[-1].result
    if link is None or link.item is None or not isinstance(data, dict):
        return []
    name = listed_name(link.item, ("name", "title", "label"))
    if not isinstance(name, str) or not name.strip() or link.value == name:
        return []  # a tool that takes the name itself needs no listing: no chain to ask about
    noun = " ".join(name_words(link.noun or "item"))
    listed = set(link.item)
    out = []
    for f, v in data.items():
        if f in listed or _is_id_name(f) or not isinstance(v, (str, int, float, bool)):
            continue
        text = ask_field(f, v, f'the {noun} "{name}"')
        answer = number_answer(v) if is_number(v) else str(v)
        out.append(Question("chain", _with_scope(text, _scope(steps[0])), answer))
    return [q for q in out if answer_problem(q.answer, q.text, _arg_values(steps)) is None]


def _questions(steps: list[_Step], rng: random.Random, prefix: str | None) -> list[Question]:
    if len(steps) == 1:
        return _single(steps[0], rng, prefix)
    if steps[-1].link is not None and steps[-1].link.item is not None:
        found = _chain_lookup(steps, rng)
        if found:
            return found
    value = computed_number(steps[-1].result, _arg_values(steps[-1:]))
    if value is None:
        return []
    return [Question("compute", _task_text(steps, "What is the result?"), number_answer(value))]


def _choose(
    steps: list[_Step],
    questions: list[Question],
    rng: random.Random,
    seed: int,
    paths: tuple[str, ...],
    deduper: Deduper,
    yes_no: Counter | None = None,
) -> tuple[Question | None, str]:
    """The first question among `questions` that makes a new scenario, kinds in random order
    (so that lookups do not crowd out the rest); else None and why the last one was turned
    down. `yes_no`: the answers of the set's existence questions so far; one whose answer is
    already the more common is turned down, so that "no" is never right by habit (made-up
    names never repeat, real ones do, and the deduplication would leave mostly "no")."""
    # kinds in a weighted random order: existence (a yes or no) comes first less often
    kinds = sorted({q.kind for q in questions})
    kinds.sort(key=lambda k: -(rng.random() ** (1 / (0.4 if k == "exists" else 1.0))))
    why = "a duplicate"
    if leaks_secret(json.dumps([s.arguments for s in steps]), paths):
        return None, "a secret or a path on this machine in the task"
    for kind in kinds:
        same = [q for q in questions if q.kind == kind]
        rng.shuffle(same)
        for question in same:
            scenario = _render(steps, question, seed)
            other = "no" if question.answer == "yes" else "yes"
            if kind == "exists" and yes_no is not None and yes_no[question.answer] > yes_no[other]:
                why = "a yes or no the set has more of"
            elif leaks_secret(scenario.task, paths):
                why = "a secret or a path on this machine in the task"
            elif not _checkable(scenario):
                why = "an answer no one could check"
            elif deduper.add(scenario.task):
                return question, ""
            else:
                why = "a duplicate"
    return None, why


def _difficulty(steps: list[_Step], question: Question) -> int:
    if len(steps) == 1:
        level = 2 if len(steps[0].arguments) >= 3 else 1
        return level + (question.kind in ("extreme", "total", "count"))
    distinct = len({s.tool.name for s in steps})
    return min(5, 2 * len(steps) - 1 + (distinct >= 3))


def _task_text(steps: list[_Step], question: str) -> str:
    """The calls as a request: First, …. Then …. Finally …, and the question."""
    lines = []
    for i, step in enumerate(steps):
        lead = "First, " if i == 0 else ("Finally, " if i == len(steps) - 1 > 1 else "Then ")
        lines.append(lead + _lower_first(_instruction(step)))
    return ". ".join(lines) + f". {question}"


def _lower_first(text: str) -> str:
    """ "Add two numbers" -> "add two numbers"; an acronym ("SQL query") stays."""
    return text[:1].lower() + text[1:] if text[1:2].islower() else text


def _render(steps: list[_Step], question: Question, seed: int) -> Scenario:
    reference = Reference(
        answer=question.answer,
        calls=[
            ReferenceCall(tool=s.tool.name, arguments=s.arguments, result=s.result_text)
            for s in steps
        ],
        needs_calls=True,  # the answer is the server's data: a right guess is not a success
    )
    # a write (with allow_writes), or a call whose answer a guess hits, counts only with what
    # the task names
    writes = {s.tool.name for s in steps if tool_access(s.tool)[0] == "write"}
    reference = check_named_arguments(reference, question.text, writes)
    digest = hashlib.sha256(f"{seed}:{question.text}".encode()).hexdigest()[:10]
    tags = ["grounded", question.kind, *dict.fromkeys(s.tool.name for s in steps)]
    return Scenario(
        id=f"grounded-{digest}",
        task=question.text,
        difficulty=_difficulty(steps, question),
        reference=reference,
        tags=tags,
    )


def _failed(result: Any) -> bool:
    """An error, flagged or worded as one: never a reference."""
    return bool(result.is_error or looks_like_error(result.text))


def _tool_prefix(tools: list[ToolInfo]) -> str | None:
    """A first word most tool names share (git_log, git_branch: git), which names no data."""
    firsts = Counter(name_words(t.name)[0] for t in tools if len(name_words(t.name)) > 1)
    if not firsts:
        return None
    word, n = firsts.most_common(1)[0]
    return word if n >= max(2, len(tools) // 2) else None


class _Generator:
    """The state of one server's generation: the tools still worth calling, what was learned."""

    def __init__(self, server: Any, tools: list[ToolInfo], rng: random.Random, info: ServerInfo,
                 report: GenerationReport, session_options: dict[str, Any]) -> None:  # fmt: skip
        self.server = server
        self.tools = tools
        self.rng = rng
        self.report = report
        self.options = session_options
        self.info_name = info.name
        self.paths = server_paths(server)
        self.prefix = _tool_prefix(info.tools)
        pool = ValuePool.from_server(info)
        pool.paths = [p for p in self.paths if not p.endswith((".json", ".db", ".sqlite"))]
        self.sampler = SchemaSampler(rng, pool)
        self.repeat_checked: set[str] = set()
        self.shared: Any = None  # one session for every chain, where the tools only read

    def session(self) -> contextlib.AbstractAsyncContextManager[Any]:
        """The session a chain calls in: the shared one where set, else a fresh one."""
        if self.shared is not None:
            return contextlib.nullcontext(self.shared)
        return open_session(self.server, **self.options)

    def drop(self, tool: ToolInfo, why: str) -> None:
        if tool in self.tools:
            self.tools.remove(tool)
            self.report.meta_tools.append(tool.name)
            self.report.rejected[why] += 1

    def learn(self, step: _Step) -> None:
        data = step.result
        self.sampler.pool.learn(data)
        words = set(name_words(step.tool.name))
        sql = (_sql(step) or "").lower()
        if (
            "table" in words
            or "tables" in words
            or "sqlite_master" in sql
            or "information_schema" in sql
        ):
            for name in _names(data):
                if name not in self.sampler.pool.tables:
                    self.sampler.pool.tables.append(name)
        for v in step.arguments.values():
            if isinstance(v, str) and v in self.sampler.pool.paths:
                for name in _names(data):
                    joined = f"{v.rstrip('/')}/{name}"
                    if "." in name and joined not in self.sampler.pool.paths:
                        self.sampler.pool.paths.append(joined)

    async def call(self, session: Any, tool: ToolInfo, args: dict[str, Any]) -> Any:
        """Call, and drop the tool if its result leaks a secret or changes when repeated."""
        result = await session.call_tool(tool.name, args)
        if _failed(result):
            return result
        if leaks_secret(result.text, self.paths):
            self.drop(tool, "results that hold the environment, a secret or a path")
            return None
        if tool.name not in self.repeat_checked:
            self.repeat_checked.add(tool.name)
            again = await session.call_tool(tool.name, args)
            if again.text != result.text:
                self.drop(tool, "results that change with each call (a log, a counter, a clock)")
                return None
        return result

    async def chain(self, length: int) -> list[_Step]:
        steps: list[_Step] = []
        report, rng = self.report, self.rng
        async with self.session() as session:
            # A failed call rarely changes state, so the first step may be retried in this session.
            for _ in range(4):
                if not self.tools:
                    return []
                tool = rng.choice(self.tools)
                args = self.sampler.for_tool(tool)
                result = await self.call(session, tool, args)
                if result is None:
                    return []
                if not _failed(result):
                    break
                report.last_error = f"{tool.name}({_fmt(args)[:200]}): {result.text[:300]}"
                if not result.is_error:
                    report.rejected["an error reported as ordinary text"] += 1
            else:
                return []
            steps.append(_Step(tool, args, result.text, result.structured))
            self.learn(steps[-1])
            while len(steps) < length:
                options = [
                    (t, link)
                    for t in self.tools
                    if t.name != steps[-1].tool.name
                    for link in _links(steps[-1].result, t)
                ]
                if not options:
                    break
                tool, link = rng.choice(options)
                args = self.sampler.for_tool(tool, fixed={link.param: link.value})
                result = await self.call(session, tool, args)
                if result is None or _failed(result):
                    if result is not None and not result.is_error:
                        report.rejected["an error reported as ordinary text"] += 1
                    break
                steps.append(_Step(tool, args, result.text, result.structured, link=link))
                self.learn(steps[-1])
        return steps

    async def direct(self, steps: list[_Step], question: Question) -> list[_Step]:
        """For a question about a table read whole, the call that asks the database just that
        (`_direct`), when the server's answer to it is the question's; else `steps`."""
        param = _sql_param(steps[0]) if len(steps) == 1 else None
        if param is None or question.ask is None:
            return steps
        step = steps[0]
        sql = direct_query(step.arguments[param], question.ask)
        if sql is None:
            return steps
        args = {**step.arguments, param: sql}
        async with self.session() as session:
            result = await session.call_tool(step.tool.name, args)
        if _failed(result) or leaks_secret(result.text, self.paths):
            return steps
        data = parse_result(result.text, result.structured)
        if not reads_answer(data, question.ask.read, question.answer):
            return steps
        return [_Step(step.tool, args, result.text, result.structured)]

    async def stable(self, steps: list[_Step]) -> bool:
        """Whether the calls give the same results again in a fresh session (a reference that
        holds the current time or a fresh id would mark every later attempt wrong)."""
        async with open_session(self.server, **self.options) as session:
            for step in steps:
                result = await session.call_tool(step.tool.name, step.arguments)
                if result.is_error or result.text != step.result_text:
                    return False
        return True

    async def warm_up(self) -> None:
        """Call every tool a few times to learn what values the server deals in."""
        async with self.session() as session:
            for _ in range(3):
                for tool in list(self.tools):
                    args = self.sampler.for_tool(tool)
                    result = await self.call(session, tool, args)
                    if result is not None and not _failed(result):
                        self.learn(_Step(tool, args, result.text, result.structured))


def _names(data: Any) -> list[str]:
    """The names a listing gives: plain strings, or the name field of each record."""
    items = data if isinstance(data, list) else []
    if isinstance(data, dict):
        items = next((v for v in data.values() if isinstance(v, list)), [])
    out = []
    for item in items:
        name = listed_name(item, ("name", "table_name", "tbl_name", "title", "path"))
        if isinstance(name, str) and name and len(name) <= 80:
            out.append(name)
    return out


def _checkable(scenario: Scenario) -> bool:
    """Answers a person could check: no astronomically large or small numbers."""
    answer = scenario.reference.answer if scenario.reference else None
    if answer is None or not is_number(answer):
        return True
    return float(answer) == 0 or 1e-3 <= abs(float(answer)) < 1e9


async def grounded_scenarios(server: Any, n: int = 24, **options: Any) -> ScenarioSet:
    """The scenarios of `build_grounded` (same options), with what was turned down logged."""
    scenarios, report = await build_grounded(server, n, **options)
    if report.built < n:
        logger.warning("%s", report.describe())
    return scenarios


async def build_grounded(
    server: Any,
    n: int = 24,
    *,
    seed: int = 0,
    chain_fraction: float = 0.5,
    max_steps: int = 3,
    max_attempts: int | None = None,
    info: ServerInfo | None = None,
    allow_writes: bool = False,
    fresh_sessions: bool = False,
    progress: bool = False,
    **session_options: Any,
) -> tuple[ScenarioSet, GenerationReport]:
    """Build up to `n` distinct scenarios with verified references from a live server.

    Only tools that read (`mcprl.mcp.tool_access`) are called unless `allow_writes`. A result
    that is an error (flagged, or worded as one) never becomes a reference, and a scenario whose
    calls give other results in a fresh session (the time, a new id) is dropped. The chains share
    one session (one process over stdio) unless `allow_writes` or `fresh_sessions` (a session
    per chain, for a server whose reading tools keep state per session). Returns what
    was built, even when short of `n`, with a report of what was turned down; raises
    `ScenarioGenerationError` only when nothing could be built.
    """
    if n < 1:
        raise UsageError(f"n must be at least 1, got {n}")
    started = time.perf_counter()
    info = info or await inspect_server(server, **session_options)
    report = GenerationReport(asked=n)
    tools = info.tools
    if not allow_writes:
        report.skipped_tools = [t.name for t in tools if tool_access(t)[0] == "write"]
        tools = [t for t in tools if t.name not in report.skipped_tools]
        if not tools:
            names = ", ".join(report.skipped_tools)
            raise ScenarioGenerationError(
                f"every tool of {info.name!r} may change its data ({names}), so none was "
                "called; set `allow_writes=True` to call them, against a "
                "disposable copy of the server's data"
            )
    meta = [t for t in tools if is_meta_tool(t)]
    report.meta_tools = [t.name for t in meta]
    report.unfillable_tools = [t.name for t in tools if t not in meta and undescribed_arguments(t)]
    tools = [t for t in tools if t not in meta and t.name not in report.unfillable_tools]
    if not tools:
        why = []
        if report.meta_tools:
            why.append(f"{', '.join(report.meta_tools)} tell about the server or the session "
                       "(logs, echoes, demos, the environment)")  # fmt: skip
        if report.unfillable_tools:
            why.append(f"{', '.join(report.unfillable_tools)} take objects whose fields the "
                       "schema does not name")  # fmt: skip
        if report.skipped_tools:
            why.append(f"{', '.join(report.skipped_tools)} may write")
        raise ScenarioGenerationError(
            f"{info.name!r} has no tool that reads the user's data: " + "; ".join(why)
        )
    rng = random.Random(seed)
    gen = _Generator(server, tools, rng, info, report, session_options)
    async with contextlib.AsyncExitStack() as stack:
        if not (allow_writes or fresh_sessions):  # no call changes what a later chain sees
            gen.shared = await stack.enter_async_context(open_session(server, **session_options))
        out = await _generate(gen, n, seed, chain_fraction, max_steps, max_attempts, progress)
    report.built = len(out)
    report.seconds = time.perf_counter() - started
    if not out:
        example = f" The last failure: {report.last_error}." if report.last_error else ""
        raise ScenarioGenerationError(
            f"{report.describe()}.{example} The server may need arguments this sampler cannot "
            "guess: use an LLM `generator`, or write scenarios by hand"
        )
    return ScenarioSet(out), report


async def _generate(gen: _Generator, n: int, seed: int, chain_fraction: float, max_steps: int,
                    max_attempts: int | None, progress: bool) -> list[Scenario]:  # fmt: skip
    """`build_grounded`'s loop: chains called, asked about, screened and replayed until `n`
    scenarios are kept or the attempts run out."""
    report, rng = gen.report, gen.rng
    deduper = Deduper(threshold=0.95)
    await gen.warm_up()
    out: list[Scenario] = []
    yes_no: Counter = Counter()  # the answers of existence questions kept
    budget = max_attempts if max_attempts is not None else 12 * n
    give_up = max(24, 2 * n)  # attempts without one working first call: the sampler cannot help
    since_new = 0  # attempts since the last scenario kept: the server has no new ones to give
    bar = _bar(n, gen.info_name, progress)
    try:
        for _ in range(budget):
            report.attempts += 1
            since_new += 1
            if out and since_new > give_up:
                break
            if bar is not None:
                bar.set_postfix_str(_postfix(report), refresh=True)
            length = 1 if rng.random() >= chain_fraction else rng.randint(2, max_steps)
            steps = await gen.chain(length)
            if not steps:
                report.first_calls_failed += 1
                if not out and report.first_calls_failed >= give_up:
                    break
                continue
            if length > 1 and len(steps) == 1 and rng.random() < 0.5:
                continue  # a chain that could not continue; keep some as single steps
            questions = _questions(steps, rng, gen.prefix)
            if not questions:
                report.rejected["no question a person would ask of the result"] += 1
                continue
            question, why = _choose(steps, questions, rng, seed, gen.paths, deduper, yes_no)
            if question is not None:
                steps = await gen.direct(steps, question)
            scenario = _render(steps, question, seed) if question is not None else None
            if scenario is None:
                report.rejected[why] += 1
            elif not await gen.stable(steps):
                report.rejected["results that change between sessions (time, random ids)"] += 1
            else:
                if "exists" in scenario.tags:
                    yes_no[scenario.reference.answer] += 1
                out.append(scenario)
                since_new = 0
                if bar is not None:
                    bar.update(1)
                if len(out) == n:
                    break
    finally:
        if bar is not None:
            bar.close()
    return out


def _bar(n: int, name: str, enabled: bool) -> Any:
    if not enabled:
        return None
    from mcprl._progress import progress_bar

    return progress_bar(
        total=n,
        desc=f"scenarios for {name}",
        leave=False,
        bar_format="{desc}: {n}/{total} |{bar}| [{elapsed}{postfix}]",
    )


def _postfix(report: GenerationReport) -> str:
    turned_down = sum(report.rejected.values())
    return f"{report.attempts} tried, {report.first_calls_failed} failed, {turned_down} rejected"
