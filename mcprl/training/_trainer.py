"""`LoraTrainer`: one GRPO step on a LoRA adapter, from judged trajectory groups.

    trainer = LoraTrainer(resolve_model("smollm2-135m"), LoraConfig())
    metrics = trainer.step(groups, TrainConfig(learning_rate=1e-4))
    trainer.save(checkpoint_dir)             # adapter + optimizer state

A step reads like the algorithm: build sequences from the sampled tokens, compute advantages per
group, then for each micro-batch: log-probabilities under the current policy, the chosen policy
loss, an optional KL penalty to the base model, backward; finally clip the gradient norm and take
one optimizer step. Micro-batch losses are normalised against the whole batch, so accumulating
them gives exactly the full-batch gradient. With `updates_per_step` k > 1 the step's groups are
dealt into k mini-batches of whole groups, one optimizer step each (PPO's mini-batches: the
later ones see a policy that has moved since sampling, which the clipped ratio accounts for).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from mcprl._memory import return_freed_memory
from mcprl.errors import CheckpointError
from mcprl.serving import ThreadGovernor, pick_dtype, torch_dtype
from mcprl.serving import prefix_kv as run_prefix
from mcprl.training._batch import MicroBatch, build_sequences, micro_batches, split_by_group
from mcprl.training._config import LoraConfig, TrainConfig
from mcprl.training._losses import LOSSES, Normalizer, kl_k3, pushed_down_by_probability
from mcprl.types import TrajectoryGroup

__all__ = ["LoraTrainer"]

logger = logging.getLogger(__name__)


class LoraTrainer:
    # whether a prefix the sequences share can run once per update (`TrainConfig.share_prefix`):
    # it continues rows from a key/value cache, which needs transformers' own forward pass
    shares_prefix = True

    def __init__(
        self,
        base_path: str,
        lora: LoraConfig | None = None,
        *,
        adapter_path: str | Path | None = None,
        dtype: str = "float32",
        device: str | None = None,
    ) -> None:
        from transformers import AutoTokenizer

        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.tokenizer = AutoTokenizer.from_pretrained(base_path)
        self.dtype = pick_dtype(dtype, str(self.device))
        self.model = self._load(base_path, lora or LoraConfig(), adapter_path)
        self.model.config.use_cache = False
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=1e-4, weight_decay=0.0)
        self.updates = 0
        self._shared: list[torch.nn.Parameter] = []  # base weights read from an engine
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else (self.tokenizer.eos_token_id or 0)

    def _load(self, base_path: str, lora: LoraConfig, adapter_path: str | Path | None) -> Any:
        """The base model with a trainable LoRA: a new one (`lora`), or the one saved at
        `adapter_path`."""
        from peft import LoraConfig as PeftLoraConfig
        from peft import PeftModel, get_peft_model
        from transformers import AutoModelForCausalLM

        base = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch_dtype(self.dtype))
        base = base.to(self.device)
        if self.device.type == "cpu":  # grouped-query SDPA: see mcprl.serving._kv
            from mcprl.serving import CPU_ATTENTION

            base.set_attn_implementation(CPU_ATTENTION)
        if adapter_path is not None:
            return PeftModel.from_pretrained(base, str(adapter_path), is_trainable=True)
        config = PeftLoraConfig(
            r=lora.r,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            target_modules=lora.target_modules,
            task_type="CAUSAL_LM",
        )
        return get_peft_model(base, config)

    def share_base_weights(self, served: torch.nn.Module) -> int:
        """Read the frozen base weights from `served`, a model of the same base that an engine
        serves, in place of this trainer's own copy; returns the bytes no longer held twice.
        Each weight is taken only where its name (the LoRA and adapter wrappers' names left
        out), shape, dtype and device match. Neither side writes base weights: the trainer
        updates the LoRA only, and the engine adds its adapters' products to the base layers'
        outputs. On a CPU, SmolLM2-135M's bfloat16 weights are 0.27 GB of a default run's
        ~4 GB."""

        def key(name: str) -> str:
            name = name.removeprefix("base_model.model.")
            return name.replace(".base_layer.", ".").replace(".base.", ".")

        theirs = {key(n): t for n, t in served.named_parameters()}
        shared = 0
        for name, mine in self.model.named_parameters():
            other = theirs.get(key(name))
            if mine.requires_grad or other is None or other is mine:
                continue
            if (other.shape, other.dtype, other.device) != (mine.shape, mine.dtype, mine.device):
                continue
            if other.data_ptr() == mine.data_ptr():
                continue
            mine.data = other.data
            self._shared.append(mine)
            shared += mine.numel() * mine.element_size()
        return shared

    def _check_shared_weights(self) -> None:
        """Refuse to train on shared base weights that the engine has swapped out (it decodes
        from packed copies, `mcprl.serving._packed.SwappedWeights`): reading them would read
        freed memory. The engine swaps them back for work it runs (`Engine.run_exclusive`)."""
        if any(p.untyped_storage().nbytes() == 0 for p in self._shared):
            raise RuntimeError(
                "the base weights this trainer shares with an engine are swapped out; run the "
                "step under `Engine.run_exclusive` (as `LocalBackend` does) or `Engine.paused()`"
            )

    def _hidden(
        self, ids: torch.Tensor, attention: torch.Tensor, checkpointed: bool = False
    ) -> torch.Tensor:
        """The last layer's hidden states (after the final norm) of whole rows, [rows, T, H];
        `checkpointed`: under layer checkpoints (`_layer_checkpoints`)."""
        body = self.model.get_base_model().model
        if not checkpointed:
            return body(input_ids=ids, attention_mask=attention).last_hidden_state
        with _layer_checkpoints(body) as cache:
            out = body(
                input_ids=ids, attention_mask=attention, past_key_values=cache, use_cache=True
            )
        return out.last_hidden_state

    # -- one step ------------------------------------------------------------------------------

    def step(
        self,
        groups: list[TrajectoryGroup],
        config: TrainConfig,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> dict[str, float]:
        """One GRPO update from `groups`; `on_progress(done, total)` after each micro-batch."""
        self._check_shared_weights()
        started = time.perf_counter()
        sequences, stats = build_sequences(
            groups,
            scale_rewards=config.scale_rewards,
            positive_weight=config.positive_weight,
            negative_weight=config.negative_weight,
            informative=config.informative,
            call_credit=config.call_credit,
            cap_failures=config.cap_failures,
            solved_failure_weight=config.solved_failure_weight,
        )
        metrics = _reward_metrics(stats)
        if not sequences:
            logger.info("no group carried a signal; no update this step")
            metrics.update(trained_tokens=0.0, skipped_update=1.0)
            metrics["time_train_s"] = time.perf_counter() - started
            return metrics
        for group in self.optimizer.param_groups:
            group["lr"] = config.learning_rate
            group["weight_decay"] = config.weight_decay
            group["betas"] = (config.adam_beta1, group["betas"][1])
        loss_fn = LOSSES[config.loss](config.eps_low, config.eps_high)
        self.model.train()
        totals = {"loss": 0.0, "kl": 0.0, "clipped": 0.0, "abs_logprob_drift": 0.0}
        plan, ran = [], 0
        for part in split_by_group(sequences, config.updates_per_step):
            tokens = sum(s.trained_tokens for s in part)
            norm = Normalizer(config.normalization, tokens, len(part), config.fixed_length)
            # a sequence that pushes nothing (a solved kind's failure at solved_failure_weight
            # 0) adds nothing to the loss, nor without a KL term to the gradient: counted in the
            # normalisation, as it always was, and not run
            part = [s for s in part if s.pushes or config.beta > 0]
            if not part:
                continue
            ran += sum(s.trained_tokens for s in part)
            batches = micro_batches(
                part,
                config.token_budget,
                self.pad_id,
                share_prefix=config.share_prefix and self.shares_prefix,
            )
            plan.append((norm, batches))
        done, total = 0, sum(len(batches) for _, batches in plan)
        # threads sized to the cores other processes leave free, as the engine's are: beside
        # another run's rollouts a step on two spinning threads ran at 0.16x its speed alone
        governor = ThreadGovernor.for_device(self.device.type)
        if governor is not None:
            governor.settle()
        norms = []
        # the ratio's denominator per micro-batch: None is the micro-batch's own forward pass
        # (first update), a tensor the policy before the step's first update (later ones)
        before = [[None] * len(batches) for _, batches in plan]
        if config.old_logprobs == "trainer" and len(plan) > 1:
            before = [self._logprobs_before(batches) for _, batches in plan]
            before[0] = [None] * len(plan[0][1])
        for (norm, batches), olds in zip(plan, before, strict=True):
            self.optimizer.zero_grad(set_to_none=True)
            shared = self._prefix_pass(batches, config.checkpoint_prefix)
            ref_kv = self._reference_prefix(batches) if config.beta > 0 else None
            head: _HeadPass | None = None  # a group's own head, run once for its micro-batches
            turn: _TurnPass | None = None  # a turn some of its rows share, run once for them
            for i, (batch, own) in enumerate(zip(batches, olds, strict=True)):
                if governor is not None:
                    governor.poll()
                new_head = head is not None and not head.runs(batch.head)
                if turn is not None and (new_head or not turn.runs(batch.turn)):
                    turn.backward()  # into its head's leaves, before the head's own
                    turn = None
                if head is not None and new_head:
                    head.backward()
                    head = None
                if head is None and batch.head is not None and shared is not None:
                    head = self._head_pass(batch.head, shared, config.checkpoint_prefix)
                if turn is None and batch.turn is not None and head is not None:
                    turn = self._turn_pass(batches[i:], head, config.checkpoint_prefix)
                if config.old_logprobs == "sampler":
                    own = batch.old_logprobs
                # a row longer than the budget is a micro-batch of its own, and would keep
                # activations for all its tokens (a catalog tail after a tool result: ~1,500)
                long = config.checkpoint_rows and batch.input_ids.numel() > config.token_budget
                parts = self._micro_step(
                    batch,
                    loss_fn,
                    norm,
                    config.beta,
                    turn or head or shared,
                    ref_kv,
                    own,
                    checkpointed=long,
                    push_down_below=config.push_down_below,
                )
                for k, v in parts.items():
                    totals[k] += v / (len(plan) if k in ("loss", "kl") else 1)
                if self.device.type == "cpu":
                    # glibc keeps what a micro-batch freed and serves the next one's tensors
                    # from fresh pages: a default calculator run's process climbed from 2.9 to
                    # 4.4 GB within one step while 1.5-2.4 GB was in use
                    return_freed_memory()
                done += 1
                if on_progress is not None:
                    on_progress(done, total)
            if turn is not None:
                turn.backward()
            if head is not None:
                head.backward()  # into the shared prefix's leaves, before theirs
            if shared is not None:
                shared.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(
                self.params, config.max_grad_norm if config.max_grad_norm else math.inf
            )
            norms.append(float(grad_norm))
            self.optimizer.step()
            self.updates += 1
        self.optimizer.zero_grad(set_to_none=True)
        # glibc keeps the step's freed activations: after a default calculator step on CPU the
        # process still held 9.9 GB, and 1.0 GB after trimming
        return_freed_memory()
        tokens = max(ran, 1)
        metrics.update(
            loss=totals["loss"],
            kl=totals["kl"],
            clip_fraction=totals["clipped"] / tokens,
            abs_logprob_drift=totals["abs_logprob_drift"] / tokens,
            grad_norm=sum(norms) / max(len(norms), 1),
            updates=float(len(norms)),
            learning_rate=config.learning_rate,
            trained_tokens=float(stats.trained_tokens),
            sequences=float(stats.sequences),
            idle_tokens=float(stats.trained_tokens - ran),
            time_train_s=time.perf_counter() - started,
        )
        return metrics

    def _prefix_pass(
        self, batches: list[MicroBatch], checkpoint_from: int | None = None
    ) -> _PrefixPass | None:
        """The prefix the micro-batches of an update share, run once for all of them; with
        layer checkpoints when it has `checkpoint_from` tokens or more."""
        prefix = batches[0].prefix
        long = _reaches(prefix, checkpoint_from)
        if prefix is None or (len(batches) < 2 and not long):
            return None  # one micro-batch runs its prefix itself
        assert all(b.prefix is not None and torch.equal(b.prefix, prefix) for b in batches)
        body = self.model.get_base_model().model
        return _PrefixPass(body, prefix.to(self.device), checkpointed=long)

    def _head_pass(
        self, head: torch.Tensor, shared: _PrefixPass, checkpoint_from: int | None = None
    ) -> _HeadPass:
        """A group's own head (`MicroBatch.head`), run once after the update's shared prefix
        for all the group's micro-batches, with layer checkpoints from `checkpoint_from`
        tokens: its gradient reaches the prefix through `shared`'s leaves."""
        body = self.model.get_base_model().model
        checkpointed = _reaches(head, checkpoint_from)
        return _HeadPass(body, head.to(self.device), checkpointed=checkpointed, past=shared.kv)

    def _turn_pass(
        self, batches: list[MicroBatch], head: _HeadPass, checkpoint_from: int | None = None
    ) -> _TurnPass:
        """The turn of `batches[0]` (`MicroBatch.turn`), which some rows of a group share, run
        once after their head for all their micro-batches (`batches` up to the first with
        another turn), with its predictions' log-probabilities where one of their rows trains
        them: its gradient reaches the head through `head`'s leaves."""
        batch, turn = batches[0], batches[0].turn
        keep = torch.zeros(len(turn), dtype=torch.bool)
        for other in batches:
            if other.turn is None or not torch.equal(other.turn, turn):
                break
            keep |= other.loss_mask[:, : len(turn)].bool().any(0)
        return _TurnPass(
            self.model.get_base_model(),
            turn.to(self.device),
            batch.input_ids[0, 0].to(self.device),
            head.kv,
            keep.to(self.device),
            _reaches(turn, checkpoint_from),
        )

    def _logprobs_before(self, batches: list[MicroBatch]) -> list[torch.Tensor]:
        """Each micro-batch's log-probabilities under the policy as it is, without gradients."""
        out = []
        with torch.no_grad():
            for batch in batches:
                out.append(
                    self.token_logprobs(
                        batch.input_ids.to(self.device),
                        batch.attention_mask.to(self.device),
                        batch.loss_mask.to(self.device),
                        prefix=_on(batch.prefix, self.device),
                        head=_on(batch.head, self.device),
                        turn=_on(batch.turn, self.device),
                    )
                )
        return out

    def _reference_prefix(
        self, batches: list[MicroBatch]
    ) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        """The shared prefix's keys and values under the base model (adapter off), run once for
        the KL term of all the micro-batches of an update."""
        if len(batches) < 2 or batches[0].prefix is None:
            return None  # one micro-batch runs its prefix itself
        body = self.model.get_base_model().model
        with torch.no_grad(), self.model.disable_adapter():
            return run_prefix(body, batches[0].prefix.to(self.device))

    def _micro_step(
        self,
        batch: MicroBatch,
        loss_fn,
        norm: Normalizer,
        beta: float,
        shared: _PrefixPass | None = None,
        ref_kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
        old: torch.Tensor | None = None,
        checkpointed: bool = False,
        push_down_below: float = 0.0,
    ) -> dict:
        """One micro-batch's loss, backward. `old`: the ratio's denominator (None: this pass's
        own log-probabilities, so the ratio is 1 and only its gradient counts); `checkpointed`:
        the policy's pass runs its layers under activation checkpoints; `push_down_below`:
        `TrainConfig.push_down_below`."""
        ids = batch.input_ids.to(self.device)
        attention = batch.attention_mask.to(self.device)
        mask = batch.loss_mask.to(self.device)
        sampled = batch.old_logprobs.to(self.device)
        adv = batch.advantages.to(self.device)
        prefix, head = _on(batch.prefix, self.device), _on(batch.head, self.device)
        turn = _on(batch.turn, self.device)
        new = self.token_logprobs(
            ids,
            attention,
            mask,
            prefix=prefix,
            prefix_kv=shared.kv if shared else None,
            # the step hands a micro-batch with a head that head's pass, or else runs it here;
            # and one with a turn that turn's pass (which holds the head's keys and values)
            head=None if isinstance(shared, _HeadPass) else head,
            turn=shared if isinstance(shared, _TurnPass) else turn,
            checkpointed=checkpointed,
        )
        old = new.detach() if old is None else old.to(self.device)
        if push_down_below > 0:
            adv = pushed_down_by_probability(adv, new, push_down_below)
        per_token, clipped = loss_fn.per_token(new, old, adv, mask)
        loss = norm(per_token, mask)
        kl_value = 0.0
        if beta > 0:
            with torch.no_grad(), self.model.disable_adapter():
                ref = self.token_logprobs(
                    ids, attention, mask, prefix=prefix, prefix_kv=ref_kv, head=head, turn=turn
                )
            kl = norm(kl_k3(new, ref), mask)
            loss = loss + beta * kl
            kl_value = float(kl.detach())
        loss.backward()
        return {
            "loss": float(loss.detach()),
            "kl": kl_value,
            "clipped": float((clipped * mask).sum()),
            # how far the trainer is from what the server sampled with
            "abs_logprob_drift": float(((new.detach() - sampled).abs() * mask).sum()),
        }

    def token_logprobs(
        self,
        ids: torch.Tensor,
        attention: torch.Tensor,
        mask: torch.Tensor | None = None,
        *,
        prefix: torch.Tensor | None = None,
        prefix_kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
        head: torch.Tensor | None = None,
        turn: torch.Tensor | _TurnPass | None = None,
        checkpointed: bool = False,
    ) -> torch.Tensor:
        """log p(token t | tokens < t) for t = 1..T-1, as [batch, T-1] float32.

        With `mask`, the vocabulary projection and softmax run only where mask is 1 (zeros
        elsewhere): the trained tokens are a fraction of the sequence, and the [tokens x vocab]
        logits are the largest tensors of a step. With `prefix` ([P] tokens that precede every
        row of `ids`), the prefix runs once and the rows continue from its key/value cache;
        gradients flow through both. `prefix_kv`: that cache, already computed (`_PrefixPass`).
        `head` ([H] tokens after the prefix, before every row): run once after the prefix, the
        rows continuing from both (`MicroBatch.head`).
        `turn` ([U] tokens after the head, before every row, trained ones among them; or its
        `_TurnPass`, whose keys and values then stand for the prefix's and head's too): run
        once, its predictions' log-probabilities the same in every row, so the result is
        [batch, U + T - 1], the turn's predictions first (`MicroBatch.turn`).
        `checkpointed`: the rows' layers run under activation checkpoints (`_layer_checkpoints`:
        the same values and gradient, for one more forward pass of the rows).
        """
        causal_lm = self.model.get_base_model()
        body = causal_lm.model
        shared = None  # the turn's log-probabilities, [U]
        if isinstance(turn, _TurnPass):
            hidden = self._after_prefix(body, turn.kv, ids, attention, checkpointed)
            shared, mask = turn.logprobs, None if mask is None else mask[:, len(turn.tokens) :]
        elif prefix is None and head is None and turn is None:
            hidden = self._hidden(ids, attention, checkpointed)
        else:
            kv = prefix_kv
            if kv is None and prefix is not None:
                kv = run_prefix(body, prefix)
            if head is not None:
                kv = run_prefix(body, head, past=kv)
            if turn is not None:
                keep = None if mask is None else mask[:, : len(turn)].bool().any(0)
                turn_hidden, kv = _run_turn(body, turn, kv)
                shared = _turn_logprobs(causal_lm, turn_hidden, turn, ids[0, 0], keep)
                mask = None if mask is None else mask[:, len(turn) :]
            assert kv is not None
            hidden = self._after_prefix(body, kv, ids, attention, checkpointed)
        hidden, targets = hidden[:, :-1], ids[:, 1:]
        if mask is None:
            logits = causal_lm.lm_head(hidden).float()
            out = torch.log_softmax(logits, dim=-1).gather(-1, targets[..., None])[..., 0]
        else:
            out = _picked_logprobs(causal_lm, hidden, targets, mask.bool())
        if shared is None:
            return out
        return torch.cat([shared[None].expand(len(ids), -1), out], dim=1)

    @staticmethod
    def _after_prefix(
        body: Any,
        kv: list[tuple[torch.Tensor, torch.Tensor]],
        ids: torch.Tensor,
        attention,
        checkpointed: bool = False,
    ) -> torch.Tensor:
        """The rows' last hidden states ([rows, T, d]) after `kv`, the keys and values of the
        positions every row starts with (batch 1). Several rows run as one sequence of their
        tokens (`PACK_ROWS`, `_packed_rows`)."""
        from mcprl.serving import expanded_cache

        rows, width = ids.shape
        if PACK_ROWS and rows > 1 and kv[0][0].shape[0] == 1:
            return _packed_rows(body, kv, ids, attention, checkpointed)
        start = kv[0][0].shape[-2]
        full = torch.cat([attention.new_ones(rows, start), attention], dim=1)
        positions = torch.arange(start, start + width, device=ids.device).expand(rows, -1)
        inputs = {"input_ids": ids, "attention_mask": full, "position_ids": positions}
        if not checkpointed:
            cache = expanded_cache(kv, rows)
            return body(**inputs, past_key_values=cache, use_cache=True).last_hidden_state
        head = [(k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1)) for k, v in kv]
        with _layer_checkpoints(body, head) as cache:
            out = body(**inputs, past_key_values=cache, use_cache=True)
        return out.last_hidden_state

    # -- state ---------------------------------------------------------------------------------

    def save(self, directory: str | Path) -> None:
        """Adapter weights (peft format, safetensors) and optimizer state (safetensors + JSON)."""
        directory = Path(directory)
        self.model.save_pretrained(directory)
        save_optimizer_state(directory, self.optimizer.state_dict(), self.updates)

    def load_state(self, directory: str | Path) -> None:
        state, self.updates = load_optimizer_state(directory)
        self.optimizer.load_state_dict(state)


