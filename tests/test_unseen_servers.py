"""Scenarios from servers built elsewhere: read-only by default, no errors or unstable answers
kept as references, values taken from descriptions, environment variables in a command line, and
generation that keeps what it built. The servers in tests/servers imitate the failure kinds seen
on third-party servers (see each file's docstring)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from mcprl.errors import MCPServerStartError, ScenarioGenerationError, ServerSpecError
from mcprl.mcp import ServerSpec, ToolInfo, inspect_server, looks_like_error, tool_access
from mcprl.scenarios import build_grounded, named_arguments
from mcprl.scenarios._sampling import described_examples
from tests.helpers import served

pytestmark = pytest.mark.anyio

SERVERS = Path(__file__).resolve().parent / "servers"
PY = sys.executable


# -- the classifiers ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        'Database error: Parser Error: syntax error at or near "travel"',
        "Error: Invalid format for time 'weekly groceries': expected HH:MM",
        "Error: Invalid timezone: 'call the dentist'",
        "error: no such table: notes",
        "Traceback (most recent call last):\n  File ...",
        '{"error": "not found"}',
        "Could not find a repository at 'reading list'",
        "Unknown table 'fruits'",
        "Permission denied: /etc/shadow",
        "Failed to parse expression '2 +'",
    ],
)
def test_failure_reports_in_ordinary_text_are_recognised(text):
    assert looks_like_error(text)


@pytest.mark.parametrize(
    "text",
    ["42", '{"count": 3}', "14:30", "hello", "Error rate for March: 2%", "Errors are rare here",
     "The invalidation queue is empty", '{"items": [], "error_count": 0}', ""],
)  # fmt: skip
def test_ordinary_results_are_not_taken_for_errors(text):
    assert not looks_like_error(text)


def _tool(name: str, annotations: dict | None = None, **props: dict) -> ToolInfo:
    schema = {"type": "object", "properties": props}
    return ToolInfo(name=name, input_schema=schema, annotations=annotations or {})


@pytest.mark.parametrize(
    ("tool", "access"),
    [
        (_tool("add", {"readOnlyHint": True}), "read"),  # an annotation decides
        (_tool("list_notes", {"readOnlyHint": False}), "write"),
        (_tool("get_thing", {"destructiveHint": True}), "write"),
        (_tool("delete_file"), "write"),
        (_tool("add_observations"), "write"),
        (_tool("createEntities"), "write"),
        (_tool("list_files"), "read"),
        (_tool("get_current_time"), "read"),
        (_tool("searchNodes"), "read"),
        (_tool("read_query", sql={"type": "string"}), "write"),  # runs whatever SQL it is given
        (_tool("frobnicate"), "write"),  # nothing says it is safe
    ],
)
def test_tools_are_read_only_only_on_evidence(tool, access):
    assert tool_access(tool)[0] == access


def test_examples_quoted_in_descriptions_go_to_their_parameters():
    text = (
        "Convert a time.\n\ntime: 24-hour HH:MM, e.g. '14:30'. source_timezone, "
        "target_timezone: IANA names such as\n'Europe/London' or 'Australia/Sydney'."
    )
    found = described_examples(text, ["time", "source_timezone", "target_timezone"])
    assert found["time"] == ["14:30"]
    zones = ["Europe/London", "Australia/Sydney"]
    assert found["source_timezone"] == found["target_timezone"] == zones
    assert described_examples("A path like `/tmp/data.csv`.", ["path"]) == {
        "path": ["/tmp/data.csv"]
    }


# -- generation on the test servers ---------------------------------------------------------


async def test_writing_tools_are_never_called_without_allow_writes(tmp_path):
    (tmp_path / "a.txt").write_text("hello")
    spec = f"SANDBOX_DIR={tmp_path} {PY} {SERVERS / 'files.py'}"  # the variable reaches it
    scenarios, report = await build_grounded(spec, 3, seed=0)
    called = {
        json.loads(line)["tool"] for line in (tmp_path / "calls.log").read_text().splitlines()
    }
    assert called <= {"list_files", "read_file"}
    assert sorted(report.skipped_tools) == ["delete_file", "write_file"]
    assert "`allow_writes=True`" in report.describe()
    assert (tmp_path / "a.txt").read_text() == "hello"
    assert all(s.reference.calls[0].tool in called for s in scenarios)


async def test_allow_writes_calls_them(tmp_path):
    (tmp_path / "a.txt").write_text("hello")
    spec = f"SANDBOX_DIR={tmp_path} {PY} {SERVERS / 'files.py'}"
    scenarios, report = await build_grounded(spec, 4, seed=0, allow_writes=True, max_attempts=30)
    called = {
        json.loads(line)["tool"] for line in (tmp_path / "calls.log").read_text().splitlines()
    }
    assert called & {"write_file", "delete_file"} and not report.skipped_tools
    # a write in a reference counts only with the values its task names; a read with any
    for s in scenarios:
        for c in s.reference.calls:
            writes = c.tool in ("write_file", "delete_file")
            assert c.match == (named_arguments(s.task, c.arguments) if writes else None)
    matched = [c.match for s in scenarios for c in s.reference.calls if c.tool == "write_file"]
    assert ["name", "content"] in matched  # the file and what it must hold, as the task says


async def test_a_server_that_needs_a_variable_says_so_and_starts_with_it(tmp_path):
    with pytest.raises(MCPServerStartError, match="SANDBOX_DIR is required"):
        await inspect_server(f"{PY} {SERVERS / 'files.py'}")
    info = await inspect_server(f"SANDBOX_DIR={tmp_path} {PY} {SERVERS / 'files.py'}")
    assert info.name == "files"
    spec = ServerSpec.parse("A=1 B=two=2 python server.py --flag")
    assert spec.env == {"A": "1", "B": "two=2"} and spec.command == (
        "python",
        "server.py",
        "--flag",
    )
    with pytest.raises(ServerSpecError, match="names no command"):
        ServerSpec.parse("A=1 B=2")


def test_an_example_server_imports_from_where_mcprl_imports(monkeypatch, tmp_path):
    """The SDK starts a stdio server with a minimal environment; an example server runs on
    mcprl's own interpreter, so packages installed on PYTHONPATH must reach it too."""
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    spec = ServerSpec.parse("example:calculator")
    assert spec.env == {"PYTHONPATH": str(tmp_path)}
    assert ServerSpec.parse("example:calculator", env={"X": "1"}).env == {
        "PYTHONPATH": str(tmp_path),
        "X": "1",
    }
    monkeypatch.delenv("PYTHONPATH")
    assert ServerSpec.parse("example:calculator").env is None


