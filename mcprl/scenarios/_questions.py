"""Questions a person asks of data a tool returned, with the answer read off that data.

    records_questions(parse_result(text), noun="product", whole=True, rng=rng)

From records (a list of objects, anywhere in the result) it asks:

- a lookup: 'What is the price of the product "Desk lamp"?'  (a record named by its name, or by
  a number for records that have no name: 'What is the status of order 3?');
- a count: 'How many products are there?', 'How many products have category "lighting"?';
- an extreme: 'Which product has the lowest stock?'  (only where one record holds it);
- a total: 'What is the total stock of all products?' (of at most four records: past that the
  answer is sums done in the head, not a read of the data, and no call can make it easier);
- existence: 'Is there a product named "Desk lamp"?' (yes, or no for a name faker makes up).

From a list of plain values (branch names, file names) it asks for the count and existence; from
one object, its fields. Counts, extremes, totals and existence are asked only of a `whole`
listing (a call that does not filter), since the question does not say how the data was
filtered: a name missing from the last 5 lines of a file may stand in the sixth.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass, replace
from decimal import Decimal, InvalidOperation
from typing import Any

from mcprl.mcp import name_words
from mcprl.scenarios._sampling import singular
from mcprl.scenarios._screen import answer_problem

__all__ = ["Ask", "Question", "ask_field", "format_number", "plural", "records_questions"]

_NAME_FIELDS = ("name", "title", "label", "key", "filename", "file", "path", "message", "subject")
_NUMERIC = (int, float)
_MOST_ADDED = 4  # a total adds up at most this many values
_LINKS = {"from", "to", "source", "target", "parent", "child", "type"}  # point at other records
# a count of failures says how the generator's own call went, not what the data holds
_FAILURES = {"failed", "failure", "failures", "error", "errors", "warning", "warnings"}


@dataclass(frozen=True)
class Ask:
    """What a question reads of the records, for a query that reads just that: the records
    whose fields equal `where`, counted ("count"), one field's value ("value", of the record
    first by `order`, a field and ASC or DESC, when one is given) or its sum ("sum")."""

    read: str  # count, value, sum
    field: str | None = None
    where: tuple[tuple[str, Any], ...] = ()
    order: tuple[str, str] | None = None


@dataclass(frozen=True)
class Question:
    kind: str  # lookup, count, extreme, total, exists, field
    text: str
    answer: str
    ask: Ask | None = None  # of records: what it reads of them


def plural(noun: str) -> str:
    if noun.endswith("y") and noun[-2:-1] not in "aeiou":
        return noun[:-1] + "ies"
    if noun.endswith(("s", "x", "ch", "sh")):
        return noun + "es"
    return noun + "s"


def _a(noun: str) -> str:
    return f"an {noun}" if noun[:1] in "aeio" else f"a {noun}"  # a user, an entry


def _exists_text(noun: str, value: str) -> str:
    if noun == "line":
        return f'Is there a line that reads "{value}"?'
    return f'Is there {_a(noun)} named "{value}"?'


def format_number(value: float, like: list[Any] | None = None) -> str:
    """A number as a person writes it, with no more decimals than the values it came from."""
    if isinstance(value, bool):
        return str(value).lower()
    places = max((_places(v) for v in like or [value]), default=0)
    rounded = round(float(value), places)
    if rounded.is_integer():
        return str(int(rounded))
    return f"{rounded:.{places}f}".rstrip("0").rstrip(".")


def _places(value: Any) -> int:
    try:
        exponent = Decimal(repr(value) if isinstance(value, float) else str(value)).as_tuple()
    except InvalidOperation:
        return 0
    return max(0, -int(exponent.exponent)) if isinstance(exponent.exponent, int) else 0


def _words(field: str) -> str:
    return " ".join(name_words(field)) or field


def _is_number(value: Any) -> bool:
    return isinstance(value, _NUMERIC) and not isinstance(value, bool)


def _answer(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return repr(value)  # rounded where the question is made
    return str(value).strip()


def _idish(field: str) -> bool:
    words = name_words(field)
    return bool(words) and (
        words[-1] in ("id", "uuid", "cid", "pk", "hash", "sha") or field == "_id"
    )


def _record_lists(value: Any, key: str | None = None, depth: int = 0):
    """(key, list of dicts) for each list of objects in the result, outermost first; not the
    lists inside a record (a folder's `children`: a question could not say whose)."""
    if depth > 4:
        return
    if isinstance(value, list) and len(value) >= 1 and all(isinstance(v, dict) for v in value):
        yield key, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _record_lists(v, str(k), depth + 1)


def _named_by_id(records: list[dict[str, Any]]) -> str | None:
    """A record whose first field is a hash names its kind there ({"Commit": "668bac…"})."""
    first = next(iter(records[0]), None)
    value = records[0].get(first) if first else None
    if isinstance(value, str) and answer_problem(value, "") == "a random id":
        return first.lower()
    return None


def _flags(records: list[dict[str, Any]]) -> set[str]:
    """Fields that hold only 0 and 1 (notnull, pk): flags, not quantities a person asks for."""
    out = set()
    for f in _scalars(records[0]):
        values = [r.get(f) for r in records]
        if all(v in (0, 1) and not isinstance(v, float) for v in values):
            out.add(f)
    return out


def _scalars(record: dict[str, Any]) -> dict[str, Any]:
    return {
        k: v
        for k, v in record.items()
        if isinstance(v, (str, int, float, bool)) and v != "" and not set(name_words(k)) & _FAILURES
    }


def _key_field(records: list[dict[str, Any]]) -> str | None:
    """The field that names each record: a name-like one with a distinct, short value in every
    record; else any such text field; else a small number (an order's number)."""
    fields = [f for f in _scalars(records[0]) if all(f in r for r in records)]

    def distinct_text(f: str) -> bool:
        values = [r[f] for r in records]
        ok = all(isinstance(v, str) and 0 < len(v) <= 40 for v in values)
        return ok and len(set(values)) == len(values) and answer_problem(values[0], "") is None

    named = [f for f in fields if name_words(f)[-1:] and name_words(f)[-1] in _NAME_FIELDS]
    for f in named:
        if distinct_text(f):
            return f
    for f in fields:
        values = [r[f] for r in records]
        small = all(isinstance(v, int) and 0 <= v < 10_000 for v in values)
        if _idish(f) and small and len(set(values)) == len(values):
            return f
    # another text field names records only where there are enough of them to tell (a status
    # that differs between two orders does not name them)
    others = [f for f in fields if f not in named and not _idish(f) and f not in _LINKS]
    for f in others if len(records) >= 3 else []:
        if distinct_text(f):
            return f
    return None


def _counted(field: str) -> bool:
    """A field that counts things: its last word is a plural (open_tasks, books_on_loan)."""
    words = name_words(field)
    plural = [w for w in words if w.endswith("s") and not w.endswith(("ss", "us", "is"))]
    return len(words) >= 2 and any(len(w) > 3 for w in plural)  # not "permissions" alone


def ask_field(field: str, value: Any, subject: str | None) -> str:
    """'How many open tasks does the user "Ana" have?' for a count, else 'What is the team of
    the user "Ana"?'; without a subject, of the thing the call was about."""
    words = _words(field)
    if isinstance(value, int) and not isinstance(value, bool) and _counted(field):
        return f"How many {words} does {subject} have?" if subject else f"How many {words}?"
    return f"What is the {words} of {subject}?" if subject else f"What is the {words}?"


def _named(noun: str, record: dict[str, Any], key: str) -> str:
    value = record[key]
    return f'the {noun} "{value}"' if isinstance(value, str) else f"{noun} {value}"


def records_questions(
    data: Any, *, noun: str | None, whole: bool, rng: random.Random, said: str = ""
) -> list[Question]:
    """Questions about the records and values in `data` (see the module docstring). `said`:
    words the task already holds, which no answer may repeat."""
    out: list[Question] = []
    for key, records in _record_lists(data):
        thing = singular(key) if key else (_named_by_id(records) or noun or "item")
        thing = " ".join(name_words(thing)) or "item"
        found = _about_records(records, thing, whole, rng)
        # records inside an object: a query of the table would not read them the same way
        out += found if key is None else [replace(q, ask=None) for q in found]
    if (
        isinstance(data, list)
        and len(data) >= 2
        and all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in data)
    ):
        out += _about_values(data, noun or "item", whole, rng)
    if isinstance(data, dict) and not out:
        out += _about_object(data, noun)
    return [q for q in out if answer_problem(q.answer, q.text + " " + said) is None]


