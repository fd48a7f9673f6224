"""Practice tasks a person would ask, on servers like third-party ones (tests/servers): questions
answered by the server's own data, never an echo, a dump, a meta tool's output or a secret."""

from __future__ import annotations

import json
import random
import re
import sys
from pathlib import Path

import pytest

from mcprl.mcp import ToolInfo, open_session
from mcprl.scenarios import build_grounded
from mcprl.scenarios._grounded import _single, _Step
from mcprl.scenarios._parse import parse_result
from mcprl.scenarios._questions import records_questions
from mcprl.scenarios._screen import (
    answer_problem,
    is_meta_tool,
    leaks_secret,
    undescribed_arguments,
)

SERVERS = Path(__file__).resolve().parent / "servers"
PY = sys.executable

PRODUCTS = [
    {"id": 1, "name": "Desk lamp", "category": "lighting", "price": 24.5, "stock": 12},
    {"id": 2, "name": "Office chair", "category": "furniture", "price": 149.0, "stock": 4},
    {"id": 3, "name": "Bookshelf", "category": "furniture", "price": 89.9, "stock": 7},
]


# -- reading results --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[{"name": "a"}]', [{"name": "a"}]),
        ("[{'name': 'products'}, {'name': 'orders'}]", [{"name": "products"}, {"name": "orders"}]),
        ("Commit: 1a2b\nAuthor: Ana Silva\n\nCommit: 3c4d\nAuthor: Ben Ode",
         [{"Commit": "1a2b", "Author": "Ana Silva"}, {"Commit": "3c4d", "Author": "Ben Ode"}]),
        ("size: 45\nisFile: true", {"size": 45, "isFile": True}),
        ("  drafts\n* main", ["drafts", "main"]),
        ("[FILE] a.txt\n[DIR] notes", ["a.txt", "notes"]),
        ("391", 391),
        ("The sum of 31 and 25 is 56.", "The sum of 31 and 25 is 56."),
        ("[FILE] a.txt   41 B\n\nTotal: 1 files", "[FILE] a.txt   41 B\n\nTotal: 1 files"),
    ],
)  # fmt: skip
def test_results_are_read_in_the_forms_servers_write(text, expected):
    assert parse_result(text) == expected


def test_structured_content_is_preferred_and_unwrapped():
    assert parse_result("ignored", {"result": [1, 2]}) == [1, 2]
    assert parse_result("a\nb", {"content": "a\nb"}) == ["a", "b"]


# -- questions --------------------------------------------------------------------------------


def _questions(data, whole=True, seed=0):
    return records_questions(data, noun="product", whole=whole, rng=random.Random(seed))


def test_records_give_lookups_counts_extremes_and_totals_with_true_answers():
    qs = {q.text: q.answer for q in _questions(PRODUCTS)}
    assert qs["How many products are there?"] == "3"
    (counted,) = [t for t in qs if t.startswith('How many products have category "')]
    category = counted.split('"')[1]
    assert qs[counted] == str(sum(p["category"] == category for p in PRODUCTS))
    assert qs["Which product has the lowest stock?"] == "Office chair"
    assert qs["Which product has the highest price?"] == "Office chair"
    assert qs["What is the total stock of all products?"] == "23"
    assert qs["What is the total price of all products?"] == "263.4"  # the data's precision
    lookups = [t for t in qs if t.startswith("What is the ") and ' of the product "' in t]
    assert lookups and all("id" not in t.split(" of ")[0] for t in lookups)


def test_a_total_of_many_rows_is_not_asked_since_it_is_sums_in_the_head_not_a_read():
    rows = [
        {**p, "id": i, "name": f"{p['name']} {i}", "stock": p["stock"] + i}
        for i, p in enumerate(PRODUCTS * 3)
    ]
    kinds = {q.kind for q in _questions(rows)}
    assert "total" not in kinds  # 9 rows: L105's sqlite val tasks summed 8
    assert {"count", "extreme", "lookup"} <= kinds


def test_a_filtered_listing_gets_only_lookups():
    """A name missing from a filtered listing may stand outside it: no "is there …?" either."""
    kinds = {q.kind for q in _questions(PRODUCTS, whole=False)}
    assert kinds == {"lookup"}