async def test_errors_worded_as_text_are_never_references():
    scenarios, report = await build_grounded(f"{PY} {SERVERS / 'sqlish.py'}", 4, seed=0)
    assert report.skipped_tools == ["query"]  # free-text SQL may write
    for s in scenarios:
        assert not any(looks_like_error(c.result or "") for c in s.reference.calls)
        assert "error" not in (s.reference.answer or "").lower()


async def test_answers_that_change_between_sessions_are_dropped_and_described_values_used():
    scenarios, report = await build_grounded(f"{PY} {SERVERS / 'clock.py'}", 3, seed=0)
    # the clock's answer changes when the call is repeated: it is no practice material
    assert "get_current_time" in report.meta_tools
    assert scenarios and all(
        c.tool == "convert_time" for s in scenarios for c in s.reference.calls
    )  # the current time is never a reference
    # the zones quoted in convert_time's description, and in current_time's for `timezone`
    zones = {"Europe/London", "Australia/Sydney", "America/New_York", "Asia/Tokyo"}
    for s in scenarios:
        (call,) = s.reference.calls
        assert call.arguments["source_timezone"] in zones
        assert call.arguments["source_timezone"] != call.arguments["target_timezone"]
        assert call.result and ":" in call.result


async def test_examples_one_tool_gives_serve_parameters_of_the_same_kind_in_another():
    scenarios, report = await build_grounded(f"{PY} {SERVERS / 'clock.py'}", 8, seed=0)
    assert report.built == 8  # 4 zones; 2 (those convert_time quotes itself) give only 2 tasks
    used = {c.arguments[k] for s in scenarios for c in s.reference.calls for k in c.arguments}
    assert used & {"America/New_York", "Asia/Tokyo"}  # quoted only for current_time's timezone


