"""AutoRL: inputs and a system prompt from a task description, then the usual training loop."""

from __future__ import annotations

import json

import pytest

from mcprl.autorl import autorl_rubric, write_task_set
from mcprl.cli import main
from mcprl.errors import ScenarioGenerationError
from mcprl.scenarios import ScenarioSet
from ruler import DEFAULT_RUBRIC, LLMClient
from tests.helpers import ScriptedJudge

TASK = "Turn a customer's complaint into one polite sentence of apology."


def _prompt() -> str:
    return json.dumps({"system_prompt": "Apologise politely, in one sentence, for the problem."})


def _inputs(*texts: str) -> str:
    return json.dumps({"inputs": list(texts)})


@pytest.mark.anyio
async def test_inputs_are_deduplicated_and_split_and_the_prompt_kept(tmp_path):
    script = ScriptedJudge(
        _prompt(),
        _inputs("My parcel arrived two weeks late.", "My parcel arrived two weeks late!",
                "The blender you sold me broke on day one."),
        _inputs("The blender you sold me broke on day one.", "I was charged twice for one order.",
                "Your support line kept me on hold for an hour.", "The shoes are the wrong size."),
    )  # fmt: skip
    llm = LLMClient("openai/writer", api_base="http://127.0.0.1:9/v1", completion_fn=script)
    task_set = await write_task_set(TASK, n=5, generator=llm, batch_size=4)
    tasks = [s.task for s in task_set.scenarios]
    assert len(tasks) == 5 and len(set(tasks)) == 5
    assert "My parcel arrived two weeks late!" not in tasks  # a near-duplicate
    assert task_set.system_prompt.startswith("Apologise politely")
    assert len(task_set.scenarios.val) >= 1 and len(task_set.scenarios.train) >= 3
    # the schema asks for exactly the batch still missing
    schema = script.requests[1]["response_format"]["json_schema"]["schema"]
    assert schema["properties"]["inputs"]["minItems"] == 4
    task_set.save_to(tmp_path)
    assert (tmp_path / "task.txt").read_text().strip() == TASK
    assert len(ScenarioSet.load(tmp_path / "scenarios.jsonl")) == 5


@pytest.mark.anyio
async def test_too_few_distinct_inputs_is_an_error_with_advice():
    script = ScriptedJudge(_prompt(), _inputs("Same complaint again and again."))
    llm = LLMClient("openai/writer", api_base="http://127.0.0.1:9/v1", completion_fn=script)
    with pytest.raises(ScenarioGenerationError, match=r"got 1 of 4 distinct inputs.*fewer"):
        await write_task_set(TASK, n=4, generator=llm, max_rounds=3)


@pytest.mark.anyio
async def test_a_system_prompt_cut_off_mid_ramble_is_asked_for_again_with_another_seed():
    cut = '{"system_prompt": "Support our team, DEB 3A, DEB 3A, DEB 3A, DEB'  # hit max_tokens
    script = ScriptedJudge(cut, _prompt(), _inputs("My parcel arrived two weeks late.",
                           "I was charged twice for one order."))  # fmt: skip
    llm = LLMClient("openai/writer", api_base="http://127.0.0.1:9/v1", completion_fn=script)
    task_set = await write_task_set(TASK, n=2, generator=llm, seed=5, val_fraction=0.5)
    assert task_set.system_prompt.startswith("Apologise politely")
    seeds = [r["seed"] for r in script.requests[:2]]
    assert seeds[0] == 5 and seeds[1] != 5


@pytest.mark.anyio
async def test_a_system_prompt_unusable_every_time_is_an_error_naming_the_generator():
    cut = '{"system_prompt": "DEB 3A, DEB 3A'
    script = ScriptedJudge(cut, cut, cut, _prompt())
    llm = LLMClient("openai/writer", api_base="http://127.0.0.1:9/v1", completion_fn=script)
    with pytest.raises(ScenarioGenerationError, match="openai/writer gave no usable reply"):
        await write_task_set(TASK, n=2, generator=llm)
    assert len(script.requests) == 3


def test_the_rubric_carries_the_task():
    rubric = autorl_rubric(TASK)
    assert rubric.startswith(DEFAULT_RUBRIC.rstrip()[:40]) and TASK in rubric


def test_autorl_end_to_end_with_the_local_model(tmp_path, capsys):
    """The tiny model writes the data, answers, and judges (as the base model); one GRPO step."""
    argv = [
        "autorl", TASK, "-n", "4", "--path", str(tmp_path), "--steps", "1",
        "--groups-per-step", "2", "--rollouts-per-group", "2", "--max-tokens", "16",
        "--eval-every", "0", "--max-val", "1", "-q", "--no-report",
    ]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr()
    run = tmp_path / "autorl" / "agent"
    assert (run / "system_prompt.txt").read_text().strip()
    assert len(ScenarioSet.load(run / "scenarios.jsonl")) == 4
    assert (run / "checkpoints" / "0001").is_dir()
    assert "judge openai/smollm2-135m" in out.out
    rows = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
    # the tiny judge often ties a group (no signal, no update); the step is recorded either way
    assert any(r["step"] == 1 and "train/reward_mean" in r for r in rows)
    groups = (run / "trajectories" / "train" / "0001.jsonl").read_text().splitlines()
    first = json.loads(groups[0])["trajectories"][0]
    assert [m["role"] for m in first["messages"]] == ["system", "user", "assistant"]
    assert "reward_ruler" in first["metrics"]