_READ = ToolInfo(
    name="read_text_file",
    description="Read the complete contents of a file from the file system as text.",
    input_schema={"type": "object", "properties": {"path": {"type": "string"},
                  "tail": {"type": "number"}}, "required": ["path"]},
)  # fmt: skip


def test_a_file_read_is_asked_about_its_lines_and_only_when_read_whole():
    budget = "item,amount\nrent,950\nfood,320\ntravel,110"
    whole = _single(_Step(_READ, {"path": "/data/budget.csv"}, budget), random.Random(0), None)
    assert {q.kind for q in whole} == {"count", "exists"}
    assert 'For path "/data/budget.csv", how many lines are there?' in {q.text for q in whole}
    # the last 2 lines: the file's other lines are unseen, and its last line is no computed
    # result ("Read … with tail 2. What is the result?" -> 110 was asked before)
    tail = _Step(_READ, {"path": "/data/budget.csv", "tail": 2}, "travel,110")
    assert _single(tail, random.Random(0), None) == []
    add = ToolInfo(name="add", description="Add two numbers.", input_schema={"type": "object"})
    summed = _Step(add, {"a": 31, "b": 25}, "The sum of 31 and 25 is 56.")
    assert [q.answer for q in _single(summed, random.Random(0), None)] == ["56"]
    # a tool that counts a file's lines computes: its number is its result
    count = ToolInfo(name="count_lines", description="Count a file's lines.", input_schema={})
    counted = _Step(count, {"path": "/data/budget.csv"}, "4")
    assert [q.answer for q in _single(counted, random.Random(0), None)] == ["4"]


def test_records_without_names_are_named_by_their_number_and_ids_are_never_answers():
    orders = [{"id": 1, "customer": "Maria", "status": "shipped"},
              {"id": 2, "customer": "Maria", "status": "pending"}]  # fmt: skip
    qs = records_questions(orders, noun="order", whole=True, rng=random.Random(0))
    assert any(re.fullmatch(r"What is the status of order [12]\?", q.text) for q in qs)
    assert all(q.answer not in ("1", "2") or q.kind == "count" for q in qs)


def test_existence_asks_both_ways():
    answers = set()
    for seed in range(12):
        answers |= {q.answer for q in _questions(PRODUCTS, seed=seed) if q.kind == "exists"}
    assert answers == {"yes", "no"}


@pytest.mark.parametrize(
    ("answer", "task", "args", "problem"),
    [
        ("Asia/Tokyo", 'With timezone "Asia/Tokyo", what is its timezone?', [], "echo"),
        ("reading list", "What is it?", ["reading list"], "echo"),
        ('{"a": 1, "b": [2, 3]}', "What is it?", [], "dump"),
        ("2026-11-25T22:52:29+00:00", "When?", [], "timestamp"),
        ("668bacdb36cdacf571e3c16b4d54c30e455a085c", "Which commit?", [], "random id"),
        ("56", "What is the sum of 31 and 25?", [31, 25], None),
    ],
)
def test_poor_answers_are_named(answer, task, args, problem):
    found = answer_problem(answer, task, args)
    assert (found is None) if problem is None else (problem in found)


@pytest.mark.parametrize(
    ("name", "description", "meta"),
    [
        ("get_call_log", "Return this server's MCP calls", True),
        ("echo", "Echoes back the input string", True),
        ("get-env", "Returns all environment variables", True),
        ("trigger-long-running-operation", "Demonstrates a long running operation", True),
        ("get-tiny-image", "Returns a tiny MCP logo image.", True),
        ("git_log", "Shows the commit logs", False),
        ("check_notifications", "Unread notifications for a user", False),
        ("get_users", "List the team's users.", False),
        ("read_query", "Execute a SELECT query on the SQLite database", False),
    ],
)
def test_meta_tools_are_told_from_data_tools(name, description, meta):
    tool = ToolInfo(name=name, description=description, input_schema={"type": "object"})
    assert is_meta_tool(tool) is meta