async def test_names_a_listing_tool_returns_feed_the_tools_that_take_them():
    # sqlish: count_rows(table) accepts only the names that list_tables returns
    scenarios, _ = await build_grounded(f"{PY} {SERVERS / 'sqlish.py'}", 8, seed=0)
    counted = {
        c.arguments["table"]: c.result for s in scenarios for c in s.reference.calls
        if c.tool == "count_rows"
    }  # fmt: skip
    assert set(counted) == {"fruit", "vegetables"}
    chain = next(s for s in scenarios if [c.tool for c in s.reference.calls] == [
        "list_tables", "count_rows"])  # fmt: skip
    assert chain.reference.answer == "4" and chain.difficulty >= 3  # fruit, the first listed
    assert "first table listed" in chain.task
    for s in scenarios:  # in words: no tool names, no asides that point at them
        assert "list_tables" not in s.task and "count_rows" not in s.task, s.task


def test_a_pattern_gets_a_string_that_matches_it():
    import random
    import re

    from mcprl.scenarios._sampling import SchemaSampler, ValuePool

    sampler = SchemaSampler(random.Random(0), ValuePool())
    schema = {
        "type": "object",
        "properties": {
            "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
            "at": {"type": "string", "description": "e.g. '14:30'", "pattern": "^\\d\\d:\\d\\d$"},
        },
        "required": ["code", "at"],
    }
    for _ in range(5):
        args = sampler.arguments(schema)
        assert re.fullmatch("[A-Z]{3}-[0-9]{4}", args["code"]) and args["at"] == "14:30"


def test_a_number_that_counts_things_is_whole():
    """server-filesystem's `read_file` takes `tail`, a "number" for "the last N lines": a
    task reads 40 lines, never 40.3."""
    import random

    from mcprl.scenarios._sampling import SchemaSampler, ValuePool

    sampler = SchemaSampler(random.Random(0), ValuePool())
    lines = {"type": "number", "description": "If provided, returns only the last N lines"}
    price = {"type": "number", "description": "The price in euros"}
    assert all(isinstance(sampler.value(lines, "tail"), int) for _ in range(40))
    assert any(not float(sampler.value(price, "price")).is_integer() for _ in range(40))


async def test_nothing_built_is_an_error_that_shows_a_failure():
    with pytest.raises(ScenarioGenerationError) as info:
        await build_grounded(f"{PY} {SERVERS / 'sqlish.py'}", 2, seed=0, allow_writes=True,
                             max_attempts=0)  # fmt: skip
    assert "built 0 of 2" in str(info.value)


async def test_a_wrong_http_path_names_the_url_and_the_status():
    with served("calculator") as url:
        wrong = url.replace("/mcp", "/nope")
        with pytest.raises(MCPServerStartError) as info:
            await inspect_server(wrong)
    message = str(info.value)
    assert f"{wrong} answered HTTP 404 (Not Found)" in message and "/mcp" in message


def test_scenarios_cli_keeps_a_short_set_and_says_what_it_turned_down(tmp_path, capsys):
    from mcprl.cli import main

    out = tmp_path / "sql.jsonl"
    code = main(["scenarios", f"{PY} {SERVERS / 'sqlish.py'}", "-n", "6", "--grounded",
                 "-o", str(out)])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 0 and out.is_file()
    assert "may change the server's data: query" in err
    assert "warning: kept the" in err and "fewer than the 6 asked" in err
    assert "Not called, as they may change the server's data: query" in err


def test_an_evaluation_keeps_each_model_as_soon_as_it_is_done(tmp_path):
    from mcprl.evaluate import EvalRow, EvalWriter
    from mcprl.types import Trajectory, TrajectoryGroup

    writer = EvalWriter(tmp_path)
    group = TrajectoryGroup(scenario_id="s1", trajectories=[Trajectory(reward=1.0)])
    writer.add(EvalRow(model="agent@3", metrics={"success": 0.5}, seconds=2.0), [group])
    # a run stopped here (Ctrl-C, a crash in the next model) has kept the first model
    assert "| agent@3 | 50%" in (writer.dir / "table.md").read_text()
    assert "(in progress)" in (writer.dir / "table.md").read_text()
    assert json.loads((writer.dir / "results.json").read_text())[0]["model"] == "agent@3"
    assert (writer.dir / "agent@3.jsonl").is_file()
