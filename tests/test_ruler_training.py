"""Training on RULER's scores: the judge's verdict as success, its spending, its budget, its
two passes and hints; with a scripted policy and a scripted judge in place of models."""

from __future__ import annotations

import re

import pytest

from mcprl.cli._display import EXIT_BUDGET, exit_code, print_summary
from mcprl.curriculum import ScenarioSampler
from mcprl.rewards import Reward, is_informative
from mcprl.scenarios import Scenario, ScenarioSet
from mcprl.train import RunConfig, TrainingRun
from mcprl.types import Trajectory, TrajectoryGroup
from ruler import Judge
from tests.fakes import FakeBackend
from tests.helpers import LocalChatServer, ScriptedJudge, by_content, chat_completion, load_example
from tests.test_curriculum import _policy, _scenario


def _judged(sid: str, scores: list[float], success: list[float] | None = None) -> TrajectoryGroup:
    """A group scored by the judge alone; `success`: the reference check, where known."""
    return TrajectoryGroup(
        scenario_id=sid,
        trajectories=[
            Trajectory(
                reward=s,
                metrics={"reward_ruler": s, "judged_success": float(s >= 0.5)}
                | ({"success": success[i]} if success else {}),
            )
            for i, s in enumerate(scores)
        ],
    )


def test_with_ruler_alone_a_group_trains_when_the_judge_says_one_attempt_succeeded():
    by = Reward.of("ruler").informative("success")
    assert by == "judged"
    assert Reward.of("reference").informative("success") == "success"
    assert Reward.of("ruler").informative("reward") == "reward"
    assert is_informative(_judged("a", [0.9, 0.1]), by)
    # partial credit alone (no attempt judged a success) teaches nothing, as with references
    assert not is_informative(_judged("a", [0.3, 0.1, 0.05]), by)
    # the judge decides, even where the reference check says otherwise
    assert is_informative(_judged("a", [0.9, 0.1], success=[0.0, 0.0]), by)
    assert not is_informative(_judged("a", [0.3, 0.1], success=[1.0, 0.0]), by)


def test_without_references_the_sampler_and_exploration_go_by_the_judges_verdict():
    free = [
        Scenario(id=f"f{i}", task=f"Greet user {i}.", split="train", difficulty=1) for i in range(2)
    ]
    sampler = ScenarioSampler(free, informative="judged")
    sampler.observe([_judged("f0", [0.3, 0.1])])
    assert sampler.stats["f0"].successes == 0
    assert sampler.unsolved(free[0])  # tried, never judged a success: explore it
    sampler.observe([_judged("f0", [0.9, 0.1])])
    assert sampler.stats["f0"].successes == 1 and sampler.stats["f0"].informative == 1
    assert not sampler.unsolved(free[0])
    by_reference = ScenarioSampler(free, informative="success")
    by_reference.observe([_judged("f0", [0.3, 0.1])])
    assert not by_reference.unsolved(free[0])  # no reference, no verdict: success unknown


def _scored_by_answer(kwargs: dict) -> dict:
    """A judge that scores an attempt answering 5 at 0.9, any other at 0.1, with usage."""
    reply = by_content(lambda body: 0.9 if '\\"answer\\": 5' in body else 0.1)(kwargs)
    return chat_completion(reply)


def _run(tmp_path, judge: Judge, **settings) -> tuple[TrainingRun, ScenarioSet]:
    scenarios = ScenarioSet([_scenario(f"mixed{i}") for i in range(3)] + [_scenario("val")])
    for s in scenarios.scenarios:
        s.split = "val" if s.id == "val" else "train"
    config = RunConfig(
        **{"groups_per_step": 1, "rollouts_per_group": 2, "oversample": 1, "eval_every": 0,
           "reward": "ruler", "write_report": False, **settings}
    )  # fmt: skip
    run = TrainingRun(config, load_example("calculator").server, FakeBackend(tmp_path, ""),
                      say=lambda _: None, progress=False, reward=judge)  # fmt: skip
    return run, scenarios


def _policy_checked_first(body: dict) -> tuple[int, dict]:  # the token-data check: 1 message
    messages = body["messages"]
    return _policy({**body, "messages": [*messages, *messages][:2]})


@pytest.mark.anyio
async def test_the_budget_stops_the_run_before_the_judge_spends_more_and_keeps_the_last_step(
    tmp_path, capsys
):
    # 120 tokens a call at $1,000 per million: $0.12 a judged group (one per step or evaluation)
    fn = ScriptedJudge(chat_completion("OK"), _scored_by_answer)
    judge = Judge("openai/mine", completion_fn=fn, cache=False, price=(1000.0, 1000.0))
    run, scenarios = _run(tmp_path, judge, steps=5, judge_budget=0.40)
    with LocalChatServer(_policy_checked_first) as policy:
        run.backend.base_url = policy.base_url
        await run.prepare(scenarios)
        summary = await run.run()
    # eval 0 ($0.12), step 1 ($0.24), step 2 ($0.36); step 3 would pass $0.40
    assert summary.last_step == 2 and summary.stopped is not None
    assert "`judge_budget`" in summary.stopped and "step 2 saved" in summary.stopped
    assert await run.backend.list_checkpoints(run.model) == [0, 1, 2]
    rows = await run.backend.history(run.model)
    steps = [r for r in rows if "judge/tokens" in r]
    assert [r["judge/cost_usd"] for r in steps] == pytest.approx([0.12, 0.12])
    assert steps[-1]["judge/total_cost_usd"] == pytest.approx(0.36)
    assert rows[0]["val/judge_cost_usd"] == pytest.approx(0.12)
    assert summary.judge_spent == pytest.approx({"tokens": 360.0, "cost_usd": 0.36})
    assert exit_code(summary) == EXIT_BUDGET
    print_summary(summary, "mcprl train x --judge-budget 0.4")
    out = capsys.readouterr().out
    assert "judge: 360 tokens, $0.3600" in out
    assert "--judge-budget" in out and "resume: mcprl train x" in out


@pytest.mark.anyio
async def test_a_budget_needs_a_price(tmp_path):
    from mcprl.errors import PreflightError

    judge = Judge("openai/unpriced", completion_fn=ScriptedJudge(chat_completion("OK")))
    run, scenarios = _run(tmp_path, judge, steps=1, judge_budget=1.0)
    with pytest.raises(PreflightError, match="`judge_price`"):
        await run.prepare(scenarios)


@pytest.mark.anyio
async def test_two_passes_record_their_agreement_and_a_hint_shows_the_reference(tmp_path):
    fn = ScriptedJudge(chat_completion("OK"), _scored_by_answer)
    judge = Judge("openai/mine", completion_fn=fn, cache=False, passes=2)
    run, scenarios = _run(tmp_path, judge, steps=1, judge_hint=True)
    with LocalChatServer(_policy_checked_first) as policy:
        run.backend.base_url = policy.base_url
        await run.prepare(scenarios)
        await run.run()
    rows = await run.backend.history(run.model)
    step = next(r for r in rows if r["step"] == 1 and "judge/tokens" in r)
    assert step["judge/calls"] == 2  # one group, judged twice
    assert step["train/judge_agreement"] == pytest.approx(1.0)  # a consistent judge
    assert "judge/cost_usd" not in step  # no price known: tokens only
    prompts = [r["messages"][1]["content"] for r in fn.requests[1:]]
    hint = re.search(r"<hint_\w+>\n(.*?)</hint_", prompts[0], re.S).group(1)
    assert "answer: 5" in hint and "not seen by the agents" in hint