@pytest.mark.parametrize(
    ("schema", "unfillable"),
    [
        ({"requests": {"type": "array", "items": {"type": "object"}}}, ["requests"]),
        ({"requests": {"type": "array", "items": {"$ref": "#/$defs/Free"}}}, ["requests"]),
        ({"options": {"anyOf": [{"type": "object"}, {"type": "null"}]}}, ["options"]),
        ({"requests": {"type": "array", "items": {"$ref": "#/$defs/Request"}}}, []),
        ({"filter": {"type": "object", "examples": [{"status": "open"}]}}, []),
        ({"name": {"type": "string"}, "tags": {"type": "array"}}, []),
    ],
)
def test_arguments_no_user_would_fill_are_found(schema, unfillable):
    """An object whose fields the schema does not name gets `{}` from any sampler: no task."""
    defs = {
        "Free": {"type": "object", "additionalProperties": True},
        "Request": {"type": "object", "properties": {"value": {"type": "number"}}},
    }
    input_schema = {"type": "object", "properties": schema, "required": list(schema),
                    "$defs": defs}  # fmt: skip
    tool = ToolInfo(name="convert_batch", description="", input_schema=input_schema)
    assert undescribed_arguments(tool) == unfillable


def test_secrets_and_machine_paths_are_recognised(monkeypatch):
    monkeypatch.setenv("MCPRL_TEST_API_TOKEN", "tok-5e3f0a9c1d")
    assert leaks_secret("the value is tok-5e3f0a9c1d")
    assert leaks_secret("sk-abcdefghijklmnopqrstuvwx")
    assert leaks_secret("HOME=/root\nPATH=/usr/bin\nLANG=C.UTF-8")
    home = str(Path.home())
    assert leaks_secret(f"{home}/secret/notes.txt")
    assert not leaks_secret(f"{home}/data/x.txt", allowed_paths=[f"{home}/data"])
    assert not leaks_secret("Desk lamp") and not leaks_secret("The sum of 31 and 25 is 56.")


# -- on live servers --------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_tracker_gets_questions_about_its_data_and_never_its_call_log(monkeypatch):
    monkeypatch.setenv("MCPRL_TEST_API_TOKEN", "tok-5e3f0a9c1d")
    spec = f"{PY} {SERVERS / 'tracker.py'}"
    scenarios, report = await build_grounded(spec, 8, seed=0)
    assert report.built == 8
    assert {"get_call_log", "get_settings"} <= set(report.meta_tools)
    assert report.unfillable_tools == ["count_batch"]
    assert "count_batch" in report.describe()
    dumped = scenarios.dumps()
    assert "tok-5e3f0a9c1d" not in dumped and "PATH=" not in dumped
    for s in scenarios:
        tools = {c.tool for c in s.reference.calls}
        assert tools <= {"get_users", "get_tasks", "check_notifications"}, s.task
        answer = s.reference.answer
        assert answer and s.task.endswith("?") and "_" not in s.task, s.task
        assert answer.lower() not in s.task.lower(), s.task  # never an echo
        assert len(answer) < 40 and not answer.startswith(("{", "["))
    kinds = {tag for s in scenarios for tag in s.tags}
    assert len(kinds & {"lookup", "count", "extreme", "total", "exists"}) >= 3
    # every answer is what the data says: replay and check one count against the records
    async with open_session(spec) as session:
        tasks = json.loads((await session.call_tool("get_tasks", {})).text)["tasks"]
    for s in scenarios:
        m = re.fullmatch(r'How many tasks have (\w+(?: \w+)?) "(.+)"\?', s.task)
        if m:
            field = m.group(1).replace(" ", "_")
            assert s.reference.answer == str(sum(t[field] == m.group(2) for t in tasks))


@pytest.mark.anyio
async def test_free_text_expressions_get_arithmetic_and_the_form_a_description_shows():
    scenarios, report = await build_grounded(f"{PY} {SERVERS / 'calc.py'}", 8, seed=0)
    assert report.built == 8 and report.first_calls_failed == 0
    by_tool = {}
    for s in scenarios:
        (call,) = s.reference.calls
        by_tool.setdefault(call.tool, []).append((s, call))
    assert set(by_tool) == {"calculate", "convert"}
    for s, call in by_tool["calculate"]:
        expression = call.arguments["expression"]
        assert s.task == f"What is {expression}?"
        assert float(s.reference.answer) == pytest.approx(eval(expression), rel=1e-4)
    for s, call in by_tool["convert"]:
        assert re.fullmatch(r"\d+ m to km", call.arguments["expression"])
        assert s.reference.answer not in s.task


