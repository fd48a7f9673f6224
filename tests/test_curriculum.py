"""Steps that carry signal: the scenario sampler, and dynamic sampling in the training loop.

The policy is a scripted OpenAI-compatible endpoint on loopback and the backend a recording
double, so these run in seconds: what is checked is which scenarios a step draws and trains on.
"""

from __future__ import annotations

import json

import pytest

from mcprl.cli._display import _own_attempts
from mcprl.console import Console
from mcprl.curriculum import ScenarioSampler, example_scenarios, is_informative
from mcprl.mcp import ToolInfo
from mcprl.report import write_report
from mcprl.scenarios import Reference, ReferenceCall, Scenario, ScenarioSet
from mcprl.train import RunConfig, TrainingRun
from mcprl.types import Trajectory, TrajectoryGroup
from tests.fakes import FakeBackend, scripted_config
from tests.helpers import LocalChatServer, load_example, solved_scenario


def _scenario(sid: str, difficulty: int = 1, answer: str = "5") -> Scenario:
    return Scenario(
        id=sid,
        task=f"Task {sid}: add 2 and 3.",
        difficulty=difficulty,
        reference=Reference(answer=answer),
    )


def _group(sid: str, rewards: list[float]) -> TrajectoryGroup:
    return TrajectoryGroup(
        scenario_id=sid,
        trajectories=[Trajectory(reward=r, metrics={"success": float(r >= 1)}) for r in rewards],
    )


def test_a_group_is_informative_only_when_its_rewards_differ():
    assert is_informative(_group("a", [1.0, 0.0]))
    assert not is_informative(_group("a", [0.3, 0.3, 0.3]))
    assert not is_informative(_group("a", [1.0]))


def _partial(sid: str, rewards: list[float], solved: int = 0) -> TrajectoryGroup:
    """A group whose first `solved` attempts succeeded; the others earned partial credit."""
    return TrajectoryGroup(
        scenario_id=sid,
        trajectories=[
            Trajectory(reward=1.0 if i < solved else r, metrics={"success": float(i < solved)})
            for i, r in enumerate(rewards)
        ],
    )


def test_by_success_a_group_needs_a_success_and_a_failure():
    partial_only = _partial("a", [0.25, 0.1, 0.0])  # right tool, wrong numbers; nothing solved
    assert is_informative(partial_only)
    assert not is_informative(partial_only, by="success")
    assert is_informative(_partial("a", [0.0, 0.25, 0.0], solved=1), by="success")
    assert not is_informative(_partial("a", [0.0, 0.0], solved=2), by="success")
    unmarked = TrajectoryGroup(trajectories=[Trajectory(reward=0.4), Trajectory(reward=0.6)])
    assert is_informative(unmarked, by="success")  # no reference answer: the rewards decide
    assert not is_informative(_group("a", [0.3, 0.3]), by="success")


def test_by_success_a_kind_never_solved_stops_being_drawn_whatever_its_partial_credit():
    adds = [_kinded(f"add{i}", "add") for i in range(4)]
    chains = [_kinded(f"chain{i}", "multiply") for i in range(4)]  # never solved
    samplers = {by: ScenarioSampler(adds + chains, seed=0, informative=by)
                for by in ("reward", "success")}  # fmt: skip
    for sampler in samplers.values():
        for i in range(4):
            sampler.observe([_partial(f"add{i}", [0.0] * 4, solved=2)])
            sampler.observe([_partial(f"chain{i}", [0.25, 0.1, 0.0, 0.0])] * 2)
    by_reward, by_success = samplers["reward"], samplers["success"]
    assert by_reward.weight(chains[0]) > 0.8  # it "differs" every time
    assert by_success.weight(chains[0]) < 0.2  # only the prior is left of it
    assert by_success.weight(adds[0]) > 0.8


def test_the_sampler_starts_easy_and_leaves_scenarios_that_stopped_teaching():
    scenarios = [_scenario(f"e{i}", 1) for i in range(4)] + [
        _scenario(f"h{i}", 5) for i in range(4)
    ]
    sampler = ScenarioSampler(scenarios, seed=0, mode="curriculum")
    first = [s.id for step in range(1, 41) for s in sampler.draw(2, step=step)]
    easy = sum(sid.startswith("e") for sid in first)
    assert easy > 0.65 * len(first)  # prior 0.8 vs 0.2: easy tasks come first

    for _ in range(6):  # the easy ones are now always solved: ties, no signal
        sampler.observe([_group(f"e{i}", [1.0, 1.0, 1.0]) for i in range(4)])
        sampler.observe([_group(f"h{i}", [1.0, 0.0, 0.0]) for i in range(4)])
    later = [s.id for step in range(41, 81) for s in sampler.draw(2, step=step)]
    assert sum(sid.startswith("h") for sid in later) > 0.7 * len(later)
    assert sampler.summary()["scenarios_always_solved"] == 4


def test_draws_are_distinct_seeded_and_exclude_what_was_drawn():
    sampler = ScenarioSampler([_scenario(f"s{i}") for i in range(6)], seed=3)
    batch = sampler.draw(4, step=2)
    assert len({s.id for s in batch}) == 4
    assert [s.id for s in batch] == [s.id for s in sampler.draw(4, step=2)]  # resume repeats it
    rest = sampler.draw(4, step=2, round_index=4, exclude=[s.id for s in batch])
    assert len(rest) == 2 and not {s.id for s in rest} & {s.id for s in batch}
    uniform = ScenarioSampler([_scenario("a", 1), _scenario("b", 5)], mode="uniform")
    assert uniform.weight(uniform.scenarios[0]) == uniform.weight(uniform.scenarios[1])
    with pytest.raises(ValueError, match="'random': choose one of fresh, curriculum, uniform"):
        ScenarioSampler(uniform.scenarios, mode="random")


def test_a_step_draws_kinds_of_task_by_weight_and_seldom_repeats_one():
    def kind(sid: str, *tools: str) -> Scenario:
        calls = [ReferenceCall(tool=t, arguments={}) for t in tools]
        return Scenario(
            id=sid, task=sid, difficulty=1, reference=Reference(answer="1", calls=calls)
        )

    adds = [kind(f"add{i}", "add") for i in range(8)]
    others = [kind("mul", "multiply"), kind("avg", "add", "add", "divide")]
    sampler = ScenarioSampler(adds + others, seed=0, mode="curriculum")
    steps = [sampler.draw(3, step=step) for step in range(1, 201)]
    per_step = [sum(s.id.startswith("add") for s in drawn) for drawn in steps]
    # 8 of 10 scenarios are adds; drawn as scenarios, 2.4 a step would be
    assert sum(per_step) / len(per_step) < 1.3
    assert per_step.count(3) < 10
    again = sampler.draw(2, step=1, round_index=1, exclude=["mul", "avg", "add0"])
    assert [s.id.startswith("add") for s in again] == [True, True]  # only adds are left
    sampler = ScenarioSampler([*adds, others[0]], seed=0, mode="curriculum")
    redraws = [sampler.draw(1, step=step, round_index=1, exclude=["add0"])[0].id
               for step in range(1, 101)]  # fmt: skip
    assert redraws.count("mul") > 70  # an add tied this step: another kind first


def test_a_step_does_not_spend_its_draws_on_kinds_that_stopped_teaching():
    subs = [_kinded(f"sub{i}", "subtract") for i in range(6)]
    dead = [_kinded(f"chain{i}", f"tool{i}", difficulty=3) for i in range(4)]  # never solved
    sampler = ScenarioSampler(subs + dead, seed=0, informative="success")
    for _ in range(10):
        sampler.observe([_group(s.id, [0.0] * 4) for s in dead])
    per_step = [sum(s.id.startswith("sub") for s in sampler.draw(4, step=step))
                for step in range(1, 101)]  # fmt: skip
    # one draw per kind first would take one subtraction and three dead kinds every step
    assert sum(per_step) / len(per_step) > 1.8


def _kinded(sid: str, tool: str, difficulty: int = 1) -> Scenario:
    call = ReferenceCall(tool=tool, arguments={})
    return Scenario(
        id=sid, task=sid, difficulty=difficulty, reference=Reference(answer="1", calls=[call])
    )


def test_fresh_sampling_draws_a_kinds_unseen_scenarios_before_repeating_one():
    powers = [_kinded(f"pow{i}", "power") for i in range(5)]
    sampler = ScenarioSampler(powers, seed=0, mode="fresh")
    seen = []
    for step in range(1, 6):  # the policy half-solves each: per scenario, it would be drawn again
        (drawn,) = sampler.draw(1, step=step)
        seen.append(drawn.id)
        sampler.observe([_group(drawn.id, [1.0, 0.0, 0.0])])
    assert sorted(seen) == [s.id for s in powers]  # five steps, five different power tasks

    by_scenario = ScenarioSampler(powers, seed=0, mode="curriculum")
    by_scenario.observe([_group("pow0", [1.0, 0.0])] * 3)
    assert by_scenario.weight(powers[0]) > by_scenario.weight(powers[1])  # the repeat is favoured


@pytest.mark.parametrize("redraw", [0, 1])
def test_a_task_missed_at_a_solved_kind_is_drawn_again_before_fresh_ones(redraw):
    powers = [_kinded(f"pow{i}", "power") for i in range(6)]
    sampler = ScenarioSampler(powers, seed=0, mode="fresh", redraw=redraw)
    seen: list[str] = []
    for step in range(1, 6):  # the second task drawn is never solved, every other one is
        (drawn,) = sampler.draw(1, step=step)
        seen.append(drawn.id)
        sampler.observe([_group(drawn.id, [0.0, 0.0] if seen[1:2] == [drawn.id] else [1.0, 0.0])])
    missed = seen[1]
    if redraw:  # back at the next draw of its kind, and no more than once
        assert seen[2] == missed and seen.count(missed) == 2
    else:  # five draws, five tasks: it never comes back
        assert len(set(seen)) == 5
    unsolved_kind = ScenarioSampler(powers, seed=0, mode="fresh", redraw=1)
    unsolved_kind.observe([_group("pow1", [0.0, 0.0])])
    assert unsolved_kind.draw(1, step=2)[0].id != "pow1"  # its kind explores instead


