"""GRPO: losses against a plainly written reference, sequences, and real training steps."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch

import mcprl.training._batch
from mcprl.training import (
    LOSSES,
    LoraTrainer,
    Normalizer,
    Sequence,
    TrainConfig,
    batch_advantages,
    build_sequences,
    group_advantages,
    micro_batches,
    split_by_group,
)
from mcprl.training._losses import kl_k3, pushed_down_by_probability
from mcprl.types import Choice, Trajectory, TrajectoryGroup

# -- the loss, checked against a loop over tokens ---------------------------------------------


def reference_loss(new, old, adv, mask, variant, eps_low, eps_high, norm, fixed_length):
    """The objective written out token by token, with no vectorisation."""
    batch, time = new.shape
    terms = [[None] * time for _ in range(batch)]
    for b in range(batch):
        a = adv[b, 0]
        n_b = sum(int(mask[b, t]) for t in range(time))
        if variant == "gspo":
            log_ratio = sum((new[b, t] - old[b, t]) for t in range(time) if mask[b, t]) / max(
                n_b, 1
            )
            s = torch.exp(log_ratio)
            seq_term = -torch.minimum(s * a, s.clamp(1 - eps_low, 1 + eps_high) * a)
        for t in range(time):
            if not mask[b, t]:
                continue
            r = torch.exp(new[b, t] - old[b, t])
            if variant == "ppo":
                terms[b][t] = -torch.minimum(r * a, r.clamp(1 - eps_low, 1 + eps_high) * a)
            elif variant == "cispo":
                w = r.clamp(1 - eps_low, 1 + eps_high).detach()
                terms[b][t] = -w * a * new[b, t]
            else:
                terms[b][t] = seq_term
    flat = [x for row in terms for x in row if x is not None]
    n_tokens = len(flat)
    if norm == "token":
        return sum(flat) / n_tokens
    if norm == "sequence":
        per_seq = []
        for row in terms:
            kept = [x for x in row if x is not None]
            per_seq.append(sum(kept) / max(len(kept), 1))
        return sum(per_seq) / batch
    return sum(flat) / (batch * fixed_length)


CASES = [
    (variant, norm)
    for variant in ("ppo", "cispo", "gspo")
    for norm in ("token", "sequence", "fixed")
    if variant != "gspo" or norm == "sequence"
]


@pytest.mark.parametrize(("variant", "norm"), CASES)
def test_losses_and_gradients_match_a_token_loop(variant, norm):
    torch.manual_seed(0)
    batch, time = 4, 7
    old = torch.randn(batch, time).clamp(-5, 0) - 0.1
    base = old + 0.4 * torch.randn(batch, time)  # ratios both inside and outside the clip range
    mask = (torch.rand(batch, time) > 0.3).float()
    mask[:, 0] = 1.0
    adv = torch.tensor([[1.3], [-0.7], [0.4], [-1.0]])

    new_vec = base.clone().requires_grad_(True)
    loss_fn = LOSSES[variant](0.2, 0.28)
    norm_fn = Normalizer(norm, int(mask.sum()), batch, fixed_length=16)
    per_token, _ = loss_fn.per_token(new_vec, old, adv, mask)
    vectorised = norm_fn(per_token, mask)
    vectorised.backward()

    new_loop = base.clone().requires_grad_(True)
    looped = reference_loss(new_loop, old, adv, mask, variant, 0.2, 0.28, norm, 16)
    looped.backward()

    assert math.isclose(vectorised.item(), looped.item(), rel_tol=1e-5, abs_tol=1e-7)
    assert torch.allclose(new_vec.grad, new_loop.grad, atol=1e-6)  # stated tolerance: 1e-6


def test_pushed_down_by_probability_a_failed_fluke_token_barely_moves_the_update():
    """On-policy (ratio 1), a token with advantage A < 0 and probability p < P contributes
    -A * grad p / P; one the policy gave p = 1e-4 (a temperature-1 fluke) then barely pulls,
    where by log p it would pull as hard as a likely mistake. A token at P or above, and every
    positive advantage, keep their gradient."""
    logits = torch.tensor([[[9.0, 0.0, 0.0], [2.0, 1.0, 0.0]]], requires_grad=True)  # [1, 2, 3]
    tokens = torch.tensor([[1, 0]])  # the first unlikely (p ~ 1e-4), the second likely
    mask = torch.ones(1, 2)

    def gradient(adv: torch.Tensor, below: float) -> torch.Tensor:
        logits.grad = None
        new = torch.log_softmax(logits, -1).gather(-1, tokens[..., None])[..., 0]
        if below > 0:
            adv = pushed_down_by_probability(adv, new, below)
        per_token, _ = LOSSES["ppo"](0.2, 0.2).per_token(new, new.detach(), adv, mask)
        per_token.sum().backward()
        return logits.grad.clone()

    adv = torch.tensor([[-1.0]])
    by_log, by_prob, below_half = gradient(adv, 0.0), gradient(adv, 1.0), gradient(adv, 0.5)
    probs = torch.softmax(logits.detach(), -1)
    p = probs[0, [0, 1], [1, 0]]
    assert p[0] < 2e-4 and p[1] > 0.6
    # with A = -1 the loss is -A * p = p: its gradient, token by token, is grad p
    for t in range(2):
        one_hot = torch.nn.functional.one_hot(tokens[0, t], 3).float()
        grad_p = p[t] * (one_hot - probs[0, t])  # d p_token / d logits
        assert torch.allclose(by_prob[0, t], grad_p, atol=1e-6)
    assert by_log[0, 0].abs().sum() > 1.9 and by_prob[0, 0].abs().sum() < 1e-3  # the fluke
    assert by_prob[0, 1].abs().sum() > 0.3 * by_log[0, 1].abs().sum()  # the likely mistake
    # below P = 0.5: the fluke at p / 0.5 of its log-p pull, the likely mistake untouched
    assert torch.allclose(below_half[0, 0], by_prob[0, 0] / 0.5, atol=1e-7)
    assert torch.equal(below_half[0, 1], by_log[0, 1])
    plus = torch.tensor([[0.5]])
    assert torch.equal(gradient(plus, 1.0), gradient(plus, 0.0))


def test_kl_penalty_matches_a_token_loop():
    torch.manual_seed(1)
    new = torch.randn(3, 5, requires_grad=True)
    ref = torch.randn(3, 5)
    loop = sum(
        math.exp(float(ref[b, t] - new[b, t])) - float(ref[b, t] - new[b, t]) - 1
        for b in range(3)
        for t in range(5)
    )
    assert math.isclose(float(kl_k3(new, ref).sum()), loop, rel_tol=1e-5)
    assert float(kl_k3(ref, ref).abs().max()) == 0.0


def test_gspo_needs_sequence_normalisation():
    with pytest.raises(ValueError, match='normalization="sequence"'):
        TrainConfig(loss="gspo")
    TrainConfig(loss="gspo", normalization="sequence")


def test_advantages():
    assert group_advantages([1.0, 1.0, 1.0]) is None
    centred = group_advantages([1.0, 0.0], scale=False)
    assert centred == [0.5, -0.5]
    scaled = group_advantages([1.0, 0.0, 0.5, 0.5])
    assert abs(sum(scaled)) < 1e-9 and scaled[0] > 1.0


def test_batch_scaling_keeps_a_success_group_above_a_partial_credit_group():
    success, partial = [1.0, 0.1, 0.0, 0.0], [0.1, 0.0, 0.0, 0.2]
    per_group = batch_advantages([success, partial, [1.0, 1.0]], scale="group")
    per_batch = batch_advantages([success, partial, [1.0, 1.0]], scale="batch")
    assert per_group[2] is None and per_batch[2] is None  # a tie teaches nothing either way
    # per group, a spread of 0.2 in partial credit pushes as hard as a success does
    assert max(per_group[1]) / max(per_group[0]) > 0.8
    # per batch, the partial-credit group keeps its size relative to the success group
    assert max(per_batch[1]) / max(per_batch[0]) < 0.2
    assert abs(sum(per_batch[0])) < 1e-9
    assert TrainConfig(scale_rewards=True).scale_rewards == "group"  # the old switch still reads
    assert TrainConfig(scale_rewards=False).scale_rewards == "none"


# -- sequences ----------------------------------------------------------------------------------


def traj(reward, *choices):
    return Trajectory(reward=reward, choices=list(choices))


def choice(prompt, tokens, lp=-0.5):
    return Choice(
        message_index=0, prompt_token_ids=prompt, token_ids=tokens, logprobs=[lp] * len(tokens)
    )


def test_a_multi_turn_attempt_stays_one_sequence_when_prompts_extend():
    first = choice([1, 2, 3], [10, 11])
    second = choice([1, 2, 3, 10, 11, 20, 21], [30, 31, 32])
    unrelated = choice([9, 9], [40])
    group = TrajectoryGroup(trajectories=[traj(1.0, first, second), traj(0.0, unrelated)])
    sequences, stats = build_sequences([group])
    merged = sequences[0]
    assert merged.tokens == [1, 2, 3, 10, 11, 20, 21, 30, 31, 32]
    assert merged.mask == [0, 0, 0, 1, 1, 0, 0, 1, 1, 1]
    assert merged.old_logprobs == [0, 0, 0, -0.5, -0.5, 0, 0, -0.5, -0.5, -0.5]
    assert len(sequences) == 2 and stats.trained_tokens == 6


def test_a_prompt_that_does_not_extend_starts_a_new_sequence():
    first = choice([1, 2, 3], [10, 11])
    rewritten = choice([1, 2, 3, 12, 20], [30])  # the template re-rendered the reply differently
    sequences, _ = build_sequences(
        [TrajectoryGroup(trajectories=[traj(1.0, first, rewritten), traj(0.0, choice([1], [5]))])]
    )
    assert [s.tokens for s in sequences[:2]] == [[1, 2, 3, 10, 11], [1, 2, 3, 12, 20, 30]]


def test_equal_rewards_failed_and_untrainable_attempts_are_left_out():
    flat = TrajectoryGroup(trajectories=[traj(0.5, choice([1], [2])), traj(0.5, choice([1], [3]))])
    untrainable = Trajectory(reward=1.0, choices=[Choice(message_index=0)])
    mixed = TrajectoryGroup(
        trajectories=[traj(1.0, choice([1], [2])), traj(0.0, choice([1], [3])), untrainable],
        exceptions=[__import__("mcprl").AttemptError(type="E", message="m")],
    )
    sequences, stats = build_sequences([flat, mixed])
    assert stats.groups == 2 and stats.groups_skipped == 1
    assert stats.trajectories_dropped == 2 and len(sequences) == 2


def test_by_success_a_group_of_partial_credit_alone_is_not_trained_nor_scales_the_batch():
    def group(rewards, successes):
        return TrajectoryGroup(
            trajectories=[
                Trajectory(reward=r, choices=[choice([1], [2 + i])], metrics={"success": s})
                for i, (r, s) in enumerate(zip(rewards, successes, strict=True))
            ]
        )

    solved = group([1.0, 0.0], [1.0, 0.0])
    partial = group([0.25, 0.0], [0.0, 0.0])
    by_reward, stats = build_sequences([solved, partial], scale_rewards="batch")
    assert len(by_reward) == 4 and stats.groups_skipped == 0
    by_success, stats = build_sequences([solved, partial], "batch", informative="success")
    alone, _ = build_sequences([solved], scale_rewards="batch")
    assert stats.groups_skipped == 1 and stats.trajectories_dropped == 0
    assert [s.advantage for s in by_success] == [s.advantage for s in alone]
    assert stats.rewards == [1.0, 0.0, 0.25, 0.0]  # still reported


def test_positive_weight_shrinks_only_the_attempts_that_beat_their_group():
    rewards = [1.0, 0.5, 0.0, 0.0]
    group = TrajectoryGroup(
        trajectories=[traj(r, choice([1], [2 + i])) for i, r in enumerate(rewards)]
    )
    plain, _ = build_sequences([group], scale_rewards="none")
    weighted, _ = build_sequences([group], scale_rewards="none", positive_weight=0.1)
    assert [s.advantage for s in plain] == [0.625, 0.125, -0.375, -0.375]
    assert [s.advantage for s in weighted] == pytest.approx([0.0625, 0.0125, -0.375, -0.375])
    losers, _ = build_sequences([group], scale_rewards="none", negative_weight=0.2)
    assert [s.advantage for s in losers] == pytest.approx([0.625, 0.125, -0.075, -0.075])


def test_cap_failures_shrinks_only_the_failures_of_a_group_that_mostly_won():
    def group(wins: int) -> TrajectoryGroup:
        rewards = [1.0] * wins + [0.0] * (8 - wins)
        return TrajectoryGroup(
            trajectories=[traj(r, choice([1], [2 + i])) for i, r in enumerate(rewards)]
        )

    plain, _ = build_sequences([group(7), group(1)], scale_rewards="none")
    capped, _ = build_sequences([group(7), group(1)], scale_rewards="none", cap_failures=True)
    assert [s.advantage for s in plain[:8]] == pytest.approx([0.125] * 7 + [-0.875])
    assert [s.advantage for s in capped[:8]] == pytest.approx([0.125] * 7 + [-0.125])
    assert [s.advantage for s in capped[8:]] == [s.advantage for s in plain[8:]]  # 1 of 8
    batch, _ = build_sequences([group(6)], scale_rewards="batch", cap_failures=True)
    assert batch[0].advantage == pytest.approx(-batch[-1].advantage)  # after the scale
    winners_only, _ = build_sequences(
        [group(7), group(1)], scale_rewards="none", cap_failures=True, solved_failure_weight=0
    )
    assert [s.advantage for s in winners_only[:8]] == pytest.approx([0.125] * 7 + [0.0])
    assert [s.advantage for s in winners_only[8:]] == [s.advantage for s in plain[8:]]
    halved, _ = build_sequences([group(6)], scale_rewards="none", solved_failure_weight=0.5)
    assert [s.advantage for s in halved[6:]] == pytest.approx([-0.375, -0.375])  # no cap


def test_positive_weight_outside_0_1_is_refused_by_name():
    with pytest.raises(ValueError, match="positive_weight"):
        TrainConfig(positive_weight=0)
    with pytest.raises(ValueError, match="positive_weight"):
        TrainConfig(positive_weight=2)
    with pytest.raises(ValueError, match="negative_weight"):
        TrainConfig(negative_weight=-0.1)
    with pytest.raises(ValueError, match="adam_beta1"):
        TrainConfig(adam_beta1=1)


def test_micro_batches_respect_the_token_budget():
    sequences, _ = build_sequences(
        [
            TrajectoryGroup(
                trajectories=[
                    traj(float(i % 2), choice(list(range(5 + i)), [7] * 10)) for i in range(9)
                ]
            )
        ]
    )
    batches = micro_batches(sequences, token_budget=64, pad_id=0)
    assert sum(b.input_ids.shape[0] for b in batches) == 9
    assert all(b.input_ids.numel() <= 64 or b.input_ids.shape[0] == 1 for b in batches)


def test_what_the_rows_share_counts_once_in_each_micro_batch_up_to_half_the_budget():
    """Rows behind a 40-token prompt and their group's own 70-token head (a worked example):
    the 109 tokens they share count once per micro-batch, but at most half the budget, so the
    tails always get half of it. Counting none of the head put a group's rows all together,
    whose activations grew with them (a calculator step: 3.4 GB); counting all of it left
    one row per micro-batch behind a long prompt (slower, the same gradient)."""
    from mcprl.training._batch import HEAD_MINIMUM

    prompt = list(range(1000, 1040))
    groups = []
    for g in range(2):
        head = list(range(2000 + 100 * g, 2070 + 100 * g))  # past the prompt: the group's own
        rows = [traj(float(i % 2), choice(prompt + head, [7 + i] * 10)) for i in range(8)]
        groups.append(TrajectoryGroup(scenario_id=f"g{g}", trajectories=rows))
    sequences, _ = build_sequences(groups)
    assert len(head) >= HEAD_MINIMUM

    def rows(budget: int) -> list[tuple[int, int]]:
        batches = micro_batches(sequences, token_budget=budget, pad_id=0, share_prefix=True)
        # 40 + 69 shared; each tail 11 tokens (the head's last, whose prediction is trained)
        assert all(len(b.prefix) == 40 and len(b.head) == 69 for b in batches)
        return [tuple(b.input_ids.shape) for b in batches]

    assert rows(120) == [(5, 11), (3, 11)] * 2  # 60 counted (half) + 5 x 11 fit 120
    assert rows(300) == [(8, 11)] * 2  # 109 counted + 8 x 11 fit 300
    assert rows(218) == [(8, 11)] * 2  # 109 (just half) + 88
    assert rows(200) == [(8, 11)] * 2  # 100 counted (half) + 88


# -- real steps with the tiny model ------------------------------------------------------------

pytestmark_slow = pytest.mark.slow


@pytest.fixture(scope="module")
def base_path():
    from mcprl.serving import resolve_model

    return resolve_model("smollm2-135m")


def _on_policy_group(trainer: LoraTrainer, prompt: list[int], completions, rewards):
    trajectories = []
    for tokens, reward in zip(completions, rewards, strict=True):
        ids = torch.tensor([prompt + tokens], device=trainer.device)
        with torch.no_grad():
            lp = trainer.token_logprobs(ids, torch.ones_like(ids))[0, len(prompt) - 1 :]
        trajectories.append(
            traj(
                reward,
                Choice(
                    message_index=2, prompt_token_ids=prompt, token_ids=tokens, logprobs=lp.tolist()
                ),
            )
        )
    return TrajectoryGroup(scenario_id="s", trajectories=trajectories)


def _sequence_logprob(trainer, prompt, tokens) -> float:
    ids = torch.tensor([prompt + tokens], device=trainer.device)
    with torch.no_grad():
        return float(trainer.token_logprobs(ids, torch.ones_like(ids))[0, len(prompt) - 1 :].sum())


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["ppo", "cispo", "gspo"])
def test_one_step_raises_the_good_completion_and_lowers_the_bad(base_path, variant):
    trainer = LoraTrainer(base_path)
    tok = trainer.tokenizer
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is 6 times 7?"}],
        add_generation_prompt=True,
        tokenize=True,
    )
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    good = tok.encode("6 times 7 is 42.<|im_end|>")
    bad = tok.encode("I like turtles.<|im_end|>")
    before = [_sequence_logprob(trainer, prompt, c) for c in (good, bad)]
    group = _on_policy_group(trainer, prompt, [good, bad], [1.0, 0.0])
    norm = "sequence" if variant == "gspo" else "token"
    metrics = trainer.step(
        [group], TrainConfig(learning_rate=2e-3, loss=variant, normalization=norm)
    )
    after = [_sequence_logprob(trainer, prompt, c) for c in (good, bad)]
    assert after[0] > before[0] and after[1] < before[1], (before, after)
    assert metrics["abs_logprob_drift"] < 1e-3  # on-policy: the trainer agrees with the sampler
    assert metrics["grad_norm"] > 0 and metrics["groups_skipped_fraction"] == 0


@pytest.mark.slow
def test_a_trainer_reads_the_served_base_weights_only_where_they_match(base_path):
    from mcprl.serving import load_model

    served = load_model("smollm2-135m", dtype="float32", device="cpu").model
    trainer = LoraTrainer(base_path, dtype="float32", device="cpu")
    ids = torch.tensor([trainer.tokenizer.encode("Add 2 and 3.")])
    with torch.no_grad():
        before = trainer.token_logprobs(ids, torch.ones_like(ids))
    weights = sum(p.numel() * 4 for p in served.parameters())
    assert trainer.share_base_weights(served) == weights  # every base weight, held once
    with torch.no_grad():
        assert torch.equal(trainer.token_logprobs(ids, torch.ones_like(ids)), before)
    other = LoraTrainer(base_path, dtype="bfloat16", device="cpu")
    assert other.share_base_weights(served) == 0  # another dtype: its own copy stays
    # an engine that decodes from packed weights frees the plain ones (`SwappedWeights`): a
    # step that would read them is refused by name, never run on freed memory
    swapped = torch.nn.Parameter(torch.zeros(4), requires_grad=False)
    trainer._shared.append(swapped)
    swapped.untyped_storage().resize_(0)
    with pytest.raises(RuntimeError, match="run_exclusive"):
        trainer.step([], TrainConfig())


@pytest.mark.slow
def test_updates_per_step_takes_one_optimizer_step_per_share_of_the_groups(base_path):
    trainer = LoraTrainer(base_path)
    tok = trainer.tokenizer
    groups, pairs = [], []
    for question, right in (("What is 6 times 7?", "42"), ("What is 9 minus 4?", "5")):
        prompt = tok.encode(f"Q: {question} A:")
        good, bad = tok.encode(f" {right}.<|im_end|>"), tok.encode(" I like turtles.<|im_end|>")
        groups.append(_on_policy_group(trainer, prompt, [good, bad], [1.0, 0.0]))
        pairs.append((prompt, good, bad))
    before = [[_sequence_logprob(trainer, p, c) for c in (g, b)] for p, g, b in pairs]
    metrics = trainer.step(groups, TrainConfig(learning_rate=2e-3, updates_per_step=2))
    after = [[_sequence_logprob(trainer, p, c) for c in (g, b)] for p, g, b in pairs]
    assert metrics["updates"] == 2 and trainer.updates == 2
    for (good0, bad0), (good1, bad1) in zip(before, after, strict=True):
        assert good1 > good0 and bad1 < bad0  # each group's own update, then the other's
    assert metrics["abs_logprob_drift"] > 0  # the second update ran on a moved policy


@pytest.mark.slow
def test_without_momentum_a_step_follows_its_own_groups(base_path):
    """Two steps that prefer opposite completions. With AdamW's default momentum the second
    update still carries the first one's direction, so the reversal moves back less; with
    `adam_beta1=0` it moves back most of the way the first step moved forward."""
    moved = {}
    for beta1 in (0.9, 0.0):
        trainer = LoraTrainer(base_path)
        prompt = trainer.tokenizer.encode("Q: What is 6 times 7? A:")
        good = trainer.tokenizer.encode(" 42.<|im_end|>")
        bad = trainer.tokenizer.encode(" I like turtles.<|im_end|>")
        config = TrainConfig(learning_rate=2e-3, adam_beta1=beta1)

        def margin(trainer=trainer, prompt=prompt, good=good, bad=bad) -> float:
            return _sequence_logprob(trainer, prompt, good) - _sequence_logprob(
                trainer, prompt, bad
            )

        start = margin()
        trainer.step([_on_policy_group(trainer, prompt, [good, bad], [1.0, 0.0])], config)
        forward = margin() - start
        trainer.step([_on_policy_group(trainer, prompt, [good, bad], [0.0, 1.0])], config)
        moved[beta1] = (forward, margin() - start - forward)
    forward, back = moved[0.0]
    assert forward > 0 and back < -0.7 * forward, moved  # measured: 18.2 forward, 16.0 back
    assert -0.8 * abs(back) < moved[0.9][1] < 0, moved  # measured: 10.2 back


@pytest.mark.slow
def test_the_ratio_divides_by_the_trainers_own_logprobs_not_the_servers(base_path):
    """A server that rounds differently (bfloat16) reports log-probs a little off the
    trainer's. Against the trainer's own, the update is the on-policy one; against the server's,
    the tokens pushed past the clip range lose their gradient."""
    grads, clipped = {}, {}
    for case, old in (("exact", "trainer"), ("off", "trainer"), ("off-sampler", "sampler")):
        torch.manual_seed(0)
        trainer = LoraTrainer(base_path)
        prompt = trainer.tokenizer.encode("Q: What is 6 times 7? A:")
        group = _on_policy_group(trainer, prompt, [[11, 12, 13, 14], [15, 16, 17]], [1.0, 0.0])
        if case != "exact":  # the server's numbers, 0.3 nats off on alternate tokens
            for t in group.trajectories:
                lp = t.choices[0].logprobs
                t.choices[0].logprobs = [x + (0.3 if i % 2 else -0.3) for i, x in enumerate(lp)]
        config = TrainConfig(max_grad_norm=None, learning_rate=1e-9, old_logprobs=old)
        metrics = trainer.step([group], config)
        grads[case] = _seen_gradient(trainer)
        clipped[case] = metrics["clip_fraction"]
    _assert_same_gradient(grads["off"], grads["exact"])
    assert clipped["off"] == clipped["exact"] == 0.0
    assert clipped["off-sampler"] > 0.2  # about half the tokens sit past the clip range
    assert (grads["off-sampler"] - grads["exact"]).norm() > 0.1 * grads["exact"].norm()


def test_groups_are_dealt_whole_into_mini_batches():
    sequences = [Sequence([1, 2], [0, 1], [0.0, -1.0], a, group=g)
                 for g, a in ((0, 1.0), (0, -1.0), (1, 0.5), (2, 1.0), (2, -1.0))]  # fmt: skip
    parts = split_by_group(sequences, 2)
    assert [[s.group for s in p] for p in parts] == [[0, 0, 2, 2], [1]]
    assert [[s.group for s in p] for p in split_by_group(sequences, 5)] == [[0, 0], [1], [2, 2]]


@pytest.mark.slow
def test_gradient_accumulation_equals_one_full_batch(base_path):
    grads = []
    for budget in (64, 100_000):
        torch.manual_seed(0)
        trainer = LoraTrainer(base_path)
        prompt = trainer.tokenizer.encode("Hello there, how are you?")
        group = _on_policy_group(
            trainer, prompt, [[11, 12, 13], [14, 15], [16, 17, 18, 19]], [1.0, 0.0, 0.5]
        )
        trainer.step(
            [group], TrainConfig(token_budget=budget, max_grad_norm=None, learning_rate=1e-9)
        )
        # the update is negligible; read back the gradient the optimizer saw via its state
        grads.append(_seen_gradient(trainer))
    _assert_same_gradient(grads[0], grads[1])


@pytest.mark.slow
def test_a_failure_left_out_of_a_solved_group_is_not_run_and_the_gradient_is_unchanged(base_path):
    """At solved_failure_weight 0 the failure of a group that mostly won has no advantage: the
    step does not run it, and its gradient is the one that running it with a vanishing weight
    gives (its tokens still count in the normalisation)."""
    grads, metrics = [], []
    for weight in (1e-12, 0.0):
        torch.manual_seed(0)
        trainer = LoraTrainer(base_path)
        prompt = trainer.tokenizer.encode("Hello there, how are you?")
        group = _on_policy_group(
            trainer, prompt, [[11, 12, 13], [14, 15], [16, 17, 18, 19]], [1.0, 1.0, 0.0]
        )
        config = TrainConfig(
            max_grad_norm=None, learning_rate=1e-9, cap_failures=True, solved_failure_weight=weight
        )
        metrics.append(trainer.step([group], config))
        grads.append(_seen_gradient(trainer))
    _assert_same_gradient(grads[1], grads[0])
    assert [m["trained_tokens"] for m in metrics] == [9, 9]
    assert [m["idle_tokens"] for m in metrics] == [0, 4]  # the failure's four tokens


@pytest.mark.slow
def test_a_step_on_cpu_hands_freed_memory_back_after_every_micro_batch(base_path, monkeypatch):
    """glibc would keep what each micro-batch freed (a default run's process grew 1.5 GB within
    one step while its memory in use stayed flat), so the trainer trims after each one."""
    from mcprl.training import _trainer

    trims: list[int] = []
    trainer = LoraTrainer(base_path, device="cpu")
    _, groups = _prefix_groups(trainer)
    done: list[int] = []
    monkeypatch.setattr(_trainer, "return_freed_memory", lambda: trims.append(len(done)))
    trainer.step(groups, TrainConfig(token_budget=64), on_progress=lambda d, _: done.append(d))
    assert len(done) == 4
    assert trims == [0, 1, 2, 3, 4]  # before each micro-batch's progress is told, then at the end


@pytest.mark.slow
@pytest.mark.parametrize(("others", "threads"), [(1.5, 1), (0.0, 2)])
def test_a_step_on_cpu_takes_the_threads_other_processes_leave_free(
    base_path, monkeypatch, others, threads
):
    """Two spinning threads beside another run's rollouts slow both processes many times over
    (`mcprl.serving._threads`); the trainer sizes its threads as the engine does, and grows
    back at once when the machine is quiet."""
    from mcprl.serving import _threads

    class Busy:
        cores = 2

        def others(self) -> float:
            return others

    monkeypatch.setattr(_threads, "CoreUse", Busy)
    monkeypatch.setattr(_threads, "_most", 2)
    before = torch.get_num_threads()
    torch.set_num_threads(3 - threads)  # the count the step must leave
    try:
        trainer = LoraTrainer(base_path, device="cpu")
        _, groups = _prefix_groups(trainer)
        seen: list[int] = []
        on_progress = lambda d, _: seen.append(torch.get_num_threads())  # noqa: E731
        trainer.step(groups, TrainConfig(token_budget=64), on_progress=on_progress)
    finally:
        torch.set_num_threads(before)
    assert seen == [threads] * 4


def _prefix_groups(trainer: LoraTrainer) -> tuple[list[int], list[TrajectoryGroup]]:
    """Two groups of two attempts behind one 80-token prompt (a shared prefix), on policy; each
    attempt 20 or 21 tokens, so that at a budget of 64 each is a micro-batch of its own (the
    prompt counts 32 of it: `micro_batches`)."""
    prompt = trainer.tokenizer.encode("You are a helpful assistant with tools. " * 8)
    tails = [list(range(11, 31)), list(range(31, 52))]
    groups = [_on_policy_group(trainer, [*prompt, 21 + g], tails, [1, 0]) for g in range(2)]
    return prompt, groups


def _seen_gradient(trainer: LoraTrainer) -> torch.Tensor:
    """The gradient the optimizer saw last step (its first moment, after one step), flattened;
    with a negligible learning rate this reads a step's gradient back."""
    state = trainer.optimizer.state
    return torch.cat([state[p]["exp_avg"].flatten() for p in trainer.params])


