"""Scenarios: files, splits, de-duplication, LLM-written and grounded generation."""

from __future__ import annotations

import json
import random
import re
import sys
from pathlib import Path

import pytest

from mcprl.errors import ScenarioFileError, ScenarioGenerationError
from mcprl.mcp import ToolInfo, inspect_server, open_session
from mcprl.scenarios import (
    SCENARIOS_SCHEMA,
    Deduper,
    Reference,
    Scenario,
    ScenarioSet,
    generate_scenarios,
    grounded_scenarios,
    scenario_count,
)
from tests.helpers import EXAMPLES, LocalChatServer, ScriptedJudge, chat_completion, load_example

pytestmark = pytest.mark.anyio

CURATED = Path(__file__).resolve().parent.parent / "scenarios"


def _set(n: int = 20) -> ScenarioSet:
    return ScenarioSet(
        Scenario(id=f"s{i}", task=f"task number {i}", difficulty=1 + i % 5) for i in range(n)
    )


# -- files ---------------------------------------------------------------------------------------


def test_jsonl_round_trip_is_lossless(tmp_path):
    original = _set().with_split(0.25, seed=3)
    original.scenarios[0].reference = Reference(answer="42", tolerance=0.01)
    path = original.save(tmp_path / "s.jsonl")
    loaded = ScenarioSet.load(path)
    assert [s.model_dump() for s in loaded] == [s.model_dump() for s in original]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "line 2: not valid JSON"),
        ('{"id": "x", "task": "t", "difficulty": 7}', "line 2: difficulty: Input should be"),
        ('{"id": "x", "difficulty": 2}', "line 2: task: Field required"),
        ('{"id": "a", "task": "dup", "difficulty": 2}', "line 2: scenario id 'a' is already used"),
        ('{"id": "x", "task": "t", "difficulty": 2, "extra": 1}', "line 2: extra"),
    ],
)
def test_a_bad_line_is_named(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "a", "task": "fine", "difficulty": 1}\n' + line + "\n")
    with pytest.raises(ScenarioFileError, match=message):
        ScenarioSet.load(path)


def test_empty_and_missing_files(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ScenarioFileError, match="has no scenarios"):
        ScenarioSet.load(tmp_path / "empty.jsonl")
    with pytest.raises(ScenarioFileError, match="cannot read"):
        ScenarioSet.load(tmp_path / "missing.jsonl")


def test_split_is_seeded_stratified_and_kept(tmp_path):
    a, b = _set(40).with_split(0.25, seed=1), _set(40).with_split(0.25, seed=1)
    assert [s.split for s in a] == [s.split for s in b]
    assert [s.split for s in _set(40).with_split(0.25, seed=2)] != [s.split for s in a]
    assert len(a.val) == 10 and len(a.train) == 30
    assert set(a.val.histogram().values()) == {2}  # every level on both sides
    reloaded = ScenarioSet.load(a.save(tmp_path / "a.jsonl")).with_split(0.5, seed=9)
    assert [s.split for s in reloaded] == [s.split for s in a]  # an existing split is kept


def test_val_asks_kinds_that_training_practises():
    """sqlite's 10 one-step tasks: 7 column questions, 2 lookups, 1 existence. A split by
    difficulty alone put both lookups and the existence question in val (L109), so val asked
    what training never showed. Val now draws across kinds and leaves each kind one in train."""
    kinds = [("exists", "describe_table")] * 7 + [("lookup", "read_query")] * 2
    kinds += [("exists", "read_query")]
    for seed in range(20):
        tasks = [
            Scenario(id=f"t{i}", task=f"Task {i}?", difficulty=1, tags=list(k))
            for i, k in enumerate(kinds)
        ]
        split = ScenarioSet(tasks).with_split(0.3, seed=seed)
        train = {tuple(s.tags) for s in split.train}
        val = [tuple(s.tags) for s in split.val]
        assert len(val) == 3 and train == set(kinds)
        assert val.count(("lookup", "read_query")) == 1  # in proportion: 2 of 7, 1 of 2