def test_fresh_sampling_draws_a_grounded_kinds_answers_evenly():
    def asked(sid: str, answer: str, tags: tuple[str, ...] = ("grounded", "exists")) -> Scenario:
        call = ReferenceCall(tool="git_log", arguments={})
        ref = Reference(answer=answer, calls=[call])
        return Scenario(id=sid, task=f"Is there a commit {sid}?", difficulty=1, reference=ref,
                        tags=list(tags))  # fmt: skip

    def answers(scenarios: list[Scenario]) -> list[str]:
        sampler, said = ScenarioSampler(scenarios, seed=0, mode="fresh"), []
        for step in range(1, 9):
            (drawn,) = sampler.draw(1, step=step)
            said.append(drawn.reference.answer)
            sampler.observe([_group(drawn.id, [1.0, 0.0])])
        return said

    # three of the four questions are answered no: "no" to everything would be right 3 times in 4
    questions = [asked("a", "no"), asked("b", "No"), asked("c", "no"), asked("d", "yes")]
    assert answers(questions).count("yes") == 4  # of 8 draws: the answers come up evenly
    # a written task set (no question kind) draws its tasks evenly, whatever their answers
    written = [asked(s.id, s.reference.answer, tags=()) for s in questions]
    assert answers(written).count("yes") == 2


def test_fresh_sampling_estimates_informativeness_per_kind():
    scenarios = [_kinded(f"add{i}", "add") for i in range(4)] + [
        _kinded(f"root{i}", "root", difficulty=5) for i in range(4)
    ]
    sampler = ScenarioSampler(scenarios, seed=0, mode="fresh")
    for i in range(2):  # two adds always solved: every add, seen or not, stops looking easy
        sampler.observe([_group(f"add{i}", [1.0, 1.0, 1.0])] * 3)
    sampler.observe([_group("root0", [1.0, 0.0, 0.0])])
    unseen_add, unseen_root = scenarios[3], scenarios[7]
    assert sampler.weight(unseen_add) < sampler.weight(unseen_root)
    adds = ScenarioSampler(scenarios[:4], seed=0, mode="fresh")
    adds.observe([_group("add0", [1.0, 0.0])])
    for step in range(1, 21):  # add0 was drawn: the other three come first, every time
        assert "add0" not in [s.id for s in adds.draw(3, step=step)]


def test_the_estimate_follows_what_the_policy_does_now():
    divides = [_kinded(f"div{i}", "divide") for i in range(8)]
    recent, counted = ScenarioSampler(divides, seed=0), ScenarioSampler(divides, decay=1.0)
    for sampler in (recent, counted):
        for i in range(3):  # it taught at first...
            sampler.observe([_group(f"div{i}", [1.0, 0.0, 0.0])])
        for i in range(3, 6):  # ...and now every attempt solves it
            sampler.observe([_group(f"div{i}", [1.0, 1.0, 1.0])])
    assert recent.weight(divides[7]) < 0.2
    assert counted.weight(divides[7]) > 0.5  # plain counts remember the first three
    for i in range(6, 8):  # and when it starts to teach again, it is drawn again
        recent.observe([_group(f"div{i}", [1.0, 0.0, 0.0])])
    assert recent.weight(divides[0]) > 0.6
    with pytest.raises(ValueError, match="decay=0: it must be in"):
        ScenarioSampler(divides, decay=0)
    with pytest.raises(ValueError, match=r"repeat_kind=1\.5: it must be in"):
        ScenarioSampler(divides, repeat_kind=1.5)


# -- dynamic sampling in the loop, with a scripted policy ------------------------------------


def _policy(body: dict) -> tuple[int, dict]:
    """Solves `mixed` tasks on odd seeds only; answers `tie` tasks wrong every time."""
    task = body["messages"][1]["content"]
    answer = 5 if "mixed" in task and body.get("seed", 0) // 1000 % 2 else 7
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "complete_task", "arguments": json.dumps({"answer": answer})},
    }
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": None, "tool_calls": [call]},
        "finish_reason": "tool_calls",
        "token_ids": [1, 2],
        "prompt_token_ids": [3],
        "mcprl": {"model_logprobs": [-0.5, -0.5], "token_logprobs": [-0.5, -0.5]},
    }
    return 200, {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                 "choices": [choice]}  # fmt: skip


async def _step_of_ties_and_mixed(tmp_path, policy=_policy, informative="reward", mixed=2,
                                  make=_scenario, say=lambda _: None):  # fmt: skip
    """One training step over 6 scenarios the policy fails and `mixed` it solves half the time."""
    tie = [make(f"tie{i}") for i in range(6)]
    scenarios = ScenarioSet([*tie, *[make(f"mixed{i}") for i in range(mixed)], make("val")])
    for s in scenarios.scenarios:
        s.split = "val" if s.id == "val" else "train"
    calculator = load_example("calculator").server
    with LocalChatServer(policy) as server:
        backend = FakeBackend(tmp_path, server.base_url)
        config = scripted_config(steps=1, groups_per_step=2, rollouts_per_group=2, oversample=4)
        config.train.informative = informative
        run = TrainingRun(config, calculator, backend, say=say, progress=False,
                          observers=[Console(say)])  # fmt: skip
        await run.prepare(scenarios)
        await run._step(summary := _summary(run))
    return backend, summary


@pytest.mark.anyio
async def test_tied_groups_are_replaced_within_the_oversampling_budget(tmp_path):
    backend, run_summary = await _step_of_ties_and_mixed(tmp_path)
    (groups,) = backend.trained
    informative = [g for g in groups if is_informative(g)]
    # both `mixed` scenarios were found and trained, however many ties were drawn first
    assert sorted(g.scenario_id for g in informative) == ["mixed0", "mixed1"]
    row = backend.rows[0]
    assert row["train/groups_trained"] == 2
    assert row["train/groups_drawn"] == len(groups) <= 8
    assert row["train/groups_tied"] == len(groups) - 2
    # every `tie` scenario drawn is counted as never solved, and no `mixed` one is
    assert row["train/scenarios_never_solved"] == len(groups) - 2
    assert run_summary.steps_without_update == 0


def _with_call(sid: str) -> Scenario:
    """Add 2 and 3, with the reference call: an attempt that makes it earns partial credit."""
    call = ReferenceCall(tool="add", arguments={"a": 2, "b": 3})
    return Scenario(id=sid, task=f"Task {sid}: add 2 and 3.", difficulty=1,
                    reference=Reference(answer="5", calls=[call]))  # fmt: skip


def _caller(body: dict) -> tuple[int, dict]:
    """Calls `add(2, 3)` on odd seeds and `multiply(2, 3)` on even ones, then answers: the
    result on `mixed` tasks (right after `add`), 7 on `tie` tasks (never right, but the `add`
    callers earn the reference call's credit)."""
    status, reply = _policy(body)
    call = reply["choices"][0]["message"]["tool_calls"][0]["function"]
    results = [m["content"] for m in body["messages"] if m["role"] == "tool"]
    if not results:
        call["name"] = "add" if body.get("seed", 0) // 1000 % 2 else "multiply"
        call["arguments"] = json.dumps({"a": 2, "b": 3})
    elif "mixed" in body["messages"][1]["content"]:
        call["arguments"] = json.dumps({"answer": json.loads(results[-1])["result"]})
    return status, reply


@pytest.mark.anyio
async def test_by_success_groups_with_no_success_are_redrawn_and_not_trained(tmp_path):
    backend, _ = await _step_of_ties_and_mixed(tmp_path, _caller, "success", make=_with_call)
    (groups,) = backend.trained
    assert backend.configs[0].informative == "success"  # the trainer skips them too
    assert all(is_informative(g) for g in groups)  # every group differs by partial credit
    assert sorted(g.scenario_id for g in groups if is_informative(g, "success")) == [
        "mixed0",
        "mixed1",
    ]
    assert backend.rows[0]["train/groups_trained"] == 2
    assert backend.rows[0]["train/groups_tied"] == len(groups) - 2


@pytest.mark.anyio
async def test_by_success_a_step_of_partial_credit_alone_says_it_made_no_update(tmp_path):
    said: list[str] = []
    backend, summary = await _step_of_ties_and_mixed(
        tmp_path, _caller, "success", mixed=0, make=_with_call, say=said.append
    )
    assert all(is_informative(g) for g in backend.trained[0])
    assert backend.rows[0]["train/groups_trained"] == 0
    assert summary.steps_without_update == 1
    assert "; no update: no group had both a success and a failure" in said[-1]


@pytest.mark.anyio
async def test_a_step_whose_groups_all_tie_says_it_made_no_update(tmp_path):
    scenarios = ScenarioSet([_scenario(f"tie{i}") for i in range(4)] + [_scenario("tv")])
    for s in scenarios.scenarios:
        s.split = "val" if s.id == "tv" else "train"
    calculator = load_example("calculator").server
    said: list[str] = []
    with LocalChatServer(_policy) as policy:
        backend = FakeBackend(tmp_path, policy.base_url)
        config = scripted_config(steps=1, groups_per_step=2, rollouts_per_group=2, oversample=1.5)
        config.train.informative = "reward"
        run = TrainingRun(config, calculator, backend, say=said.append, progress=False,
                          observers=[Console(said.append)])  # fmt: skip
        await run.prepare(scenarios)
        summary = _summary(run)
        await run._step(summary)
    assert backend.rows[0]["train/groups_drawn"] == 3  # 2 × 1.5: the budget holds
    assert backend.rows[0]["train/groups_trained"] == 0
    assert summary.steps_without_update == 1
    assert "; no update: no group had differing rewards" in said[-2]
    assert said[-1].startswith("  warning: every attempt of this step scored")


@pytest.mark.anyio
async def test_a_default_run_draws_each_task_of_a_kind_before_repeating_one(tmp_path):
    call = ReferenceCall(tool="add", arguments={"a": 2, "b": 3})
    mixed = [
        Scenario(id=f"mixed{i}", task=f"mixed {i}: add 2 and 3.", split="train", difficulty=1,
                 reference=Reference(answer="5", calls=[call]))
        for i in range(3)
    ]  # fmt: skip
    scenarios = ScenarioSet([*mixed, _scenario("val")])
    scenarios.scenarios[-1].split = "val"
    calculator = load_example("calculator").server
    with LocalChatServer(_policy) as policy:
        backend = FakeBackend(tmp_path, policy.base_url)
        config = RunConfig(steps=3, groups_per_step=1, rollouts_per_group=2, eval_every=0,
                           reward="reference", write_report=False)  # fmt: skip
        assert config.sampling == "fresh"
        run = TrainingRun(config, calculator, backend, say=lambda _: None, progress=False)
        await run.prepare(scenarios)
        summary = _summary(run)
        for _ in range(3):
            await run._step(summary)
    drawn = [g.scenario_id for groups in backend.trained for g in groups]
    assert sorted(drawn) == ["mixed0", "mixed1", "mixed2"]  # each group differed, none repeated


def _two_train_one_val() -> ScenarioSet:
    """Train tasks tie0 and tie1, val task tv."""
    scenarios = ScenarioSet([_scenario(f"tie{i}") for i in range(2)] + [_scenario("tv")])
    for s in scenarios.scenarios:
        s.split = "val" if s.id == "tv" else "train"
    return scenarios