# Optimizer state is stored in formats that cannot run code when read: tensors in safetensors,
# everything else in JSON. A run folder may come from anyone; loading it must be safe.
_STATE_JSON, _STATE_TENSORS, _LEGACY_STATE = (
    "trainer_state.json",
    "optimizer.safetensors",
    "trainer_state.pt",
)


def save_optimizer_state(directory: Path, state: dict[str, Any], updates: int) -> None:
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    entries: dict[str, dict[str, Any]] = {}
    for index, entry in state["state"].items():
        out: dict[str, Any] = {}
        for key, value in entry.items():
            if torch.is_tensor(value):
                name = f"{index}.{key}"
                tensors[name] = value.detach().to("cpu").contiguous()
                out[key] = {"tensor": name}
            else:
                out[key] = {"value": value}
        entries[str(index)] = out
    save_file(tensors, str(directory / _STATE_TENSORS))
    meta = {
        "format": 1,
        "updates": updates,
        "param_groups": state["param_groups"],
        "state": entries,
    }
    (directory / _STATE_JSON).write_text(json.dumps(meta), encoding="utf-8")


def load_optimizer_state(directory: str | Path) -> tuple[dict[str, Any], int]:
    """The optimizer state dict and update count saved by `save_optimizer_state`.

    A checkpoint from before that format (`trainer_state.pt`) is read with torch's weights-only
    loader, which refuses anything but tensors and plain data; nothing is ever unpickled freely.
    """
    directory = Path(directory)
    meta_path = directory / _STATE_JSON
    if meta_path.is_file():
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
            tensors = load_file(str(directory / _STATE_TENSORS))
            state = {
                int(index): {
                    key: tensors[v["tensor"]] if "tensor" in v else v["value"]
                    for key, v in entry.items()
                }
                for index, entry in meta["state"].items()
            }
            return {"state": state, "param_groups": meta["param_groups"]}, int(meta["updates"])
        except (OSError, ValueError, KeyError, TypeError, SafetensorError) as exc:
            raise CheckpointError(
                f"cannot read the optimizer state in {directory}: {exc}; restore the file or "
                "delete that checkpoint directory to resume from the one before"
            ) from exc
    legacy = directory / _LEGACY_STATE
    if legacy.is_file():
        import pickle

        try:
            state = torch.load(legacy, weights_only=True, map_location="cpu")
            return state["optimizer"], int(state["updates"])
        except (pickle.UnpicklingError, RuntimeError, KeyError, TypeError) as exc:
            raise CheckpointError(
                f"refusing to load {legacy}: it holds objects other than tensors and plain data, "
                "and loading it could run code; do not use a run folder you cannot trust "
                f"({str(exc)[:300]})"
            ) from exc
    raise CheckpointError(
        f"{directory} has no optimizer state ({_STATE_JSON}); delete that checkpoint directory "
        "to resume from the one before"
    )


