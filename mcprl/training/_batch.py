"""From judged groups to training sequences, and from sequences to micro-batches.

Sequences are built from the token ids the policy sampled; text is never re-tokenized. Each
assistant completion's tokens are trained on; prompt, tool and user tokens are masked. A
multi-turn attempt stays one sequence when each recorded prompt extends the previous prompt and
completion; otherwise each completion is its own sequence.

Agent prompts start alike: every attempt of a step carries the same system prompt and tool block
(~800 tokens for the calculator), and only a few hundred tokens after it differ. With
`share_prefix`, a micro-batch holds the tokens its sequences share once (`MicroBatch.prefix`)
and each sequence's own tail after it; the trainer runs the prefix once and the tails on its
key/value cache, which is the same computation (same logits, same gradient) at a fraction of the
tokens. Past it, a group's rows share their task (and its worked example: the group's head,
`MicroBatch.head`), and often their first turn too: attempts that made the same call, word for
word, got the same result, hundreds of tokens of a listing or a log. Such a turn runs once for
its rows (`MicroBatch.turn`), trained tokens and all: a prediction the rows share is the same in
each of them, so its log-probability is computed once and each row's loss reads it.

Credit per call (`call_credit` > 0): an attempt's advantage is one number for all its tokens,
so an attempt that made the first two calls of a three-call chain and then went wrong is pushed
down as a whole, the right calls with the wrong one. With references whose calls are known,
each turn also gets `call_credit x (made - rate)`: `made` is 1 where the turn made the reference
call that was due (`mcprl.rewards.call_turns`, in order, with the right arguments), and `rate`
is how often the group's turns that were due that call made it. The tokens of that turn carry
the attempt's advantage plus this bonus. A group that no attempt solved, which the informative
filter would skip, trains on these bonuses alone where they differ.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import torch

from mcprl.rewards import Informative, is_informative
from mcprl.training._config import ScaleRewards
from mcprl.training._losses import batch_advantages, failures_capped
from mcprl.types import Choice, Trajectory, TrajectoryGroup

__all__ = [
    "BatchStats",
    "MicroBatch",
    "Sequence",
    "build_sequences",
    "call_bonuses",
    "micro_batches",
    "shared_prefix_length",
    "split_by_group",
]


@dataclass
class Sequence:
    tokens: list[int]
    mask: list[int]  # 1 where tokens[t] is a trained completion token
    old_logprobs: list[float]  # aligned with tokens; 0.0 where mask is 0
    advantage: float
    group: int = 0  # the index of its group among the step's groups with signal
    bonus: list[float] | None = None  # per token, added to `advantage` (credit per call)

    @property
    def trained_tokens(self) -> int:
        return sum(self.mask)

    @property
    def pushes(self) -> bool:
        """Whether the policy loss moves the policy on it: with no advantage and no credit per
        call every loss variant gives it a loss of zero and no gradient."""
        return self.advantage != 0 or any(self.bonus or ())


@dataclass
class BatchStats:
    groups: int = 0
    groups_skipped: int = 0
    trajectories_dropped: int = 0  # failed or not trainable
    sequences: int = 0
    trained_tokens: int = 0
    rewards: list[float] = field(default_factory=list)
    groups_call_credit_only: int = 0  # trained on credit per call alone (no outcome signal)


def _extends(prefix: list[int], ids: list[int]) -> bool:
    return len(ids) >= len(prefix) and ids[: len(prefix)] == prefix


def _sequences_of(
    traj: Trajectory, advantage: float, bonus: dict[int, float] | None = None
) -> list[Sequence]:
    """`bonus`: credit per call, by the message index of the turn that earns it."""
    out: list[Sequence] = []
    current: Sequence | None = None
    for c in traj.choices:
        assert c.prompt_token_ids is not None and c.token_ids is not None
        assert c.logprobs is not None
        if current is not None and _extends(current.tokens, c.prompt_token_ids):
            gap = len(c.prompt_token_ids) - len(current.tokens)
            current.tokens = list(c.prompt_token_ids)
            current.mask += [0] * gap
            current.old_logprobs += [0.0] * gap
            if current.bonus is not None:
                current.bonus += [0.0] * gap
        else:
            current = Sequence(
                list(c.prompt_token_ids),
                [0] * len(c.prompt_token_ids),
                [0.0] * len(c.prompt_token_ids),
                advantage,
                bonus=[0.0] * len(c.prompt_token_ids) if bonus else None,
            )
            out.append(current)
        _append(current, c, (bonus or {}).get(c.message_index, 0.0))
    return out


def _append(seq: Sequence, c: Choice, bonus: float = 0.0) -> None:
    seq.tokens += c.token_ids
    seq.mask += [1] * len(c.token_ids)
    seq.old_logprobs += list(c.logprobs)
    if seq.bonus is not None:
        seq.bonus += [bonus] * len(c.token_ids)


def call_bonuses(trajectories: list[Trajectory], weight: float) -> list[dict[int, float]]:
    """Credit per call for each of a group's attempts: {message index: bonus} (module
    docstring). Empty where the attempts carry no `call_turns` or every turn did alike."""
    turns = [json.loads(t.metadata.get("call_turns") or "[]") for t in trajectories]
    made: dict[int, list[int]] = {}
    for rows in turns:
        for _, due, hit in rows:
            made.setdefault(due, []).append(hit)
    rate = {due: sum(hits) / len(hits) for due, hits in made.items()}
    out = [{index: weight * (hit - rate[due]) for index, due, hit in rows} for rows in turns]
    return [{k: v for k, v in b.items() if v != 0.0} for b in out]


def build_sequences(
    groups: list[TrajectoryGroup],
    scale_rewards: ScaleRewards = "group",
    positive_weight: float = 1.0,
    negative_weight: float = 1.0,
    informative: Informative = "reward",
    call_credit: float = 0.0,
    cap_failures: bool = False,
    solved_failure_weight: float = 1.0,
) -> tuple[list[Sequence], BatchStats]:
    """Training sequences for every group with signal, and what was left out.

    Positive advantages are multiplied by `positive_weight` and negative ones by
    `negative_weight` (after scaling, and after `cap_failures` and `solved_failure_weight`:
    `failures_capped`). A group that is not informative by `informative` (see
    `mcprl.curriculum.is_informative`) is skipped, and its rewards take no part in a batch's
    scale, unless `call_credit` gives its turns credit that differs (module docstring)."""
    stats = BatchStats()
    sequences: list[Sequence] = []
    usable_of = [
        [t for t in group.trajectories if t.trainable and t.reward is not None] for group in groups
    ]
    signal = [is_informative(group, informative) for group in groups]
    all_advantages = batch_advantages(
        [[t.reward for t in u] if s else [] for u, s in zip(usable_of, signal, strict=True)],
        scale=scale_rewards,
    )
    for group, usable, advantages in zip(groups, usable_of, all_advantages, strict=True):
        stats.groups += 1
        stats.trajectories_dropped += len(group.trajectories) - len(usable) + len(group.exceptions)
        stats.rewards += [t.reward for t in usable]
        bonuses = call_bonuses(usable, call_credit) if call_credit > 0 else [{}] * len(usable)
        if advantages is None and any(bonuses):
            advantages = [0.0] * len(usable)
            stats.groups_call_credit_only += 1
        if advantages is None:
            stats.groups_skipped += 1
            continue
        index = stats.groups - stats.groups_skipped - 1
        if cap_failures or solved_failure_weight < 1:
            advantages = failures_capped(advantages, cap_failures, solved_failure_weight)
        for traj, adv, bonus in zip(usable, advantages, bonuses, strict=True):
            adv *= positive_weight if adv > 0 else negative_weight
            for seq in _sequences_of(traj, adv, bonus):
                seq.group = index
                sequences.append(seq)
    stats.sequences = len(sequences)
    stats.trained_tokens = sum(s.trained_tokens for s in sequences)
    return sequences, stats


@dataclass
class MicroBatch:
    input_ids: torch.Tensor  # [b, T]: each sequence after the shared prefix
    attention_mask: torch.Tensor  # [b, T]
    loss_mask: torch.Tensor  # [b, T-1], for the predictions of tokens 1..T-1
    old_logprobs: torch.Tensor  # [b, T-1]
    advantages: torch.Tensor  # [b, 1], or [b, T-1] per prediction with credit per call
    prefix: torch.Tensor | None = None  # [P]: tokens every sequence starts with, run once
    head: torch.Tensor | None = None  # [H]: tokens after the prefix that this batch's rows share
    # [U]: tokens after the head that these rows share, trained ones among them (the same call
    # and its result): run once, `input_ids` are the tails after it, and `loss_mask`,
    # `old_logprobs` and `advantages` (per prediction) cover the turn's predictions too, so
    # they are [b, U + T - 1]
    turn: torch.Tensor | None = None


def shared_prefix_length(sequences: list[Sequence], minimum: int = 32) -> int:
    """How many leading tokens to run once for all `sequences` (0: not worth it).

    The prefix stops one token before the sequences part, and before the first trained token's
    predecessor, so every trained prediction is made inside the tails.
    """
    from mcprl.serving import common_prefix_length

    if len(sequences) < 2:
        return 0
    common = common_prefix_length([s.tokens for s in sequences])  # leaves each one token
    trained = min((s.mask.index(1) if 1 in s.mask else len(s.mask)) for s in sequences)
    length = min(common, trained - 1)
    return length if length >= minimum else 0


def split_by_group(sequences: list[Sequence], parts: int) -> list[list[Sequence]]:
    """`parts` lists of whole groups (group i goes to list i mod parts), empty lists left out:
    an update sees every attempt of each of its groups, the better and the worse together."""
    out = [[s for s in sequences if s.group % parts == i] for i in range(parts)]
    return [chunk for chunk in out if chunk]


HEAD_MINIMUM = 64
"""Tokens a group's rows share past the update's prefix (its task, a worked example shown to
it) for the group to be packed in micro-batches of its own, that head run once for them all."""

TURN_MINIMUM = 64
"""Tokens some of a group's rows share past its head (the same first call, word for word, and
the result it got) for them to be packed apart, those tokens run once for them (`MicroBatch.turn`).
A git step's turns (a log, ~760 tokens) trained in 368 s instead of 574 (beside other work).
With the rows packed (`mcprl.training._trainer.PACK_ROWS`), turns from 64 tokens paid too,
against 256: a calculator step 66.0 -> 46.8 s, unit-converter 184.7 -> 158.9 s, catalog 120.5
-> 104.6 s, sqlite 47.9 -> 45.4 s, their peaks 0.02-0.32 GB higher (at most 4.09 GB), alone
(benchmarks/RESULTS.md)."""


def micro_batches(
    sequences: list[Sequence], token_budget: int, pad_id: int, share_prefix: bool = False
) -> list[MicroBatch]:
    """Pack sequences (longest first) so each micro-batch pads to at most `token_budget`.

    With `share_prefix`, the prefix all sequences share runs once and only the tails are
    padded; a group whose rows share `HEAD_MINIMUM` tokens or more past it (a task opened by its
    own worked examples) is packed apart, after the others, with those tokens as its
    micro-batches' `head`, run once for the group (`LoraTrainer.step`); and its rows that go on
    alike for `TURN_MINIMUM` tokens or more past it (`_turns`) apart again, that turn run once
    for them (`MicroBatch.turn`). What the rows share
    (prefix, or prefix and head) counts once per micro-batch, up to half the budget: the tails
    hold the activations (about 2 MB a token on SmolLM2-135M, whatever the context), so a
    micro-batch gets between half the budget and all of it for them. Counting the whole prefix
    left a calculator step a row per micro-batch (its prompt: ~850 of the 1,024); counting none
    of a head packed a group's eight tails behind their worked example, 3.4 GB at the peak
    (benchmarks/RESULTS.md, "What a micro-batch counts").
    """
    prefix = shared_prefix_length(sequences) if share_prefix else 0
    packs: list[tuple[int, list[Sequence]]] = []  # (tokens run once, the rows)
    mixed = sequences
    if share_prefix:
        mixed = []
        groups: dict[int, list[Sequence]] = {}
        for seq in sequences:
            groups.setdefault(seq.group, []).append(seq)
        for rows in groups.values():
            head = shared_prefix_length(rows, minimum=prefix + HEAD_MINIMUM)
            if head:
                packs.append((head, rows))
            else:
                mixed += rows
    shared = token_budget // 2  # at most what the shared tokens count

    def counted(start: int) -> int:
        return min(start, shared)

    out = [
        _collate(b, pad_id, prefix) for b in _packed(mixed, token_budget, prefix, counted(prefix))
    ]
    for start, rows in packs:  # the head runs once for the group, and counts with the prefix
        for end, shared_rows in _turns(rows, start):  # and a turn once for the rows sharing it
            out += [
                _collate(b, pad_id, prefix, start, end)
                for b in _packed(shared_rows, token_budget, end, counted(end))
            ]
    return out


def _turns(rows: list[Sequence], start: int) -> list[tuple[int, list[Sequence]]]:
    """A group's rows past its head (`start`) as (where their tails start, the rows): rows
    that share `TURN_MINIMUM` tokens or more past it share them as a turn, which stops one token
    before they part, so that each row predicts its first token of its own in its tail; the
    others start at `start`. Every prediction of a shared token is the same in every row that
    shares it: the rows' losses on it are taken from one pass (`LoraTrainer.token_logprobs`)."""
    from mcprl.serving import common_prefix_length

    buckets: dict[tuple[int, ...], list[Sequence]] = {}
    for seq in rows:
        buckets.setdefault(tuple(seq.tokens[start : start + TURN_MINIMUM + 1]), []).append(seq)
    out: list[tuple[int, list[Sequence]]] = []
    alone: list[Sequence] = []
    for bucket in buckets.values():
        length = common_prefix_length([s.tokens[start:] for s in bucket]) - 1
        if len(bucket) > 1 and length >= TURN_MINIMUM:
            out.append((start + length, bucket))
        else:
            alone += bucket
    if alone:
        out.insert(0, (start, alone))
    return out


