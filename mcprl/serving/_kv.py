"""The engine's KV cache and its CPU attention (the trainer's too, on CPU).

- `GrowingCache`: a KV cache whose layers write new keys and values into preallocated buffers
  (grown by a fixed headroom when full) instead of concatenating the whole cache at every
  token, as transformers' `DynamicCache` does. Rows can be dropped, merged with another batch's
  rows, and trimmed of the leading columns no row attends to. It keeps keys and values in the
  model's dtype unless given another (`Engine(kv_dtype=...)`): bfloat16 takes half the memory
  of float32, and its attention is faster (below).
- `cpu_attention`: attention for one query token. Over a 16-bit cache, torch's fused CPU
  kernel, each key-value head's group of query heads (GQA) as the kernel's queries: it reads
  the cache's strided views in place, with float32 scores, softmax and sums (the weights are
  rounded to bfloat16 for their product with the values), where a bfloat16 matrix
  product copies a strided view whole at every call (3.1 ms against 0.5 ms for 27 rows of 648
  positions, one layer). Over a float32 cache, two batched matrix products per layer, the query
  heads of each key-value head grouped so keys and values are read once (torch's fused kernel
  is slower for that shape, and 5-7x slower when no padding mask is given). Several query
  tokens go to torch's SDPA in the cache's dtype, with each key-value head read once by its
  group of query heads (`enable_gqa`); the trainer uses it on CPU too.
- Shared-prefix attention: when the forward call passes `shared_prefix` (per layer, the keys
  and values of a prompt head every row starts with, batch 1), the cache holds only what
  follows it in each row, and one query token's attention reads that head once for all rows
  (every row's query heads stacked as one batch's queries) instead of once per row; over a
  16-bit cache the two parts are merged by their log-sum-exps. In an agent step, 16-32 rows
  share a ~900-token system prompt and tool block: read per row, it was 45% of a decoding
  step's time (16 rows, bfloat16, 2-core CPU).
"""

from __future__ import annotations

import itertools
import weakref

import torch
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.cache_utils import Cache, DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

__all__ = ["CPU_ATTENTION", "GrowingCache", "cpu_attention"]

CPU_ATTENTION = "mcprl_cpu"
HEADROOM = 128  # positions reserved beyond the current length when a layer's buffer grows
# torch's fused CPU attention kernel, which also returns each query's log-sum-exp
_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_FLASH_DTYPES = (torch.bfloat16, torch.float16)  # caches whose one-query attention it runs


def cpu_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw):
    """transformers' attention signature; `query` [B, H, q, D], keys [B, Hkv, T, D].

    `shared_prefix` (a keyword of the model's forward call, passed down to here): per layer,
    (keys, values) [1, Hkv, P, D] that every row attends to before its own `key`/`value`."""
    shared = kw.pop("shared_prefix", None)
    prefix = shared[module.layer_idx] if shared is not None else None
    if query.shape[2] != 1 or dropout:
        if prefix is not None:
            key, value, attention_mask = _with_prefix(prefix, query, key, value, attention_mask)
        return _grouped_sdpa(module, query, key, value, attention_mask, scaling, dropout, **kw)
    batch, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    q = query.reshape(batch, kv_heads, groups, dim).to(key.dtype)
    scale = scaling if scaling is not None else dim**-0.5
    if key.dtype in _FLASH_DTYPES:
        out = _flash_one_query(q, key, value, attention_mask, prefix, scale)
        return out.to(query.dtype).reshape(batch, heads, 1, dim).transpose(1, 2), None
    scores = torch.matmul(q, key.transpose(-1, -2)).float()
    scores *= scale
    if attention_mask is not None:
        mask = attention_mask[:, :, -1:, :]  # [B, 1, 1, T]
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask
    if prefix is None:
        probs = scores.softmax(dim=-1).to(value.dtype)
        out = torch.matmul(probs, value).to(query.dtype)  # [B, Hkv, G, D]
        return out.reshape(batch, heads, 1, dim).transpose(1, 2), None
    # every row's query heads of one key-value head as the rows of one matrix product
    prefix_keys, prefix_values = prefix[0][0], prefix[1][0]  # [Hkv, P, D]
    length = prefix_keys.shape[1]
    stacked = q.transpose(0, 1).reshape(kv_heads, batch * groups, dim)
    head = torch.bmm(stacked, prefix_keys.transpose(-1, -2)).float() * scale  # [Hkv, B*G, P]
    head = head.reshape(kv_heads, batch, groups, length).transpose(0, 1)
    probs = torch.cat([head, scores], dim=-1).softmax(dim=-1).to(value.dtype)
    out = torch.matmul(probs[..., length:], value)  # [B, Hkv, G, D]
    weights = probs[..., :length].transpose(0, 1).reshape(kv_heads, batch * groups, length)
    out += torch.bmm(weights, prefix_values).reshape(kv_heads, batch, groups, dim).transpose(0, 1)
    return out.to(query.dtype).reshape(batch, heads, 1, dim).transpose(1, 2), None