def _reward_metrics(stats: Any) -> dict[str, float]:
    rewards = stats.rewards
    mean = sum(rewards) / len(rewards) if rewards else 0.0
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards)) if rewards else 0.0
    return {
        "reward_mean": mean,
        "reward_std": std,
        "groups": float(stats.groups),
        "groups_skipped_fraction": stats.groups_skipped / max(stats.groups, 1),
        "attempts_dropped": float(stats.trajectories_dropped),
        "groups_call_credit_only": float(stats.groups_call_credit_only),
    }


def _on(tokens: torch.Tensor | None, device: Any) -> torch.Tensor | None:
    return tokens.to(device) if tokens is not None else None


class _PrefixPass:
    """A prefix shared by an update's micro-batches, run forward once and backward once.

    The micro-batches read its keys and values through detached leaves, whose gradients add up
    over the micro-batches; `backward()` then sends the sum through the prefix's own graph. The
    gradient is the same as running the prefix in every micro-batch, at one prefix's cost.
    """

    def __init__(
        self,
        body: Any,
        prefix: torch.Tensor,
        checkpointed: bool = False,
        past: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> None:
        self.tokens = prefix
        self.outputs = (
            _checkpointed_prefix(body, prefix, past)
            if checkpointed
            else run_prefix(body, prefix, past=past)
        )
        self.kv = [
            (keys.detach().requires_grad_(keys.requires_grad),
             values.detach().requires_grad_(values.requires_grad))
            for keys, values in self.outputs
        ]  # fmt: skip

    def backward(self) -> None:
        pairs = [
            (out, leaf.grad)
            for outs, leaves in zip(self.outputs, self.kv, strict=True)
            for out, leaf in zip(outs, leaves, strict=True)
            if leaf.grad is not None
        ]
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], grad_tensors=[g for _, g in pairs])
        self.outputs = self.kv = []  # free the graph


