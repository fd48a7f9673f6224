"""The policy engine: continuous batching with a KV cache, for many requests at once.

Requests arrive from any thread or event loop and wait in a queue. A worker thread runs one
batch of rows for one model (the base or a LoRA adapter), a token at a time: at every step,
waiting requests for that model join (their prompts are prefilled, from a cached shared prefix
where there is one, and their keys and values merged into the batch's cache), every row samples
its next token, and finished rows leave at once. There are no waves: a request never waits for
others to finish, only for the next step (or, if it is for another model, for the running batch
to drain). Sampling, stop and length checks are tensor operations, with one host-device sync
per step; the engine runs on the model's device (CPU or CUDA).

Every token records its id, its log-probability under the distribution it was sampled from
(temperature, top-p and any grammar mask applied) and under the model itself (temperature 1, no
mask): the trainer needs the second to form importance ratios against the same distribution it
computes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from mcprl._memory import batch_kv_bytes, bound_allocator, return_freed_memory
from mcprl.errors import UsageError
from mcprl.serving._grammar import CanonicalTokens, GrammarFactory, apply_bitmask
from mcprl.serving._kv import CPU_ATTENTION, GrowingCache
from mcprl.serving._lora import ServedAdapters
from mcprl.serving._models import LoadedModel
from mcprl.serving._packed import SwappedWeights, pack_output_layer
from mcprl.serving._prefix import (
    Continuation,
    ConversationCache,
    PrefixCache,
    common_prefix_length,
    kv_head,
    prefix_kv,
)
from mcprl.serving._threads import ThreadGovernor

__all__ = ["Completion", "Engine", "SamplingParams"]

logger = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    min_p: float = 0.0  # drop tokens less likely than min_p times the likeliest one
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    n: int = 1
    top_logprobs: int = 0
    ignore_eos: bool = False  # generate max_tokens tokens whatever comes (for benchmarks)


@dataclass
class Completion:
    """One choice: the sampled tokens, their log-probabilities, and why it stopped."""

    token_ids: list[int]
    logprobs: list[float]  # under the sampling distribution
    model_logprobs: list[float]  # under the model: temperature 1, no top-p, no grammar
    top_logprobs: list[list[tuple[int, float]]]
    finish_reason: str  # "stop" or "length"
    text: str = ""


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    adapter: str | None
    grammar: Any
    future: concurrent.futures.Future
    results: list[Completion | None] = field(default_factory=list)
    enqueued: float = field(default_factory=time.perf_counter)
    # whether a reply's text ends its conversation: then no next turn will continue it, and
    # its keys and values are not kept (`Engine.submit`)
    ends_conversation: Callable[[str], bool] | None = None


@dataclass
class _Task:
    """A callable for the worker thread (`Engine.run_exclusive`)."""

    fn: Callable[[], Any]
    future: concurrent.futures.Future


@dataclass
class _Row:
    request: _Request
    choice: int
    draws: torch.Tensor
    matcher: Any = None
    respell: torch.Generator | None = None  # draws among respellings (CanonicalTokens)
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    model_logprobs: list[float] = field(default_factory=list)
    top: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: str = "length"


class Engine:
    """Owns the model; generation requests are batched by a worker thread.

    Use `generate` from async code, `generate_blocking` from threads. `run_exclusive(fn)` runs
    a training step on the engine's own thread between two decoding steps; `paused()` holds the
    model from another thread: no decoding step runs while either does.
    """

    def __init__(
        self,
        loaded: LoadedModel,
        *,
        max_batch_size: int = 32,
        batch_wait_s: float = 0.01,
        prefix_cache: bool = True,
        shared_attention: bool = True,
        conversation_cache: bool = True,
        canonical: bool = False,
        max_batch_kv_bytes: int | str | None = "auto",
        packed_weights: bool = True,
        swapped_weights: bool = True,
        kv_dtype: torch.dtype | None = None,
    ):
        bound_allocator()  # freed caches go back to the OS within a phase too (`_memory`)
        self.loaded = loaded
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        config = self.model.config
        self.max_context = int(getattr(config, "max_position_embeddings", 4096))
        self.stop_token_ids = _stop_ids(self.tokenizer, self.model)
        self.grammars = GrammarFactory(
            self.tokenizer, int(config.vocab_size), sorted(self.stop_token_ids)
        )
        # off by default: measured, it made learning worse (CanonicalTokens, RESULTS.md)
        self.canonical = (
            CanonicalTokens(self.tokenizer, int(config.vocab_size)) if canonical else None
        )
        self.adapters: dict[str, str] = {}
        self._adapters = ServedAdapters(self.model)
        self._model_lock = threading.RLock()
        self._queue: queue.Queue[_Request | _Task | None] = queue.Queue()
        self._pending: deque[_Request] = deque()
        self._closed = False
        self._batch: _Batch | None = None
        self._swapped: SwappedWeights | None = None  # set below, once the output layer is packed
        self._idle = threading.Condition(self._model_lock)  # notified after every step
        self._stops: torch.Tensor | None = None
        self.device = next(self.model.parameters()).device
        # the KV cache's dtype (None: the model's). A bfloat16 cache takes half the memory of a
        # float32 one and its one-query attention runs in torch's fused kernel (`_kv`)
        self.kv_dtype = kv_dtype
        # kept replies (`ConversationCache`) are stored in the model's own dtype: the keys and
        # values were computed in it, so narrowing them back is exact, and bfloat16 halves them
        self.kept_dtype = next(self.model.parameters()).dtype
        # bytes of keys and values one cached position of one row takes (None: unknown)
        self.kv_bytes_per_token = _kv_bytes_per_token(config, self.kv_dtype or self.kept_dtype)
        # the most keys and values the running batch may hold, its rows' left padding included,
        # before waiting requests stop joining it ("auto": on CPU 1 GiB, or 512 MiB where memory
        # is short, and no bound elsewhere: `batch_kv_bytes`).
        # Rows are padded to the longest: one prompt after a long tool result can make every
        # row of a batch hold its length, most of it padding (RESULTS, "Memory of a batch").
        if max_batch_kv_bytes == "auto":
            max_batch_kv_bytes = batch_kv_bytes(self.device.type)
        self.max_batch_kv_bytes = max_batch_kv_bytes
        if self.device.type == "cpu":  # see mcprl.serving._kv
            self.model.set_attn_implementation(CPU_ATTENTION)
        # rows keep a cached prompt head once for all of them, not a copy each (`_Prefix`);
        # that needs mcprl's attention function, installed on CPU only
        self.shared_attention = shared_attention and self.device.type == "cpu"
        # prefills: admissions into the running batch; steps: forward passes of the batch
        # prefill_tokens: prompt tokens run through the model (after the shared-prefix cache)
        # shared_steps: steps whose rows read one copy of their common prompt head (`_Prefix`)
        self.stats = {"prefills": 0, "steps": 0, "rows": 0, "tokens": 0, "prefill_tokens": 0,
                      "prefill_s": 0.0, "step_s": 0.0, "shared_steps": 0, "trims": 0,
                      "trim_s": 0.0, "kv_waits": 0, "swaps": 0, "swap_s": 0.0}  # fmt: skip
        self.prefix_cache = PrefixCache() if prefix_cache else None
        # as many kept positions as 1 GiB of float32 holds, in the dtype they are kept in
        kept_bytes = (1 << 30) * self.kept_dtype.itemsize // 4
        self.conversations = ConversationCache(kept_bytes) if conversation_cache else None
        # on CPU, threads follow the cores other processes leave free (mcprl.serving._threads)
        self.governor = ThreadGovernor.for_device(self.device.type)
        # idle this long after work, the engine returns freed memory to the OS (`_memory`)
        self.trim_after_s = 1.0
        self._worked = False
        # busy, it returns what finished rows freed at most this often (None: only when idle)
        self.trim_every_s: float | None = 2.0
        self._trimmed = time.monotonic()
        self._worker = threading.Thread(target=self._run, name="mcprl-engine", daemon=True)
        self._worker.start()
        # on CPU, the output layer's weight reordered once for oneDNN, not at every call
        # (mcprl.serving._packed): the same results, faster prefills and steps, one more copy. On
        # the engine's thread: reordering on this one gave it an OpenMP team of its own, and the
        # engine's steps ran 1.7x slower from then on (`run_exclusive`).
        self.packed_bytes = (
            self.run_exclusive(lambda: pack_output_layer(self.model)) if packed_weights else 0
        )
        # and the other linear layers decode from packed weights alone, swapped back to their
        # plain ones while exclusive work (training) runs (`SwappedWeights`): 1.15x faster
        # decoding at no cost in memory. Packed at the first step, on the engine's thread.
        if packed_weights and swapped_weights:  # the output layer, packed above, stays as it is
            self._swapped = SwappedWeights(self.model)

    # -- public ------------------------------------------------------------------------------

    def submit(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        adapter: str | None = None,
        grammar: Any = None,
        ends_conversation: Callable[[str], bool] | None = None,
    ) -> concurrent.futures.Future:
        """Queue a request. `ends_conversation(text)`: whether a reply with this text ends its
        conversation (no next turn will continue it), so that its keys and values are not kept
        for one (`ConversationCache`); without it, every reply is kept while there is room."""
        if self._closed:
            raise RuntimeError("the engine is closed")
        if adapter is not None and adapter not in self.adapters:
            raise KeyError(adapter)
        request = _Request(list(prompt_ids), params, adapter, grammar, concurrent.futures.Future())
        request.ends_conversation = ends_conversation
        request.results = [None] * params.n
        self._queue.put(request)
        return request.future

    async def generate(self, prompt_ids: list[int], params: SamplingParams, **kw: Any):
        """Await the completions on the running asyncio loop (no thread held while waiting)."""
        return await asyncio.wrap_future(self.submit(prompt_ids, params, **kw))

    def generate_blocking(self, prompt_ids: list[int], params: SamplingParams, **kw: Any):
        return self.submit(prompt_ids, params, **kw).result()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Hold the model (for training): decoding waits until the block ends. The model's
        weights are the plain ones inside it."""
        with self._model_lock:
            self._plain_weights()
            yield

    def run_exclusive(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the engine's worker thread, between two decoding steps, and return what
        it returns (blocking; its exception is raised here). Rows in flight wait and go on.

        A training step belongs here rather than under `paused()` in a thread of its own: torch
        runs CPU operations in an OpenMP team per calling thread, and once a second thread has
        a team, more threads share the cores than there are cores and OpenMP stops spinning
        between parallel regions. Measured on a 2-core CPU: a decoding step of 16 rows took 172
        ms before the first training step and 270 ms after it, for the rest of the run, and 270
        ms from the start under OMP_WAIT_POLICY=PASSIVE.
        """
        if threading.current_thread() is self._worker:
            return fn()
        if self._closed:
            raise RuntimeError("the engine is closed")
        task = _Task(fn, concurrent.futures.Future())
        self._queue.put(task)
        return task.future.result()

    def release_caches(self, adapter: str | None) -> None:
        """Forget the cached keys and values computed with `adapter` (prompt heads, previous
        turns). Before a training step: the step replaces that adapter, so they would never be
        read again, and the memory they hold goes to the step's activations instead."""
        with self._model_lock:
            if self.prefix_cache is not None:
                self.prefix_cache.drop(adapter)
            if self.conversations is not None:
                self.conversations.drop(adapter)

    def load_adapter(self, name: str, path: str) -> None:
        """Make the LoRA adapter at `path` resident under `name` (see `mcprl.serving._lora`)."""
        with self._model_lock:
            if name in self.adapters:
                raise UsageError(f"an adapter named {name!r} is already loaded")
            self._adapters.load(name, path)
            self.adapters[name] = path
            if self.prefix_cache is not None:
                self.prefix_cache.drop(name)
            if self.conversations is not None:
                self.conversations.drop(name)

    def unload_adapter(self, name: str) -> None:
        """Unload `name`, after the rows decoding with it have finished."""
        with self._model_lock:
            while self._batch is not None and self._batch.adapter == name:
                self._idle.wait(timeout=1.0)
            if name not in self.adapters:
                raise KeyError(name)
            del self.adapters[name]
            if self.prefix_cache is not None:
                self.prefix_cache.drop(name)
            if self.conversations is not None:
                self.conversations.drop(name)
            self._adapters.unload(name)

    def close(self) -> None:
        self._closed = True
        self._queue.put(None)
        self._worker.join(timeout=30)
        while True:  # what the worker never took: nobody may wait on it for ever
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not None and not item.future.done():
                item.future.set_exception(RuntimeError("the engine was closed"))

    # -- worker --------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            if self._batch is None and not self._pending:
                try:  # idle: after a second with nothing to do, hand freed memory back
                    item = self._queue.get(timeout=self.trim_after_s if self._worked else None)
                except queue.Empty:
                    self._trim()
                    self._worked = False
                    continue
                self._worked = True
                if item is None:
                    return
                if isinstance(item, _Task):
                    self._run_task(item)
                    continue
                self._pending.append(item)
                time.sleep(self.batch_wait_s)  # let concurrent requests start together
            self.poll_threads()
            self._drain_queue()
            with self._model_lock, torch.inference_mode():
                try:
                    self._packed_weights()
                    self._admit()
                    if self._batch is not None:
                        self._step()
                except Exception as exc:  # a failed step fails its requests, never the engine
                    logger.exception("generation failed")
                    self._fail(exc)
                self._idle.notify_all()
                if self._closed:  # closing abandons work in flight: no step outlives close()
                    self._fail(RuntimeError("the engine was closed"), pending=True)
                    return

    def _drain_queue(self) -> None:
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is None:
                self._closed = True
                return
            if isinstance(item, _Task):  # between two steps: in-flight rows wait for it
                self._run_task(item)
                continue
            self._pending.append(item)

    def poll_threads(self) -> None:
        """Size the CPU threads to the cores other processes leave free, if a few seconds have
        passed since the last look (`mcprl.serving._threads`). Call it on the engine's thread:
        work run by `run_exclusive` does, between its own pieces (a training step's
        micro-batches)."""
        if self.governor is not None and threading.current_thread() is self._worker:
            self.governor.poll()

    def _run_task(self, task: _Task) -> None:
        self.poll_threads()  # a training step runs long: start it at the right count
        with self._model_lock:
            try:
                self._plain_weights()
                result = task.fn()
            except BaseException as exc:  # the caller gets it; the engine goes on
                task.future.set_exception(exc)
            else:
                task.future.set_result(result)
            self._idle.notify_all()

    def _packed_weights(self) -> None:
        """Decode from the swapped layers' packed weights (`SwappedWeights`)."""
        if self._swapped is not None and not self._swapped.packed:
            self._swap(self._swapped.pack)

    def _plain_weights(self) -> None:
        """Give the swapped layers their plain weights back, for work that reads them."""
        if self._swapped is not None and self._swapped.packed:
            self._swap(self._swapped.unpack)

    def _swap(self, fn: Callable[[], None]) -> None:
        started = time.perf_counter()
        fn()
        self.stats["swaps"] += 1
        self.stats["swap_s"] += time.perf_counter() - started

    def _fail(self, exc: Exception, *, pending: bool = False) -> None:
        """Fail the running batch's requests (and the waiting ones, with `pending`)."""
        requests = [r.request for r in self._batch.rows] if self._batch is not None else []
        if pending:
            requests += self._pending
            self._pending.clear()
        for request in {id(r): r for r in requests}.values():
            if not request.future.done():
                request.future.set_exception(exc)
        self._batch = None

    def _admit(self) -> None:
        """Prefill waiting requests into the running batch (continuous batching).

        Requests are admitted in arrival order. One for another model (base or adapter) than the
        running batch's waits until that batch drains, and those behind it wait too: no request
        is overtaken for long, whatever the others ask for. So does one that would take the
        batch over `max_batch_size` rows or `max_batch_kv_bytes` of keys and values.
        """
        if not self._pending:
            return
        batch = self._batch
        running = batch.rows if batch is not None else []
        adapter = batch.adapter if batch is not None else self._pending[0].adapter
        joining: list[_Request] = []
        rows = len(running)
        # the batch's width and shared head as requests join (a new batch: the rows share what
        # they all start with, an estimate of what the prefix cache will find)
        width = batch.mask.shape[1] if batch is not None else 0
        if batch is None:
            head = tuple(self._pending[0].prompt_ids)
        else:
            head = batch.prefix.ids if batch.prefix is not None else ()
        # `stats["kv_waits"]`: steps at which a waiting request did not fit
        while self._pending:
            request = self._pending[0]
            if request.adapter != adapter:
                break
            if rows + request.params.n > self.max_batch_size and (rows or joining):
                break
            wider, shared = _joined_width(width, request.prompt_ids, head)
            if (rows or joining) and self._over_kv_budget(rows + request.params.n, wider):
                self.stats["kv_waits"] += 1
                break
            width, head = wider, head[:shared]
            self._pending.popleft()
            if adapter is not None and adapter not in self.adapters:
                request.future.set_exception(KeyError(f"the adapter {adapter!r} was unloaded"))
                continue
            joining.append(request)
            rows += request.params.n
        if not joining:
            return
        found: dict[int, Continuation] = {}
        if self.conversations is not None:
            for r in joining:
                hit = self.conversations.find(adapter, r.prompt_ids)
                if hit is not None:
                    found[id(r)] = hit
        self._adapters.use(adapter)
        for group in (
            [r for r in joining if id(r) in found],
            *_by_own_head([r for r in joining if id(r) not in found]),
        ):
            if not group:
                continue
            new_rows = [
                _Row(r, j, _draws(r.params, j), self._matcher(r))
                for r in group
                for j in range(r.params.n)
            ]
            self.stats["prefills"] += 1
            self.stats["rows"] += len(new_rows)
            started = time.perf_counter()
            if id(group[0]) in found:
                hits = [found[id(row.request)] for row in new_rows]
                joined = self._prefill_continued(self.model, new_rows, hits, adapter)
            else:
                joined = self._prefill(self.model, new_rows, adapter)
            self.stats["prefill_s"] += time.perf_counter() - started
            self._batch = joined if self._batch is None else self._batch.merge(joined)

    def _over_kv_budget(self, rows: int, width: int) -> bool:
        """Whether `rows` rows of `width` positions would hold more keys and values than
        `max_batch_kv_bytes`."""
        if self.max_batch_kv_bytes is None or self.kv_bytes_per_token is None:
            return False
        return rows * width * self.kv_bytes_per_token > self.max_batch_kv_bytes

    def _step(self) -> None:
        """Sample one token for every row, retire finished rows, run the model once."""
        batch = self._batch
        started = time.perf_counter()
        tokens, finished = self._sample(batch)
        self.stats["steps"] += 1
        self.stats["tokens"] += len(batch.rows)
        self.stats["shared_steps"] += batch.prefix is not None
        for k in finished:
            self._keep_conversation(batch, k)
            self._complete(batch.rows[k])
        if finished:
            self._trim_busy()
            keep = [k for k in range(len(batch.rows)) if k not in set(finished)]
            if not keep:
                self._batch = None
                return
            batch.select(keep)
            tokens = tokens[torch.tensor(keep, device=tokens.device)]
        batch.mask = torch.cat([batch.mask, batch.mask.new_ones(len(batch.rows), 1)], dim=1)
        batch.positions = batch.positions + 1
        self._adapters.use(batch.adapter)
        out = self.model(
            input_ids=tokens[:, None],
            attention_mask=batch.mask,
            position_ids=batch.positions,
            past_key_values=batch.cache,
            use_cache=True,
            **batch.prefix_kwargs(),
        )
        batch.logits = out.logits[:, -1, :].float()
        self.stats["step_s"] += time.perf_counter() - started

    def _trim_busy(self) -> None:
        if self.trim_every_s is not None and time.monotonic() - self._trimmed >= self.trim_every_s:
            self._trim()

    def _trim(self) -> None:
        """Hand freed memory back to the OS; idle and busy trims share one clock and count."""
        started = time.monotonic()
        return_freed_memory()
        self._trimmed = time.monotonic()
        self.stats["trims"] += 1
        self.stats["trim_s"] += self._trimmed - started

    def _matcher(self, request: _Request) -> Any:
        return None if request.grammar is None else self.grammars.matcher(request.grammar)

    def _prefill(self, model: Any, rows: list[_Row], adapter: str | None) -> _Batch:
        """Run the prompts (left-padded) from the longest cached shared prefix on."""
        prompts = [r.request.prompt_ids for r in rows]
        start, kv = 0, None
        if self.prefix_cache is not None:

            def build(ids: list[int], start: int, head: Any):
                if head is not None and self.kv_dtype is not None:  # back to the model's dtype,
                    dtype = next(model.parameters()).dtype  # exactly: it was widened from it
                    head = [(k.to(dtype), v.to(dtype)) for k, v in head]
                tail = torch.tensor(ids[start:], device=self.device)
                kv = prefix_kv(model, tail, past=head, logits_to_keep=1)
                if self.kv_dtype is None:
                    return kv
                return [(k.to(self.kv_dtype), v.to(self.kv_dtype)) for k, v in kv]

            start, kv = self.prefix_cache.lookup(adapter, prompts, build)
        cache = GrowingCache(self.kv_dtype)
        prefix = _Prefix(tuple(prompts[0][:start]), kv) if kv and self.shared_attention else None
        head_mask = None
        if prefix is None and kv:  # a copy of the head in every row
            for i, (keys, values) in enumerate(kv):
                cache.update(
                    keys.expand(len(rows), -1, -1, -1), values.expand(len(rows), -1, -1, -1), i
                )
            head_mask = torch.ones(len(rows), start, dtype=torch.long, device=self.device)
        tails = [p[start:] for p in prompts]
        return self._run_tails(
            model, rows, adapter, cache, head_mask, tails, [start] * len(rows), prefix
        )

    def _prefill_continued(
        self, model: Any, rows: list[_Row], found: list[Continuation], adapter: str | None
    ) -> _Batch:
        """Rows whose prompts continue kept replies: each starts from its reply's keys and
        values (left-padded to a common length) and runs only what follows."""
        heads = [c.head for c in found]
        common = _shared_length(heads)
        own = []  # per row, per layer: the head beyond the common part, then the reply's own
        for c in found:
            if c.head is not None and c.head_length > common:
                own.append(
                    [
                        (
                            torch.cat([hk[:, :, common:], k.to(hk.dtype)], 2),
                            torch.cat([hv[:, :, common:], v.to(hv.dtype)], 2),
                        )
                        for (hk, hv), (k, v) in zip(c.head.kv, c.own, strict=True)
                    ]
                )
            else:
                own.append(c.own)
        kept = [kv[0][0].shape[2] for kv in own]
        width = max(kept)
        cache = GrowingCache(self.kv_dtype)
        for i in range(len(own[0])):
            like = own[0][i][0]
            dtype = self.kv_dtype or like.dtype
            keys = like.new_zeros(len(rows), like.shape[1], width, like.shape[3], dtype=dtype)
            values = keys.clone()
            for r, kv in enumerate(own):
                keys[r, :, width - kept[r] :] = kv[i][0][0]
                values[r, :, width - kept[r] :] = kv[i][1][0]
            cache.update(keys, values, i)
        head_mask = torch.tensor([[0] * (width - n) + [1] * n for n in kept], device=self.device)
        starts = [len(c.ids) for c in found]
        tails = [r.request.prompt_ids[n:] for r, n in zip(rows, starts, strict=True)]
        prefix = heads[0].head(common) if common else None
        return self._run_tails(model, rows, adapter, cache, head_mask, tails, starts, prefix)

    def _run_tails(
        self,
        model: Any,
        rows: list[_Row],
        adapter: str | None,
        cache: GrowingCache,
        head_mask: torch.Tensor | None,
        tails: list[list[int]],
        starts: list[int],
        prefix: _Prefix | None,
    ) -> _Batch:
        """Run each row's `tails` (left-padded) after what `cache` holds for it (`head_mask`
        marks it; `starts`: the position of each tail's first token), and make their batch."""
        device = self.device
        width = max(len(t) for t in tails)
        self.stats["prefill_tokens"] += width * len(rows)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        ids = torch.tensor([[pad] * (width - len(t)) + t for t in tails], device=device)
        tail = torch.tensor([[0] * (width - len(t)) + [1] * len(t) for t in tails], device=device)
        mask = tail if head_mask is None else torch.cat([head_mask.to(tail.dtype), tail], dim=1)
        positions = torch.tensor(starts, device=device)[:, None] + (tail.cumsum(-1) - 1).clamp(
            min=0
        )
        out = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
            **({"shared_prefix": prefix.kv} if prefix else {}),
        )
        params = [r.request.params for r in rows]
        return _Batch(
            rows=rows,
            adapter=adapter,
            cache=cache,
            mask=mask,
            positions=positions[:, -1:],
            logits=out.logits[:, -1, :].float(),
            draws=_stack_draws([r.draws for r in rows], device),
            temperature=torch.tensor([[p.temperature or 1.0] for p in params], device=device),
            greedy=torch.tensor([p.temperature == 0 for p in params], device=device),
            top_p=torch.tensor([p.top_p for p in params], device=device),
            min_p=torch.tensor([p.min_p for p in params], device=device),
            max_len=torch.tensor(
                [
                    min(p.max_tokens, self.max_context - len(r.request.prompt_ids))
                    for p, r in zip(params, rows, strict=True)
                ],
                device=device,
            ),
            stops_at_eos=torch.tensor([not p.ignore_eos for p in params], device=device),
            count=torch.zeros(len(rows), dtype=torch.long, device=device),
            prefix=prefix,
        )

    def _sample(self, batch: _Batch) -> tuple[torch.Tensor, list[int]]:
        """Sample every row's next token with tensor operations; one host sync per step.

        Returns the tokens (on the device) and the rows that finished with them. Per row, only
        bookkeeping runs in Python: appending the token and its log-probabilities, and the
        grammar matcher of a constrained row (a terminated matcher is never asked again).
        """
        rows, logits = batch.rows, batch.logits
        model_logp = torch.log_softmax(logits, dim=-1)
        constrained = [
            k for k, r in enumerate(rows) if r.matcher is not None and not r.matcher.is_terminated()
        ]
        if constrained:
            bitmask = self.grammars.bitmask(len(rows))
            for k in constrained:
                rows[k].matcher.fill_next_token_bitmask(bitmask, k)
            apply_bitmask(logits, bitmask.to(logits.device), constrained)
        logp = torch.log_softmax(logits / batch.temperature, dim=-1)
        if bool((batch.top_p < 1.0).any()):
            logp = _top_p(logp, batch.top_p)
        if bool((batch.min_p > 0.0).any()):
            logp = _min_p(logp, batch.min_p)
        # Inverse-CDF sampling with one uniform draw per row from that row's own seeded stream:
        # as exact as torch.multinomial and about 20x cheaper on a 49k vocabulary.
        cdf = logp.exp().cumsum(dim=-1)
        draws = batch.draws.gather(1, batch.count[:, None])[:, 0]
        targets = (draws * cdf[:, -1]).clamp(min=1e-12)[:, None]
        sampled = torch.searchsorted(cdf, targets).clamp(max=logp.shape[-1] - 1)[:, 0]
        tokens = torch.where(batch.greedy, logp.argmax(dim=-1), sampled)
        picked = tokens[:, None]
        batch.count += 1
        stop = torch.isin(tokens, self._stop_tensor(tokens.device)) & batch.stops_at_eos
        done = stop | (batch.count >= batch.max_len)
        host = torch.stack(
            [
                tokens.double(),
                logp.gather(1, picked)[:, 0].double(),
                model_logp.gather(1, picked)[:, 0].double(),
                stop.double() + done.double(),  # 2: stopped, 1: hit a length limit, 0: goes on
            ]
        ).tolist()  # the one host-device sync of the step
        if self.canonical is not None:
            for k in constrained:
                self._respell(batch, k, host, tokens, logp, model_logp)
        finished = []
        for k, row in enumerate(rows):
            token = int(host[0][k])
            row.tokens.append(token)
            row.logprobs.append(host[1][k])
            row.model_logprobs.append(host[2][k])
            params = row.request.params
            if params.top_logprobs:
                values, ids = torch.topk(logp[k], params.top_logprobs)
                row.top.append([(int(i), float(v)) for i, v in zip(ids, values, strict=True)])
            if row.matcher is not None and not row.matcher.is_terminated():
                row.matcher.accept_token(token)
            state = host[3][k]
            if params.stop and _hit_stop(self.tokenizer, row.tokens, params.stop):
                state = 2.0
            if state:
                row.finish_reason = "stop" if state >= 2 else "length"
                finished.append(k)
        return tokens, finished

    def _respell(self, batch: _Batch, k: int, host: list[list[float]], tokens, logp, model_logp):
        """Write row k's token as the tokenizer spells it (`CanonicalTokens`): a token that
        would be split from the text after it becomes a longer token spelling its text, drawn
        by the model's probabilities among those the grammar allows."""
        row = batch.rows[k]
        token = int(host[0][k])
        options = self.canonical.respellings(row.matcher, token)
        if options is None:
            return
        if row.respell is None:
            row.respell = torch.Generator()
            seed = row.request.params.seed
            row.respell.manual_seed(
                (seed * 1_000_003 + row.choice + 1)
                if seed is not None
                else int.from_bytes(os.urandom(7))
            )
        sampled = logp[k].detach().float().cpu()
        path = float(sampled[token])  # log-probability of the text chosen so far
        for _ in range(_RESPELL_TRIES):
            choices = torch.tensor(options, dtype=torch.long)
            allowed = sampled[choices]
            keep = torch.isfinite(allowed)
            if not bool(keep.any()):
                return  # nothing spells it better here: keep the model's token
            choices, allowed = choices[keep], torch.log_softmax(allowed[keep], dim=-1)
            if bool(batch.greedy[k]):
                pick = int(allowed.argmax())
            else:
                pick = int(torch.multinomial(allowed.exp(), 1, generator=row.respell))
            token, path = int(choices[pick]), path + float(allowed[pick])
            options = self.canonical.respellings(row.matcher, token)
            if options is None:
                break
        else:
            return
        stop = token in self.stop_token_ids and bool(batch.stops_at_eos[k])
        done = stop or int(batch.count[k]) >= int(batch.max_len[k])
        host[0][k] = token
        # the token's own probability and that of reaching it through a shorter one
        host[1][k] = float(torch.logaddexp(sampled[token], torch.tensor(path)))
        host[2][k] = float(model_logp[k, token])
        host[3][k] = float(stop) + float(done)
        tokens[k] = token

    def _keep_conversation(self, batch: _Batch, k: int) -> None:
        """Keep row k's keys and values (it finished) for its conversation's next turn."""
        if self.conversations is None:
            return
        row = batch.rows[k]
        ids = (*row.request.prompt_ids, *row.tokens[:-1])  # what went through the model
        ends = row.request.ends_conversation
        if ends is not None and ends(self._text(row)):
            self.conversations.end(batch.adapter, ids)  # its earlier turns are done with too
            return
        columns = batch.mask[k].nonzero()[:, 0]
        head = len(batch.prefix.ids) if batch.prefix is not None else 0
        if head + len(columns) != len(ids):  # never expected; a miss costs only speed
            logger.debug(
                "not keeping a reply: %d cached tokens for %d", head + len(columns), len(ids)
            )
            return
        own = [
            (
                layer.keys[k : k + 1].index_select(2, columns).to(self.kept_dtype),
                layer.values[k : k + 1].index_select(2, columns).to(self.kept_dtype),
            )
            for layer in batch.cache.layers
        ]
        self.conversations.add(batch.adapter, Continuation(ids, batch.prefix, own))

    def _stop_tensor(self, device: torch.device) -> torch.Tensor:
        if self._stops is None or self._stops.device != device:
            self._stops = torch.tensor(sorted(self.stop_token_ids), device=device)
        return self._stops

    def _text(self, row: _Row) -> str:
        """A finished row's reply as text: without its stop token, cut at a stop string."""
        body = (
            row.tokens[:-1] if row.tokens and row.tokens[-1] in self.stop_token_ids else row.tokens
        )
        text = self.tokenizer.decode(body, skip_special_tokens=True)
        for s in row.request.params.stop:
            if s in text:
                text = text[: text.index(s)]
        return text

    def _complete(self, row: _Row) -> None:
        request = row.request
        text = self._text(row)
        request.results[row.choice] = Completion(
            row.tokens, row.logprobs, row.model_logprobs, row.top, row.finish_reason, text
        )
        if all(r is not None for r in request.results) and not request.future.done():
            request.future.set_result(list(request.results))