def _flash_one_query(q, key, value, attention_mask, prefix, scale):
    """One query token's attention over a cache in a 16-bit dtype: `q` [B, Hkv, G, D], each
    key-value head's G query heads as G queries of torch's fused CPU kernel, which reads the
    cache's strided views in place (a 16-bit matrix product copies them whole), with float32
    scores, softmax and sums. With a shared prefix, the kernel runs twice, over the rows' own
    keys and over the prefix with every row's queries stacked, and the two are merged by their
    log-sum-exps. Returns [B, Hkv, G, D] in float32 where merged, else the cache's dtype."""
    mask = None
    if attention_mask is not None:
        mask = attention_mask[:, :, -1:, :]  # [B, 1, 1, T]
        # the kernel takes an additive mask in its own dtype (made per layer: inference tensors
        # have no version counter for `_additive`'s memo)
        mask = _to_additive(mask, key.dtype) if mask.dtype == torch.bool else mask.to(key.dtype)
    out, lse = _FLASH(q, key, value, attn_mask=mask, scale=scale)  # [B, Hkv, G, D], [B, Hkv, G]
    if prefix is None:
        return out
    batch, kv_heads, groups, dim = q.shape
    stacked = q.transpose(0, 1).reshape(1, kv_heads, batch * groups, dim)
    head, head_lse = _FLASH(stacked, prefix[0], prefix[1], scale=scale)
    head = head.reshape(kv_heads, batch, groups, dim).transpose(0, 1)
    head_lse = head_lse.reshape(kv_heads, batch, groups).transpose(0, 1)
    total = torch.logaddexp(lse, head_lse)
    own_weight = (lse - total).exp_().unsqueeze(-1)
    head_weight = (head_lse - total).exp_().unsqueeze(-1)
    return out.float() * own_weight + head.float() * head_weight


def _with_prefix(prefix, query, key, value, attention_mask):
    """Keys, values and mask with the shared prefix in front, for several query tokens (a
    prefill after the prefix): every query attends to all of it."""
    prefix_keys, prefix_values = prefix
    batch, length = key.shape[0], prefix_keys.shape[2]
    key = torch.cat([prefix_keys.expand(batch, -1, -1, -1), key], dim=2)
    value = torch.cat([prefix_values.expand(batch, -1, -1, -1), value], dim=2)
    queries, total = query.shape[2], key.shape[2]
    if attention_mask is None:  # causal over the row's own tokens, the queries last
        own = torch.arange(total - length, device=key.device)
        at = torch.arange(queries, device=key.device) + (total - length - queries)
        attention_mask = (own[None, :] <= at[:, None])[None, None]
    shape = (*attention_mask.shape[:3], length)
    if attention_mask.dtype == torch.bool:
        head = attention_mask.new_ones(shape)
    else:
        head = attention_mask.new_zeros(shape)
    attention_mask = torch.cat([head, attention_mask], dim=-1)
    return key, value, attention_mask


def _grouped_sdpa(module, query, key, value, attention_mask, scaling, dropout, **kw):
    """Several query tokens: torch's SDPA reading each key-value head once for its group of query
    heads (`enable_gqa`), where transformers repeats the keys and values per query head whenever
    a mask is given. In training those copies are kept for the backward pass: for 18 rows of 180
    tokens after an 840-token prefix, 2.4 of the 8.1 GB a forward pass of SmolLM2-135M saves."""
    causal = kw.get("is_causal")
    causal = getattr(module, "is_causal", True) if causal is None else causal
    causal = attention_mask is None and query.shape[2] > 1 and causal
    extras = any(kw.get(k) is not None for k in ("position_bias", "softcap", "s_aux"))
    if extras or (causal and key.shape[2] != query.shape[2]):  # transformers' handling
        out, weights = sdpa_attention_forward(
            module, query.to(key.dtype), key, value, attention_mask,
            scaling=scaling, dropout=dropout, **kw,
        )  # fmt: skip
        return out.to(query.dtype), weights
    if attention_mask is not None and attention_mask.dtype == torch.bool and query.requires_grad:
        attention_mask = _additive(attention_mask, key.dtype)
    out = torch.nn.functional.scaled_dot_product_attention(
        query.to(key.dtype),
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=causal,
        enable_gqa=key.shape[1] != query.shape[1],
    )
    return out.transpose(1, 2).contiguous().to(query.dtype), None