class _HeadPass(_PrefixPass):
    """A group's own head, run once after the update's shared prefix (`past`, whose keys and
    values it holds too) for all the group's micro-batches; its backward reaches the prefix's
    leaves, so it runs before the prefix's own."""

    def runs(self, head: torch.Tensor | None) -> bool:
        """Whether this pass is the head `head`."""
        return head is not None and torch.equal(head.to(self.tokens.device), self.tokens)


class _TurnPass(_HeadPass):
    """A turn some rows of a group share (`MicroBatch.turn`), run once after their head (`past`)
    for all their micro-batches: its keys and values, and the log-probabilities of its
    predictions (`logprobs`, [U]: of its tokens 2..U, then of the rows' first tail token,
    which they share), which the rows read through detached leaves whose gradients add up over
    the micro-batches; `backward()` sends both through the turn's graph, into `past`'s leaves.
    `keep`: [U], where some row trains a prediction (only those are projected onto the
    vocabulary)."""

    def __init__(
        self,
        causal_lm: Any,
        turn: torch.Tensor,
        first: torch.Tensor,
        past: list[tuple[torch.Tensor, torch.Tensor]],
        keep: torch.Tensor,
        checkpointed: bool = False,
    ) -> None:
        self.tokens = turn
        hidden, kv = _run_turn(causal_lm.model, turn, past, checkpointed)
        logprobs = _turn_logprobs(causal_lm, hidden, turn, first, keep)
        self.outputs = [*kv, (logprobs,)]
        leaves = [
            tuple(t.detach().requires_grad_(t.requires_grad) for t in out) for out in self.outputs
        ]
        self.kv, self.logprobs = leaves[:-1], leaves[-1][0]

    def backward(self) -> None:
        self.kv = [*self.kv, (self.logprobs,)]  # the outputs' leaves, pair by pair
        super().backward()