@pytest.mark.slow
def test_a_shared_prefix_run_once_gives_the_same_gradient(base_path):
    """Plain, and the prefix once per micro-batch, in one micro-batch; then plain, and the prefix
    once for all four micro-batches of the update, in four."""
    grads, tokens = [], []
    for share, budget in ((False, 4096), (True, 4096), (False, 64), (True, 64)):
        torch.manual_seed(0)
        trainer = LoraTrainer(base_path)
        prompt, groups = _prefix_groups(trainer)
        sequences, _ = build_sequences(groups)
        batches = micro_batches(sequences, budget, 0, share_prefix=share)
        tokens.append(
            sum(
                b.input_ids.numel() + len(b.prefix if b.prefix is not None else ()) for b in batches
            )
        )
        config = TrainConfig(
            max_grad_norm=None, learning_rate=1e-9, share_prefix=share, token_budget=budget
        )
        ran = []
        trainer._prefix_pass = _recording(trainer._prefix_pass, ran)
        trainer.step(groups, config)
        grads.append(_seen_gradient(trainer))
    assert len(batches) == 4 and all(len(b.prefix) == len(prompt) for b in batches)
    assert ran == [4]  # the last configuration ran the prefix once for its four micro-batches
    assert tokens[1] < tokens[0] / 2  # the prompt ran once instead of four times
    _assert_same_gradient(grads[0], grads[1])
    _assert_same_gradient(grads[2], grads[3])