def _summary(run: TrainingRun):
    from mcprl.train import RunSummary

    return RunSummary(project="p", name="n", run_dir=str(run.run_dir), reward=run.reward.name,
                      judge=None, first_step=0, last_step=0, target_steps=1)  # fmt: skip


@pytest.mark.anyio
async def test_a_run_trains_on_a_reward_function_of_the_users(tmp_path):
    scenarios = _two_train_one_val()
    calculator = load_example("calculator").server

    async def by_position(group: TrajectoryGroup) -> list[float]:
        return [float(i) for i in range(len(group.trajectories))]

    said: list[str] = []
    with LocalChatServer(_policy) as policy:
        backend = FakeBackend(tmp_path, policy.base_url)
        config = RunConfig(steps=1, groups_per_step=2, rollouts_per_group=2, oversample=1,
                           eval_every=0, write_report=False)  # fmt: skip
        run = TrainingRun(config, calculator, backend, say=said.append, progress=False,
                          reward=by_position)  # fmt: skip
        await run.prepare(scenarios)
        await run._step(_summary(run))
        assert run.reward.name == "custom" and "  reward: custom" in said
        assert run.informative == "reward"  # success decides only with a reference reward
        (groups,) = backend.trained  # every group differs now: both trained
        assert [sorted(g.rewards) for g in groups] == [[0.0, 1.0], [0.0, 1.0]]

        run = TrainingRun(config.model_copy(update={"name": "bad"}), calculator, backend,
                          say=said.append, progress=False, reward=lambda g: [1.0])  # fmt: skip
        await run.prepare(scenarios)
        with pytest.raises(ValueError, match="returned 1 values for a group of 2 attempts"):
            await run._step(_summary(run))


@pytest.mark.anyio
async def test_a_decaying_schedule_lowers_the_learning_rate_of_each_step(tmp_path):
    scenarios = _two_train_one_val()

    async def by_position(group: TrajectoryGroup) -> list[float]:
        return [float(i) for i in range(len(group.trajectories))]

    with LocalChatServer(_policy) as policy:
        backend = FakeBackend(tmp_path, policy.base_url)
        config = RunConfig(steps=4, groups_per_step=1, rollouts_per_group=2, eval_every=0,
                           lr_schedule="linear", write_report=False)  # fmt: skip
        config.train.learning_rate = 2e-3
        run = TrainingRun(config, load_example("calculator").server, backend,
                          say=lambda _: None, progress=False, reward=by_position)  # fmt: skip
        await run.prepare(scenarios)
        for _ in range(4):
            await run._step(_summary(run))
    assert [c.learning_rate for c in backend.configs] == pytest.approx([2e-3, 1.5e-3, 1e-3, 5e-4])
    assert config.train.learning_rate == 2e-3  # the run's own setting is left as given


@pytest.mark.anyio
async def test_lr_by_signal_shrinks_a_step_where_few_groups_trained(tmp_path):
    scenarios = _two_train_one_val()

    async def one_differs(group: TrajectoryGroup) -> list[float]:
        n = len(group.trajectories)
        return [0.0] * n if group.scenario_id == "tie0" else [float(i) for i in range(n)]

    rates = {}
    for by_signal in (False, True):
        with LocalChatServer(_policy) as policy:
            backend = FakeBackend(tmp_path / str(by_signal), policy.base_url)
            config = RunConfig(steps=1, groups_per_step=2, rollouts_per_group=2, oversample=1,
                               eval_every=0, lr_schedule="constant", lr_by_signal=by_signal,
                               write_report=False)  # fmt: skip
            run = TrainingRun(config, load_example("calculator").server, backend,
                              say=lambda _: None, progress=False, reward=one_differs)  # fmt: skip
            await run.prepare(scenarios)
            await run._step(_summary(run))
        assert backend.rows[-1]["train/groups_trained"] == 1  # of the 2 the step asked for
        rates[by_signal] = backend.configs[-1].learning_rate
    assert rates[False] == pytest.approx(2e-3)
    assert rates[True] == pytest.approx(1e-3)  # half the groups trained: half the step


def test_learning_rate_schedules():
    from mcprl.train import scheduled_lr

    assert [scheduled_lr(1.0, "constant", s, 4) for s in (1, 4, 9)] == [1.0, 1.0, 1.0]
    assert [scheduled_lr(1.0, "linear", s, 4) for s in (1, 2, 3, 4)] == [1.0, 0.75, 0.5, 0.25]
    cosine = [scheduled_lr(1.0, "cosine", s, 4) for s in (1, 2, 3, 4)]
    assert cosine[0] == 1.0 and cosine[2] == pytest.approx(0.5) and 0 < cosine[3] < 0.25
    assert scheduled_lr(1.0, "linear", 7, 4) == 0.0  # past the end: no update left to make
    with pytest.raises(ValueError, match="unknown learning-rate schedule 'step'"):
        scheduled_lr(1.0, "step", 1, 4)


@pytest.mark.anyio
async def test_a_judge_given_to_the_run_is_the_one_that_ranks(tmp_path):
    from ruler import Judge
    from tests.helpers import ScriptedJudge, by_content

    scenarios = _two_train_one_val()
    for s in scenarios.scenarios:
        s.reference = None
    judge = Judge("openai/mine", completion_fn=ScriptedJudge("OK", by_content(len)), cache=False)
    with LocalChatServer(_policy) as policy:
        backend = FakeBackend(tmp_path, policy.base_url)
        config = RunConfig(steps=1, groups_per_step=1, rollouts_per_group=2, oversample=1,
                           eval_every=0, write_report=False)  # fmt: skip
        run = TrainingRun(config, load_example("calculator").server, backend,
                          say=lambda _: None, progress=False, reward=judge)  # fmt: skip
        await run.prepare(scenarios)
        assert run.reward.name == "ruler" and run.judge is judge


# -- exploration: kinds of task the policy never solves -------------------------------------


def _stuck_on_multiply(body: dict) -> tuple[int, dict]:
    """Calls multiply(2, 3) first, or the tool a named tool_choice names; then answers with
    that call's result."""
    status, reply = _policy(body)
    call = reply["choices"][0]["message"]["tool_calls"][0]["function"]
    results = [m["content"] for m in body["messages"] if m["role"] == "tool"]
    if not results:
        choice = body.get("tool_choice")
        named = choice["function"]["name"] if choice and choice.get("type") == "function" else None
        call["name"] = named or "multiply"
        # pinned arguments (mcprl's engine: a demonstration) are the call's, else its habit
        call["arguments"] = json.dumps(choice["function"].get("arguments") or {"a": 2, "b": 3}
                                       if named else {"a": 2, "b": 3})  # fmt: skip
    else:
        try:
            call["arguments"] = json.dumps({"answer": json.loads(results[-1])["result"]})
        except (ValueError, KeyError, TypeError):  # a tool that takes other arguments
            call["arguments"] = json.dumps({"answer": 0})
    return status, reply


def test_a_kind_is_unsolved_until_an_attempt_of_the_policys_own_choosing_solves_it():
    adds = [_with_call(f"add{i}") for i in range(2)]
    sampler = ScenarioSampler([*adds, _scenario("no-calls")])
    assert not sampler.unsolved(adds[0])  # never tried: nothing to explore yet
    failed = _group("add0", [0.0, 0.0])
    sampler.observe([failed])
    assert sampler.unsolved(adds[1])  # the kind, not the scenario
    explored = _group("add0", [1.0, 0.0])
    explored.trajectories[0].metadata["first_tool"] = "add"  # solved where the loop chose
    sampler.observe([explored])
    assert sampler.unsolved(adds[0])
    sampler.observe([_group("add1", [1.0, 0.0])])
    assert not sampler.unsolved(adds[0])
    no_reference = Scenario(id="free", task="Say hello.", split="train", difficulty=1)
    free = ScenarioSampler([no_reference])
    free.observe([_group("free", [0.0, 0.0])])
    assert not free.unsolved(no_reference)  # success is unknown there: no exploration


def _sql(sid: str, asks: str) -> Scenario:
    """A generated question through `read_query`: the SQL differs, the tool does not."""
    call = ReferenceCall(tool="read_query", arguments={"query": f"SELECT {sid}"})
    return Scenario(id=sid, task=f"Question {sid}?", difficulty=1,
                    reference=Reference(answer="3", calls=[call], needs_calls=True),
                    tags=["grounded", asks, "read_query"])  # fmt: skip


def test_a_solved_count_leaves_a_lookup_through_the_same_tool_unsolved():
    count, lookup = _sql("count", "count"), _sql("lookup", "lookup")
    sampler = ScenarioSampler([count, lookup])
    sampler.observe([_group("lookup", [0.0, 0.0]), _group("count", [1.0, 0.0])])
    assert sampler.unsolved(lookup)  # it still gets exploration and demonstrations
    assert not sampler.unsolved(count)
    # two kinds: a step of two draws takes one of each
    assert {s.id for s in sampler.draw(2, step=1)} == {"count", "lookup"}


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("explore", "hidden"), [(1.0, []), (0.0, []), (1.0, ["divide"]), (0.15, [])]
)
async def test_a_kind_the_policy_never_solves_gets_attempts_that_start_with_other_tools(
    tmp_path, explore, hidden
):
    """The policy always multiplies; the task needs `add`. Once a group of the kind failed, the
    next one's attempts each start with a different tool, so `add` is tried and succeeds; a
    tool the agent is not offered (`hidden_tools`) is never one of them."""
    scenarios = ScenarioSet([_with_call("add0"), _with_call("add1"), _scenario("val")])
    scenarios.scenarios[-1].split = "val"
    calculator = load_example("calculator").server
    said: list[str] = []
    with LocalChatServer(_stuck_on_multiply) as server:
        backend = FakeBackend(tmp_path, server.base_url)
        config = RunConfig(steps=2, groups_per_step=1, rollouts_per_group=7, oversample=1,
                           eval_every=0, reward="reference", write_report=False,
                           explore=explore, demonstrate=0)  # fmt: skip
        run = TrainingRun(config, calculator, backend, say=said.append, progress=False,
                          observers=[Console(said.append)])  # fmt: skip
        await run.prepare(scenarios)
        run.config.rollout.hidden_tools = hidden
        summary = _summary(run)
        await run._step(summary)
        await run._step(summary)
    first, second = backend.trained
    assert [t.metadata.get("first_tool") for t in first[0].trajectories] == [None] * 7
    assert backend.rows[0]["train/attempts_explored"] == 0
    solved = [t.metadata.get("first_tool") for t in second[0].trajectories if t.reward == 1.0]
    assert "train/own_attempts" not in backend.rows[0]  # every attempt was the policy's own
    if explore == 0:
        assert solved == [] and backend.rows[1]["train/attempts_explored"] == 0
        return
    tools = [t.metadata.get("first_tool") for t in second[0].trajectories]
    if explore < 1:  # 2 of 7 attempts: the reference's tool is always one of them
        assert "add" in tools and len([t for t in tools if t]) == 2 and solved == ["add"]
        # the step's success is the loop's: the policy's own five attempts solved nothing
        row = backend.rows[1]
        assert row["train/successes"] == 1 and row["train/checked_attempts"] == 7
        assert (row["train/own_successes"], row["train/own_attempts"]) == (0, 5)
        assert "success 14% (its own attempts 0 of 5)" in said[-1]
        assert _own_attempts(summary.training) == (  # the closing screen's line
            "1 of 14 solved; the model's own (not started by the loop) 0 of 12, so every "
            "success in training was the loop's"
        )
        return
    offered = sorted(t.name for t in run.info.tools if t.name not in hidden)
    assert sorted(t for t in tools if t) == offered  # one attempt per tool offered
    assert solved == ["add"] and backend.rows[1]["train/failed_attempts"] == 0
    assert backend.rows[1]["train/attempts_explored"] == len(offered)
    assert f"{len(offered)} attempts explored" in said[-1]