def _about_records(
    records: list[dict[str, Any]], noun: str, whole: bool, rng: random.Random
) -> list[Question]:
    out: list[Question] = []
    key = _key_field(records)
    many = plural(noun)
    if whole and len(records) >= 2:
        count = Ask("count")
        out.append(Question("count", f"How many {many} are there?", str(len(records)), count))
    if key is not None:
        record = rng.choice(records)
        skip = _flags(records) | _LINKS | {key}
        fields = [f for f in _scalars(record) if f not in skip and not _idish(f)]
        for f in fields:
            text = ask_field(f, record[f], _named(noun, record, key))
            lookup = Ask("value", f, ((key, record[key]),))
            out.append(Question("lookup", text, _answer(record[f]), lookup))
        if whole and len(records) >= 3 and isinstance(record[key], str):
            out.append(_exists(records, noun, key, rng))
    if not whole or len(records) < 2:
        return out
    skip = _flags(records) | _LINKS | {key}
    shared = [f for f in _scalars(records[0]) if all(f in r for r in records) and f not in skip]
    for f in shared:
        values = [r[f] for r in records]
        if _idish(f):
            continue
        if all(_is_number(v) for v in values):
            out += _numeric(records, noun, key, f, values)
        elif all(isinstance(v, str) for v in values) and len(set(values)) < len(values):
            value = rng.choice(sorted(set(values)))
            text = f'How many {many} have {_words(f)} "{value}"?'
            count = Ask("count", where=((f, value),))
            out.append(Question("count", text, str(values.count(value)), count))
    return out


