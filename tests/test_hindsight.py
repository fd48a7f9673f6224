"""Hindsight tasks: a failed attempt's chain of calls becomes the task it solved, and only when
its answer checks."""

from __future__ import annotations

import json

import pytest

from mcprl.console import Console
from mcprl.curriculum import ScenarioSampler, task_kind
from mcprl.hindsight import hindsight_task, hindsight_tasks
from mcprl.rewards import is_success
from mcprl.scenarios import Reference, Scenario, ScenarioSet
from mcprl.train import RunConfig, RunSummary, TrainingRun
from mcprl.types import Trajectory, TrajectoryGroup
from tests.fakes import FakeBackend
from tests.helpers import AVERAGE, LocalChatServer, load_example


def _attempt(*calls: tuple[str, dict, str], answer: str, guided: int = 0) -> Trajectory:
    """An attempt that makes `calls` (tool, arguments, result text), then answers."""
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": AVERAGE.task}]
    for i, (name, args, result) in enumerate([*calls, ("complete_task", {"answer": answer}, "")]):
        call_id = f"guided_{i + 1}" if i < guided else f"c{i}"
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": name, "arguments": json.dumps(args)}}]})  # fmt: skip
        messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
    metadata = {"final_answer": answer} | ({"guided_calls": guided} if guided else {})
    return Trajectory(messages=messages, metadata=metadata)


def test_a_failed_chain_becomes_the_task_it_solved():
    # added two of the three numbers, halved the sum, and answered that: wrong for the average
    attempt = _attempt(
        ("add", {"a": 23, "b": 38}, "61"), ("divide", {"a": 61, "b": 2}, "30.5"), answer="30.5"
    )
    assert not is_success(attempt, AVERAGE)
    task = hindsight_task(attempt, AVERAGE)
    assert task is not None
    assert task.task == (
        "Call add with a = 23, b = 38. Then call divide with a = that result, b = 2. "
        "What does the last call return?"
    )
    assert task.reference.answer == "30.5" and task.answer_type == "number"
    assert [(c.tool, c.arguments, c.result) for c in task.reference.calls] == [
        ("add", {"a": 23, "b": 38}, "61"),
        ("divide", {"a": 61, "b": 2}, "30.5"),
    ]
    assert task.split == "train" and task.tags == ["hindsight", "from:avg"]
    assert is_success(attempt, task)  # the attempt is a solved example of it
    assert task_kind(task) == ("hindsight", "add", "divide") != task_kind(AVERAGE)
    # the same chain gives the same task; JSON results are read as the answer check reads them
    again = _attempt(
        ("add", {"a": 23, "b": 38}, '{"result": 61}'),
        ("divide", {"a": 61, "b": 2}, '{"result": 30.5}'),
        answer="30.5",
    )
    assert hindsight_task(again, AVERAGE).id == task.id


@pytest.mark.parametrize(
    ("calls", "answer", "guided", "why"),
    [
        ((("add", {"a": 23, "b": 38}, "61"), ("divide", {"a": 61, "b": 2}, "30.5")), "30", 0,
         "its answer is not its chain's last result"),
        ((("add", {"a": 23, "b": 38}, "61"), ("divide", {"a": 61, "b": 3}, "20.333333333333332")),
         "20.33", 0, "its answer does not check against the result as written"),
        ((("add", {"a": 23, "b": 38}, "61"), ("divide", {"a": 60, "b": 2}, "30")), "30", 0,
         "no call fed another: not a chain"),
        ((("add", {"a": 23, "b": 38}, "61"), ("add", {"a": 61, "b": 86}, "147"),
          ("divide", {"a": 147, "b": 3}, "49")), "49", 0, "it succeeded at its own task"),
        ((("add", {"a": 23, "b": 38}, "61"), ("divide", {"a": 61, "b": 2}, "30.5")), "30.5", 1,
         "the loop made its first call"),
        ((("add", {"a": 23, "b": 38}, "Error: bad"), ("divide", {"a": 61, "b": 2}, "30.5")),
         "30.5", 0, "the call it fed on failed"),
    ],
)  # fmt: skip
def test_no_task_unless_the_attempts_answer_checks(calls, answer, guided, why):
    assert hindsight_task(_attempt(*calls, answer=answer, guided=guided), AVERAGE) is None, why