_RESPELL_TRIES = 8


@dataclass
class _Prefix:
    """A prompt head every row of a batch starts with, its keys and values kept once: per
    layer [1, Hkv, len(ids), D], from the prefix cache. The rows' own cache and mask cover only
    what follows it, and the model's attention reads it through `shared_prefix`."""

    ids: tuple[int, ...]
    kv: list[tuple[torch.Tensor, torch.Tensor]]

    def head(self, length: int) -> _Prefix:
        return _Prefix(self.ids[:length], kv_head(self.kv, length))


def _shared_length(heads: list[_Prefix | None]) -> int:
    """How many leading tokens all these heads share (0 if any is None)."""
    if any(h is None for h in heads):
        return 0
    length = min(len(h.ids) for h in heads)
    for h in heads[1:]:
        if h is not heads[0]:
            length = next((i for i in range(length) if h.ids[i] != heads[0].ids[i]), length)
    return length


@dataclass
class _Batch:
    """The rows decoding together: their KV cache, attention mask and sampling state.

    Rows are left-padded to a common length; each row's positions are explicit, so rows that
    joined at different times share one cache. Row-wise tensors are kept in row order. With a
    shared `prefix`, the cache and mask start after it.
    """

    rows: list[_Row]
    adapter: str | None
    cache: Any
    mask: torch.Tensor  # [rows, length], 0 on padding
    positions: torch.Tensor  # [rows, 1], the position of each row's last token
    logits: torch.Tensor  # [rows, vocab], for each row's next token
    draws: torch.Tensor  # [rows, tokens], each row's uniform draws in order
    temperature: torch.Tensor  # [rows, 1]
    greedy: torch.Tensor  # [rows]
    top_p: torch.Tensor  # [rows]
    min_p: torch.Tensor  # [rows]
    max_len: torch.Tensor  # [rows], tokens a row may sample (max_tokens, context)
    stops_at_eos: torch.Tensor  # [rows]
    count: torch.Tensor  # [rows], tokens sampled so far
    prefix: _Prefix | None = None

    _ROWWISE = ("logits", "draws", "temperature", "greedy", "top_p", "min_p", "max_len",
                "stops_at_eos", "count", "positions")  # fmt: skip

    def select(self, keep: list[int]) -> None:
        """Keep these rows; drop the cache columns no remaining row attends to."""
        index = torch.tensor(keep, device=self.mask.device)
        self.rows = [self.rows[k] for k in keep]
        self.cache.batch_select_indices(index)
        self.mask = self.mask[index]
        for name in self._ROWWISE:
            setattr(self, name, getattr(self, name)[index])
        used = self.mask.any(dim=0)
        first = int(used.int().argmax()) if bool(used.any()) else 0
        if first:
            self.mask = self.mask[:, first:]
            self.cache.trim_left(first)

    def prefix_kwargs(self) -> dict[str, Any]:
        return {"shared_prefix": self.prefix.kv} if self.prefix is not None else {}

    def _keep_shared(self, length: int) -> None:
        """Share only the prefix's first `length` tokens: the rest moves into every row."""
        prefix = self.prefix
        if prefix is None or len(prefix.ids) <= length:
            return
        rows = len(self.rows)
        rest = [(k[:, :, length:], v[:, :, length:]) for k, v in prefix.kv]
        self.cache.prepend(
            [(k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1)) for k, v in rest]
        )
        moved = self.mask.new_ones(rows, len(prefix.ids) - length)
        self.mask = torch.cat([moved, self.mask], dim=1)
        self.prefix = prefix.head(length) if length else None

    def merge(self, other: _Batch) -> _Batch:
        """One batch of both: the shorter side is left-padded (masked out) to the longer. They
        go on sharing the prompt head both shared, if any."""
        if other.adapter != self.adapter:
            raise UsageError("only rows for the same model share a batch")
        common = _shared_length([self.prefix, other.prefix])
        self._keep_shared(common)
        other._keep_shared(common)
        length = max(self.mask.shape[1], other.mask.shape[1])

        def pad(t: torch.Tensor) -> torch.Tensor:
            missing = length - t.shape[1]
            return torch.cat([t.new_zeros(len(t), missing), t], dim=1) if missing else t

        self.cache.stack(other.cache)
        self.mask = torch.cat([pad(self.mask), pad(other.mask)])
        width = max(self.draws.shape[1], other.draws.shape[1])
        self.draws = torch.cat([_pad_right(self.draws, width), _pad_right(other.draws, width)])
        for name in self._ROWWISE:
            if name != "draws":
                setattr(self, name, torch.cat([getattr(self, name), getattr(other, name)]))
        self.rows = self.rows + other.rows
        return self