@pytest.mark.anyio
@pytest.mark.parametrize("demonstrate", [0, 1, 9])
async def test_a_demonstration_pins_the_reference_call_the_policy_never_writes(
    tmp_path, demonstrate
):
    """The policy always writes (2, 3); the task needs add(4, 9). Exploring its tool cannot
    solve it: the arguments are wrong, so beside a demonstration only other tools are
    explored. A demonstration makes the reference's first call, its arguments pinned, and the
    policy answers from its result; the demonstrated attempts are told apart, counted, and
    never count as the policy's own success."""
    call = ReferenceCall(tool="add", arguments={"a": 4, "b": 9})
    reference = Reference(answer="13", calls=[call])
    tasks = [Scenario(id=f"add{i}", task="Add 4 and 9.", difficulty=1, split="train",
                      reference=reference) for i in range(2)]  # fmt: skip
    scenarios = ScenarioSet([*tasks, _scenario("val")])
    scenarios.scenarios[-1].split = "val"
    said: list[str] = []
    with LocalChatServer(_stuck_on_multiply) as server:
        backend = FakeBackend(tmp_path, server.base_url)
        config = RunConfig(steps=2, groups_per_step=1, rollouts_per_group=4, oversample=1,
                           eval_every=0, reward="reference", write_report=False,
                           explore=0.25, demonstrate=demonstrate)  # fmt: skip
        calculator = load_example("calculator").server
        run = TrainingRun(config, calculator, backend, say=said.append, progress=False,
                          observers=[Console(said.append)])  # fmt: skip
        await run.prepare(scenarios)
        summary = _summary(run)
        await run._step(summary)
        await run._step(summary)
    second = run.sampler  # the kind stays unsolved: demonstrations are not the policy's own
    assert second.unsolved(tasks[0])
    trajectories = backend.trained[-1][0].trajectories if backend.trained else []
    row = backend.rows[1]
    shown = min(demonstrate, 3)  # one attempt of 4 always stays the policy's own
    assert row["train/attempts_demonstrated"] == shown
    if not shown:
        assert row["train/success"] == 0 == row["train/groups_trained"]  # add(2, 3) everywhere
        return
    pinned = [t for t in trajectories if "first_arguments" in t.metadata]
    assert [json.loads(t.metadata["first_arguments"]) for t in pinned] == [{"a": 4, "b": 9}] * shown
    assert all(t.reward == 1.0 for t in pinned)
    assert all(t.reward < 1 for t in trajectories if t not in pinned)  # add(2, 3) at best
    assert f"{_plural_attempts(shown)} demonstrated" in said[-1]
    # the explored attempt starts with another tool: one of `add`'s own would write (2, 3),
    # fail, and push `add` down beside the demonstrations that push it up
    explored = [t.metadata.get("first_tool") for t in trajectories if t not in pinned]
    assert len([t for t in explored if t]) == 1 and "add" not in explored


def _adds_two_and_three(body: dict) -> tuple[int, dict]:
    """Calls add(2, 3) (or the call a tool_choice pins), then answers with its result."""
    status, reply = _stuck_on_multiply(body)
    call = reply["choices"][0]["message"]["tool_calls"][0]["function"]
    if call["name"] == "multiply":
        call["name"] = "add"
    return status, reply


def _add(sid: str, a: int, b: int) -> Scenario:
    call = ReferenceCall(tool="add", arguments={"a": a, "b": b})
    return Scenario(id=sid, task=f"Add {a} and {b}.", difficulty=1, split="train",
                    reference=Reference(answer=str(a + b), calls=[call]))  # fmt: skip


@pytest.mark.anyio
@pytest.mark.parametrize("demonstrate", [0, 2])
async def test_a_task_its_solved_kind_does_not_teach_gets_demonstrations(tmp_path, demonstrate):
    """The policy always adds 2 and 3: "Add 2 and 3" is solved, so the kind `add` is, but
    "Add 4 and 9" fails in every attempt and its group teaches nothing. Drawn again, it gets
    demonstrations of its reference call (and no explored attempts: its kind is solved)."""
    tasks = [_add("easy", 2, 3), _add("missed", 4, 9)]
    scenarios = ScenarioSet([*tasks, _scenario("val")])
    scenarios.scenarios[-1].split = "val"
    with LocalChatServer(_adds_two_and_three) as server:
        backend = FakeBackend(tmp_path, server.base_url)
        config = scripted_config(steps=2, groups_per_step=2, rollouts_per_group=4, oversample=1,
                                 explore=0.5, guide=0, demonstrate=demonstrate)  # fmt: skip
        run = TrainingRun(config, load_example("calculator").server, backend,
                          say=lambda _: None, progress=False)  # fmt: skip
        await run.prepare(scenarios)
        summary = _summary(run)
        await run._step(summary)
        assert run.sampler.solved(tasks[1]) and not run.sampler.unsolved(tasks[1])
        assert run.sampler.missed(tasks[1]) and not run.sampler.missed(tasks[0])
        assert backend.rows[0]["train/groups_trained"] == 0  # one all right, one all wrong
        await run._step(summary)
    row = backend.rows[1]
    assert row["train/attempts_demonstrated"] == demonstrate
    assert row.get("train/attempts_explored", 0) == 0
    if demonstrate:
        trained = [t for g in backend.trained[-1] for t in g.trajectories]
        pinned = [t for t in trained if "first_arguments" in t.metadata]
        assert [json.loads(t.metadata["first_arguments"]) for t in pinned] == [{"a": 4, "b": 9}] * 2
        assert all(t.reward == 1.0 for t in pinned) and row["train/groups_trained"] == 1


def _answers_after_one_call(body: dict) -> tuple[int, dict]:
    """Makes a pinned call where the tool_choice pins one; else multiplies 2 by 3 first, and
    answers with its last result as soon as it has one (a chain's second call never comes)."""
    status, reply = _policy(body)
    call = reply["choices"][0]["message"]["tool_calls"][0]["function"]
    results = [json.loads(m["content"])["result"] for m in body["messages"] if m["role"] == "tool"]
    choice = body.get("tool_choice")
    pinned = choice.get("function", {}) if isinstance(choice, dict) else {}
    if "arguments" in pinned:
        call["name"], call["arguments"] = pinned["name"], json.dumps(pinned["arguments"])
    elif not results:
        call["name"], call["arguments"] = "multiply", json.dumps({"a": 2, "b": 3})
    else:
        call["arguments"] = json.dumps({"answer": results[-1]})
    return status, reply


async def _two_demonstrating_steps(tmp_path, policy, scenarios, steps=2, **settings):
    """Two (or `steps`) training steps of one group of 4 attempts on the calculator,
    exploration and guided attempts off and 2 attempts demonstrated where a kind is unsolved,
    `policy` answering; (run, backend)."""
    with LocalChatServer(policy) as server:
        backend = FakeBackend(tmp_path, server.base_url)
        config = scripted_config(steps=steps, groups_per_step=1, rollouts_per_group=4, oversample=1,
                                 explore=0, guide=0, demonstrate=2, **settings)  # fmt: skip
        run = TrainingRun(config, load_example("calculator").server, backend,
                          say=lambda _: None, progress=False)  # fmt: skip
        await run.prepare(scenarios)
        summary = _summary(run)
        for _ in range(steps):
            await run._step(summary)
    return run, backend


@pytest.mark.anyio
@pytest.mark.parametrize("calls", [1, 0])
async def test_a_demonstration_of_the_whole_chain_pins_each_call_in_turn(tmp_path, calls):
    """The policy answers after its first call. Shown the chain's first call alone
    (`demonstrate_calls=1`) it still answers too early; shown every call (0), each pinned on
    its turn, the demonstrations succeed and every call is a trained turn of their own."""
    scenarios = ScenarioSet([_chain("c0"), _chain("c1"), _scenario("val")])
    for s, split in zip(scenarios.scenarios, ["train", "train", "val"], strict=True):
        s.split = split
    run, backend = await _two_demonstrating_steps(
        tmp_path, _answers_after_one_call, scenarios, demonstrate_calls=calls
    )
    assert backend.rows[1]["train/attempts_demonstrated"] == 2
    assert run.sampler.unsolved(scenarios.scenarios[0])  # demonstrations are not its own
    if calls == 1:
        assert backend.rows[1]["train/success"] == 0 == backend.rows[1]["train/groups_trained"]
        return
    shown = [t for t in backend.trained[-1][0].trajectories if "first_arguments" in t.metadata]
    assert len(shown) == 2 and all(t.reward == 1.0 for t in shown)
    for t in shown:
        assert t.metadata["demonstrated_calls"] == 2
        made = [c["function"] for m in t.messages for c in m.get("tool_calls") or []]
        assert [(c["name"], json.loads(c["arguments"])) for c in made[:2]] == [
            ("add", {"a": 2, "b": 3}), ("multiply", {"a": 5, "b": 4})]  # fmt: skip
        assert [c.message_index for c in t.choices] == [2, 4, 6]  # each call trained