@pytest.mark.slow
def test_a_groups_own_head_runs_once_for_its_micro_batches_with_the_same_gradient(
    base_path, checkpoints
):
    """Two groups behind one prompt, each task opened by its own 90-token worked example, each
    attempt a micro-batch of its own: each group's example (its head) runs once for its two
    micro-batches, after the prompt run once for all four, and the gradient is the one of
    every row run whole; so with the KL term on, and with the prompt and heads under layer
    checkpoints."""
    grads, tokens, heads, layers = {}, {}, [], {}
    runs = [(False, 512, 0.0), (True, 512, 0.0), (True, 64, 0.0), (False, 512, 0.5),
            (True, 512, 0.5)]  # fmt: skip
    for share, checkpoint, beta in runs:
        torch.manual_seed(0)
        trainer = LoraTrainer(base_path)
        prompt = trainer.tokenizer.encode("You are a helpful assistant with tools. " * 8)
        example = trainer.tokenizer.encode("Worked example: add 2 and 3, answer 5. " * 8)
        tails = [list(range(100, 140)), list(range(300, 340))]
        groups = [
            _on_policy_group(trainer, [*prompt, *example[g:], 21 + g], tails, [1, 0])
            for g in range(2)
        ]
        sequences, _ = build_sequences(groups)
        batches = micro_batches(sequences, 64, 0, share_prefix=share)
        tokens[share] = sum(b.input_ids.numel() for b in batches) + (
            len(prompt) + len(example) * 2 if share else 0
        )
        config = TrainConfig(
            max_grad_norm=None,
            learning_rate=1e-9,
            share_prefix=share,
            token_budget=64,
            beta=beta,
            checkpoint_prefix=checkpoint,
        )
        trainer._head_pass = _recording(trainer._head_pass, heads)
        checkpoints.clear()
        trainer.step(groups, config)
        grads[share, checkpoint, beta] = _seen_gradient(trainer)
        layers[share, checkpoint, beta] = len(checkpoints)
    assert [len(b.head) for b in batches] == [len(example)] * 2 + [len(example) - 1] * 2
    assert all(len(b.prefix) == len(prompt) for b in batches)
    assert [b.input_ids.shape for b in batches] == [(1, 41)] * 4  # the task's last token on
    assert len(heads) == 6  # twice a step: once for each group's two micro-batches
    assert tokens[True] < 0.6 * tokens[False]  # 4 rows of 226 tokens: 906 in all, 471 so
    depth = trainer.model.config.num_hidden_layers
    # whole rows over the budget run under layer checkpoints, a row each; shared, the rows'
    # own 41 tokens do not, and from 64 tokens the prompt and the two heads do
    assert layers == {(False, 512, 0.0): 4 * depth, (True, 512, 0.0): 0,
                      (True, 64, 0.0): 3 * depth, (False, 512, 0.5): 4 * depth,
                      (True, 512, 0.5): 0}  # fmt: skip
    # 1.9e-4 apart on the AMD EPYC; without the heads' own gradient 0.6
    for share, checkpoint, beta in runs[1:3] + runs[4:]:
        got = grads[share, checkpoint, beta]
        _assert_same_gradient(got, grads[False, 512, beta], rtol=1e-3)