# -- an LLM proposes, the server verifies -------------------------------------------------------


@pytest.mark.anyio
async def test_an_llm_proposes_tasks_with_calls_and_only_verified_ones_get_answers():
    from mcprl.mcp import inspect_server
    from mcprl.scenarios import generate_scenarios
    from tests.helpers import ScriptedJudge

    spec = f"{PY} {SERVERS / 'tracker.py'}"
    info = await inspect_server(spec)
    proposals = [
        ("How many people are on the team?", [("get_users", {})], "count"),
        ("Which team is Ben Ode in?", [("get_users", {})], "team"),
        ("How many hours will Migrate database take?", [("get_tasks", {})],
         "estimate_hours"),
        ("How many calls has the server seen?", [("get_call_log", {})], "count"),
        ("Add a task to buy coffee for ana.",
         [("create_task", {"title": "buy coffee", "assignee": "ana"})], None),
        ("How many unread notifications does zed have?",
         [("check_notifications", {"username": "zed"})], "unread"),
        ("What is the weather in Paris?", [("get_weather", {"city": "Paris"})], "temp"),
    ]  # fmt: skip
    reply = json.dumps({"scenarios": [
        {"task": t, "difficulty": 1, "calls": [{"tool": n, "arguments": a} for n, a in calls],
         **({"answer_from": hint} if hint else {}), "answer_type": "number"}
        for t, calls, hint in proposals
    ]})  # fmt: skip
    made = await generate_scenarios(
        info.tools, n=len(proposals), generator="t/g", completion_fn=ScriptedJudge(reply),
        server=spec,
    )  # fmt: skip
    by_task = {s.task: s for s in made}
    expected = {
        "How many people are on the team?": "4",
        "Which team is Ben Ode in?": "backend",
        "How many hours will Migrate database take?": "13",
    }
    for task, answer in expected.items():
        s = by_task[task]
        assert "verified" in s.tags and s.reference.answer == answer, s
        assert s.reference.calls[0].result  # the server's own result is recorded
        assert s.answer_type is None  # the recorded answer says what it is
    for task in set(by_task) - set(expected):  # a meta tool, a write, an error, no such tool
        s = by_task[task]
        assert "unverified" in s.tags and s.reference is None, s
        assert s.answer_type == "number"  # the writer's word: no reference shows it


@pytest.mark.anyio
async def test_values_that_only_a_resource_shows_serve_the_tools_and_prompts_are_listed():
    from mcprl.mcp import inspect_server

    spec = f"{PY} {SERVERS / 'library.py'}"
    info = await inspect_server(spec)
    assert [p.name for p in info.prompts] == ["overdue_reminder"]
    assert info.prompts[0].arguments == ["member_id"]
    scenarios, report = await build_grounded(spec, 4, seed=0, info=info)
    assert report.built == 4 and report.first_calls_failed == 0
    for s in scenarios:
        (call,) = s.reference.calls
        assert call.arguments["member_id"] in {"m-1042", "m-2207", "m-3311"}
        assert s.reference.answer in call.result and s.task.endswith("?")


def test_a_computation_reads_as_the_question_its_description_implies():
    from mcprl.scenarios._grounded import _computation, _Step

    tool = ToolInfo(name="get-sum", description="Returns the sum of two numbers.",
                    input_schema={"type": "object"})  # fmt: skip
    question = _computation(_Step(tool, {"a": 31, "b": 25}, "The sum of 31 and 25 is 56."), 56)
    assert (question.text, question.answer) == ("What is the sum of 31 and 25?", "56")


def test_a_tally_of_values_is_not_asked_as_fields():
    tally = {"genres": {"adventure": 9, "fantasy": 4, "mystery": 7, "romance": 3}}
    texts = [q.text for q in records_questions(tally, noun=None, whole=True, rng=random.Random(0))]
    assert not any("adventure" in t for t in texts)