def test_the_longest_chain_back_from_the_last_call_is_kept_and_tasks_are_new_and_capped():
    attempt = _attempt(
        ("multiply", {"a": 2, "b": 2}, "4"),  # fed nothing on: left out
        ("add", {"a": 23, "b": 38}, "61"),
        ("add", {"a": 61, "b": 86}, "147"),
        ("divide", {"a": 147, "b": 2}, "73.5"),
        answer="73.5",
    )
    task = hindsight_task(attempt, AVERAGE)
    assert [c.tool for c in task.reference.calls] == ["add", "add", "divide"]
    assert task.difficulty == 3
    other = _attempt(
        ("add", {"a": 23, "b": 38}, "61"), ("divide", {"a": 61, "b": 2}, "30.5"), answer="30.5"
    )
    group = TrajectoryGroup(scenario_id="avg", trajectories=[attempt, attempt, other])
    both = hindsight_tasks([group], {"avg": AVERAGE}, limit=5)
    assert [t.id for t in both] == [task.id, hindsight_task(other, AVERAGE).id]  # one per chain
    assert hindsight_tasks([group], {"avg": AVERAGE}, limit=1) == both[:1]
    assert hindsight_tasks([group], {"avg": AVERAGE}, limit=5, known=[task.id]) == both[1:]
    sampler = ScenarioSampler([AVERAGE])
    sampler.add(both + both)
    assert [s.id for s in sampler.scenarios] == ["avg", *(t.id for t in both)]


def _chains_wrong(body: dict) -> tuple[int, dict]:
    """Whatever the task: adds 2 and 3, multiplies the sum by 6, answers that (30)."""
    results = [json.loads(m["content"])["result"] for m in body["messages"] if m["role"] == "tool"]
    if not results:
        name, args = "add", {"a": 2, "b": 3}
    elif len(results) == 1:
        name, args = "multiply", {"a": results[-1], "b": 6}
    else:
        name, args = "complete_task", {"answer": results[-1]}
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{len(results)}", "type": "function",
             "function": {"name": name, "arguments": json.dumps(args)}}]},
        "finish_reason": "tool_calls",
        "token_ids": [1, 2],
        "prompt_token_ids": [3],
        "mcprl": {"model_logprobs": [-0.5, -0.5], "token_logprobs": [-0.5, -0.5]},
    }  # fmt: skip
    return 200, {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                 "choices": [choice]}  # fmt: skip


@pytest.mark.anyio
async def test_a_run_adds_its_hindsight_tasks_draws_them_and_keeps_them_for_a_resume(tmp_path):
    chain = Scenario(
        id="c", task="Add 2 and 3, then times 4.", difficulty=3,
        reference=Reference(answer="20", calls=[
            {"tool": "add", "arguments": {"a": 2, "b": 3}},
            {"tool": "multiply", "arguments": {"a": 5, "b": 4}}]),
    )  # fmt: skip
    val = chain.model_copy(update={"id": "val", "split": "val"})
    said: list[str] = []
    config = RunConfig(steps=2, groups_per_step=2, rollouts_per_group=2, oversample=1,
                       eval_every=0, reward="reference", write_report=False, explore=0,
                       hindsight=3)  # fmt: skip
    with LocalChatServer(_chains_wrong) as server:
        backend = FakeBackend(tmp_path, server.base_url)
        run = TrainingRun(config, load_example("calculator").server, backend,
                          say=said.append, progress=False)  # fmt: skip
        run.observers.append(Console(said.append))
        await run.prepare(ScenarioSet([chain, val]))
        summary = RunSummary(project="p", name="n", run_dir=str(run.run_dir), reward="reference",
                             judge=None, first_step=0, last_step=0, target_steps=2)  # fmt: skip
        await run._step(summary)
        assert [s.task for s in run.hindsight] == [
            "Call add with a = 2, b = 3. Then call multiply with a = that result, b = 6. "
            "What does the last call return?"
        ]
        assert backend.rows[-1]["train/hindsight_added"] == 1
        assert any("1 hindsight task added" in line for line in said)
        await run._step(summary)  # the new task is drawn, and the policy solves it
        drawn = {g.scenario_id for g in backend.trained[-1]}
        assert drawn == {"c", run.hindsight[0].id}
        solved = next(g for g in backend.trained[-1] if g.scenario_id == run.hindsight[0].id)
        assert all(t.metrics["success"] == 1.0 for t in solved.trajectories)
        kept = await backend.read_file(run.model, "hindsight.jsonl")
        assert [s.id for s in ScenarioSet.loads(kept, "h")] == [run.hindsight[0].id]
        again = TrainingRun(config, load_example("calculator").server, backend,
                            say=said.append, progress=False)  # fmt: skip
        await again.prepare(ScenarioSet([chain, val]))  # a resume: the task is back in the pool
        assert [s.id for s in again.sampler.scenarios] == ["c", run.hindsight[0].id]
