"""Training configuration: small composed models, checked once."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from mcprl.errors import UsageError
from mcprl.rewards import Informative

__all__ = ["LoraConfig", "ScaleRewards", "TrainConfig"]

ScaleRewards = Literal["group", "batch", "none"]

ALL_PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class LoraConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    r: int = Field(default=8, ge=1)
    alpha: int = Field(default=16, ge=1)
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    target_modules: list[str] = Field(default_factory=lambda: list(ALL_PROJECTIONS))


class TrainConfig(BaseModel):
    """One GRPO step's settings (see `mcprl.training._losses` for the variants)."""

    model_config = ConfigDict(extra="forbid")
    learning_rate: float = Field(default=1e-4, gt=0, description="5e-6..1e-5 for 1B+ models")
    loss: Literal["ppo", "gspo", "cispo"] = "ppo"
    eps_low: float = Field(default=0.2, ge=0, lt=1)
    eps_high: float = Field(default=0.2, ge=0)
    beta: float = Field(default=0.0, ge=0, description="KL penalty to the base model")
    normalization: Literal["token", "sequence", "fixed"] = "token"
    fixed_length: int = Field(default=1024, ge=1, description='for normalization "fixed"')
    scale_rewards: ScaleRewards = Field(
        default="batch",
        description='divide advantages by the std of their group ("group", GRPO), of the '
        'step\'s groups ("batch") or not at all ("none", Dr. GRPO); true/false mean group/none',
    )
    positive_weight: float = Field(
        default=1.0,
        gt=0,
        le=1,
        description="weight of the attempts that beat their group's mean (W-REINFORCE, Zhu et "
        "al. 2025, weights them 0.1): below 1, the update mostly pushes down what failed, and "
        "the probability it frees goes to the alternatives by their odds under the policy, "
        "instead of onto the one choice that won",
    )
    negative_weight: float = Field(
        default=1.0,
        ge=0,
        le=1,
        description="weight of the attempts below their group's mean, in [0, 1]: a negative "
        "gradient on an attempt the policy found unlikely raises every other choice by its "
        "odds, so the policy's likeliest choice gains most, in this context and in others "
        "that share its weights (the squeezing effect, Ren & Sutherland 2025); below 1, the "
        "update is mostly the winners pulled up",
    )
    cap_failures: bool = Field(
        default=True,
        description="push a group's failures down no harder than its winners are pulled up: "
        "where most of a group's attempts won, each failure's negative advantage is shrunk "
        "to the winners' size (a 7-of-8 group's lone failure otherwise weighs 7 winners). "
        "Groups that mostly failed, where a task is being learned, are left as they are",
    )
    solved_failure_weight: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="weight of the failures of a group that mostly won, after `cap_failures`: "
        "0 (the default) trains such a group on its winners alone. A solved kind's failures "
        "are mostly temperature-1 slips (a misspelt title); pushing their rare tokens down "
        "squeezes the probability onto the policy's likeliest tokens everywhere "
        "(`negative_weight`), while the groups that mostly failed, where a kind is being "
        "learned, keep their full push. 1: GRPO's push after the cap",
    )
    push_down_below: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="a token with a negative advantage that the policy gives a probability p "
        "below this is pushed down with weight p / push_down_below: the gradient of p, not of "
        "log p, for tokens the policy would rarely sample again. A temperature-1 attempt "
        "samples tokens at p=1e-4 now and then (a digit run, a garbled name); by log p each "
        "pulls on the update like a likely mistake, and the squeezing effect "
        "(`negative_weight`) piles their mass onto the likeliest tokens. 0: every token by "
        "log p (GRPO); 1: every token by its probability",
    )
    old_logprobs: Literal["trainer", "sampler"] = Field(
        default="trainer",
        description="what the clipped ratio divides by: the trainer's own log-probabilities "
        "before this step's first update (`trainer`, as TRL and verl do: with one update per "
        "step the ratio is exactly 1, so only later mini-batches clip), or the ones the server "
        "sampled with (`sampler`). They differ by the two programs' rounding: in bfloat16 by "
        "0.02-0.06 nats a token, which clipped 1-8% of the trained tokens (benchmarks/RESULTS.md)",
    )
    informative: Informative = Field(
        default="reward",
        description="which groups are trained: those whose rewards differ (`reward`), or only "
        "those where some attempts succeeded and some failed (`success`, DAPO's filter; groups "
        "of scenarios without a reference answer fall back to `reward`). The training loop "
        "draws and redraws scenarios by the same rule; `mcprl train` defaults to `success` "
        "where its reward checks references (`reference`, `both`; benchmarks/RESULTS.md), "
        "the library to `reward`, as ART does",
    )
    call_credit: float = Field(
        default=0.0,
        ge=0,
        description="credit per call: each turn's tokens also get this weight x (1 if the turn "
        "made the reference call that was due, else 0, less how often the group's turns due "
        "that call made it); 0 is off. Needs references with calls (mcprl.training._batch)",
    )
    max_grad_norm: float | None = Field(default=1.0, gt=0)
    updates_per_step: int = Field(
        default=1,
        ge=1,
        description="optimizer steps per training step, each on its share of the groups "
        "(PPO mini-batches: later ones are off-policy, and the clip range applies)",
    )
    token_budget: int = Field(
        default=1024,
        ge=64,
        description="padded tokens per micro-batch; the tokens its rows share (the prompt "
        "prefix, a group's own head) count once, up to half of it; activation memory grows "
        "with it (about 2 MB a tail token on SmolLM2-135M: benchmarks/step_memory.py); the "
        "gradient is the same",
    )
    share_prefix: bool = Field(
        default=True,
        description="run once what sequences share: the prompt prefix of an update, a group's "
        "head (its task and worked example), and a turn some of a group's attempts took alike "
        "(the same call and its result), trained tokens and all (same gradient)",
    )
    checkpoint_prefix: int | None = Field(
        default=512,
        ge=1,
        description="a shared prefix of this many tokens or more runs layer by layer under "
        "activation checkpointing: each layer's activations are recomputed in the backward "
        "pass instead of kept, for one more forward pass of the prefix (once an update) and "
        "the same gradient. A 4,400-token tool list kept about 4.7 GB of them; the "
        "calculator's ~840-token head 0.8 GB, a step's peak 2.71 -> 1.93 GB at no measured "
        "cost (2048 before; benchmarks/step_memory.py --checkpoint-prefix). None: never",
    )
    checkpoint_rows: bool = Field(
        default=True,
        description="a micro-batch whose rows hold more padded tokens than token_budget (a row "
        "longer than the budget is a micro-batch of its own, as a catalog turn after a long "
        "tool result) runs each layer under activation checkpointing, so that the budget bounds "
        "the activations kept for long rows too: one more forward pass of those rows, the same "
        "gradient",
    )
    weight_decay: float = Field(default=0.0, ge=0)
    adam_beta1: float = Field(
        default=0.9,
        ge=0,
        lt=1,
        description="AdamW's momentum across training steps: each step's update is this much "
        "the earlier steps' directions (0: the update follows this step's groups alone)",
    )

    @field_validator("scale_rewards", mode="before")
    @classmethod
    def _scale_from_bool(cls, value: object) -> object:
        if isinstance(value, bool):  # the old switch: on = per group, off = none
            return "group" if value else "none"
        return value

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        if self.loss == "gspo" and self.normalization != "sequence":
            raise UsageError(
                'loss "gspo" gives one loss per sequence; set normalization="sequence" with it'
            )
        return self
