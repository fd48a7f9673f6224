"""Credit per call: each turn of a chain earns credit for the reference call it made."""

from __future__ import annotations

import json

import torch

from mcprl.rewards import call_turns, scorer
from mcprl.training import TrainConfig
from mcprl.training._batch import build_sequences, call_bonuses, micro_batches
from mcprl.types import Choice, Trajectory, TrajectoryGroup
from tests.helpers import AVERAGE


def _attempt(*turns: tuple[str, dict], answer: str = "0", guided: int = 0) -> Trajectory:
    """An attempt whose assistant turns make `turns` (guided ones first, without choices),
    then answer; each turn of the model's own has one choice of 2 tokens after a prompt that
    extends the conversation so far."""
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": AVERAGE.task}]
    choices, tokens = [], [1, 2, 3]
    calls = [*turns, ("complete_task", {"answer": answer})]
    for i, (name, args) in enumerate(calls):
        call_id = f"guided_{i + 1}" if i < guided else f"c{i}"
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": name, "arguments": json.dumps(args)}}]})  # fmt: skip
        if i >= guided:
            reply = [100 + i, 200 + i]
            choices.append(Choice(message_index=len(messages) - 1, prompt_token_ids=list(tokens),
                                  token_ids=reply, logprobs=[-0.5, -0.5]))  # fmt: skip
            tokens += reply
        messages.append({"role": "tool", "tool_call_id": call_id, "content": "1"})
        tokens += [7, 8]  # the tool result's tokens in the next prompt
    return Trajectory(messages=messages, choices=choices, metadata={"final_answer": answer})


def test_each_turn_is_marked_with_the_call_that_was_due_and_whether_it_made_it():
    two_right_then_wrong = _attempt(
        ("add", {"a": 23, "b": 38}), ("add", {"a": 61, "b": 86}), ("multiply", {"a": 147, "b": 3})
    )
    assert call_turns(two_right_then_wrong, AVERAGE.reference) == [
        [2, 0, 1],
        [4, 1, 1],
        [6, 2, 0],
        [8, 2, 0],  # answering while a call is due is a miss too
    ]
    out_of_order = _attempt(("add", {"a": 61, "b": 86}), ("add", {"a": 23, "b": 38}))
    assert call_turns(out_of_order, AVERAGE.reference) == [[2, 0, 0], [4, 0, 1], [6, 1, 0]]
    rounded = _attempt(("add", {"a": 23, "b": 38}), ("add", {"a": 61, "b": 85}))
    assert [hit for *_, hit in call_turns(rounded, AVERAGE.reference)] == [1, 0, 0]
    solved = _attempt(
        ("add", {"a": 23, "b": 38}), ("add", {"a": 61, "b": 86}), ("divide", {"a": 147, "b": 3})
    )
    assert call_turns(solved, AVERAGE.reference)[-1] == [6, 2, 1]  # the answer is not counted


def test_calls_made_for_a_guided_attempt_move_the_chain_on():
    guided = _attempt(
        ("add", {"a": 23, "b": 38}), ("add", {"a": 61, "b": 86}), ("divide", {"a": 147, "b": 3}),
        guided=1,
    )  # fmt: skip
    assert call_turns(guided, AVERAGE.reference) == [[2, 0, 1], [4, 1, 1], [6, 2, 1]]
    assert [c.message_index for c in guided.choices] == [4, 6, 8]


def _scored(*attempts: Trajectory) -> TrajectoryGroup:
    import asyncio

    group = asyncio.run(
        scorer({"avg": AVERAGE})(TrajectoryGroup(scenario_id="avg", trajectories=list(attempts)))
    )
    for t in group.trajectories:  # as the loop records it
        t.metrics["success"] = t.metrics["reward_answer"]
    return group


def test_a_chain_no_attempt_finished_trains_its_right_calls_up_and_its_wrong_ones_down():
    right_first = _attempt(("add", {"a": 23, "b": 38}), ("multiply", {"a": 61, "b": 86}))
    wrong_first = _attempt(("subtract", {"a": 23, "b": 38}))
    group = _scored(right_first, wrong_first, wrong_first.model_copy(deep=True))
    assert all(t.metrics["reward_answer"] == 0 for t in group.trajectories)

    skipped, stats = build_sequences([group], informative="success")
    assert skipped == [] and stats.groups_skipped == 1  # no success: nothing to learn, before

    sequences, stats = build_sequences([group], informative="success", call_credit=0.5)
    assert stats.groups_call_credit_only == 1 and stats.groups_skipped == 0
    first = sequences[0]
    # call 0 was due at 5 turns (wrong_first's two turns, twice) and made at 1: the turn that
    # made it gets +0.5 x (1 - 1/5); call 1 was due at 2 turns, both right_first's, and made at
    # none: no credit either way
    assert first.advantage == 0.0
    trained = [b for b, m in zip(first.bonus, first.mask, strict=True) if m]
    assert trained == [0.5 * (1 - 1 / 5)] * 2 + [0.0] * 4
    other = sequences[1]
    assert [b for b, m in zip(other.bonus, other.mask, strict=True) if m] == [-0.5 / 5] * 4

    batch = micro_batches(sequences, 4096, pad_id=0)[0]
    assert batch.advantages.shape == batch.loss_mask.shape  # per prediction
    per_token = batch.advantages[batch.loss_mask.bool()]
    assert torch.allclose(per_token[:2], torch.tensor(0.4))


def test_in_a_group_with_a_success_credit_adds_to_the_outcome_advantage():
    solved = _attempt(
        ("add", {"a": 23, "b": 38}), ("add", {"a": 61, "b": 86}), ("divide", {"a": 147, "b": 3}),
        answer="49",
    )  # fmt: skip
    half = _attempt(("add", {"a": 23, "b": 38}), ("divide", {"a": 61, "b": 3}))
    group = _scored(solved, half)
    plain, _ = build_sequences([group], scale_rewards="none", informative="success")
    credited, _ = build_sequences(
        [group], scale_rewards="none", informative="success", call_credit=0.5
    )
    assert [s.advantage for s in credited] == [s.advantage for s in plain]
    assert plain[1].advantage < 0
    bonus = [b for b, m in zip(credited[1].bonus, credited[1].mask, strict=True) if m]
    # the first call both made (rate 1: no credit); call 1 was due at 3 turns, made at 1 (the
    # solved attempt's): each of half's two turns that missed it gets 0.5 x (0 - 1/3)
    assert bonus[:2] == [0.0, 0.0] and bonus[2:] == [-1 / 6] * 4


def test_without_references_or_with_credit_off_nothing_changes():
    plain = Trajectory(choices=[Choice(message_index=2, prompt_token_ids=[1], token_ids=[2],
                                       logprobs=[-1.0])])  # fmt: skip
    assert call_bonuses([plain, plain], 0.5) == [{}, {}]
    assert TrainConfig().call_credit == 0