def _run_turn(
    body: Any,
    turn: torch.Tensor,
    past: list[tuple[torch.Tensor, torch.Tensor]],
    checkpointed: bool = False,
) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    """`turn`'s last hidden states ([U, d]) after `past`, and the keys and values of both (as
    `run_prefix`'s), with layer checkpoints where `checkpointed`."""
    out, cache = _run_after(body, past, {"input_ids": turn[None]}, checkpointed)
    return out.last_hidden_state[0], [(layer.keys, layer.values) for layer in cache.layers]


def _run_after(
    body: Any,
    past: list[tuple[torch.Tensor, torch.Tensor]],
    inputs: dict[str, torch.Tensor],
    checkpointed: bool = False,
) -> tuple[Any, Any]:
    """`body(**inputs)` (batch 1) after `past`'s keys and values, under layer checkpoints where
    `checkpointed`: (its output, the cache that then holds both)."""
    from mcprl.serving import expanded_cache

    if checkpointed:
        with _layer_checkpoints(body, past) as cache:
            return body(**inputs, past_key_values=cache, use_cache=True), cache
    cache = expanded_cache(past, 1)
    return body(**inputs, past_key_values=cache, use_cache=True), cache


def _turn_logprobs(
    causal_lm: Any,
    hidden: torch.Tensor,
    turn: torch.Tensor,
    first: torch.Tensor,
    keep: torch.Tensor | None,
) -> torch.Tensor:
    """log p of `turn`'s tokens 2..U and of `first` (the token after it), from its hidden
    states ([U, d]), [U] float32; zero where `keep` is False (no row trains that prediction)."""
    targets = torch.cat([turn[1:], first.reshape(1)])
    keep = torch.ones_like(targets, dtype=torch.bool) if keep is None else keep
    return _picked_logprobs(causal_lm, hidden, targets, keep)


