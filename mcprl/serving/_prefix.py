"""Shared-prefix KV cache: compute the attention keys and values of a common prompt prefix once.

Agent prompts repeat a long head at every turn of every attempt: the system prompt with the tool
descriptions (about a thousand tokens for the calculator) and often the task. The engine prefills
a wave of requests by reusing the cached keys and values of the longest prefix all rows share, and
runs the model only on what follows it. Entries are kept per adapter (the LoRA changes keys and
values), least recently used first out.

A wave reuses the longest start it shares with any entry, whole or not, when that is at least
`min_tokens` long and within `slack` tokens of all the rows share (a single row: any such start).
Otherwise, when the rows share at least `min_tokens`, a new entry is made, running only the
tokens after that start: each task's wave shares the system prompt and tools with the waves
before it, and with a long tool list that is most of its head. A single row with nothing to
reuse gets an entry too: a row without a shared head would make every row it joins hold a copy
of its own (`Engine`'s merge), for a 3,000-token tool list a copy per row per layer.

`ConversationCache` keeps what follows the head for each finished reply: an agent's next turn
repeats the previous prompt and the reply before the tool's answer, and starts from there.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "Continuation",
    "ConversationCache",
    "PrefixCache",
    "common_prefix_length",
    "expanded_cache",
    "kv_head",
    "prefix_kv",
]

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer, batch 1: (keys, values)


def prefix_kv(model, ids: torch.Tensor, past: KV | None = None, **kwargs) -> KV:
    """The keys and values of `ids` ([P] tokens) in every layer of `model`, batch 1 (with their
    autograd graph where gradients are on); `kwargs` go to the forward call. With `past`, the
    keys and values of tokens before `ids`: the result holds both, `past` first."""
    from transformers import DynamicCache

    cache = DynamicCache()
    for i, (keys, values) in enumerate(past or []):
        cache.update(keys, values, i)  # appending makes new tensors: `past` stays as it is
    model(input_ids=ids[None], past_key_values=cache, use_cache=True, **kwargs)
    return [(layer.keys, layer.values) for layer in cache.layers]


def expanded_cache(kv: KV, rows: int):
    """A `DynamicCache` holding `kv` (batch 1) for `rows` rows, without copying (autograd-safe)."""
    from transformers import DynamicCache

    cache = DynamicCache()
    for i, (keys, values) in enumerate(kv):
        cache.update(keys.expand(rows, -1, -1, -1), values.expand(rows, -1, -1, -1), i)
    return cache


def common_prefix_length(prompts: Sequence[Sequence[int]]) -> int:
    """Tokens all prompts share, leaving each at least one token to run through the model."""
    limit = min(len(p) for p in prompts) - 1
    first = prompts[0]
    n = 0
    while n < limit and all(p[n] == first[n] for p in prompts[1:]):
        n += 1
    return max(n, 0)


def kv_head(kv: KV, length: int) -> KV:
    """The first `length` positions of cached keys and values (views)."""
    return [(k[:, :, :length], v[:, :, :length]) for k, v in kv]


class PrefixCache:
    def __init__(self, max_entries: int = 6, min_tokens: int = 64, slack: int = 48) -> None:
        self.max_entries, self.min_tokens, self.slack = max_entries, min_tokens, slack
        self.entries: OrderedDict[tuple[str | None, tuple[int, ...]], KV] = OrderedDict()
        # saved_tokens: prompt tokens not run through the model thanks to the cache
        self.stats = {"hits": 0, "builds": 0, "saved_tokens": 0}

    def lookup(
        self,
        adapter: str | None,
        prompts: Sequence[Sequence[int]],
        build: Callable[[list[int], int, KV | None], KV],
    ) -> tuple[int, KV | None]:
        """(prefix length, its keys and values) to start these prompts from; (0, None) if none.

        `build(ids, start, head)` makes a new entry's keys and values for `ids`, given those of
        its first `start` tokens (`head`, a cached entry it extends; None when `start` is 0)."""
        shared = common_prefix_length(prompts)
        ids = tuple(prompts[0][:shared])
        start, key = self._longest_start(adapter, ids)
        close = start + self.slack >= shared or len(prompts) == 1  # no new entry is worth it
        if start >= self.min_tokens and close:
            self.entries.move_to_end(key)
            self.stats["hits"] += 1
            self.stats["saved_tokens"] += start * len(prompts)
            return start, kv_head(self.entries[key], start)
        if shared < self.min_tokens:
            return 0, None
        known = None
        if key is not None:  # the entry it extends counts as used: the wave's shared head
            self.entries.move_to_end(key)  # outlives the groups' own heads built on it
            known = kv_head(self.entries[key], start)
        self.entries[(adapter, ids)] = build(list(ids), start, known)
        self.stats["builds"] += 1
        self.stats["saved_tokens"] += shared * (len(prompts) - 1) + start
        while len(self.entries) > self.max_entries:
            self.entries.popitem(last=False)
        return shared, self.entries[(adapter, ids)]

    def _longest_start(self, adapter: str | None, ids: tuple[int, ...]) -> tuple[int, Any]:
        """The most leading tokens of `ids` a cached entry of `adapter` starts with too, and
        that entry's key: a whole entry, or the start of one that goes on otherwise (the tool
        block of another task's head)."""
        start, best = 0, None
        for key in self.entries:
            if key[0] == adapter:
                same = [a == b for a, b in zip(ids, key[1], strict=False)]
                n = same.index(False) if False in same else len(same)
                # of entries that share as much, the one it covers whole (the wave's head)
                whole = best is not None and start == len(best[1])
                if n > start or (n == start and n == len(key[1]) and not whole):
                    start, best = n, key
        return start, best

    def drop(self, adapter: str | None) -> None:
        """Forget the entries of an adapter (it was unloaded, or replaced under its name)."""
        for key in [k for k in self.entries if k[0] == adapter]:
            del self.entries[key]

    def clear(self) -> None:
        self.entries.clear()


