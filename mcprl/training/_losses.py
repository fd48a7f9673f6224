"""GRPO, as implemented: advantages, the policy-loss variants, and normalisation.

Shapes: every tensor is [batch, time], already aligned so that position t holds the
log-probability of token t; `mask` is 1 on trained (assistant) tokens and 0 elsewhere.

- Advantage = reward - mean(group), then scaled (`scale_rewards`): "group" divides by the
  group's std (GRPO), "batch" by the std of every centred reward in the step's groups with
  signal (LitePPO, Liu et al. 2025), "none" leaves it (Dr. GRPO). Per-group scaling blows a
  group whose rewards differ only by small partial credit up to the size of a group where one
  attempt succeeded; batch scaling keeps their ratio, so success drives the update.
  Groups whose rewards are all equal carry no signal and are skipped.
- `PPOClip`: token-level ratio against the old log-probabilities, clipped at
  [1 - eps_low, 1 + eps_high]. The old ones are the trainer's own before the step's first update
  (`TrainConfig.old_logprobs`), so with one update a step the ratio is 1 and the loss is
  REINFORCE with the advantages; the server's sampling log-probabilities are the other choice.
- `GSPO`: one ratio per sequence, the geometric mean of its token ratios, clipped likewise.
- `CISPO`: REINFORCE on the log-probabilities, weighted by the clipped ratio with its gradient
  stopped, so clipped tokens still contribute.
- KL to the base model (beta > 0): the k3 estimator exp(ref - new) - (ref - new) - 1 per token.
- Normalisation: "token" (sum over the batch's trained tokens / their count), "sequence" (mean
  per sequence, then over sequences), "fixed" (sum / (sequences x a fixed length), Dr. GRPO).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from mcprl.errors import UsageError
from mcprl.training._config import ScaleRewards

__all__ = [
    "CISPO",
    "GSPO",
    "LOSSES",
    "Normalizer",
    "PPOClip",
    "PolicyLoss",
    "batch_advantages",
    "failures_capped",
    "group_advantages",
    "kl_k3",
    "pushed_down_by_probability",
]


def group_advantages(rewards: list[float], scale: bool = True) -> list[float] | None:
    """Advantages for one group, or None when every reward is equal (no signal)."""
    if len(rewards) < 2 or max(rewards) - min(rewards) < 1e-9:
        return None
    mean = sum(rewards) / len(rewards)
    centred = [r - mean for r in rewards]
    if not scale:
        return centred
    std = math.sqrt(sum(c * c for c in centred) / (len(rewards) - 1))
    return [c / (std + 1e-6) for c in centred]


def batch_advantages(
    groups: list[list[float]], scale: ScaleRewards = "group"
) -> list[list[float] | None]:
    """Advantages for each group's rewards (None for a group without signal), scaled per group,
    by the std over the whole batch's groups with signal, or not at all."""
    out = [group_advantages(r, scale=scale == "group") for r in groups]
    if scale != "batch":
        return out
    centred = [a for adv in out if adv is not None for a in adv]
    if len(centred) < 2:
        return out
    std = math.sqrt(sum(c * c for c in centred) / (len(centred) - 1))
    return [None if adv is None else [a / (std + 1e-6) for a in adv] for adv in out]


def failures_capped(advantages: list[float], cap: bool = True, weight: float = 1.0) -> list[float]:
    """`advantages` with the failures of a group that mostly won pushed down less.

    A group mostly won where its most negative advantage is larger in size than its most
    positive one. Centred advantages of k wins in n attempts are (n-k)/n and -k/n, so such a
    group gives each failure k/(n-k) times a winner's push: 7 in a 7-of-8 group, 1/7 in a
    1-of-8 one, which is left alone. With `cap` every negative advantage is shrunk by the same
    factor to the winners' size (`TrainConfig.cap_failures`); then each is multiplied by
    `weight` (`TrainConfig.solved_failure_weight`; 0 trains the group on its winners alone)."""
    top = max((a for a in advantages if a > 0), default=0.0)
    bottom = -min((a for a in advantages if a < 0), default=0.0)
    if bottom <= top or top == 0.0:
        return advantages
    factor = (top / bottom if cap else 1.0) * weight
    return [a * factor if a < 0 else a for a in advantages]


