"""The training loop's preflight checks and scheduling, with doubles in place of the model."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from mcprl.cli import main
from mcprl.errors import PreflightError
from mcprl.scenarios import Reference, Scenario, ScenarioSet
from mcprl.train import RunConfig, TrainingRun
from tests.fakes import FakeBackend
from tests.helpers import LocalChatServer, chat_completion

EXAMPLES = Path(__file__).resolve().parent.parent / "scenarios"

ROOT = Path(__file__).resolve().parent.parent


def _scenarios(n: int = 8, reference: bool = True) -> ScenarioSet:
    ref = Reference(answer="4") if reference else None
    items = [Scenario(id=f"s{i}", task=f"Add 2 and {i}.", difficulty=1, reference=ref)
             for i in range(n)]  # fmt: skip
    return ScenarioSet(items).with_split(0.25, seed=0)


def test_a_bad_scenario_file_fails_before_the_model_loads(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "task": "Add 1 and 2.", "difficulty": 9}\n')
    code = main(["train", "example:calculator", "--scenarios", str(bad), "--path",
                 str(tmp_path / "runs"), "-q"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1
    assert "bad.jsonl line 1" in err and "difficulty" in err
    assert "model" not in err.split("error:")[0]  # no "✓ model ... loaded" before it


@pytest.mark.anyio
async def test_reference_reward_needs_references(tmp_path):
    backend = FakeBackend(tmp_path)
    run = TrainingRun(RunConfig(reward="reference"), None, backend, say=lambda _: None)
    with pytest.raises(PreflightError, match="`reward=reference` needs a reference"):
        await run.prepare(_scenarios(reference=False))
    assert backend.registered == []


@pytest.mark.anyio
async def test_auto_reward_picks_ruler_without_references(tmp_path):
    with LocalChatServer(lambda body: (200, chat_completion("OK"))) as judge:
        config = RunConfig(judge="openai/j", judge_api_base=judge.base_url)
        run = TrainingRun(config, None, FakeBackend(tmp_path), say=lambda _: None)
        await run.prepare(_scenarios(reference=False))
    assert run.reward.name == "ruler" and run.judge.model == "openai/j"


@pytest.mark.anyio
async def test_auto_reward_never_trains_on_the_local_judge_alone(tmp_path, monkeypatch):
    for key in ("MCPRL_JUDGE", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY",
                "OPENROUTER_API_KEY"):  # fmt: skip
        monkeypatch.delenv(key, raising=False)
    run = TrainingRun(RunConfig(), None, FakeBackend(tmp_path), say=lambda _: None)
    with pytest.raises(PreflightError, match="`judge=MODEL`") as info:
        await run.prepare(_scenarios(reference=False))
    assert "`reward=ruler`" in str(info.value)
    # with references, auto trains on them and needs no judge at all
    run = TrainingRun(RunConfig(name="refs"), None, FakeBackend(tmp_path), say=lambda _: None)
    await run.prepare(_scenarios(reference=True))
    assert run.reward.name == "reference" and run.judge is None


@pytest.mark.anyio
async def test_a_judge_that_does_not_answer_stops_the_run_before_training(tmp_path):
    refuse = {"error": {"message": "invalid api key", "type": "auth"}}
    with LocalChatServer(lambda body: (401, refuse)) as judge:
        config = RunConfig(reward="ruler", judge="openai/j", judge_api_base=judge.base_url)
        run = TrainingRun(config, None, FakeBackend(tmp_path), say=lambda _: None)
        with pytest.raises(PreflightError, match="the judge openai/j does not answer"):
            await run.prepare(_scenarios())


@pytest.mark.anyio
async def test_a_run_keeps_its_scenarios_and_refuses_others(tmp_path):
    backend = FakeBackend(tmp_path)
    run = TrainingRun(RunConfig(reward="reference"), None, backend, say=lambda _: None)
    await run.prepare(_scenarios(8))
    stored = tmp_path / "default" / "agent" / "scenarios.jsonl"
    assert len(ScenarioSet.load(stored)) == 8
    again = TrainingRun(RunConfig(reward="reference"), None, backend, say=lambda _: None)
    await again.prepare(None)  # nothing given: the run's own scenarios
    assert len(again.scenarios) == 8
    with pytest.raises(PreflightError, match="trained on other scenarios"):
        await again.prepare(_scenarios(5))
    assert len(ScenarioSet.load(stored)) == 8  # not overwritten


@pytest.mark.anyio
async def test_scenarios_without_a_val_split_are_refused(tmp_path):
    items = ScenarioSet(
        [Scenario(id="a", task="Add 1 and 2.", difficulty=1, split="train",
                  reference=Reference(answer="3"))]
    )  # fmt: skip
    run = TrainingRun(RunConfig(), None, FakeBackend(tmp_path), say=lambda _: None)
    with pytest.raises(PreflightError, match="need a train and a val split"):
        await run.prepare(items)


def test_config_refuses_groups_of_one():
    with pytest.raises(ValueError, match="rollouts_per_group"):
        RunConfig(rollouts_per_group=1)


@pytest.mark.anyio
async def test_groups_are_judged_concurrently_and_kept_in_order():
    import anyio

    from mcprl.collect import score_groups
    from mcprl.types import TrajectoryGroup

    started = 0
    all_started = anyio.Event()

    async def score(group):
        nonlocal started
        started += 1
        if started == 3:
            all_started.set()
        await all_started.wait()  # judged one at a time, this would never return
        return None if group.scenario_id == "b" else group

    groups = [TrajectoryGroup(scenario_id=s) for s in "abc"]
    with anyio.fail_after(5):
        out = await score_groups(groups, score, progress=False)
    assert [g.scenario_id for g in out] == ["a", "c"]


@pytest.mark.anyio
async def test_a_run_says_when_attempts_share_a_session_on_the_strength_of_tool_names(tmp_path):
    """Unannotated tools named for reading: one session for all attempts (`mcprl.collect`),
    and the run says so, with the switch; annotated read-only tools need no such word."""
    from tests.helpers import EXAMPLES as SERVERS

    server = tmp_path / "lookup.py"
    server.write_text(
        f"import sys\nsys.path.insert(0, {str(SERVERS)!r})\n"
        "from _compat import make_server, serve\n"
        "server = make_server('lookup', 'reads')\n"
        '@server.tool()\ndef get_answer() -> int:\n    """The answer."""\n    return 42\n'
        "serve(server)\n"
    )
    task = ScenarioSet(
        [
            Scenario(
                id=k,
                task="What is the answer?",
                difficulty=1,
                split=split,
                reference=Reference(answer="42"),
            )
            for k, split in (("a", "train"), ("b", "val"))
        ]
    )
    for name, target in (
        ("guessed", f"{sys.executable} {server}"),
        ("annotated", "example:catalog"),
    ):
        said: list[str] = []
        run = TrainingRun(RunConfig(), target, FakeBackend(tmp_path / name), say=said.append)
        await run.prepare(task)
        shared = [line for line in said if "share one server session" in line]
        if name == "guessed":
            assert "(not annotated: get_answer)" in shared[0] and "--fresh-sessions" in shared[0]
        else:
            assert shared == []


@pytest.mark.anyio
@pytest.mark.parametrize("allow_writes", [False, True])
async def test_writing_tools_no_task_calls_are_not_offered_unless_allowed(tmp_path, allow_writes):
    """The notes tasks that only read: the agent gets no tool that could change the notes,
    unless --allow-writes; the tasks that write offer the writing tools they call."""
    notes = ScenarioSet.load(EXAMPLES / "notes.jsonl")
    writes = {"create_note", "update_note", "delete_note"}
    reading = ScenarioSet([s for s in notes if not {c.tool for c in s.reference.calls} & writes])
    assert 0 < len(reading) < len(notes)
    for scenarios, hidden in ((notes, []), (reading, [] if allow_writes else sorted(writes))):
        said: list[str] = []
        config = RunConfig()
        config.rollout.allow_writes = allow_writes
        run = TrainingRun(config, "example:notes", FakeBackend(tmp_path / str(len(scenarios))),
                          say=said.append)  # fmt: skip
        await run.prepare(scenarios)
        assert sorted(run.config.rollout.hidden_tools) == hidden
        note = [line for line in said if "may change the server's data" in line]
        if hidden:
            assert "not offered 3 tools" in note[0] and "`allow_writes=True`" in note[0]
            assert len(note) == 1
        else:
            assert "(create_note, update_note, delete_note)" in note[-1]
            assert "disposable copy" in note[-1]