def _kv_bytes_per_token(config: Any, dtype: torch.dtype) -> int | None:
    """Bytes of keys and values per cached position of one row, from a decoder's config."""
    layers = getattr(config, "num_hidden_layers", None)
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    dim = getattr(config, "head_dim", None)
    if not dim and heads:
        dim = getattr(config, "hidden_size", 0) // heads
    if not (layers and kv_heads and dim):
        return None
    return int(layers) * 2 * int(kv_heads) * int(dim) * dtype.itemsize


# Tokens a prompt repeated by several requests of a wave must run past what the whole wave
# shares for those requests to be prefilled apart (`_by_own_head`).
OWN_HEAD_MINIMUM = 128


def _by_own_head(requests: list[_Request]) -> list[list[_Request]]:
    """The requests of a wave to prefill together: apart, each prompt that several rows repeat
    and that runs `OWN_HEAD_MINIMUM` tokens or more past what the whole wave shares (a group's
    attempts at a task opened by its own worked example: its ~1,000 tokens then run once, not
    once a row; the batches merge after); then the rest, together."""
    if len(requests) < 2:
        return [requests]
    shared = common_prefix_length([r.prompt_ids for r in requests])
    same: dict[tuple[int, ...], list[_Request]] = {}
    for r in requests:
        same.setdefault(tuple(r.prompt_ids), []).append(r)
    apart = [
        group
        for prompt, group in same.items()
        if sum(r.params.n for r in group) > 1 and len(prompt) - shared >= OWN_HEAD_MINIMUM
    ]
    if not apart:
        return [requests]
    kept = {id(r) for group in apart for r in group}
    return [*apart, [r for r in requests if id(r) not in kept]]