@dataclass(frozen=True)
class Normalizer:
    """Turns per-token losses into one number, consistently across micro-batches.

    `total_tokens` and `total_sequences` describe the whole batch, so the losses of
    micro-batches add up to the loss of the batch and gradient accumulation is exact.
    """

    kind: str
    total_tokens: int
    total_sequences: int
    fixed_length: int = 1024

    def __call__(self, per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        masked = per_token * mask
        if self.kind == "token":
            return masked.sum() / max(self.total_tokens, 1)
        if self.kind == "sequence":
            lengths = mask.sum(-1).clamp(min=1)
            return (masked.sum(-1) / lengths).sum() / max(self.total_sequences, 1)
        if self.kind == "fixed":
            return masked.sum() / (max(self.total_sequences, 1) * self.fixed_length)
        raise UsageError(f"unknown normalisation {self.kind!r}")


class PolicyLoss:
    """A policy-loss variant: per-token losses (and clip statistics) from log-probabilities."""

    name = "base"

    def __init__(self, eps_low: float = 0.2, eps_high: float = 0.2) -> None:
        self.eps_low, self.eps_high = eps_low, eps_high

    def per_token(
        self, new: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(per-token loss, per-token 1.0 where clipping was active); adv is [batch, 1], or
        [batch, T-1] where turns carry credit of their own (`TrainConfig.call_credit`)."""
        raise NotImplementedError


class PPOClip(PolicyLoss):
    name = "ppo"

    def per_token(self, new, old, adv, mask):
        ratio = torch.exp(new - old)
        clipped = ratio.clamp(1 - self.eps_low, 1 + self.eps_high)
        unclipped_obj, clipped_obj = ratio * adv, clipped * adv
        loss = -torch.minimum(unclipped_obj, clipped_obj)
        return loss, (clipped_obj < unclipped_obj).float()


class GSPO(PolicyLoss):
    name = "gspo"

    def per_token(self, new, old, adv, mask):
        lengths = mask.sum(-1, keepdim=True).clamp(min=1)
        log_ratio = ((new - old) * mask).sum(-1, keepdim=True) / lengths
        ratio = torch.exp(log_ratio)  # [batch, 1]: one ratio per sequence
        clipped = ratio.clamp(1 - self.eps_low, 1 + self.eps_high)
        seq_loss = -torch.minimum(ratio * adv, clipped * adv)
        was_clipped = (clipped * adv < ratio * adv).float()
        return seq_loss.expand_as(new), was_clipped.expand_as(new)


class CISPO(PolicyLoss):
    name = "cispo"

    def per_token(self, new, old, adv, mask):
        ratio = torch.exp(new - old)
        weight = ratio.clamp(1 - self.eps_low, 1 + self.eps_high).detach()
        return -weight * adv * new, (weight != ratio.detach()).float()


LOSSES: dict[str, type[PolicyLoss]] = {cls.name: cls for cls in (PPOClip, GSPO, CISPO)}


def pushed_down_by_probability(
    adv: torch.Tensor, new: torch.Tensor, below: float = 1.0
) -> torch.Tensor:
    """Per-token advantages where each negative one whose token the policy gives a probability
    p < `below` is multiplied by p / `below` (`TrainConfig.push_down_below`): the token's
    policy-gradient term becomes -A * grad p / below in place of -A * grad log p. `adv` is
    [batch, 1] or [batch, T-1], `new` the log-probabilities, [batch, T-1]."""
    weight = (new.detach().exp() / below).clamp(max=1.0)
    return torch.where(adv < 0, adv * weight, adv.expand_as(new))


def kl_k3(new: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Per-token estimate of KL(new || ref), always >= 0, unbiased in expectation."""
    diff = ref - new
    return torch.exp(diff) - diff - 1