def _never_reads_its_result(body: dict) -> tuple[int, dict]:
    """Makes a pinned call (answer included) where the tool_choice pins one; else calls
    add(2, 3) first, then answers 7 whatever the result said (the catalog's habit: a count
    in front of it, another number answered)."""
    status, reply = _policy(body)
    call = reply["choices"][0]["message"]["tool_calls"][0]["function"]
    choice = body.get("tool_choice")
    pinned = choice.get("function", {}) if isinstance(choice, dict) else {}
    if "arguments" in pinned:
        call["name"], call["arguments"] = pinned["name"], json.dumps(pinned["arguments"])
    elif not any(m["role"] == "tool" for m in body["messages"]):
        call["name"], call["arguments"] = "add", json.dumps({"a": 2, "b": 3})
    return status, reply


def _adds_4_and_9() -> tuple[list[Scenario], ScenarioSet]:
    """Two train tasks "Add 4 and 9." (add(4, 9) → 13) and a val task; (the tasks, the set)."""
    ref = Reference(answer="13", calls=[ReferenceCall(tool="add", arguments={"a": 4, "b": 9})])
    tasks = [Scenario(id=f"add{i}", task="Add 4 and 9.", difficulty=1, split="train",
                      reference=ref) for i in range(2)]  # fmt: skip
    scenarios = ScenarioSet([*tasks, _scenario("val")])
    scenarios.scenarios[-1].split = "val"
    return tasks, scenarios


@pytest.mark.anyio
@pytest.mark.parametrize("answer", [False, True])
async def test_a_demonstration_with_its_answer_shows_the_whole_attempt(tmp_path, answer):
    """The policy answers 7 after any call; the task needs add(4, 9) and 13. A demonstration
    of the call alone fails as every attempt does, and nothing trains. With
    `demonstrate_answer`, complete_task is pinned to the reference's answer after the call:
    the demonstrations succeed, the answer's turn is trained on like the call's, and the kind
    stays unsolved (they are not the policy's own)."""
    tasks, scenarios = _adds_4_and_9()
    run, backend = await _two_demonstrating_steps(
        tmp_path, _never_reads_its_result, scenarios, demonstrate_answer=answer
    )
    row = backend.rows[1]
    assert row["train/attempts_demonstrated"] == 2
    assert run.sampler.unsolved(tasks[0])
    if not answer:
        assert row["train/success"] == 0 == row["train/groups_trained"]
        return
    trajectories = backend.trained[-1][0].trajectories
    shown = [t for t in trajectories if "first_arguments" in t.metadata]
    assert len(shown) == 2 and all(t.reward == 1.0 for t in shown)
    assert all(t.reward < 1 for t in trajectories if t not in shown)
    for t in shown:
        assert t.metadata["demonstrated_answer"] == "13" == t.metadata["final_answer"]
        assert [c.message_index for c in t.choices] == [2, 4]  # the call and the answer


@pytest.mark.anyio
async def test_a_kind_whose_shown_calls_never_lead_to_its_answer_is_shown_the_answer(tmp_path):
    """The same policy, with `demonstrate_answer_after=2`: step 2 demonstrates the call
    alone, and both attempts answer 7; from step 3 on, the kind's demonstrations pin 13 too.
    A kind whose shown calls were answered right once keeps demonstrating the calls alone."""
    tasks, scenarios = _adds_4_and_9()
    run, backend = await _two_demonstrating_steps(
        tmp_path, _never_reads_its_result, scenarios, steps=3, demonstrate_answer_after=2
    )
    assert [backend.rows[i]["train/attempts_demonstrated"] for i in (1, 2)] == [2, 2]
    assert backend.rows[1]["train/success"] == 0 < backend.rows[2]["train/success"]
    shown = [t for t in backend.trained[-1][0].trajectories if "first_arguments" in t.metadata]
    assert [t.metadata.get("demonstrated_answer") for t in shown] == ["13", "13"]
    assert run.sampler.answer_unread(tasks[0], 2) and not run.sampler.answer_unread(tasks[0], 3)
    assert run.sampler.unsolved(tasks[0])  # shown answers are not its own
    read = _group("add0", [1.0, 0.0])
    read.trajectories[0].metadata |= {"first_arguments": "{}", "demonstrated_calls": 1}
    run.sampler.observe([read])
    assert not run.sampler.answer_unread(tasks[0], 2)


def _plural_attempts(n: int) -> str:
    return f"{n} attempt" + ("s" if n != 1 else "")


@pytest.mark.anyio
async def test_a_run_reads_its_history_once_and_its_observers_see_every_row(tmp_path):
    """The loop re-read the whole history 3-4 times a step to learn what it had just written
    (an HTTP call each on the remote backend); it keeps the rows it appends instead, and the
    trackers and the report follow them as events."""
    from mcprl.train import GroupsDrawn, RowRecorded, RunEnded, RunStarted, StepStarted

    class CountingBackend(FakeBackend):
        reads = 0

        async def history(self, model):
            CountingBackend.reads += 1
            return await super().history(model)

    scenarios = ScenarioSet([_scenario(f"mixed{i}") for i in range(3)] + [_scenario("val")])
    for s in scenarios.scenarios:
        s.split = "val" if s.id == "val" else "train"
    events: list = []

    async def observe(event) -> None:
        events.append(event)

    def policy_checked_first(body: dict) -> tuple[int, dict]:  # the token-data check: 1 message
        messages = body["messages"]
        return _policy({**body, "messages": [*messages, *messages][:2]})

    with LocalChatServer(policy_checked_first) as policy:
        backend = CountingBackend(tmp_path, policy.base_url)
        config = RunConfig(steps=3, groups_per_step=1, rollouts_per_group=2, eval_every=2,
                           reward="reference", write_report=False)  # fmt: skip
        run = TrainingRun(config, load_example("calculator").server, backend,
                          say=lambda _: None, progress=False, observers=[observe])  # fmt: skip
        await run.prepare(scenarios)
        reads_before = CountingBackend.reads
        summary = await run.run()
    assert CountingBackend.reads - reads_before == 1
    assert isinstance(events[0], RunStarted) and isinstance(events[-1], RunEnded)
    assert events[-1].completed and events[-1].summary is summary
    rows = [e.row for e in events if isinstance(e, RowRecorded)]
    assert rows == await backend.history(run.model)  # exactly what the backend appended
    assert [r["step"] for r in rows if "val/attempts" in r] == [0, 2, 3]
    assert [e.step for e in events if isinstance(e, StepStarted)] == [1, 2, 3]
    assert [e.step for e in events if isinstance(e, GroupsDrawn)] == [1, 2, 3]
    assert summary.last_step == 3 and summary.baseline_step == 0 and summary.final_step == 3


# -- guided attempts: chains of calls the policy never finishes ----------------------------------


def _chain(sid: str) -> Scenario:
    """add(2, 3) then multiply(5, 4): 20."""
    calls = [ReferenceCall(tool="add", arguments={"a": 2, "b": 3}),
             ReferenceCall(tool="multiply", arguments={"a": 5, "b": 4})]  # fmt: skip
    return Scenario(id=sid, task=f"Task {sid}: add 2 and 3, then times 4.", difficulty=2,
                    reference=Reference(answer="20", calls=calls))  # fmt: skip


def _finishes_only_what_it_is_shown(body: dict) -> tuple[int, dict]:
    """Multiplies 2 by 3 when it starts from nothing (wrong); after an `add` result of 5, it
    multiplies that by 4; then answers with its last result."""
    status, reply = _policy(body)
    call = reply["choices"][0]["message"]["tool_calls"][0]["function"]
    results = [json.loads(m["content"])["result"] for m in body["messages"] if m["role"] == "tool"]
    made = [c["function"]["name"] for m in body["messages"] for c in m.get("tool_calls") or []]
    if made and made[-1] == "add":
        call["name"], call["arguments"] = "multiply", json.dumps({"a": results[-1], "b": 4})
    elif not results:
        call["name"], call["arguments"] = "multiply", json.dumps({"a": 2, "b": 3})
    else:
        call["arguments"] = json.dumps({"answer": results[-1]})
    return status, reply


@pytest.mark.anyio
async def test_a_guided_attempt_starts_after_exactly_k_reference_calls_and_says_so():
    from mcprl import Model
    from mcprl.rollout import RolloutConfig, rollout

    calculator = load_example("calculator").server
    with LocalChatServer(_finishes_only_what_it_is_shown) as policy:
        model = Model(name="m", base_url=policy.base_url, api_key="x")
        guided = await rollout(model, _chain("c"), calculator, RolloutConfig(guided_calls=1))
        alone = await rollout(model, _chain("c"), calculator, RolloutConfig())
        capped = await rollout(model, _chain("c"), calculator, RolloutConfig(guided_calls=5))
    made = [(m["role"], (m.get("tool_calls") or [{}])[0].get("function", {}).get("name"))
            for m in guided.messages[2:]]  # fmt: skip
    assert made[:2] == [("assistant", "add"), ("tool", None)]  # the one call made for it
    assert made[2] == ("assistant", "multiply")  # then the policy's own
    assert guided.metadata["guided_calls"] == 1 and "guided_calls" not in alone.metadata
    assert guided.metadata["final_answer"] == "20" and alone.metadata["final_answer"] == "6"
    # only the policy's own replies carry token data to train on
    assert [c.message_index for c in guided.choices] == [4, 6]
    assert capped.metadata["guided_calls"] == 1  # the chain's last call is always the policy's


def test_the_calls_made_for_a_guided_attempt_fall_as_its_kind_gets_solved():
    import random

    long = _chain("long")
    long.reference.calls *= 2  # four calls
    sampler = ScenarioSampler([long])
    rng = random.Random(0)
    assert {sampler.guided_calls(long, rng) for _ in range(50)} == {1, 2, 3}
    solved = _group("long", [1.0, 0.0])
    solved.trajectories[0].metadata["guided_calls"] = 3
    sampler.observe([solved])
    assert {sampler.guided_calls(long, rng) for _ in range(50)} == {1, 2}
    assert sampler.unsolved(long) and not sampler.solved(long)  # a guided success is not its own
    sampler.observe([_group("long", [1.0, 0.0])])  # now one of its own: no more guiding
    assert sampler.solved(long) and not sampler.unsolved(long)
    assert sampler.guided_calls(_with_call("one"), rng) == 0  # a single call: nothing to make
    shown = ScenarioSampler([long])  # a success with the call after 1 made calls is shown 2
    demo = _group("long", [1.0, 0.0])
    demo.trajectories[0].metadata |= {"guided_calls": 1, "first_arguments": "{}"}
    shown.observe([demo])
    assert {shown.guided_calls(long, rng) for _ in range(50)} == {1}
    more = ScenarioSampler([long])  # 1 made and 2 demonstrated: 3 shown
    demo.trajectories[0].metadata["demonstrated_calls"] = 2
    more.observe([demo])
    assert {more.guided_calls(long, rng) for _ in range(50)} == {1, 2}