def _picked_logprobs(
    causal_lm: Any, hidden: torch.Tensor, targets: torch.Tensor, keep: torch.Tensor
) -> torch.Tensor:
    """log p of `targets` from `hidden` (`targets`' shape, then d) where `keep`, float32, zero
    elsewhere: only the kept positions are projected onto the vocabulary."""
    logits = causal_lm.lm_head(hidden[keep]).float()
    picked = torch.log_softmax(logits, dim=-1).gather(-1, targets[keep][:, None])[:, 0]
    out = torch.zeros(targets.shape, dtype=picked.dtype, device=picked.device)
    return out.index_put((keep,), picked)


PACK_ROWS = True
"""Whether the rows of a micro-batch after shared positions run as one sequence
(`_packed_rows`) rather than as a batch."""


def _packed_rows(
    body: Any,
    kv: list[tuple[torch.Tensor, torch.Tensor]],
    ids: torch.Tensor,
    attention: torch.Tensor,
    checkpointed: bool = False,
) -> torch.Tensor:
    """The rows' last hidden states ([rows, T, d], zeros at padding) after `kv` (batch 1), the
    rows run as one sequence of their tokens, padding left out: each token attends to all of
    `kv` and to its own row's tokens up to itself (a block-causal mask), at the position it
    has in its row. The same values as a batch of rows (`LoraTrainer._after_prefix`), without
    what a batch costs behind a long shared head: a batch's attention reads `kv` through a copy
    per row of its keys and values at every layer, kept for the backward pass (on git, 8 rows
    after ~2,800 shared positions: ~1 GB), and runs its padding through every layer."""
    rows, width = ids.shape
    start = kv[0][0].shape[-2]
    keep = attention.bool()  # right-padded: a row's tokens come first
    row = torch.arange(rows, device=ids.device)[:, None].expand(rows, width)[keep]
    column = torch.arange(width, device=ids.device).expand(rows, width)[keep]
    own = (row[:, None] == row[None, :]) & (column[None, :] <= column[:, None])
    mask = torch.cat([own.new_ones(len(row), start), own], dim=1)[None, None]
    inputs = {
        "input_ids": ids[keep][None],
        "attention_mask": mask,
        "position_ids": (column + start)[None],
    }
    hidden = _run_after(body, kv, inputs, checkpointed)[0].last_hidden_state
    out = hidden.new_zeros(rows, width, hidden.shape[-1])
    return out.index_put((keep,), hidden[0])