@pytest.mark.slow
def test_a_turn_some_attempts_share_runs_once_for_them_with_the_same_gradient(
    base_path, checkpoints, monkeypatch
):
    """Attempts of a group that made the same 70-token call, word for word, and then parted:
    that turn, trained tokens and all, runs once for its rows (a micro-batch each), after the
    group's worked example and the prompt, and the gradient is the one of every row run whole;
    so with the KL term on, with the turn under layer checkpoints, with a second update (whose
    ratio divides by log-probabilities taken before the first), and for GSPO's ratio over a
    whole sequence."""
    monkeypatch.setattr(mcprl.training._batch, "TURN_MINIMUM", 64)  # pinned: a 70-token turn
    grads, tokens, turns = {}, {}, []
    runs = [(False, {}), (True, {}), (True, {"checkpoint_prefix": 64}), (False, {"beta": 0.5}),
            (True, {"beta": 0.5}), (False, {"updates_per_step": 2}),
            (True, {"updates_per_step": 2}), (False, {"loss": "gspo"}),
            (True, {"loss": "gspo"})]  # fmt: skip
    plain = {"checkpoint_prefix": 64}  # the same pass: its gradient is the one without
    for share, extra in runs:
        torch.manual_seed(0)
        trainer = LoraTrainer(base_path)
        prompt = trainer.tokenizer.encode("You are a helpful assistant with tools. " * 8)
        example = trainer.tokenizer.encode("Worked example: add 2 and 3, answer 5. " * 8)
        calls = [list(range(1000, 1070)), list(range(2000, 2070))]
        ends = [list(range(100 + 40 * i, 130 + 40 * i)) for i in range(5)]
        completions = [*(calls[i // 2] + ends[i] for i in range(4)), ends[4]]
        groups = [
            _on_policy_group(
                trainer, [*prompt, *example[g:], 21 + g], completions, [1, 0, 1, 0, 0.5]
            )
            for g in range(2)
        ]
        sequences, _ = build_sequences(groups)
        batches = micro_batches(sequences, 64, 0, share_prefix=share)
        once = {tuple(t.tolist()) for b in batches for t in (b.prefix, b.head, b.turn)
                if t is not None}  # fmt: skip
        tokens[share] = sum(b.input_ids.numel() for b in batches) + sum(map(len, once))
        normalization = "sequence" if extra.get("loss") == "gspo" else "token"
        config = TrainConfig(max_grad_norm=None, learning_rate=1e-9, share_prefix=share,
                             token_budget=64, normalization=normalization,
                             **{"checkpoint_prefix": 512, **extra})  # fmt: skip
        turns.clear()
        trainer._turn_pass = _recording(trainer._turn_pass, turns)
        checkpoints.clear()
        trainer.step(groups, config)
        grads[share, str(extra)] = _seen_gradient(trainer)
    # each group: the row that made no call first, then the two rows of each call, apart
    assert [None if b.turn is None else len(b.turn) for b in batches] == [None, *[70] * 4] * 2
    assert all(b.input_ids.shape == (1, 31) for b in batches)  # the call's last token on
    assert [b.loss_mask.shape[1] for b in batches] == [30, *[100] * 4] * 2
    assert len(turns) == 4  # each call once, for its two rows' micro-batches
    assert tokens[True] < 0.6 * tokens[False]
    for share, extra in runs:
        if share:
            got, want = grads[True, str(extra)], grads[False, str({} if extra == plain else extra)]
            _assert_same_gradient(got, want, rtol=1e-3)


@pytest.fixture
def checkpoints(monkeypatch) -> list[int]:
    """One entry per call of torch's activation checkpoint (one per layer run under it)."""
    import torch.utils.checkpoint

    calls: list[int] = []
    plain = torch.utils.checkpoint.checkpoint

    def counted(*args, **kwargs):
        calls.append(1)
        return plain(*args, **kwargs)

    monkeypatch.setattr(torch.utils.checkpoint, "checkpoint", counted)
    return calls


@pytest.mark.slow
def test_a_long_prefix_under_layer_checkpoints_gives_the_same_gradient(base_path, checkpoints):
    """A prefix at or over `checkpoint_prefix` tokens runs each layer under an activation
    checkpoint (its activations recomputed in the backward pass), in one micro-batch or four;
    the gradient is the one without."""
    grads, layers = [], []
    for budget, checkpoint_from in ((4096, None), (4096, 16), (64, None), (64, 16)):
        torch.manual_seed(0)
        trainer = LoraTrainer(base_path)
        _, groups = _prefix_groups(trainer)
        checkpoints.clear()
        config = TrainConfig(
            max_grad_norm=None,
            learning_rate=1e-9,
            token_budget=budget,
            checkpoint_prefix=checkpoint_from,
        )
        trainer.step(groups, config)
        layers.append(len(checkpoints))
        grads.append(_seen_gradient(trainer))
    depth = trainer.model.config.num_hidden_layers
    assert layers == [0, depth, 0, depth]  # once per layer, for the prefix only
    _assert_same_gradient(grads[1], grads[0])
    _assert_same_gradient(grads[3], grads[2])


@pytest.mark.slow
def test_rows_longer_than_the_budget_run_under_layer_checkpoints_with_the_same_gradient(
    base_path, checkpoints
):
    """A micro-batch whose rows hold more tokens than `token_budget` (each row here: 70 tokens
    after an 80-token prompt, against a budget of 64) runs its layers under activation
    checkpoints, after a shared prefix or whole: the same gradient, and much less memory kept
    for the backward pass (measured: 0.31x after a shared prefix, 0.13x without).
    `checkpoint_rows=False` keeps it all, as before."""
    grads, layers, kept = {}, {}, {}
    for share in (True, False):
        for rows in (False, True):
            torch.manual_seed(0)
            trainer = LoraTrainer(base_path)
            prompt = trainer.tokenizer.encode("You are a helpful assistant with tools. " * 8)
            long = [list(range(100, 170)), list(range(300, 370))]
            groups = [_on_policy_group(trainer, [*prompt, 21 + g], long, [1, 0]) for g in (0, 1)]
            checkpoints.clear()
            # storage kept for the backward pass, each once, the model's own weights aside;
            # each is held to the end so that no address is freed and reused by another
            weights = {p.untyped_storage().data_ptr() for p in trainer.model.parameters()}
            saved = {}

            def pack(tensor, saved=saved, weights=weights):
                storage = tensor.untyped_storage()
                if storage.data_ptr() not in weights:
                    saved.setdefault(storage.data_ptr(), (storage.nbytes(), tensor))
                return tensor

            config = TrainConfig(
                max_grad_norm=None,
                learning_rate=1e-9,
                token_budget=64,
                share_prefix=share,
                checkpoint_rows=rows,
            )
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
                trainer.step(groups, config)
            grads[share, rows] = _seen_gradient(trainer)
            layers[share, rows] = len(checkpoints)
            kept[share, rows] = sum(size for size, _ in saved.values())
            saved.clear()
    depth = trainer.model.config.num_hidden_layers
    # four micro-batches of one long row each, every layer checkpointed in each
    assert layers == {(True, False): 0, (True, True): 4 * depth,
                      (False, False): 0, (False, True): 4 * depth}  # fmt: skip
    for share in (True, False):
        _assert_same_gradient(grads[share, True], grads[share, False])
    # what stays: the logits over the 49k-word vocabulary, and after a shared prefix that
    # prefix's own pass (short of `checkpoint_prefix`)
    assert kept[True, True] < kept[True, False] / 2, kept
    assert kept[False, True] < kept[False, False] / 4, kept


@pytest.mark.slow
def test_the_kl_term_runs_the_base_models_prefix_once_with_the_same_gradient(base_path):
    """With --beta, the base model's pass over the shared prefix runs once per update, not once
    per micro-batch, and the gradient (policy and KL terms) is the same as without sharing."""
    grads, kls, passes = [], [], []
    for share in (False, True):
        torch.manual_seed(0)
        trainer = LoraTrainer(base_path)
        with torch.no_grad():  # a trained adapter: the policy differs from the base model
            for name, param in trainer.model.named_parameters():
                if "lora_B" in name:
                    param.normal_(0.0, 0.05)
        _, groups = _prefix_groups(trainer)
        config = TrainConfig(
            max_grad_norm=None, learning_rate=1e-9, share_prefix=share, token_budget=64, beta=0.5
        )
        reference_prefix = trainer._reference_prefix

        def counted(batches, run=reference_prefix):
            kv = run(batches)
            passes.append((len(batches), kv is not None))
            return kv

        trainer._reference_prefix = counted
        kls.append(trainer.step(groups, config)["kl"])
        grads.append(_seen_gradient(trainer))
    # four micro-batches each time; with sharing, one base-model prefix pass serves them all
    assert passes == [(4, False), (4, True)]
    assert kls[0] > 1e-4 and kls[1] == pytest.approx(kls[0], rel=1e-4)
    _assert_same_gradient(grads[1], grads[0])


def test_attention_over_a_prefix_keeps_one_copy_of_each_key_value_head_for_backward():
    """The trainer's CPU attention (grouped-query SDPA) gives transformers' result and gradient
    without the per-query-head copies of keys and values that transformers saves for backward
    (2.4 of 8.1 GB saved by a default calculator micro-batch)."""
    from types import SimpleNamespace

    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from mcprl.serving._kv import cpu_attention

    module = SimpleNamespace(num_key_value_groups=3, is_causal=True, training=True)
    torch.manual_seed(0)
    query = torch.randn(2, 9, 5, 16, requires_grad=True)  # 5 tail tokens after 7 prefix tokens
    keys, values = (torch.randn(2, 3, 12, 16, requires_grad=True) for _ in range(2))
    mask = torch.ones(2, 1, 5, 12, dtype=torch.bool).tril(7)
    mask[1, :, :, -1] = False  # the second row is one token shorter (padding)
    results = []
    for attention in (cpu_attention, sdpa_attention_forward):
        shapes: list[tuple[int, ...]] = []

        def keep(t: torch.Tensor, shapes=shapes) -> torch.Tensor:
            shapes.append(tuple(t.shape))
            return t

        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            out, _ = attention(module, query, keys, values, mask, scaling=0.25)
        grads = torch.autograd.grad(out.square().sum(), (query, keys, values))
        results.append((out, grads, shapes))
    (mine, my_grads, my_saved), (theirs, their_grads, their_saved) = results
    torch.testing.assert_close(mine, theirs)
    for got, want in zip(my_grads, their_grads, strict=True):
        torch.testing.assert_close(got, want)
    per_head_copy = (2, 9, 12, 16)
    assert per_head_copy in their_saved and per_head_copy not in my_saved


def test_the_layers_of_a_training_pass_keep_one_additive_mask_for_backward():
    """SDPA turns a boolean mask into an additive one at each call, and in training each layer
    kept its copy for the backward pass (0.23 GB a 1,024-token micro-batch behind the catalog's
    head). The trainer's attention converts it once for all the layers of a pass: the same
    outputs and gradients, bit for bit, and one mask kept instead of one a layer."""
    from types import SimpleNamespace

    from mcprl.serving._kv import cpu_attention

    torch.manual_seed(0)
    query = torch.randn(2, 9, 5, 16, requires_grad=True)
    keys, values = (torch.randn(2, 3, 12, 16, requires_grad=True) for _ in range(2))
    mask = torch.ones(2, 1, 5, 12, dtype=torch.bool).tril(7)
    mask[1, :, :, -1] = False
    results = []
    for convert in (True, False):
        masks: dict[int, torch.Tensor] = {}

        def keep(t: torch.Tensor, masks=masks) -> torch.Tensor:
            if t.shape == mask.shape:
                masks[t.untyped_storage().data_ptr()] = t  # held: no address reused
            return t

        outs = []
        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            for layer in range(3):  # the layers of one forward pass, each given the same mask
                module = SimpleNamespace(num_key_value_groups=3, is_causal=True, layer_idx=layer)
                given = mask if convert else mask.clone()  # a new tensor: converted anew
                outs.append(cpu_attention(module, query, keys, values, given, scaling=0.25)[0])
        out = torch.stack(outs)
        grads = torch.autograd.grad(out.square().sum(), (query, keys, values))
        results.append((out, grads, len(masks)))
    (out, grads, kept), (their_out, their_grads, their_kept) = results
    assert torch.equal(out, their_out)
    assert all(torch.equal(a, b) for a, b in zip(grads, their_grads, strict=True))
    assert (kept, their_kept) == (1, 3)


@pytest.mark.parametrize("checkpointed", [False, True])
def test_rows_after_shared_positions_run_as_one_sequence_with_the_same_values_and_gradient(
    checkpointed, monkeypatch
):
    """A micro-batch's rows after the positions they share (the prompt, a group's head, a turn)
    run as one sequence of their tokens, padding left out, each token seeing the shared keys
    and values and its own row up to itself: the hidden states and the gradient of a padded
    batch, and the shared keys and values kept once for the backward pass, not once a row."""
    from transformers import LlamaConfig, LlamaModel

    import mcprl.training._trainer as trainer_module
    from mcprl.serving import CPU_ATTENTION, prefix_kv

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
    )  # fmt: skip
    body = LlamaModel(config)
    body.set_attn_implementation(CPU_ATTENTION)
    shared = torch.randint(0, 64, (23,))
    ids = torch.randint(0, 64, (3, 9))
    attention = torch.ones(3, 9, dtype=torch.long)
    attention[1, 6:] = 0  # rows of 9, 6 and 2 tokens, right-padded
    attention[2, 2:] = 0
    results = []
    for packed in (False, True):
        monkeypatch.setattr(trainer_module, "PACK_ROWS", packed)
        body.zero_grad()
        kv = prefix_kv(body, shared)
        sizes: list[int] = []

        def keep(t: torch.Tensor, sizes=sizes) -> torch.Tensor:
            sizes.append(t.numel())
            return t

        with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
            hidden = LoraTrainer._after_prefix(body, kv, ids, attention, checkpointed)
        real = hidden[attention.bool()]
        real.square().sum().backward()
        grads = torch.cat([p.grad.flatten() for p in body.parameters() if p.grad is not None])
        results.append((real.detach(), grads, sum(sizes)))
    (batch, batch_grad, batch_saved), (packed, packed_grad, packed_saved) = results
    torch.testing.assert_close(packed, batch, rtol=1e-4, atol=1e-5)
    _assert_same_gradient(packed_grad, batch_grad)
    assert packed_saved < batch_saved  # the shared keys and values once, and no padding


def _assert_same_gradient(got: torch.Tensor, want: torch.Tensor, rtol: float = 1e-4) -> None:
    """Equal up to float32 summation order, over the whole gradient: the kernels differ between
    CPUs (on an AVX2-only EPYC, 1 of 2.4M entries fell outside an elementwise rtol of 1e-4, with
    the difference's norm 1.2e-5 of the gradient's). A lost prefix gradient is off by O(1)."""
    diff = got - want
    assert diff.norm() <= rtol * want.norm(), float(diff.norm() / want.norm())
    assert diff.abs().max() <= rtol * want.abs().max(), float(diff.abs().max())


def _recording(prefix_pass, ran: list[int]):
    def record(batches, *args):
        ran.append(len(batches))
        return prefix_pass(batches, *args)

    return record


# -- the local backend -------------------------------------------------------------------------


def _make_group(backend_model_tokenizer, rewards=(1.0, 0.0)):
    tok = backend_model_tokenizer
    prompt = tok.encode("Say something nice.")
    completions = [tok.encode(" You are great."), tok.encode(" Whatever.")]
    trajectories = [
        traj(r, choice(prompt, c, lp=-1.0)) for r, c in zip(rewards, completions, strict=True)
    ]
    return TrajectoryGroup(scenario_id="nice", trajectories=trajectories)


@pytest.mark.slow
@pytest.mark.anyio
async def test_local_backend_trains_checkpoints_serves_and_resumes(tmp_path):
    import json

    import openai

    from mcprl import TrainableModel
    from mcprl.backends import LocalBackend

    # the run directory is a symlink to elsewhere (a run moved to a bigger disk): its
    # checkpoints load all the same, though they lie outside the backend's `path`
    (tmp_path / "runs" / "p").mkdir(parents=True)
    (tmp_path / "runs" / "p" / "agent").symlink_to(tmp_path / "moved", target_is_directory=True)
    (tmp_path / "moved").mkdir()
    with LocalBackend(tmp_path / "runs") as backend:
        model = await TrainableModel(name="agent", project="p").register(backend)
        assert await model.get_step() == 0 and model.served_name == "agent@0"
        assert "final_tools" in model.extensions  # mcprl's server: answers are not kept
        client = model.openai_client()
        ask = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6, "temperature": 0}
        at0 = await client.chat.completions.create(model="agent@0", **ask)
        base = await client.chat.completions.create(model="smollm2-135m", **ask)
        assert at0.choices[0].model_extra["token_ids"] == base.choices[0].model_extra["token_ids"]
        trainer = backend._runs[("p", "agent")].trainer
        served = {p.data_ptr() for p in backend._server.engine.model.parameters()}
        frozen = [p for p in trainer.model.parameters() if not p.requires_grad]
        assert frozen and all(p.data_ptr() in served for p in frozen)  # one copy of the base
        threads, train_step = [], trainer.step
        trainer.step = lambda *a: threads.append(threading.current_thread().name) or train_step(*a)
        result = await model.train(
            [_make_group(trainer.tokenizer)], TrainConfig(learning_rate=1e-3)
        )
        assert result.step == 1 and model.served_name == "agent@1"
        # on the engine's thread: a second thread's OpenMP team slowed decoding 1.6x after it
        assert threads == ["mcprl-engine"]
        ids = [m.id for m in (await client.models.list()).data]
        assert "agent@1" in ids and "agent@0" not in ids
        again = await client.chat.completions.create(model="smollm2-135m", **ask)
        assert again.choices[0].model_extra["token_ids"] == base.choices[0].model_extra["token_ids"]
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(model="agent@0", **ask)
        run_dir = tmp_path / "runs" / "p" / "agent"
        assert (run_dir / "checkpoints" / "0001" / "adapter_model.safetensors").is_file()
        assert (run_dir / "trajectories" / "train" / "0001.jsonl").is_file()
        history = [json.loads(x) for x in (run_dir / "history.jsonl").read_text().splitlines()]
        assert history[-1]["step"] == 1 and "train/loss" in history[-1]
        await backend.log(model, {"reward": 0.5})
        updates = backend._runs[("p", "agent")].trainer.updates

    with LocalBackend(tmp_path / "runs") as again:
        resumed = await TrainableModel(name="agent", project="p").register(again)
        assert await resumed.get_step() == 1
        trainer = again._runs[("p", "agent")].trainer
        assert trainer.updates == updates == 1 and trainer.optimizer.state  # optimizer restored
        await again.train(resumed, [_make_group(trainer.tokenizer)])
        assert await again.list_checkpoints(resumed) == [0, 1, 2]
        assert await resumed.delete_checkpoints(keep_last=1, keep_best_by="val/reward") == [0]
        assert await again.list_checkpoints(resumed) == [1, 2]  # 1 kept as best by val/reward


KILL_SCRIPT = """
import sys, anyio
from mcprl import TrainableModel
from mcprl.backends import LocalBackend
from mcprl.training import TrainConfig
from mcprl.types import Choice, Trajectory, TrajectoryGroup

def group(tok):
    prompt = tok.encode("Tell me a story about a dragon. " * 12)
    trajs = []
    for i, r in enumerate([1.0, 0.0, 0.5, 0.25]):
        toks = tok.encode(f" Once upon a time number {i}" * 8)
        trajs.append(Trajectory(reward=r, choices=[Choice(message_index=0,
            prompt_token_ids=prompt, token_ids=toks, logprobs=[-1.0] * len(toks))]))
    return TrajectoryGroup(scenario_id="s", trajectories=trajs)

async def main(path, steps):
    with LocalBackend(path) as backend:
        model = await TrainableModel(name="m", project="kill").register(backend)
        tok = backend._runs[("kill", "m")].trainer.tokenizer
        print("start", model.step, backend._runs[("kill", "m")].trainer.updates, flush=True)
        for _ in range(steps):
            print("training", model.step + 1, flush=True)
            await model.train([group(tok)] * 2, TrainConfig(token_budget=2048))
            print("done", model.step, flush=True)

anyio.run(main, sys.argv[1], int(sys.argv[2]))
"""


@pytest.mark.slow
def test_a_process_killed_mid_step_resumes_from_its_last_checkpoint(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(KILL_SCRIPT))
    runs = tmp_path / "runs"
    root = str(Path(__file__).resolve().parent.parent)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
    }
    proc = subprocess.Popen(
        [sys.executable, str(script), str(runs), "5"], stdout=subprocess.PIPE, text=True, env=env
    )
    lines = []
    for line in proc.stdout:
        lines.append(line.strip())
        if line.startswith("training 2"):
            break
    import time as _time

    _time.sleep(1.0)  # inside step 2
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    assert "done 1" in lines
    checkpoints = runs / "kill" / "m" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir() if not p.name.startswith(".")) in (
        ["0000", "0001"],
        ["0000", "0001", "0002"],  # killed before, or just after, the write
    )
    resumed = subprocess.run(
        [sys.executable, str(script), str(runs), "1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    start = resumed.stdout.splitlines()[0].split()
    step, updates = int(start[1]), int(start[2])
    assert step in (1, 2) and updates == step  # same step count and optimizer state
    assert f"done {step + 1}" in resumed.stdout
    assert not any(p.name.startswith(".tmp-") for p in checkpoints.iterdir())