@pytest.mark.anyio
@pytest.mark.parametrize("demonstrate", [0, 1])
async def test_an_unsolved_chain_gets_guided_attempts_from_its_first_draw(tmp_path, demonstrate):
    """With `demonstrate`, that many guided attempts are also shown the call after the ones
    made for them (pinned, and trained on: a token-carrying turn of the attempt's own)."""
    scenarios = ScenarioSet([_chain("c0"), _chain("c1"), _scenario("val")])
    scenarios.scenarios[-1].split = "val"
    said: list[str] = []
    with LocalChatServer(_finishes_only_what_it_is_shown) as server:
        backend = FakeBackend(tmp_path, server.base_url)
        config = RunConfig(steps=2, groups_per_step=1, rollouts_per_group=4, oversample=1,
                           eval_every=0, reward="reference", write_report=False,
                           guide=0.5, demonstrate=demonstrate)  # fmt: skip
        run = TrainingRun(config, load_example("calculator").server, backend, say=said.append,
                          progress=False, observers=[Console(said.append)])  # fmt: skip
        await run.prepare(scenarios)
        summary = _summary(run)
        await run._step(summary)
        await run._step(summary)
    for trained, row in zip(backend.trained, backend.rows, strict=True):
        # guided from the chain's first draw on: the policy alone never finishes it
        own = [t for t in trained[0].trajectories if "guided_calls" not in t.metadata]
        guided = [t for t in trained[0].trajectories if "guided_calls" in t.metadata]
        assert len(guided) == 2 and all(t.reward == 1.0 for t in guided)
        assert all(t.reward < 1.0 for t in own)
        assert row["train/attempts_guided"] == 2 - demonstrate
        assert row["train/attempts_demonstrated"] == demonstrate
        assert row["train/attempts_explored"] == 0  # guided instead of explored
        shown = [t for t in guided if "first_arguments" in t.metadata]
        assert len(shown) == demonstrate
        for t in shown:  # the chain's second call, after the first made for it
            assert (t.metadata["guided_calls"], t.metadata["first_tool"]) == (1, "multiply")
            assert json.loads(t.metadata["first_arguments"]) == {"a": 5, "b": 4}
            assert [c.message_index for c in t.choices] == [4, 6]  # the pinned call is trained
    assert f"{2 - demonstrate} attempt{'s' if demonstrate == 0 else ''} guided" in said[-1]


@pytest.mark.anyio
@pytest.mark.parametrize(("cap", "guided_groups"), [(0, 2), (1, 1)])
async def test_guide_groups_caps_the_guided_groups_of_a_step(tmp_path, cap, guided_groups):
    """Two unsolved chains drawn in one step: with `guide_groups=1` only the first drawn is
    guided; the other starts as without the guide (the policy alone, which fails it)."""
    from mcprl.rollout import RolloutConfig

    scenarios = ScenarioSet([_chain("c0"), _chain("c1"), _scenario("val")])
    for s, split in zip(scenarios.scenarios, ["train", "train", "val"], strict=True):
        s.split = split
    with LocalChatServer(_finishes_only_what_it_is_shown) as server:
        backend = FakeBackend(tmp_path, server.base_url)
        config = RunConfig(steps=1, groups_per_step=2, rollouts_per_group=4, oversample=1,
                           eval_every=0, reward="reference", write_report=False, guide=0.5,
                           guide_groups=cap, demonstrate=0,
                           rollout=RolloutConfig(examples=0))  # fmt: skip
        run = TrainingRun(config, load_example("calculator").server, backend,
                          say=lambda _: None, progress=False)  # fmt: skip
        await run.prepare(scenarios)
        await run._step(_summary(run))
    row = backend.rows[-1]
    assert row["train/attempts_guided"] == 2 * guided_groups
    assert row["train/groups_trained"] == guided_groups  # an unguided chain's group ties at 0
    groups = backend.trained[-1]
    guided = [sum("guided_calls" in t.metadata for t in g.trajectories) for g in groups]
    assert guided == [2] * guided_groups + [0] * (2 - guided_groups)  # the trained, then the tied