def _packed(
    sequences: list[Sequence], token_budget: int, start: int, counted: int = 0
) -> list[list[Sequence]]:
    """`sequences`, longest first, in lists whose tails past `start` pad to `token_budget`
    with `counted` tokens more."""
    batches: list[list[Sequence]] = []
    for seq in sorted(sequences, key=lambda s: len(s.tokens), reverse=True):
        width = len(batches[-1][0].tokens) - start if batches else 0
        if batches and counted + width * (len(batches[-1]) + 1) <= token_budget:
            batches[-1].append(seq)
        else:
            batches.append([seq])
    return batches


def _collate(
    seqs: list[Sequence], pad_id: int, prefix: int = 0, start: int = 0, end: int = 0
) -> MicroBatch:
    """`seqs` as one micro-batch: `prefix` tokens shared by the update, up to `start` shared by
    these rows (the head), up to `end` shared by them too (a turn, trained tokens among them),
    then each row's own tail, padded. The loss's tensors cover the predictions from `start`."""
    start = max(start, prefix)
    end = max(end, start)
    width = max(len(s.tokens) for s in seqs) - start

    def pad(values: list, fill) -> list:
        values = values[start:]
        return values + [fill] * (width - len(values))

    ids = torch.tensor([pad(s.tokens, pad_id)[end - start :] for s in seqs])
    attention = torch.tensor([pad([1] * len(s.tokens), 0)[end - start :] for s in seqs])
    mask = torch.tensor([pad(s.mask, 0) for s in seqs], dtype=torch.float32)[:, 1:]
    old = torch.tensor([pad(s.old_logprobs, 0.0) for s in seqs], dtype=torch.float32)[:, 1:]
    if any(s.bonus is not None for s in seqs):  # per token: the attempt's plus its turn's
        adv = torch.tensor(
            [pad([s.advantage + b for b in (s.bonus or [0.0] * len(s.tokens))], 0.0) for s in seqs],
            dtype=torch.float32,
        )[:, 1:]
    else:
        adv = torch.tensor([[s.advantage] for s in seqs], dtype=torch.float32)
    shared = torch.tensor(seqs[0].tokens[:prefix]) if prefix else None
    head = torch.tensor(seqs[0].tokens[prefix:start]) if start > prefix else None
    turn = torch.tensor(seqs[0].tokens[start:end]) if end > start else None
    return MicroBatch(ids, attention, mask, old, adv, shared, head, turn)