def _joined_width(width: int, prompt: list[int], head: tuple[int, ...]) -> tuple[int, int]:
    """(positions per row, length of the head still shared) of a batch `width` wide, whose
    rows share `head` (kept once, not per row), once `prompt` joins it: the rows are padded to
    the longest, and the part of `head` the prompt does not start with moves into every row."""
    shared = 0
    for a, b in zip(prompt, head, strict=False):
        if a != b:
            break
        shared += 1
    return max(width + len(head) - shared, len(prompt) - shared), shared


def _pad_right(t: torch.Tensor, width: int) -> torch.Tensor:
    return t if t.shape[1] == width else torch.cat([t, t.new_zeros(len(t), width - t.shape[1])], 1)


def _stack_draws(draws: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    width = max(len(d) for d in draws)
    return torch.cat([_pad_right(d[None], width) for d in draws]).to(device)


def _stop_ids(tokenizer: Any, model: Any) -> set[int]:
    ids = set()
    for source in (getattr(model, "generation_config", None), tokenizer):
        eos = getattr(source, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, (list, tuple)):
            ids.update(int(e) for e in eos)
    return ids


def _draws(params: SamplingParams, choice: int) -> torch.Tensor:
    """The uniform draws of one choice, one per token it may sample, from its own seeded stream
    (the same numbers, in the same order, as drawing one at a time)."""
    g = torch.Generator()
    seed = params.seed
    g.manual_seed((seed + 7919 * choice) if seed is not None else int.from_bytes(os.urandom(7)))
    return torch.rand(max(params.max_tokens, 1), generator=g)


def _top_p(logp: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Keep the smallest set of tokens whose probability reaches top_p; renormalize."""
    sorted_logp, order = torch.sort(logp, descending=True, dim=-1)
    cumulative = sorted_logp.exp().cumsum(dim=-1)
    drop_sorted = (cumulative - sorted_logp.exp()) >= top_p[:, None]
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    kept = torch.log_softmax(logp.masked_fill(drop, float("-inf")), dim=-1)
    return torch.where((top_p < 1.0)[:, None], kept, logp)  # the other rows untouched


def _min_p(logp: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Keep the tokens at least min_p times as likely as the row's likeliest; renormalize. A
    row with min_p 0 is returned as it came: normalizing it again rounds its log-probabilities
    anew, and at a high temperature that moved a neighbour's draw to the next token id on an
    Intel Xeon (`test_min_p_rows_draw_only_likely_tokens_and_leave_their_neighbours_alone`)."""
    floor = logp.max(dim=-1, keepdim=True).values + torch.log(min_p)[:, None]
    kept = torch.log_softmax(logp.masked_fill(logp < floor, float("-inf")), dim=-1)
    return torch.where((min_p > 0.0)[:, None], kept, logp)


def _hit_stop(tokenizer: Any, tokens: list[int], stops: list[str]) -> bool:
    tail = tokenizer.decode(tokens[-16:], skip_special_tokens=True)
    return any(s in tail for s in stops)