def _calls_then_answers(tool: dict[str, str]):
    """A policy that calls `tool["name"]` with 2 and 3 and then answers 5."""

    def policy(body: dict) -> tuple[int, dict]:
        called = any(m["role"] == "tool" for m in body["messages"])
        name, args = (
            ("complete_task", {"answer": 5}) if called else (tool["name"], {"a": 2, "b": 3})
        )
        call = {"id": f"c{len(body['messages'])}", "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)}}  # fmt: skip
        logprobs = {"model_logprobs": [-0.5, -0.5], "token_logprobs": [-0.5, -0.5]}
        choice = {"index": 0, "finish_reason": "tool_calls", "token_ids": [1, 2],
                  "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                  "prompt_token_ids": [3], "mcprl": logprobs}  # fmt: skip
        return 200, {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                     "choices": [choice]}  # fmt: skip

    return policy


async def _by_position(group: TrajectoryGroup) -> list[float]:
    return [float(i) for i in range(len(group.trajectories))]


def _first_tools(groups: list[TrajectoryGroup]) -> list[str]:
    from mcprl.rewards import winning_tool

    return [winning_tool(g) for g in groups if is_informative(g)]


@pytest.mark.anyio
async def test_contrast_holds_groups_until_two_first_tools_have_won(tmp_path):
    """A step whose groups all won with `add` makes no update and keeps them; the next step,
    won with `multiply`, trains both steps' groups at once."""
    tool = {"name": "add"}
    said: list[str] = []
    with LocalChatServer(_calls_then_answers(tool)) as policy:
        backend = FakeBackend(tmp_path, policy.base_url)
        config = RunConfig(steps=4, groups_per_step=1, rollouts_per_group=2, oversample=1,
                           eval_every=0, contrast=3, write_report=False)  # fmt: skip
        run = TrainingRun(config, load_example("calculator").server, backend,
                          say=lambda _: None, progress=False, reward=_by_position,
                          observers=[Console(said.append)])  # fmt: skip
        await run.prepare(_two_train_one_val())
        summary = _summary(run)
        await run._step(summary)
        assert _first_tools(backend.trained[-1]) == []  # held: nothing to train on
        assert (summary.steps_held, summary.steps_without_update) == (1, 0)
        assert backend.rows[-1]["train/groups_held"] == 1
        assert "no update: 1 group held until the held groups' best attempts start" in said[-1]
        tool["name"] = "multiply"
        await run._step(_summary(run))
    assert _first_tools(backend.trained[-1]) == ["add", "multiply"]
    assert backend.rows[-1]["train/groups_trained"] == 2
    assert backend.rows[-1]["train/groups_released"] == 1
    assert "2 groups trained of 1 drawn (0 tied; 1 held from earlier steps)" in said[-1]
    assert run.held == []


@pytest.mark.anyio
async def test_contrast_lets_go_after_its_steps_and_at_the_last_step(tmp_path):
    """One tool only ever wins: `contrast=1` trains the held group with the next step's, and
    the run's last step trains what it holds."""
    with LocalChatServer(_calls_then_answers({"name": "add"})) as policy:
        backend = FakeBackend(tmp_path, policy.base_url)
        config = RunConfig(steps=3, groups_per_step=1, rollouts_per_group=2, oversample=1,
                           eval_every=0, contrast=1, write_report=False)  # fmt: skip
        run = TrainingRun(config, load_example("calculator").server, backend,
                          say=lambda _: None, progress=False, reward=_by_position)  # fmt: skip
        await run.prepare(_two_train_one_val())
        trained = []
        for _ in range(3):
            await run._step(_summary(run))
            trained.append(len(_first_tools(backend.trained[-1])))
    assert trained == [0, 2, 1]  # held; its held step spent, trained with step 2's; the last


@pytest.mark.anyio
async def test_a_resumed_run_trains_the_groups_it_held_before_it_stopped(tmp_path):
    tool = {"name": "add"}
    with LocalChatServer(_calls_then_answers(tool)) as policy:
        backend = FakeBackend(tmp_path, policy.base_url)
        config = RunConfig(steps=2, groups_per_step=1, rollouts_per_group=2, oversample=1,
                           eval_every=0, contrast=3, write_report=False)  # fmt: skip
        server = load_example("calculator").server
        run = TrainingRun(config, server, backend, say=lambda _: None, progress=False,
                          reward=_by_position)  # fmt: skip
        await run.prepare(_two_train_one_val())
        await run._step(_summary(run))  # held; then the process stops
        tool["name"] = "multiply"
        again = TrainingRun(config, server, backend, say=lambda _: None, progress=False,
                            reward=_by_position)  # fmt: skip
        await again.prepare(_two_train_one_val())
        await again.run()
    assert _first_tools(backend.trained[-1]) == ["add", "multiply"]
    report = write_report(again.run_dir).read_text()
    assert "1 of 2 steps updated the model." in report
    assert "No update at step 1: <code>contrast</code> held the groups" in report


def _repeats_its_first_call_unless_asked_again(body: dict) -> tuple[int, dict]:
    """add(2, 3); then, asked once (a seed in the attempt's first 100), that call again, and
    asked again (another seed) multiply(5, 4); then answers with its last result."""
    status, reply = _policy(body)
    call = reply["choices"][0]["message"]["tool_calls"][0]["function"]
    results = [json.loads(m["content"])["result"] for m in body["messages"] if m["role"] == "tool"]
    if not results:
        call["name"], call["arguments"] = "add", json.dumps({"a": 2, "b": 3})
    elif len(results) == 1 and body["tool_choice"] != {
        "type": "function",
        "function": {"name": "complete_task"},
    }:
        again = body["seed"] % 1000 >= 100
        call["name"] = "multiply" if again else "add"
        call["arguments"] = json.dumps({"a": 5, "b": 4} if again else {"a": 2, "b": 3})
    else:
        call["arguments"] = json.dumps({"answer": results[-1]})
    return status, reply


@pytest.mark.anyio
async def test_retry_repeats_asks_training_attempts_again_and_leaves_evaluations_alone(tmp_path):
    scenarios = ScenarioSet([_chain("c0"), _chain("val")])
    scenarios.scenarios[-1].split = "val"
    with LocalChatServer(_repeats_its_first_call_unless_asked_again) as server:
        backend = FakeBackend(tmp_path, server.base_url)
        config = scripted_config(steps=1, groups_per_step=1, rollouts_per_group=2, oversample=1,
                                 explore=0, demonstrate=0, retry_repeats=1)  # fmt: skip
        run = TrainingRun(config, load_example("calculator").server, backend,
                          progress=False)  # fmt: skip
        await run.prepare(scenarios)
        summary = _summary(run)
        await run._step(summary)
        await run._evaluate(summary)
    (group,) = backend.trained[0]
    assert [t.reward for t in group.trajectories] == [1.0, 1.0]  # each asked again, solved
    assert all(t.metrics["repeats_retried"] == 1 for t in group.trajectories)
    history = [json.loads(line) for line in (run.run_dir / "history.jsonl").open()]
    assert next(r for r in history if "train/success" in r)["train/repeats_retried"] == 1.0
    val = next(r for r in history if "val/success" in r)
    assert val["val/success"] == 0.0  # the policy's own replies: it repeats add(2, 3)


# -- subtasks: one step of an unsolved chain, practised as a task of its own ---------------------


def _steps_right_on_odd_attempts(body: dict) -> tuple[int, dict]:
    """At `_chain`'s task: on odd attempts each call due is right (add(2, 3), then multiply by
    4), on even ones wrong (multiply first, add second); after two results it answers one more
    than the last, so no attempt of its own ever solves the chain. A pinned call (a
    demonstration's, `tool_choice.function.arguments`) it makes as mcprl's engine would."""
    status, reply = _policy(body)
    call = reply["choices"][0]["message"]["tool_calls"][0]["function"]
    odd = body.get("seed", 0) // 1000 % 2
    results = [json.loads(m["content"])["result"] for m in body["messages"] if m["role"] == "tool"]
    if not results:
        name, args = ("add" if odd else "multiply"), {"a": 2, "b": 3}
    elif len(results) == 1:
        name, args = ("multiply" if odd else "add"), {"a": results[-1], "b": 4}
    else:
        name, args = "complete_task", {"answer": results[-1] + 1}
    pinned = body.get("tool_choice")
    if isinstance(pinned, dict) and "arguments" in pinned.get("function", {}):  # as the engine
        name, args = pinned["function"]["name"], pinned["function"]["arguments"]
    call["name"], call["arguments"] = name, json.dumps(args)
    return status, reply


def test_a_subtask_is_one_step_of_the_chain_scored_by_its_calls_alone():
    from mcprl.curriculum import subtask
    from mcprl.errors import UsageError

    part = subtask(_chain("c"), 1)
    assert part.id == "c#step2" and part.task == _chain("c").task and "subtask" in part.tags
    assert [c.tool for c in part.reference.calls] == ["add", "multiply"]
    assert part.reference.answer is None  # the chain's answer is not this step's
    with pytest.raises(UsageError, match="0 to 1, not 2"):
        subtask(_chain("c"), 2)


@pytest.mark.anyio
async def test_an_attempt_stops_after_the_call_it_practises():
    from mcprl import Model
    from mcprl.rollout import RolloutConfig, rollout

    calculator = load_example("calculator").server
    with LocalChatServer(_finishes_only_what_it_is_shown) as policy:
        model = Model(name="m", base_url=policy.base_url, api_key="x")
        step = await rollout(model, _chain("c"), calculator,
                             RolloutConfig(guided_calls=1, stop_after_calls=2))  # fmt: skip
    names = [c["function"]["name"] for m in step.messages for c in m.get("tool_calls") or []]
    assert names == ["add", "multiply"]  # one made for it, one its own, and no answer
    assert step.messages[-1]["role"] == "tool" and json.loads(step.messages[-1]["content"]) == {
        "result": 20
    }
    assert len(step.choices) == 1 and "final_answer" not in step.metadata
    assert step.metrics["ran_out_of_turns"] == 0 and step.metrics["completed"] == 0


@pytest.mark.anyio
@pytest.mark.parametrize("demonstrate", [0, 1])
async def test_subtasks_train_one_step_of_an_unsolved_chain_and_count_apart(tmp_path, demonstrate):
    """With `demonstrate`, that many of a subtask group's attempts have the call due pinned."""
    scenarios = ScenarioSet([_chain("c0"), _chain("c1"), _chain("c2"), _chain("val")])
    for s in scenarios.scenarios:
        s.split = "val" if s.id == "val" else "train"
    with LocalChatServer(_steps_right_on_odd_attempts) as server:
        backend = FakeBackend(tmp_path, server.base_url)
        config = scripted_config(steps=1, groups_per_step=1, rollouts_per_group=4, oversample=1,
                                 explore=0, demonstrate=demonstrate, subtasks=2)  # fmt: skip
        said: list[str] = []
        run = TrainingRun(config, load_example("calculator").server, backend, progress=False,
                          observers=[Console(said.append)])  # fmt: skip
        await run.prepare(scenarios)
        await run._step(_summary(run))
    made_right = 4 + 2 * demonstrate  # the odd attempts', and the demonstrations (even ones)
    line = f"subtasks: {made_right} of 8 steps of chains made right, 2 of 2 groups trained"
    assert line in said[-1]
    groups = backend.trained[0]
    parts = [g for g in groups if "#step" in (g.scenario_id or "")]
    assert len(parts) == 2 and len({g.scenario_id.split("#")[0] for g in parts}) == 2
    for g in parts:
        k = int(g.scenario_id.rsplit("step", 1)[1])
        for t in g.trajectories:
            assert t.metadata["subtask_step"] == k and t.helped
            assert len(t.choices) == 1 and "final_answer" not in t.metadata
            made = [c["function"]["name"] for m in t.messages for c in m.get("tool_calls") or []]
            assert len(made) == k  # the calls before the step, made for it, then its own
            right = made[-1] == ["add", "multiply"][k - 1]
            assert t.metrics["success"] == float(right)
            assert t.reward == (1.0 if right else 0.0)  # the calls made for it earn nothing
        shown = [t for t in g.trajectories if "first_arguments" in t.metadata]
        assert len(shown) == demonstrate
        for t in shown:  # the call due pinned, and trained on (its turn carries tokens)
            assert t.metadata["first_tool"] == ["add", "multiply"][k - 1]
            assert t.metrics["success"] == 1.0 and len(t.choices) == 1
        assert sum(t.metrics["success"] for t in g.trajectories) == 2 + demonstrate
    row = backend.rows[0]
    assert row["train/subtask_groups"] == 2 and row["train/subtask_groups_trained"] == 2
    assert (row["train/subtask_successes"], row["train/subtask_attempts"]) == (made_right, 8)
    assert row["train/subtask_success"] == made_right / 8
    assert row["train/success"] == 0.0  # the step's own attempts: never a solved chain
    assert not run.sampler.solved(_chain("c0"))  # a subtask's success does not solve its kind


@pytest.mark.anyio
async def test_subtasks_need_a_reward_that_checks_references(tmp_path):
    from mcprl.errors import PreflightError

    scenarios = ScenarioSet([_chain("c0"), _chain("val")])
    scenarios.scenarios[-1].split = "val"
    with LocalChatServer(_steps_right_on_odd_attempts) as server:
        backend = FakeBackend(tmp_path, server.base_url)
        run = TrainingRun(RunConfig(subtasks=1, write_report=False),
                          load_example("calculator").server, backend, progress=False,
                          reward=lambda group: [0.0] * len(group.trajectories))  # fmt: skip
        with pytest.raises(PreflightError, match="subtasks=1"):
            await run.prepare(scenarios)


# -- worked examples ---------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_run_solves_its_worked_examples_once_says_which_and_opens_every_attempt_with_them(
    tmp_path,
):
    from mcprl.rollout import RolloutConfig

    scenarios = ScenarioSet([_chain("c1"), _chain("c0"), _chain("val")])
    scenarios.scenarios[-1].split = "val"
    with LocalChatServer(_policy) as server:
        backend = FakeBackend(tmp_path, server.base_url)
        config = RunConfig(steps=1, groups_per_step=1, rollouts_per_group=2, oversample=1,
                           eval_every=0, reward="reference", write_report=False, explore=0,
                           demonstrate=0,
                           rollout=RolloutConfig(examples=1, example_choice="kinds"))  # fmt: skip
        said: list[str] = []
        run = TrainingRun(config, load_example("calculator").server, backend, progress=False,
                          say=said.append)  # fmt: skip
        await run.prepare(scenarios)
        await run._step(_summary(run))
        stored = await backend.trajectories(run.model, "train")
    assert "  1 worked example(s) open every attempt:" in said
    assert "    Task c0: add 2 and 3, then times 4." in said  # of two alike, the first by id
    shown = run.config.rollout.example_messages
    results = [m["content"] for m in shown if m["role"] == "tool"]
    assert results[-1] == "Task marked complete."
    assert [json.loads(r) for r in results[:-1]] == [
        {"result": 5.0},
        {"result": 20.0},
    ]  # the server's own results, made once before the first step
    assert server.requests and all(
        r["messages"][1 : 1 + len(shown)] == shown for r in server.requests
    )
    attempts = [t for g in stored[1] for t in g.trajectories]
    assert len(attempts) == 2
    for t in attempts:  # the attempt's messages are its own
        assert t.messages[1]["content"].startswith("Please complete this task: Task c")
        assert t.metadata["worked_examples"] == 1


async def _one_step(tmp_path, scenarios, rollout, groups: int = 1):
    """One training step on the calculator's server with `rollout`, answered by `_policy`, no
    attempt started by the loop: (the run, what it said, the chat server with its requests)."""
    with LocalChatServer(_policy) as server:
        backend = FakeBackend(tmp_path, server.base_url)
        config = RunConfig(steps=1, groups_per_step=groups, rollouts_per_group=2, oversample=1,
                           eval_every=0, reward="reference", write_report=False, explore=0,
                           guide=0, demonstrate=0, rollout=rollout)  # fmt: skip
        said: list[str] = []
        run = TrainingRun(config, load_example("calculator").server, backend, progress=False,
                          say=said.append)  # fmt: skip
        await run.prepare(scenarios)
        await run._step(_summary(run))
    return run, said, server


@pytest.mark.anyio
async def test_with_similar_examples_each_task_opens_with_another_worded_like_it(tmp_path):
    from mcprl.rollout import RolloutConfig

    scenarios = ScenarioSet([_chain("c1"), _chain("c0"), _chain("val")])
    for s, split in zip(scenarios.scenarios, ["train", "train", "val"], strict=True):
        s.split = split
    rollout = RolloutConfig(examples=1, example_choice="similar")
    run, said, server = await _one_step(tmp_path, scenarios, rollout, groups=2)
    assert "  each task opens with the 1 train task(s) worded most like it, solved (2 " \
        "different ones in all), for example:" in said  # fmt: skip
    assert "    Task c0: add 2 and 3, then times 4.  <-  Task c1: add 2 and 3, then times 4." \
        in said  # fmt: skip
    rollout = run.config.rollout
    assert rollout.examples_by_task == {"c0": ["c1"], "c1": ["c0"], "val": ["c0"]}
    solved = rollout.worked_examples
    assert set(solved) == {"c0", "c1"}  # each solved once, however many tasks it is shown to
    first_task = {sid: ms[0]["content"].split("\n")[0] for sid, ms in solved.items()}
    assert first_task == {
        "c0": "Please complete this task: Task c0: add 2 and 3, then times 4.",
        "c1": "Please complete this task: Task c1: add 2 and 3, then times 4.",
    }
    assert len(server.requests) == 4
    for request in server.requests:  # each attempt opens with the other train task, solved
        shown = solved["c1" if "Task c0:" in request["messages"][-1]["content"] else "c0"]
        assert request["messages"][1 : 1 + len(shown)] == shown


@pytest.mark.anyio
async def test_examples_0_opens_each_attempt_with_its_own_task(tmp_path):
    """One worked example worded like the task is the default; `examples=0` turns them off."""
    from mcprl.rollout import RolloutConfig

    assert (RolloutConfig().examples, RolloutConfig().example_choice) == (1, "similar")
    scenarios = ScenarioSet([_chain("c1"), _chain("c0")])
    run, said, server = await _one_step(tmp_path, scenarios, RolloutConfig(examples=0))
    assert not any("worked example" in line or "worded most like" in line for line in said)
    assert run.config.rollout.worked_examples == {}
    for request in server.requests:  # the system prompt, then the task itself
        assert request["messages"][1]["content"].startswith("Please complete this task: Task c")


def test_worked_examples_are_one_train_task_a_kind_that_only_reads_short_chains_first():
    tools = [
        ToolInfo(name="search", input_schema={}, annotations={"readOnlyHint": True}),
        ToolInfo(name="get", input_schema={}, annotations={"readOnlyHint": True}),
        ToolInfo(name="delete_row", input_schema={}),  # its name says it writes
    ]
    scenarios = [
        solved_scenario("s-long", [("search", {"q": "a"}, "x" * 50)], "1"),
        solved_scenario("s-short", [("search", {"q": "b"}, "x")], "1"),  # the kind's shortest
        solved_scenario("s-val", [("search", {"q": "c"}, "")], "1", split="val"),  # never shown
        solved_scenario("sg", [("search", {"q": "d"}, "x"), ("get", {"id": 1}, "y")], "2"),
        solved_scenario("g1", [("get", {"id": 2}, "y")], "3"),
        solved_scenario("g2", [("get", {"id": 3}, "y")], "3"),
        solved_scenario(
            "gg", [("get", {"id": 4}, "y" * 1500), ("get", {"id": 5}, "y" * 501)], "3"
        ),  # results too long
        solved_scenario("del", [("delete_row", {"id": 5}, "ok")], "ok"),  # it writes
    ]
    picked = [s.id for s in example_scenarios(scenarios, tools, 8)]
    # one-call kinds by how common they are (get: 2 shown-able tasks, search: 2), then chains
    assert picked == ["g1", "sg", "s-short"]
    assert [s.id for s in example_scenarios(scenarios, tools, 2)] == ["g1", "sg"]
    assert example_scenarios(scenarios, tools, 0) == []
    # a generated count and a lookup through one tool are two kinds (`task_kind`): both shown
    count = solved_scenario("count", [("search", {"q": "e"}, "x")], "2")
    lookup = solved_scenario("lookup", [("search", {"q": "f"}, "xx")], "Ada")
    count.tags, lookup.tags = ["grounded", "count"], ["grounded", "lookup"]
    picked = [s.id for s in example_scenarios([count, lookup], tools, 4)]
    assert sorted(picked) == ["count", "lookup"]


def test_names_numbers_and_quoted_text_aside_tasks_of_one_family_read_the_same():
    from mcprl.curriculum import task_wording

    assert task_wording("How much does The Call of the Wild cost?") == task_wording(
        "How much does Dracula cost?"
    )
    assert task_wording('Is there a commit named "Add soda bread"?') == task_wording(
        'Is there a commit named "Art"?'
    )
    assert task_wording("What is the average of 23, 38 and 86?") == (
        "what", "is", "the", "average", "of", "N", "N", "and", "N",
    )  # fmt: skip
    assert task_wording("How many copies of Emma and Dracula?") != task_wording(
        "How many copies of Emma?"
    )  # two names are not one
    assert task_wording("Add 2 and 3. Then multiply by 4.") == (
        "add", "N", "and", "N", "then", "multiply", "by", "N",
    )  # fmt: skip
    # a sentence's first word is not a name; initials are one
    assert task_wording("Books by H. G. Wells?") == ("books", "by", "E")


def test_each_task_is_shown_the_train_tasks_worded_most_like_it_never_itself():
    from mcprl.curriculum import similar_scenarios

    tools = [ToolInfo(name=n, input_schema={}, annotations={"readOnlyHint": True})
             for n in ("search", "get")]  # fmt: skip

    def task(sid: str, text: str, calls: int = 1, split: str = "train", result: str = "x"):
        s = solved_scenario(sid, [("search", {"q": sid}, result)] * calls, "1", split=split)
        return s.model_copy(update={"task": text})

    scenarios = [
        task("price-1", "How much does Dracula cost?", 2),
        task("price-2", "How much does The Call of the Wild cost?", 2),
        task("price-long", "How much does Emma cost?", 2, result="x" * 1500),
        task("count-1", "How many books by Mary Shelley are in the catalog?"),
        task("count-2", "How many books by Jane Austen are in the catalog?"),
        task("val-price", "How much does Peter Pan cost?", 2, split="val"),
        task("val-count", "How many books by H. G. Wells are in the catalog?", split="val"),
    ]
    picked = {sid: [s.id for s in shown] for sid, shown in
              similar_scenarios(scenarios, tools, 1).items()}  # fmt: skip
    assert picked["val-price"] == ["price-1"]  # of the alike, the shorter results
    assert picked["val-count"] == ["count-1"]
    assert picked["price-1"] == ["price-2"] and picked["count-1"] == ["count-2"]  # not itself
    assert "val-price" not in {s for v in picked.values() for s in v}  # val is never shown
    assert [s.id for s in similar_scenarios(scenarios, tools, 2)["val-count"]] == [
        "count-1", "count-2",
    ]  # fmt: skip
    assert similar_scenarios(scenarios, tools[1:], 1) == {}  # no call to a shown tool


def test_a_train_task_is_shown_an_example_whose_answer_tells_nothing_of_its_own():
    """Copying the example's answer must earn a train task no more than a guess: of the
    examples alike, one with another answer, and of yes/no tasks answered alike half are shown
    a yes and half a no. A val task's answer picks nothing (a user's question has none)."""
    from mcprl.curriculum import similar_scenarios

    tools = [ToolInfo(name="git_log", input_schema={}, annotations={"readOnlyHint": True})]

    def task(sid: str, text: str, answer: str, split: str = "train", result: str = "x"):
        s = solved_scenario(sid, [("git_log", {}, result)], answer, split=split)
        return s.model_copy(update={"task": text})

    who = "Who wrote the commit {}?"
    scenarios = [
        task("who-1", who.format('"Add soup"'), "Ben Ode"),
        task("who-2", who.format('"Add pie"'), "Ben Ode", result="xx"),
        task("who-3", who.format('"Add tea"'), "Ana Silva", result="x" * 9),
        task("val-who", who.format('"Add jam"'), "Ben Ode", split="val"),
        *(task(f"yes-{i}", f'Is there a commit named "Y{i}"?', "yes") for i in range(4)),
        *(task(f"no-{i}", f'Is there a commit named "N{i}"?', "No") for i in range(4)),
    ]
    picked = similar_scenarios(scenarios, tools, 1)
    answer = {sid: shown[0].reference.answer for sid, shown in picked.items()}
    # by the shortest results alike, who-1 and who-2 would be shown each other: their answer
    assert answer["who-1"] == answer["who-2"] == "Ana Silva"
    assert answer["who-3"] == "Ben Ode"
    assert [s.id for s in picked["val-who"]] == ["who-1"]  # as before: the shortest alike
    for side in ("yes", "no"):
        shown = sorted(answer[f"{side}-{i}"].lower() for i in range(4))
        assert shown == ["no", "no", "yes", "yes"], side


def test_a_task_is_shown_an_example_made_with_the_tool_that_lists_its_quoted_text():
    """Every conversion task reads alike once quoted text and numbers are set aside; the tool
    whose units list the task's own units decides which solved conversion it is shown."""
    from mcprl.curriculum import similar_scenarios

    def units(*names: str) -> dict:
        unit = {"anyOf": [{"enum": list(names)}, {"type": "null"}]}  # an optional choice
        return {"properties": {"value": {"type": "number"}, "from_unit": unit, "to_unit": unit}}

    tools = [ToolInfo(name=n, input_schema=units(*u), annotations={"readOnlyHint": True})
             for n, u in (("convert_area", ("acre", "hectare")),
                          ("convert_mass", ("Grain", "pound", "gram")))]  # fmt: skip

    def task(sid: str, tool: str, a: str, b: str, result: str = "x", split: str = "train"):
        s = solved_scenario(sid, [(tool, {"from_unit": a, "to_unit": b}, result)], "1", split)
        return s.model_copy(update={"task": f'Convert 3 from "{a}" to "{b}".'})

    scenarios = [
        task("area", "convert_area", "acre", "hectare"),  # the shorter results
        task("mass", "convert_mass", "pound", "gram", result="x" * 40),
        task("val-mass", "convert_mass", "grain", "pound", split="val"),
        task("val-odd", "convert_mass", "furlong", "league", split="val"),
    ]
    picked = {sid: [s.id for s in shown] for sid, shown in
              similar_scenarios(scenarios, tools, 1).items()}  # fmt: skip
    assert picked["val-mass"] == ["mass"]  # "grain" and "pound" are mass units, in any case
    assert picked["area"] == ["mass"] and picked["mass"] == ["area"]  # never itself
    # units no tool lists: worded alike, the shorter results, as before
    assert picked["val-odd"] == ["area"]


@pytest.mark.anyio
async def test_an_evaluation_reads_how_a_run_chose_its_worked_examples(tmp_path):
    from mcprl.evaluate import trained_examples
    from mcprl.model import TrainableModel

    backend = FakeBackend(tmp_path)
    for name, rollout in [("plain", {}), ("similar", {"examples": 1, "example_choice": "similar"})]:
        model = TrainableModel(name=name, project="p")
        await backend.register(model)
        await backend.write_file(model, "run_config.json", json.dumps({"rollout": rollout}))
    found = await trained_examples(["plain", "similar@3", "base"], backend, "p")
    assert found == {"plain": (0, "kinds"), "similar@3": (1, "similar")}  # base: not a run