def _numeric(
    records: list[dict[str, Any]], noun: str, key: str | None, field: str, values: list[Any]
) -> list[Question]:
    out = []
    words = _words(field)
    if key is not None and isinstance(records[0][key], str):
        for label, pick in (("highest", max), ("lowest", min)):
            best = pick(values)
            if values.count(best) == 1:
                who = records[values.index(best)][key]
                first = Ask("value", key, order=(field, "DESC" if pick is max else "ASC"))
                text = f"Which {noun} has the {label} {words}?"
                out.append(Question("extreme", text, who, first))
    if len(set(values)) > 1 and len(values) <= _MOST_ADDED:
        total = format_number(sum(values), like=values)
        text = f"What is the total {words} of all {plural(noun)}?"
        out.append(Question("total", text, total, Ask("sum", field)))
    return out


@functools.cache
def _faker() -> Any:
    from faker import Faker  # loads its providers: only when a name is made up

    return Faker()


def _made_up(example: str, rng: random.Random, others: list[str] = ()) -> str:
    """A value of the same kind as `example` that is not in the data: the start of one name
    and the end of another ("Desk lamp", "Office chair": "Desk chair"), else faker's."""
    fake = _faker()
    fake.seed_instance(rng.randrange(2**32))
    words = example.split()
    longer = [o.split() for o in others if len(o.split()) >= 2]
    if len(longer) >= 2 and not all(w[:1].isupper() for w in words):
        a, b = rng.sample(longer, 2)
        mixed = " ".join(a[: len(a) // 2] + b[len(b) // 2 :])
        if mixed not in others:
            return mixed
    if len(words) == 2 and all(w[:1].isupper() for w in words):
        return fake.name()
    if "." in example and " " not in example:
        return fake.file_name(extension=example.rsplit(".", 1)[-1])
    made = fake.word()
    return made.capitalize() if example[:1].isupper() else made


def _exists(records: list[dict[str, Any]], noun: str, key: str, rng: random.Random) -> Question:
    names = {r[key] for r in records}
    if rng.random() < 0.5:
        name, answer = rng.choice(sorted(names)), "yes"
    else:
        name, answer = _made_up(str(records[0][key]), rng, sorted(names)), "no"
        while name in names:
            name += "s"
    return Question("exists", _exists_text(noun, name), answer, Ask("count", where=((key, name),)))


def _about_values(values: list[Any], noun: str, whole: bool, rng: random.Random) -> list[Question]:
    out = []
    many = plural(noun)
    if whole:
        out.append(Question("count", f"How many {many} are there?", str(len(values))))
    if whole and len(values) >= 3 and all(isinstance(v, str) for v in values):
        fake = _made_up(str(values[0]), rng, [str(v) for v in values])
        named = rng.choice([str(v) for v in values]) if rng.random() < 0.5 else fake
        answer = "yes" if named in values else "no"
        out.append(Question("exists", _exists_text(noun, named), answer))
    return out


def _about_object(data: dict[str, Any], noun: str | None) -> list[Question]:
    """Fields of one object, and of the objects it holds ('the day of week of the target')."""
    out = []
    for f, v in _scalars(data).items():
        if not _idish(f):
            out.append(Question("field", ask_field(f, v, None), _answer(v)))
    for part, inner in data.items():
        tally = (
            len(inner) >= 4 and all(_is_number(v) for v in inner.values())
            if isinstance(inner, dict)
            else False
        )  # {"adventure": 9, "fantasy": 4, …}: its keys are data
        if isinstance(inner, dict) and not tally:
            for f, v in _scalars(inner).items():
                if not _idish(f):
                    text = ask_field(f, v, f"the {_words(part)}")
                    out.append(Question("field", text, _answer(v)))
    return out