@dataclass
class Continuation:
    """A finished reply's keys and values, kept for the conversation's next turn.

    `ids` are the prompt and the reply's tokens that went through the model (all but the last
    sampled one); `head` is the prompt head the reply's batch shared (the engine's `_Prefix`,
    or None), and `own` holds the rest, per layer [1, Hkv, len(ids) - len(head.ids), D]."""

    ids: tuple[int, ...]
    head: Any
    own: KV

    @property
    def head_length(self) -> int:
        return len(self.head.ids) if self.head is not None else 0


def _nbytes(kv: KV) -> int:
    return sum(k.nbytes + v.nbytes for k, v in kv)


def _storage(kv: KV) -> tuple[int, int]:
    """(an id of the memory `kv` keeps alive, its size in bytes): views keep their whole base."""
    size = sum(t.untyped_storage().nbytes() for k, v in kv for t in (k, v))
    return kv[0][0].untyped_storage().data_ptr(), size


class ConversationCache:
    """The keys and values of recent replies, so that an agent's next turn, whose prompt is the
    previous prompt, the reply and the tool's answer, runs only the tokens after the reply.

    Held per adapter, least recently used first out, within `max_bytes` (each head counted once
    however many replies share it). A reply that continues a kept one replaces it.
    """

    def __init__(self, max_bytes: int = 1 << 30) -> None:
        self.max_bytes = max_bytes
        self.entries: OrderedDict[tuple[str | None, tuple[int, ...]], Continuation] = OrderedDict()
        self._heads: dict[int, list[int]] = {}  # storage id: [bytes, entries using it]
        self.bytes = 0
        # continued: prompts that started from a kept reply; saved_tokens: their kept tokens
        self.stats = {"kept": 0, "continued": 0, "saved_tokens": 0}

    def find(self, adapter: str | None, prompt: Sequence[int]) -> Continuation | None:
        """The longest kept reply this prompt continues (leaving it a token to run), if any."""
        best: Continuation | None = None
        for (key_adapter, ids), entry in self.entries.items():
            if key_adapter != adapter or len(ids) >= len(prompt):
                continue
            if (best is None or len(ids) > len(best.ids)) and tuple(prompt[: len(ids)]) == ids:
                best = entry
        if best is not None:
            self.entries.move_to_end((adapter, best.ids))
            self.stats["continued"] += 1
            self.stats["saved_tokens"] += len(best.ids)
        return best

    def add(self, adapter: str | None, entry: Continuation) -> None:
        self.end(adapter, entry.ids)  # the conversation moved on (or the same reply again)
        if entry.head is not None:
            ptr, head_bytes = _storage(entry.head.kv)
            slot = self._heads.setdefault(ptr, [head_bytes, 0])
            if not slot[1]:
                self.bytes += head_bytes
            slot[1] += 1
        self.bytes += _nbytes(entry.own)
        self.entries[(adapter, entry.ids)] = entry
        self.stats["kept"] += 1
        while self.bytes > self.max_bytes and self.entries:
            self._remove(next(iter(self.entries)))

    def end(self, adapter: str | None, ids: Sequence[int]) -> None:
        """Forget the kept replies `ids` continues: its conversation's earlier turns."""
        ids = tuple(ids)
        for key in [k for k in self.entries if k[0] == adapter and ids[: len(k[1])] == k[1]]:
            self._remove(key)

    def drop(self, adapter: str | None) -> None:
        for key in [k for k in self.entries if k[0] == adapter]:
            self._remove(key)

    def _remove(self, key: tuple[str | None, tuple[int, ...]]) -> None:
        entry = self.entries.pop(key)
        self.bytes -= _nbytes(entry.own)
        if entry.head is not None:
            ptr, _ = _storage(entry.head.kv)
            slot = self._heads[ptr]
            slot[1] -= 1
            if not slot[1]:
                self.bytes -= slot[0]
                del self._heads[ptr]