@pytest.mark.anyio
async def test_a_sql_tool_gets_queries_built_from_the_tables_the_server_reports():
    import ast
    import sqlite3

    sys.path.insert(0, str(SERVERS))
    from shopdb import ROWS

    db = sqlite3.connect(":memory:")
    db.executescript(ROWS)
    scenarios, report = await build_grounded(f"{PY} {SERVERS / 'shopdb.py'}", 8, seed=0)
    assert report.built == 8 and report.skipped_tools == ["write_query"]
    queried = [s for s in scenarios if s.reference.calls[-1].tool == "read_query"]
    assert queried
    # the curriculum tells the questions apart though they share the tool (`task_kind`)
    from mcprl.curriculum import task_kind
    from mcprl.scenarios import question_kind

    kinds = {"lookup", "count", "extreme", "total", "exists", "field"}
    for s in scenarios:
        assert question_kind(s) in kinds, s.tags
        tools = tuple(c.tool for c in s.reference.calls)
        assert task_kind(s) == (*tools, f"asks:{question_kind(s)}")
    for s in queried:
        sql = s.reference.calls[-1].arguments["query"]
        table = re.search(r"FROM (products|orders)\b", sql).group(1)
        assert table.rstrip("s") in s.task  # "How many products …", "… the order …"
        # the query a person would write: its one value is the answer, not a table to read
        assert not sql.startswith("SELECT *"), (s.task, sql)
        (row,) = ast.literal_eval(s.reference.calls[-1].result)
        assert [tuple(row.values())] == db.execute(sql).fetchall()
        (value,) = row.values()
        answer = s.reference.answer
        if answer in ("yes", "no"):
            assert sql.startswith("SELECT COUNT(*)") and (value > 0) == (answer == "yes")
        else:
            assert str(value) == answer or float(value) == float(answer)


def test_a_question_about_a_table_gets_the_query_that_reads_just_its_answer():
    from mcprl.scenarios._direct import direct_query, reads_answer
    from mcprl.scenarios._questions import Ask

    listing = "SELECT * FROM orders LIMIT 200"
    pending = Ask("count", where=(("status", "pending"),))
    assert direct_query(listing, pending) == "SELECT COUNT(*) FROM orders WHERE status = 'pending'"
    lookup = Ask("value", "unit price", (("customer", "Ann O'Neil"),))
    assert direct_query(listing, lookup) == (
        """SELECT "unit price" FROM orders WHERE customer = 'Ann O''Neil'"""
    )
    cheapest = Ask("value", "name", order=("price", "ASC"))
    assert direct_query("select * from products", cheapest) == (
        "SELECT name FROM products ORDER BY price ASC LIMIT 1"
    )
    assert direct_query("SELECT id FROM orders WHERE status = 'x'", pending) is None  # not whole
    # what the server returns must say the answer, or the listing stays the reference
    assert reads_answer([{"COUNT(*)": 0}], "count", "no")
    assert not reads_answer([{"COUNT(*)": 1}], "count", "no")
    assert reads_answer([{"SUM(price)": 15.700000000000001}], "sum", "15.7")
    assert not reads_answer([{"SUM(price)": 15.8}], "sum", "15.7")
    assert not reads_answer([{"name": "a"}, {"name": "b"}], "value", "a")


def test_what_a_clock_says_about_today_is_never_an_answer():
    from datetime import date, timedelta

    from mcprl.scenarios._grounded import _dated

    tomorrow = (date.today() + timedelta(days=1)).isoformat()  # today, in Tokyo
    assert _dated(f'{{"datetime": "{tomorrow}T08:51:00+09:00", "is_dst": false}}')
    assert not _dated('{"datetime": "2024-03-09T09:15:00+00:00"}')


def test_counts_of_failures_are_not_questions():
    result = {"results": [{"value": 3}], "summary": {"failed_conversions": 1, "total": 1}}
    texts = [q.text for q in records_questions(result, noun=None, whole=True, rng=random.Random(0))]
    assert not any("failed" in t for t in texts)