_last_mask: tuple[weakref.ref, int, torch.dtype, weakref.ref] | None = None


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask as SDPA turns it into an additive one (0 where True, -inf elsewhere),
    made once for the layers of a forward pass: SDPA converts a boolean mask at each call, and
    in training each layer kept its own copy for the backward pass (0.23 GB a micro-batch of
    1,024 tokens behind an 809-token head: 30 copies of [1, 1, 1024, 1833] float32). The layers
    of one pass get the same mask tensor from transformers. Held weakly: the backward pass's
    saved tensors keep it while they need it."""
    global _last_mask
    key = (mask._version, dtype)  # a mask changed in place is converted anew
    if _last_mask is not None and _last_mask[0]() is mask and _last_mask[1:3] == key:
        kept = _last_mask[3]()
        if kept is not None:
            return kept
    additive = _to_additive(mask, dtype)
    _last_mask = (weakref.ref(mask), *key, weakref.ref(additive))
    return additive


def _to_additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask as an additive one: 0 where True, -inf elsewhere."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, -torch.inf)


AttentionInterface.register(CPU_ATTENTION, cpu_attention)
AttentionMaskInterface.register(CPU_ATTENTION, sdpa_mask)


class GrowingLayer(DynamicLayer):
    """A `DynamicLayer` that appends in place; `keys`/`values` are views of its buffers."""

    kv_dtype: torch.dtype | None = None  # None: the model's

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self.dtype = self.kv_dtype or key_states.dtype
        self._k = self._v = None
        self.length = 0

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        new = key_states.shape[-2]
        if self._k is None or self.length + new > self._k.shape[-2]:
            # a fixed headroom, not doubling: a batch of long rows must not hold twice its memory
            self._reserve(self.length + new + HEADROOM, key_states, value_states)
        self._k[:, :, self.length : self.length + new] = key_states
        self._v[:, :, self.length : self.length + new] = value_states
        self.length += new
        self._views()
        return self.keys, self.values

    def _reserve(self, capacity: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        def buffer(like: torch.Tensor, old: torch.Tensor | None) -> torch.Tensor:
            rows, heads, _, dim = like.shape
            new = like.new_empty(rows, heads, capacity, dim, dtype=self.dtype)
            if old is not None and self.length:
                new[:, :, : self.length] = old[:, :, : self.length]
            return new

        self._k, self._v = buffer(keys, self._k), buffer(values, self._v)

    def _views(self) -> None:
        self.keys = self._k[:, :, : self.length]
        self.values = self._v[:, :, : self.length]

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep the rows at `indices`. Ascending indices (the engine's, as rows finish) move
        in place within the buffers: only the rows after the first dropped one, and only
        their written columns, are copied, and nothing new is kept. Gathering whole new
        buffers each time a row finished was 10% of a decoding step in an agent step (2-core
        CPU, 7-16 rows) and left their size in freed heap each time."""
        if not self.is_initialized or self._k is None:
            return
        keep = indices.tolist()
        if any(b <= a for a, b in itertools.pairwise(keep)):
            self._k, self._v = self._k[indices], self._v[indices]
        else:
            first = next((j for j, i in enumerate(keep) if i != j), len(keep))
            if first < len(keep):
                moved = indices[first:]
                for buffer in (self._k, self._v):
                    written = buffer[:, :, : self.length]
                    written[first : len(keep)] = written[moved]
            self._k, self._v = self._k[: len(keep)], self._v[: len(keep)]
        self._views()

    def trim_left(self, columns: int) -> None:
        """Drop the first `columns` positions (padding no row attends to any more)."""
        if columns and self.is_initialized:
            self._k = self._k[:, :, columns:]
            self._v = self._v[:, :, columns:]
            self.length -= columns
            self._views()

    def stack(self, other: GrowingLayer) -> None:
        """Append `other`'s rows, left-padding the shorter side (masked out by the caller)."""
        length = max(self.length, other.length)

        def padded(layer: GrowingLayer, buffer: torch.Tensor) -> torch.Tensor:
            view = buffer[:, :, : layer.length]
            missing = length - layer.length
            if not missing:
                return view
            shape = list(view.shape)
            shape[2] = missing
            return torch.cat([view.new_zeros(shape), view], dim=2)

        keys = torch.cat([padded(self, self._k), padded(other, other._k)])
        values = torch.cat([padded(self, self._v), padded(other, other._v)])
        self._k = self._v = None
        self.length = 0
        self.update(keys, values)

    def prepend(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Put `keys`/`values` [rows, Hkv, n, D] in front of every row's columns."""
        if not self.is_initialized or not self.length:
            self._k = self._v = None
            self.length = 0
            self.update(keys, values)
            return
        keys = torch.cat([keys.to(self.dtype), self._k[:, :, : self.length]], dim=2)
        values = torch.cat([values.to(self.dtype), self._v[:, :, : self.length]], dim=2)
        self._k = self._v = None
        self.length = 0
        self.update(keys, values)


class GrowingCache(Cache):
    """A cache of `GrowingLayer`s (see the module docstring)."""

    def __init__(self, kv_dtype: torch.dtype | None = None) -> None:
        layer = type("GrowingLayer", (GrowingLayer,), {"kv_dtype": kv_dtype})
        super().__init__(layer_class_to_replicate=layer)

    def trim_left(self, columns: int) -> None:
        for layer in self.layers:
            layer.trim_left(columns)

    def stack(self, other: GrowingCache) -> None:
        for mine, theirs in zip(self.layers, other.layers, strict=True):
            mine.stack(theirs)

    def prepend(self, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Put per-layer (keys, values) [rows, Hkv, n, D] in front of every row's columns."""
        while len(self.layers) < len(kv):  # a cache no forward pass has written yet
            self.layers.append(self.layer_class_to_replicate())
        for layer, (keys, values) in zip(self.layers, kv, strict=True):
            layer.prepend(keys, values)
