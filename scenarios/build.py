"""Build the curated scenario sets for the example servers.

Tasks are written from hand-made templates in plain language; every reference answer is the
value the live server returns for the reference calls, recorded by running them (one fresh
session per task, as an attempt gets). Re-run after changing a server or a template:

    python scenarios/build.py            # writes scenarios/{calculator,notes,catalog}.jsonl
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))

from mcprl.mcp import open_session, tool_access, tool_info  # noqa: E402
from mcprl.scenarios import (  # noqa: E402
    Reference,
    ReferenceCall,
    Scenario,
    ScenarioSet,
    check_named_arguments,
)

Call = tuple[str, dict[str, Any]]
# A template returns (task text, difficulty, calls, pick) where pick reads the answer off the
# list of parsed results.
Template = Callable[[random.Random], tuple[str, int, list[Call], Callable[[list[Any]], Any]]]


def _last(results: list[Any]) -> Any:
    return results[-1]


# -- calculator --------------------------------------------------------------------------------


def calc_templates() -> list[Template]:
    def mul(r):
        a, b = r.randint(3, 40), r.randint(3, 40)
        return f"What is {a} times {b}?", 1, [("multiply", {"a": a, "b": b})], _last

    def add(r):
        a, b = round(r.uniform(1, 500), 2), round(r.uniform(1, 500), 2)
        return f"Add {a} and {b}.", 1, [("add", {"a": a, "b": b})], _last

    def sub(r):
        a, b = r.randint(100, 999), r.randint(100, 999)
        return f"What is {a} minus {b}?", 1, [("subtract", {"a": a, "b": b})], _last

    def div(r):
        b = r.randint(2, 12)
        a = b * r.randint(3, 90)
        return f"Divide {a} by {b}.", 1, [("divide", {"a": a, "b": b})], _last

    def sqrt(r):
        x = r.choice([2, 3, 5, 10, 50, 144, 200, 625, 1000])
        return f"What is the square root of {x}?", 1, [("root", {"x": x, "n": 2})], _last

    def cube(r):
        x = r.choice([8, 27, 64, 100, 343, 1000, 2])
        return f"Find the cube root of {x}.", 2, [("root", {"x": x, "n": 3})], _last

    def pw(r):
        b, e = r.randint(2, 9), r.randint(2, 5)
        return (
            f"What is {b} to the power of {e}?",
            1,
            [("power", {"base": b, "exponent": e})],
            _last,
        )

    def conv(r):
        value, f, t, what = r.choice(
            [
                (r.choice([5, 10, 21.1, 42.195]), "km", "mile", "kilometres in miles"),
                (r.choice([1, 3, 26.2, 100]), "mile", "km", "miles in kilometres"),
                (r.choice([150, 180, 72.5]), "lb", "kg", "pounds in kilograms"),
                (r.choice([37, 100, -40, 20]), "C", "F", "degrees Celsius in Fahrenheit"),
                (r.choice([98.6, 32, 451]), "F", "C", "degrees Fahrenheit in Celsius"),
                (r.choice([6, 5.5, 12]), "ft", "m", "feet in metres"),
            ]
        )
        task = f"How much is {value} {what}?"
        return task, 2, [("convert_units", {"value": value, "from_unit": f, "to_unit": t})], _last

    def price(r):
        n, each = r.randint(3, 12), round(r.uniform(2, 30), 2)
        tip = r.choice([10, 15, 20])
        calls = [
            ("multiply", {"a": n, "b": each}),
            ("multiply", {"a": "$0", "b": 1 + tip / 100}),
        ]
        task = f"{n} tickets cost ${each} each. What is the total with a {tip}% service fee added?"
        return task, 3, calls, _last

    def hyp(r):
        a, b = r.choice([(3, 4), (5, 12), (8, 15), (6, 8), (7, 24), (2, 3)])
        calls = [
            ("power", {"base": a, "exponent": 2}),
            ("power", {"base": b, "exponent": 2}),
            ("add", {"a": "$0", "b": "$1"}),
            ("root", {"x": "$2", "n": 2}),
        ]
        task = f"A right triangle has legs of {a} and {b}. How long is the hypotenuse?"
        return task, 5, calls, _last

    def avg(r):
        xs = [r.randint(10, 99) for _ in range(3)]
        calls = [
            ("add", {"a": xs[0], "b": xs[1]}),
            ("add", {"a": "$0", "b": xs[2]}),
            ("divide", {"a": "$1", "b": 3}),
        ]
        task = f"What is the average of {xs[0]}, {xs[1]} and {xs[2]}?"
        return task, 4, calls, _last

    def marathon(r):
        km = r.choice([5, 10, 42.195])
        minutes = r.choice([25, 50, 210, 240])
        calls = [
            ("convert_units", {"value": km, "from_unit": "km", "to_unit": "mile"}),
            ("divide", {"a": minutes, "b": "$0"}),
        ]
        task = f"I ran {km} km in {minutes} minutes. What was my pace in minutes per mile?"
        return task, 4, calls, _last

    return [mul, add, sub, div, sqrt, cube, pw, conv, price, hyp, avg, marathon]


# -- catalog -------------------------------------------------------------------------------------

BOOKS = json.loads((ROOT.parent / "examples/servers/data/books.json").read_text())["books"]
AUTHORS = sorted({b["author"] for b in BOOKS})
GENRES = sorted({b["genre"] for b in BOOKS})


def catalog_templates() -> list[Template]:
    def ids_of(author):
        return [b["id"] for b in BOOKS if b["author"] == author]

    def count_author(r):
        a = r.choice(AUTHORS)
        task = f"How many books by {a} are in the catalog?"
        return task, 1, [("search_books", {"query": a})], lambda res: res[-1]["count"]

    def year_of(r):
        b = r.choice(BOOKS)
        calls = [("search_books", {"query": b["title"]}), ("get_book", {"book_id": b["id"]})]
        return f"In what year was {b['title']} published?", 2, calls, lambda res: res[-1]["year"]

    def price_of(r):
        b = r.choice(BOOKS)
        calls = [("search_books", {"query": b["title"]}), ("get_book", {"book_id": b["id"]})]
        task = f"How much does {b['title']} cost in the catalog?"
        return task, 2, calls, lambda res: res[-1]["price"]

    def genre_count(r):
        g = r.choice(GENRES)
        task = f"How many {g} books does the catalog have?"
        return task, 1, [("filter_books", {"genre": g})], lambda res: res[-1]["count"]

    def mean_price(r):
        a = r.choice([a for a in AUTHORS if len(ids_of(a)) >= 2])
        calls = [
            ("search_books", {"query": a}),
            ("aggregate", {"book_ids": ids_of(a), "field": "price", "op": "mean"}),
        ]
        task = f"What is the average price of the books by {a}?"
        return task, 3, calls, lambda res: res[-1]["value"]

    def total_pages(r):
        a = r.choice([a for a in AUTHORS if len(ids_of(a)) >= 2])
        calls = [
            ("search_books", {"query": a}),
            ("aggregate", {"book_ids": ids_of(a), "field": "pages", "op": "sum"}),
        ]
        task = f"If I read every book by {a} in the catalog, how many pages is that in total?"
        return task, 3, calls, lambda res: res[-1]["value"]

    def oldest_in_genre(r):
        g = r.choice(GENRES)
        first = sorted((b for b in BOOKS if b["genre"] == g), key=lambda b: (b["year"], b["id"]))
        calls = [("filter_books", {"genre": g}), ("get_book", {"book_id": first[0]["id"]})]
        task = f"What is the title of the oldest {g} book in the catalog?"
        return task, 3, calls, lambda res: res[-1]["title"]

    def cheap_rated(r):
        g = r.choice(GENRES)
        price, rating = r.choice([8, 10, 13]), r.choice([4.0, 4.2])
        args = {"genre": g, "max_price": price, "min_rating": rating}
        task = f"How many {g} books cost at most ${price} and are rated {rating} or higher?"
        return task, 2, [("filter_books", args)], lambda res: res[-1]["count"]

    def era_max(r):
        lo = r.choice([1800, 1840, 1860, 1880])
        hi = lo + r.choice([20, 30, 40])
        hits = [b["id"] for b in BOOKS if lo <= b["year"] <= hi]
        calls = [
            ("filter_books", {"min_year": lo, "max_year": hi}),
            ("aggregate", {"book_ids": hits, "field": "pages", "op": "max"}),
        ]
        task = f"Among books published from {lo} to {hi}, how many pages does the longest have?"
        return task, 4, calls, lambda res: res[-1]["value"]

    def stock_compare(r):
        a, b = r.sample(BOOKS, 2)
        calls = [
            ("search_books", {"query": a["title"]}),
            ("get_book", {"book_id": a["id"]}),
            ("search_books", {"query": b["title"]}),
            ("get_book", {"book_id": b["id"]}),
        ]
        task = f"How many copies of {a['title']} and {b['title']} are in stock altogether?"
        return task, 5, calls, lambda res: res[1]["in_stock"] + res[3]["in_stock"]

    return [
        count_author,
        year_of,
        price_of,
        genre_count,
        mean_price,
        total_pages,
        oldest_in_genre,
        cheap_rated,
        era_max,
        stock_compare,
    ]


# -- notes ---------------------------------------------------------------------------------------

TOPICS = [
    ("Groceries", "milk, eggs, bread and coffee", ["shopping"]),
    ("Dentist", "appointment on Tuesday at 3pm", ["health"]),
    ("Book club", "read chapters 4 to 6 of Middlemarch", ["reading"]),
    ("Trip to Lisbon", "book the train and the hotel", ["travel"]),
    ("Quarterly report", "send the draft to Ana by Friday", ["work"]),
    ("Gift ideas", "a scarf for Sam, a puzzle for Lee", ["family"]),
    ("Garden", "plant tomatoes and water the basil", ["home"]),
    ("Car service", "oil change due at 60000 km", ["car"]),
]


def notes_templates() -> list[Template]:
    def create(r):
        title, body, tags = r.choice(TOPICS)
        calls = [("create_note", {"title": title, "body": body, "tags": tags})]
        task = (
            f'Save a note titled "{title}" saying "{body}", tagged {tags[0]}. What id did it get?'
        )
        return task, 1, calls, lambda res: res[-1]["id"]

    def create_two_count(r):
        (t1, b1, g1), (t2, b2, g2) = r.sample(TOPICS, 2)
        calls = [
            ("create_note", {"title": t1, "body": b1, "tags": g1}),
            ("create_note", {"title": t2, "body": b2, "tags": g2}),
            ("list_notes", {}),
        ]
        task = f'Create a note "{t1}" ({b1}) and a note "{t2}" ({b2}). How many notes exist now?'
        return task, 3, calls, lambda res: res[-1]["count"]

    def create_then_search(r):
        picks = r.sample(TOPICS, 3)
        word = picks[0][1].split()[0]
        calls = [("create_note", {"title": t, "body": b, "tags": g}) for t, b, g in picks]
        calls.append(("search_notes", {"query": word}))
        names = ", ".join(f'"{t}" ({b})' for t, b, _ in picks)
        task = f'Write these notes: {names}. Then, how many notes mention "{word}"?'
        return task, 4, calls, lambda res: res[-1]["count"]

    def update_body(r):
        title, body, tags = r.choice(TOPICS)
        new = f"{body}; confirmed"
        calls = [
            ("create_note", {"title": title, "body": body, "tags": tags}),
            ("update_note", {"note_id": 1, "body": new}),
            ("get_note", {"note_id": 1}),
        ]
        task = (
            f'Make a note "{title}" with the text "{body}", then change its text to "{new}". '
            "What does the note say now?"
        )
        return task, 3, calls, lambda res: res[-1]["body"]

    def delete_count(r):
        picks = r.sample(TOPICS, 2)
        calls = [("create_note", {"title": t, "body": b, "tags": g}) for t, b, g in picks]
        calls.append(("delete_note", {"note_id": 1}))
        task = (
            f'Add notes "{picks[0][0]}" ({picks[0][1]}) and "{picks[1][0]}" ({picks[1][1]}), '
            f'then delete "{picks[0][0]}". How many notes remain?'
        )
        return task, 4, calls, lambda res: res[-1]["remaining"]

    def tag_filter(r):
        picks = r.sample(TOPICS, 3)
        tag = picks[1][2][0]
        calls = [("create_note", {"title": t, "body": b, "tags": g}) for t, b, g in picks]
        calls.append(("list_notes", {"tag": tag}))
        names = ", ".join(f'"{t}" ({b}, tag {g[0]})' for t, b, g in picks)
        task = f"Create these notes: {names}. How many notes carry the tag {tag}?"
        return task, 5, calls, lambda res: res[-1]["count"]

    def empty(r):
        word = r.choice(["dentist", "groceries", "lisbon", "report"])
        task = f'Do I have any notes about "{word}" yet? Search and tell me how many.'
        return task, 1, [("search_notes", {"query": word})], lambda res: res[-1]["count"]

    return [
        create,
        create_two_count,
        create_then_search,
        update_body,
        delete_count,
        tag_filter,
        empty,
    ]


# -- building ----------------------------------------------------------------------------------


def _resolve(args: dict[str, Any], results: list[Any]) -> dict[str, Any]:
    """Replace "$k" placeholders with the k-th result (a number)."""
    out = {}
    for k, v in args.items():
        out[k] = results[int(v[1:])] if isinstance(v, str) and v.startswith("$") else v
    return out


def _fmt(value: Any) -> str:
    """A number as the answer is checked: an integer as one, else rounded to four decimals (the
    check accepts half a unit of the last place written, so the server's unrounded result
    is right, and so is the answer written as here)."""
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return f"{round(value, 4):.4f}".rstrip("0").rstrip(".")
    return str(value)


async def _scenario(name: str, drawn: tuple) -> Scenario:
    """A task drawn from a template, its reference recorded from the live server."""
    task, level, calls, pick = drawn
    results: list[Any] = []
    ref_calls = []
    async with open_session(f"example:{name}") as session:
        writes = {
            t.name
            for t in map(tool_info, await session.list_tools())
            if tool_access(t)[0] == "write"
        }
        for tool, args in calls:
            args = _resolve(args, results)
            result = await session.call_tool(tool, args)
            if result.is_error:
                raise RuntimeError(f"{name}: {tool}({args}) failed: {result.text}")
            results.append(
                json.loads(result.text) if result.text[:1] in "{[" else float(result.text)
            )
            ref_calls.append(ReferenceCall(tool=tool, arguments=args, result=result.text))
    answer = pick(results)
    digest = hashlib.sha256(task.encode()).hexdigest()[:8]
    return Scenario(
        id=f"{name}-{digest}",
        task=task,
        difficulty=level,
        # The catalog's and the notes' answers are the server's data (a year, a count, a yes or
        # no), which a guess can hit: right only with the calls. A calculator answer a model
        # works out unaided is right.
        # A write, or a call whose answer a guess hits (a yes, a no, a 0), counts only with
        # what the task names (a note's title and text, the word searched for).
        reference=check_named_arguments(
            Reference(answer=_fmt(answer), calls=ref_calls, needs_calls=name != "calculator"),
            task,
            writes,
        ),
        tags=["curated", name],
    )


async def build(
    name: str, templates: list[Template], n: int, seed: int, extra_train: int = 0
) -> ScenarioSet:
    """`n` tasks from randomly chosen templates, split 3:1 into train and val; then
    `extra_train` more train tasks, taking the templates in turn so that every kind of task is
    practised about as often (a random draw of 36 gave the calculator 7 additions and not one
    single multiplication). The first `n` and their split do not depend on `extra_train`."""
    rng = random.Random(seed)
    out: list[Scenario] = []
    seen: set[str] = set()
    while len(out) < n:
        drawn = rng.choice(templates)(rng)
        if drawn[0] in seen:
            continue
        seen.add(drawn[0])
        out.append(await _scenario(name, drawn))
    scenarios = ScenarioSet(out).with_split(val_fraction=0.25, seed=seed).scenarios
    extra_rng = random.Random(seed + 1)
    added = misses = 0
    while added < extra_train and misses < 50 * len(templates):
        drawn = templates[(added + misses) % len(templates)](extra_rng)
        if drawn[0] in seen:
            misses += 1
            continue
        seen.add(drawn[0])
        scenario = await _scenario(name, drawn)
        scenario.split = "train"
        scenarios.append(scenario)
        added += 1
    return ScenarioSet(scenarios)


async def main() -> None:
    for name, templates in (
        ("calculator", calc_templates()),
        ("catalog", catalog_templates()),
        ("notes", notes_templates()),
    ):
        scenarios = await build(name, templates, n=48, seed=2026, extra_train=96)
        path = scenarios.save(ROOT / f"{name}.jsonl")
        print(f"{path}: {len(scenarios)} scenarios ({len(scenarios.val)} val)")
        print(scenarios.format_histogram())


if __name__ == "__main__":
    anyio.run(main)