def _reaches(tokens: torch.Tensor | None, checkpoint_from: int | None) -> bool:
    """Whether `tokens` are enough to run under layer checkpoints (`checkpoint_from` or more)."""
    return tokens is not None and checkpoint_from is not None and len(tokens) >= checkpoint_from


def _checkpointed_prefix(
    body: Any, prefix: torch.Tensor, past: list[tuple[torch.Tensor, torch.Tensor]] | None = None
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`run_prefix` under layer checkpoints (`_layer_checkpoints`), after `past` where given
    (the result holds both, as `run_prefix`'s does). Keys and values still carry their graph,
    so gradients reach the prefix, and `past`, as before."""
    with _layer_checkpoints(body, past) as cache:
        body(input_ids=prefix[None], past_key_values=cache, use_cache=True)
    return [(layer.keys, layer.values) for layer in cache.layers]


@contextlib.contextmanager
def _layer_checkpoints(
    body: Any, head: list[tuple[torch.Tensor, torch.Tensor]] | None = None
) -> Iterator[Any]:
    """For the pass run inside: each decoder layer under torch's (non-reentrant) activation
    checkpoint, so that it keeps only its input and the backward pass runs it again for the
    rest. Yields the cache the pass must use: it holds `head` (keys and values of earlier
    positions, per layer, batch-sized) and takes the pass's own.

    transformers' own switch (`gradient_checkpointing_enable`) drops the cache that the keys
    and values are read from, so the layers are switched here, for this pass only, with a cache
    that hands a layer run again its keys and values (the head's, then its own) instead of
    appending them a second time."""
    import torch.utils.checkpoint
    from transformers import DynamicCache

    class ReplayCache(DynamicCache):
        filled = False

        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            if not self.filled:
                return super().update(key_states, value_states, layer_idx, *args, **kwargs)
            if head is None:  # a layer run again in the backward pass
                return key_states, value_states
            keys, values = head[layer_idx]
            return torch.cat([keys, key_states], dim=-2), torch.cat([values, value_states], dim=-2)

    layers = list(body.layers)
    switches = {
        "gradient_checkpointing": True,
        "_can_checkpoint_with_cache": True,
        "_gradient_checkpointing_func": functools.partial(
            torch.utils.checkpoint.checkpoint, use_reentrant=False
        ),
    }
    cache = ReplayCache()
    for i, (keys, values) in enumerate(head or ()):
        cache.update(keys, values, i)
    try:
        for layer in layers:
            layer.__dict__.update(switches)
        yield cache
    finally:
        for layer in layers:
            for name in switches:
                layer.__dict__.pop(name, None)
        cache.filled = True