def test_val_never_takes_a_kinds_only_task():
    """Seed 1's 24 sqlite tasks held one lookup, and val took it when its level's val needed
    more tasks than the kinds of two could give (L115: the trained model had never seen a
    lookup). Val is smaller instead; a kind with one task per level still gives val one."""
    kinds = [("count",)] * 2 + [("lookup",)] + [("extreme",)] * 2  # level 1, with a "which":
    kinds += [("spread",)] * 4  # val wants 3 of its 6; level 2 has the other "which"
    for seed in range(30):
        tasks = [
            Scenario(id=f"t{i}", task=f"Task {i}?", difficulty=1 + (i >= 5), tags=list(k))
            for i, k in enumerate(kinds)
        ]
        tasks += [
            Scenario(id=f"w{i}", task=f"Which {i}?", difficulty=1 + i, tags=["which"])
            for i in range(2)
        ]
        split = ScenarioSet(tasks).with_split(0.5, seed=seed)
        train = {tuple(s.tags) for s in split.train}
        assert {tuple(s.tags) for s in split.val} <= train
        assert ("lookup",) in train
        assert [s.tags for s in split.val if s.difficulty == 1].count(["which"]) == 1
    singles = ScenarioSet(
        Scenario(id=f"s{i}", task=f"Single {i}?", difficulty=1, tags=[f"k{i}"]) for i in range(8)
    )
    assert len(singles.with_split(0.25, seed=0).val) == 2  # no other way to get a val


def test_filter_and_histogram():
    s = _set(20)
    assert s.histogram() == {1: 4, 2: 4, 3: 4, 4: 4, 5: 4}
    assert {x.difficulty for x in s.filter(2, 3)} == {2, 3}
    assert "difficulty 5" in s.format_histogram()


def test_deduper_drops_repeats_and_near_repeats_but_not_new_numbers():
    d = Deduper()
    assert d.add("What is the average price of Jules Verne's books?")
    assert not d.add("what is the average price of jules vernes books")
    assert not d.add("What is the average price of Jules Verne's books ?!")
    assert d.add("What is 12 times 18?")
    assert d.add("What is 12 times 19?")


# -- LLM-written ---------------------------------------------------------------------------------


def _reply(*tasks: tuple[str, int]) -> str:
    return json.dumps({"scenarios": [{"task": t, "difficulty": d} for t, d in tasks]})


@pytest.fixture(scope="module")
def catalog_info():
    import anyio

    return anyio.run(inspect_server, load_example("catalog").server)


async def test_llm_generation_keeps_asking_until_it_has_n(catalog_info):
    fn = ScriptedJudge(
        _reply(("How many books by Jane Austen are there?", 1), ("Too short", 9)),
        "I cannot help with that.",
        _reply(
            ("how many books by jane austen are there", 1),  # a repeat, dropped
            ("What is the mean price of the mystery books?", 3),
            ("Which Jules Verne book is the longest, and how long is it?", 4),
        ),
    )
    result = await generate_scenarios(
        catalog_info.tools,
        catalog_info.resources,
        n=3,
        generator="test/generator",
        completion_fn=fn,
        structured_output="json_schema",
    )
    assert [s.task for s in result] == [
        "How many books by Jane Austen are there?",
        "What is the mean price of the mystery books?",
        "Which Jules Verne book is the longest, and how long is it?",
    ]
    assert [s.difficulty for s in result] == [1, 3, 4]
    assert fn.calls == 3
    first = fn.requests[0]
    assert first["response_format"]["json_schema"]["schema"] == SCENARIOS_SCHEMA
    system = first["messages"][0]["content"]
    assert "search_books" in system and "Jules Verne" in system  # tools and resources shown
    assert "How many books by Jane Austen" in fn.requests[2]["messages"][1]["content"]


async def test_llm_generation_fails_clearly_after_bounded_rounds(catalog_info):
    fn = ScriptedJudge(_reply(("The same task every single time.", 2)))
    with pytest.raises(ScenarioGenerationError, match=r"got 1 of 5 .* after 4 rounds"):
        await generate_scenarios(
            catalog_info.tools, n=5, generator="test/g", completion_fn=fn, max_rounds=4
        )
    assert fn.calls == 4


async def test_instructions_reach_the_generator(catalog_info):
    fn = ScriptedJudge(_reply(("Find the cheapest fantasy book and give its price.", 3)))
    await generate_scenarios(
        catalog_info.tools, n=1, generator="t/g", completion_fn=fn, instructions="Only fantasy."
    )
    assert "Only fantasy." in fn.requests[0]["messages"][0]["content"]


async def test_llm_generation_through_litellm_and_a_local_endpoint(catalog_info):
    counter = iter(range(1000))

    def respond(body: dict) -> tuple[int, dict]:
        k = next(counter)
        tasks = [(f"List the {g} books published after {1800 + 10 * k}.", 2) for g in "ab"]
        return 200, chat_completion(_reply(*tasks))

    with LocalChatServer(respond) as server:
        result = await generate_scenarios(
            catalog_info.tools, n=4, generator="openai/local", api_base=server.base_url
        )
    assert len(result) == 4 and len({s.id for s in result}) == 4
    assert server.requests[0]["response_format"]["type"] == "json_schema"
    assert server.requests[0]["seed"] == 0 and server.requests[1]["seed"] == 1