def test_a_count_of_what_the_task_itself_lists_is_not_a_question():
    """gnomon-mcp's `calc(expressions=[...])` returns a line per expression: "For expressions
    ["31 * 11", "17 * 4"], how many calcs are there?" (2) asks the user's own input back."""
    from mcprl.scenarios._grounded import _single, _Step

    tool = ToolInfo(name="calc", description="Eval Python expressions -> list.",
                    input_schema={"type": "object"})  # fmt: skip
    given = _Step(tool, {"expressions": ["31 * 11", "17 * 4"]}, "341\n68")
    assert not [q for q in _single(given, random.Random(0), None) if q.kind == "count"]
    three = _Step(tool, {"expressions": ["31 * 11"]}, "341\n68\n7")  # not what it was given
    counts = [q for q in _single(three, random.Random(0), None) if q.kind == "count"]
    assert [q.answer for q in counts] == ["3"]


def test_objects_inside_arrays_keep_the_tool_definitions():
    from mcprl.scenarios._sampling import SchemaSampler, ValuePool

    schema = {
        "type": "object",
        "$defs": {"Req": {"type": "object", "properties": {
            "value": {"type": "number"}, "unit": {"enum": ["m", "km"]}},
            "required": ["value", "unit"]}},
        "properties": {"requests": {"type": "array", "items": {"$ref": "#/$defs/Req"}}},
        "required": ["requests"],
    }  # fmt: skip
    args = SchemaSampler(random.Random(0), ValuePool()).arguments(schema)
    assert args["requests"] and all(r["unit"] in ("m", "km") for r in args["requests"])


@pytest.mark.parametrize(
    ("text", "answers"),
    [("04:30", True), ("Staged changes:", False), ("No matches found", False),
     ("The sum of 31 and 25 is 56. Thanks for asking!", False)],
)  # fmt: skip
def test_a_short_text_answers_its_call_unless_it_is_a_header_or_nothing(text, answers):
    from mcprl.scenarios._grounded import _short_answer

    assert _short_answer(text) is answers


@pytest.mark.anyio
async def test_yes_and_no_are_equally_often_right():
    """Three names can be asked about with "yes" once each, made-up ones with "no" without end:
    the set keeps them level, so that answering "no" unread is not a winning habit."""
    scenarios, report = await build_grounded(f"{PY} {SERVERS / 'teams.py'}", 10, seed=0)
    answers = [s.reference.answer for s in scenarios if "exists" in s.tags]
    assert answers.count("yes") == 3 and answers.count("no") in (3, 4)
    assert report.rejected["a yes or no the set has more of"] > 0
    # ... and a right "no" counts only after a look at the data (`Reference.needs_calls`)
    assert all(s.reference.needs_calls for s in scenarios)


@pytest.mark.anyio
async def test_an_llm_written_yes_or_no_question_keeps_its_answer_type():
    from mcprl.mcp import ToolInfo
    from mcprl.rollout import answer_type as kind_of
    from mcprl.rollout import complete_task_tool
    from mcprl.scenarios import SCENARIOS_SCHEMA, generate_scenarios
    from tests.helpers import ScriptedJudge

    item = SCENARIOS_SCHEMA["properties"]["scenarios"]["items"]["properties"]
    assert "yes/no" in item["answer_type"]["enum"]  # the writer is offered the type
    reply = json.dumps({"scenarios": [
        {"task": "Is it raining in Paris right now?", "difficulty": 1, "answer_type": "yes/no"},
        {"task": "What is the temperature in Oslo?", "difficulty": 1, "answer_type": "boolean"},
    ]})  # fmt: skip
    tool = ToolInfo(name="get_weather", description="Weather in a city", input_schema={})
    made = {s.task: s for s in await generate_scenarios(
        [tool], n=2, generator="t/g", completion_fn=ScriptedJudge(reply))}  # fmt: skip
    asks = made["Is it raining in Paris right now?"]
    assert asks.answer_type == "yes/no" and kind_of(asks) == "yes/no"
    answer = complete_task_tool(kind_of(asks))["function"]["parameters"]["properties"]["answer"]
    assert answer["enum"] == ["yes", "no"]
    assert made["What is the temperature in Oslo?"].answer_type is None  # not a type: left out
