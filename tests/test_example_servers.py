"""The example servers' tools, called through mcprl.mcp."""

from __future__ import annotations

import json
import sys

import pytest

from mcprl.mcp import inspect_server, open_session
from tests.helpers import EXAMPLES, load_example, served

pytestmark = pytest.mark.anyio


async def call(session, name, **args):
    result = await session.call_tool(name, args)
    return result


# -- calculator ----------------------------------------------------------------------------------


@pytest.fixture
def calculator():
    return load_example("calculator").server


@pytest.mark.parametrize(
    ("tool", "args", "expected"),
    [
        ("add", {"a": 0.1, "b": 0.2}, "0.3"),
        ("subtract", {"a": 10, "b": 12.5}, "-2.5"),
        ("multiply", {"a": 12, "b": 18}, "216"),
        ("divide", {"a": 22, "b": 7}, "3.1428571429"),
        ("power", {"base": 2, "exponent": 10}, "1024"),
        ("root", {"x": 27, "n": 3}, "3"),
        ("root", {"x": 2}, "1.4142135624"),
        ("root", {"x": -8, "n": 3}, "-2"),
        ("convert_units", {"value": 26.2, "from_unit": "mile", "to_unit": "km"}, "42.1648128"),
        ("convert_units", {"value": 100, "from_unit": "C", "to_unit": "F"}, "212"),
        ("convert_units", {"value": 1, "from_unit": "lb", "to_unit": "g"}, "453.59237"),
    ],
)
async def test_calculator_tools(calculator, tool, args, expected):
    async with open_session(calculator) as session:
        result = await session.call_tool(tool, args)
    assert (result.text, result.is_error) == (expected, False)


@pytest.mark.parametrize(
    ("tool", "args", "message"),
    [
        ("divide", {"a": 1, "b": 0}, "division by zero"),
        ("root", {"x": -4}, "not real"),
        ("convert_units", {"value": 1, "from_unit": "kg", "to_unit": "km"}, "different things"),
        ("convert_units", {"value": 1, "from_unit": "stone", "to_unit": "kg"}, "stone"),
        ("power", {"base": 10, "exponent": 400}, "cannot compute"),
    ],
)
async def test_calculator_errors_explain_themselves(calculator, tool, args, message):
    async with open_session(calculator) as session:
        result = await session.call_tool(tool, args)
    assert result.is_error and message in result.text


# -- notes -----------------------------------------------------------------------------------


async def test_notes_create_list_search_update_delete():
    spec = f"{sys.executable} {EXAMPLES / 'notes.py'}"
    async with open_session(spec) as s:
        a = json.loads((await call(s, "create_note", title="Groceries", body="milk, eggs")).text)
        b = json.loads(
            (
                await call(s, "create_note", title="Trip", body="Book the train", tags=["Travel"])
            ).text
        )
        assert (a["id"], b["id"], b["tags"]) == (1, 2, ["travel"])
        listed = json.loads((await call(s, "list_notes")).text)
        assert [n["title"] for n in listed["notes"]] == ["Groceries", "Trip"]
        travel = json.loads((await call(s, "list_notes", tag="travel")).text)
        assert travel["count"] == 1
        found = json.loads((await call(s, "search_notes", query="TRAIN book")).text)
        assert [n["id"] for n in found["notes"]] == [2]
        updated = json.loads((await call(s, "update_note", note_id=1, body="milk, eggs, tea")).text)
        assert updated["body"] == "milk, eggs, tea" and updated["title"] == "Groceries"
        deleted = json.loads((await call(s, "delete_note", note_id=1)).text)
        assert deleted == {"deleted": 1, "remaining": 1}
        missing = await call(s, "get_note", note_id=1)
        assert missing.is_error and "no note with id 1" in missing.text


async def test_notes_state_is_per_session_over_http():
    with served("notes") as url:
        async with open_session(url) as first, open_session(url) as second:
            await call(first, "create_note", title="Mine", body="only in the first session")
            theirs = json.loads((await call(second, "list_notes")).text)
            mine = json.loads((await call(first, "list_notes")).text)
        assert theirs["count"] == 0 and mine["count"] == 1
        async with open_session(url) as third:  # a new session starts empty
            assert json.loads((await call(third, "list_notes")).text)["count"] == 0


async def test_notes_state_is_per_session_over_stdio():
    spec = f"{sys.executable} {EXAMPLES / 'notes.py'}"
    async with open_session(spec) as s:
        await call(s, "create_note", title="x", body="y")
    async with open_session(spec) as s:
        assert json.loads((await call(s, "list_notes")).text)["count"] == 0


# -- catalog ---------------------------------------------------------------------------------


@pytest.fixture
def catalog():
    return load_example("catalog").server


async def test_catalog_search_then_details_then_aggregate(catalog):
    books = json.loads((EXAMPLES / "data" / "books.json").read_text())["books"]
    verne = [b for b in books if b["author"] == "Jules Verne"]
    async with open_session(catalog) as s:
        found = json.loads((await call(s, "search_books", query="jules verne")).text)
        ids = [b["id"] for b in found["books"]]
        assert sorted(ids) == sorted(b["id"] for b in verne)
        detail = json.loads((await call(s, "get_book", book_id=ids[0].lower())).text)
        assert detail["author"] == "Jules Verne" and "price" in detail
        mean = json.loads((await call(s, "aggregate", book_ids=ids, field="price", op="mean")).text)
        assert mean["value"] == round(sum(b["price"] for b in verne) / len(verne), 2)


async def test_catalog_filters_and_genres(catalog):
    async with open_session(catalog) as s:
        old_scifi = json.loads(
            (await call(s, "filter_books", genre="science fiction", max_year=1870)).text
        )
        genres = json.loads((await call(s, "list_genres")).text)["genres"]
        bad = await call(s, "get_book", book_id="Z999")
        unknown_genre = await call(s, "filter_books", genre="poetry")
    assert [b["title"] for b in old_scifi["books"]] == ["Frankenstein"]
    assert sum(genres.values()) == 45
    assert bad.is_error and "B001" in bad.text
    assert unknown_genre.is_error


async def test_every_example_server_lists_tools_with_schemas():
    for name in ("calculator", "notes", "catalog"):
        info = await inspect_server(f"example:{name}")
        assert len(info.tools) >= 5, name
        for tool in info.tools:
            assert tool.description, (name, tool.name)
            assert tool.input_schema.get("type") == "object"