# -- grounded ------------------------------------------------------------------------------------


async def _replay(server, scenario: Scenario) -> None:
    """Run the reference calls in a fresh session; each must return what was recorded."""
    async with open_session(server) as session:
        for call in scenario.reference.calls:
            result = await session.call_tool(call.tool, call.arguments)
            assert not result.is_error, (scenario.task, result.text)
            assert result.text == call.result, scenario.task


def _answer_in_last_result(scenario: Scenario) -> bool:
    """The answer is read off the last result: as written there, or a number rounded to the
    precision the reference states."""
    from mcprl.rewards import answer_matches

    answer = scenario.reference.answer
    last = scenario.reference.calls[-1].result
    return answer is None or answer in last or answer_matches(last, scenario.reference)


@pytest.mark.parametrize("name", ["calculator", "catalog"])
async def test_grounded_scenarios_carry_true_references(name):
    server = load_example(name).server
    scenarios = await grounded_scenarios(server, n=16, seed=4)
    assert len(scenarios) == 16 and len({s.task for s in scenarios}) == 16
    assert max(s.difficulty for s in scenarios) >= 3  # chains exist
    assert any(len(s.reference.calls) > 1 for s in scenarios)
    for s in scenarios:
        await _replay(server, s)
        assert _answer_in_last_result(s), s


async def test_grounded_tasks_read_as_requests():
    scenarios = await grounded_scenarios(load_example("calculator").server, n=12, seed=4)
    for s in scenarios:
        assert "Finish with a short summary" not in s.task and "Step 1" not in s.task
        assert s.task.endswith("?"), s.task  # a question about the final result
        if len(s.reference.calls) > 1:
            assert s.task.startswith("First, ") and "previous step" in s.task, s.task
    assert any(s.task.startswith("Add two numbers") and "with a = " in s.task for s in scenarios)


async def test_grounded_scenarios_on_a_stateful_server_replay_from_a_fresh_session():
    spec = f"python {EXAMPLES / 'notes.py'}"
    scenarios = await grounded_scenarios(spec, n=5, seed=1, chain_fraction=1.0, allow_writes=True)
    for s in scenarios:
        await _replay(spec, s)


SQUARES_SERVER = f"""
import os, sys
sys.path.insert(0, {str(EXAMPLES)!r})
from _compat import READS, make_server, serve
with open({{started!r}}, "a") as f:  # one line per process started
    f.write(str(os.getpid()) + "\\n")
server = make_server("squares", "squares of whole numbers")

@server.tool(annotations=READS)
def square(n: int) -> int:
    \"\"\"The square of the whole number n.\"\"\"
    return n * n

serve(server)
"""


async def test_grounded_generation_on_a_server_that_only_reads_starts_one_process_for_its_calls(
    tmp_path,
):
    """The chains share one session (a process over stdio) where nothing they call can write;
    only the replay of each kept scenario opens a fresh one. A process per chain cost git's
    generation ~1.2 s each, 264 s for 24 tasks in 218 tries."""
    from mcprl.scenarios._grounded import build_grounded

    path, started = tmp_path / "squares.py", tmp_path / "started.txt"
    path.write_text(SQUARES_SERVER.format(started=str(started)))
    spec = f"{sys.executable} {path}"
    scenarios, report = await build_grounded(spec, n=3, seed=0)
    replays = (
        report.built + report.rejected["results that change between sessions (time, random ids)"]
    )
    assert len(scenarios) == 3 and report.attempts >= 3
    # the listing of the tools, the shared session, one replay per scenario it would keep
    assert len(started.read_text().split()) == 2 + replays


async def test_grounded_generation_is_reproducible():
    server = load_example("calculator").server
    a = await grounded_scenarios(server, n=6, seed=11)
    b = await grounded_scenarios(server, n=6, seed=11)
    assert [s.task for s in a] == [s.task for s in b]


# -- curated sets ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["calculator", "catalog", "notes"])
def test_curated_sets_are_valid_and_split(name):
    scenarios = ScenarioSet.load(CURATED / f"{name}.jsonl")
    assert len(scenarios) >= 40
    assert len(scenarios.val) >= 8 and len(scenarios.train) >= 30
    assert all(s.reference and s.reference.answer and s.reference.calls for s in scenarios)
    assert len(set(scenarios.histogram().values()) - {0}) >= 2


@pytest.mark.parametrize("name", ["calculator", "catalog", "notes"])
def test_a_guessed_answer_to_a_curated_task_about_the_servers_data_scores_as_wrong(name):
    """The catalog's and the notes' answers are the server's data (a count, a new note's id),
    mostly small integers a guess hits: right only with the calls. A calculator answer worked
    out unaided is right. (L99: 38 of 48 catalog training "successes" were guesses.)"""
    from mcprl.rewards import reward_parts
    from mcprl.types import Trajectory

    s = ScenarioSet.load(CURATED / f"{name}.jsonl").val.scenarios[0]
    other = "list_genres" if name == "catalog" else "add"
    c = {"id": "call_0", "type": "function", "function": {"name": other, "arguments": "{}"}}
    guess = Trajectory(
        messages=[
            {"role": "user", "content": s.task},
            {"role": "assistant", "content": None, "tool_calls": [c]},
            {"role": "tool", "tool_call_id": c["id"], "content": "[]"},
        ],
        metadata={"final_answer": s.reference.answer},
    )
    parts = reward_parts(guess, s)
    assert parts.answer == (1.0 if name == "calculator" else 0.0)
    assert parts.guessed == (0.0 if name == "calculator" else 1.0)


@pytest.mark.parametrize("name", ["calculator", "catalog"])
async def test_curated_references_are_what_the_server_returns(name):
    server = load_example(name).server
    for s in ScenarioSet.load(CURATED / f"{name}.jsonl"):
        await _replay(server, s)


async def test_curated_notes_references_replay_over_stdio():
    spec = f"python {EXAMPLES / 'notes.py'}"
    scenarios = list(ScenarioSet.load(CURATED / "notes.jsonl"))
    for s in random.Random(0).sample(scenarios, 6):
        await _replay(spec, s)


def test_curated_tasks_do_not_name_tools():
    names = {"multiply", "search_books", "get_book", "create_note", "filter_books", "aggregate"}
    for name in ("calculator", "catalog", "notes"):
        for s in ScenarioSet.load(CURATED / f"{name}.jsonl"):
            words = set(re.findall(r"[a-z_]+", s.task.lower()))
            assert not words & names, s.task


async def test_an_llm_rewords_grounded_tasks_and_the_answers_stay_verified():
    from mcprl.scenarios import reword_tasks

    built = await grounded_scenarios(load_example("calculator").server, n=6, seed=4)

    def rewrite(kwargs):
        task = kwargs["messages"][1]["content"].split("\n")[0].removeprefix("Task: ")
        if "First" in task:  # a rewrite that drops the numbers is refused
            return json.dumps({"task": "Please do a little arithmetic for me and tell me."})
        numbers = re.findall(r"-?\d+(?:\.\d+)?", task)
        return json.dumps({"task": f"I have {' and '.join(numbers)}: what do I get?"})

    fn = ScriptedJudge(rewrite)
    reworded, kept = await reword_tasks(built, "t/g", completion_fn=fn)
    chains = sum(len(s.reference.calls) > 1 for s in built)
    assert fn.calls == len(built) and kept == chains > 0
    for before, after in zip(built, reworded, strict=True):
        assert after.reference == before.reference and after.id == before.id
        if len(before.reference.calls) > 1:
            assert after.task == before.task  # kept: the rewrite lost the values
        else:
            assert after.task.startswith("I have ") and "reworded" in after.tags
    system = fn.requests[0]["messages"][0]["content"]
    assert "Never mention tool names" in system


def test_a_server_with_many_tools_gets_three_tasks_a_tool_it_may_call():
    """At a flat 24, a 16-tool unit converter got a task or none for most tools and a val set
    of 6: the default count follows the tools a task may call, two to train on and one held
    out each, within 24-96."""

    def tools(names):
        return [ToolInfo(name=n, input_schema={"type": "object"}) for n in names]

    converters = tools(f"convert_{k}" for k in range(16))
    assert scenario_count(converters) == 48
    assert scenario_count(tools(["get_time", "convert_time"])) == 24  # never fewer
    assert scenario_count(tools(f"get_{k}" for k in range(50))) == 96  # nor more
    writers = tools(f"delete_{k}" for k in range(12))
    assert scenario_count(converters[:8] + writers) == 24  # writers are not called ...
    assert scenario_count(converters[:8] + writers, allow_writes=True) == 60  # ... unless allowed
