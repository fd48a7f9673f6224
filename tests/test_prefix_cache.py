"""The engine's shared-prefix KV cache: same tokens and log-probabilities, less prefill."""

from __future__ import annotations

import pytest
import torch

from mcprl.serving._prefix import PrefixCache, common_prefix_length


def _kv(ids: list[int], start: int = 0, head=None):
    return [(torch.zeros(1, 1, len(ids), 2), torch.zeros(1, 1, len(ids), 2))]


def test_common_prefix_leaves_every_prompt_a_token():
    assert common_prefix_length([[1, 2, 3, 4], [1, 2, 3, 5]]) == 3
    assert common_prefix_length([[1, 2, 3], [1, 2, 3, 4]]) == 2
    assert common_prefix_length([[7, 8], [9, 8]]) == 0
    assert common_prefix_length([[1, 2, 3]]) == 2


def test_lookup_builds_once_reuses_and_keeps_adapters_apart():
    cache = PrefixCache(min_tokens=4, slack=2)
    head = list(range(100, 110))
    built = []

    def build(ids, start, head):
        built.append(ids)
        return _kv(ids)

    n, kv = cache.lookup("a@1", [[*head, 1], [*head, 2]], build)
    assert n == 10 and built == [head] and kv[0][0].shape[2] == 10
    n, _ = cache.lookup("a@1", [[*head, 3, 4]], build)  # one row reuses, never builds
    assert n == 10 and len(built) == 1
    n, kv = cache.lookup("a@1", [[*head[:6], 0, 0]], build)  # the start of an entry
    assert n == 6 and kv[0][0].shape[2] == 6 and len(built) == 1
    n, _ = cache.lookup("a@2", [[*head, 1], [*head, 2]], build)  # another adapter: its own
    assert n == 10 and len(built) == 2
    n, _ = cache.lookup("a@1", [[5] * 20], build)  # one row, nothing cached: its own entry
    assert n == 19 and built[-1] == [5] * 19
    assert cache.lookup("a@1", [[6] * 3], build) == (0, None)  # too short to keep
    assert cache.lookup("a@1", [[1, 2, 9], [1, 2, 8]], build) == (0, None)  # too short to keep
    cache.drop("a@1")
    assert all(key[0] != "a@1" for key in cache.entries)


def test_a_much_longer_shared_prefix_gets_its_own_entry():
    cache = PrefixCache(min_tokens=4, slack=2)
    head = list(range(10))
    cache.lookup(None, [[*head, 1], [*head, 2]], _kv)
    longer = head + list(range(50, 60))
    built = []

    def build(ids, start, kv):
        built.append((start, kv))
        return _kv(ids)

    n, _ = cache.lookup(None, [[*longer, 1], [*longer, 2]], build)
    assert n == 20 and len(cache.entries) == 2
    # built from the end of the cached head it extends, not from the first token
    ((start, kv),) = built
    assert start == 10 and kv[0][0].shape[2] == 10
    # and from the part it shares with an entry that goes on otherwise
    other = head + list(range(70, 80))
    cache.lookup(None, [[*other, 1], [*other, 2]], build)
    assert built[1][0] == 10 and len(cache.entries) == 3


def test_the_head_that_groups_extend_outlives_their_own_entries():
    """A wave of more groups than the cache keeps, each with a long prompt of its own on the
    shared head: the head is never evicted, the oldest group's entry is."""
    cache = PrefixCache(max_entries=3, min_tokens=4, slack=2)
    head = list(range(10))
    cache.lookup(None, [[*head, 1], [*head, 2]], _kv)
    groups = [head + [g] * 10 for g in range(20, 24)]
    for own in groups:
        cache.lookup(None, [[*own, 1], [*own, 2]], _kv)
    kept = [list(key[1]) for key in cache.entries]
    assert head in kept and groups[0] not in kept and groups[-1] in kept


@pytest.fixture(scope="module")
def fp32_model():
    from mcprl.serving import load_model

    return load_model("smollm2-135m", dtype="float32")


def test_engine_output_is_the_same_with_and_without_the_prefix_cache(fp32_model):
    from mcprl.serving import Engine
    from mcprl.serving._engine import SamplingParams

    tok = fp32_model.tokenizer
    head = tok.encode("System: you are a careful assistant who answers briefly. " * 8)
    prompts = [head + tok.encode(f"User: tell me about the number {n}.") for n in (7, 12, 31)]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    results = {}
    for use in (False, True):
        engine = Engine(fp32_model, prefix_cache=use)
        try:
            futures = [engine.submit(p, params) for p in prompts]
            results[use] = [f.result()[0] for f in futures]
            if use:
                assert engine.prefix_cache.stats["builds"] == 1
                assert engine.prefix_cache.stats["saved_tokens"] >= 2 * len(head)
        finally:
            engine.close()
    for plain, cached in zip(results[False], results[True], strict=True):
        assert plain.token_ids == cached.token_ids
        assert (
            max(
                abs(a - b)
                for a, b in zip(plain.model_logprobs, cached.model_logprobs, strict=False)
            )
            < 1e-3
        )


def test_a_head_that_extends_a_cached_one_runs_only_its_new_tokens(fp32_model):
    """Each task's wave shares the system prompt and tools, then its own task: its entry starts
    from the cached tools' keys and values, and the output is what no cache gives."""
    from mcprl.serving import Engine
    from mcprl.serving._engine import SamplingParams

    tok = fp32_model.tokenizer
    tools = tok.encode("System: the tools are add, subtract, multiply and divide. " * 8)
    tasks = [tools + tok.encode(f"User: what is {n} plus {n}? " * 6) for n in (7, 12)]
    waves = [[t + tok.encode(f"Attempt {i}:") for i in range(2)] for t in [tools, *tasks]]
    waves.append([tools + tok.encode("User: what is 5 times 3?")])  # one row, a new task
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    results = {}
    for use in (False, True):
        engine = Engine(fp32_model, prefix_cache=use)
        try:
            results[use] = [
                [f.result()[0] for f in [engine.submit(p, params) for p in wave]] for wave in waves
            ]
            if use:
                cache = engine.prefix_cache
                # two waves started from the tools' entry: its tokens ran once, not three times;
                # the single row started from them too, without an entry of its own
                assert cache.stats["builds"] == 3 and cache.stats["hits"] == 1
                assert cache.stats["saved_tokens"] >= 3 * len(tools) + 3 * len(tools)
        finally:
            engine.close()
    for plain_wave, cached_wave in zip(results[False], results[True], strict=True):
        for plain, cached in zip(plain_wave, cached_wave, strict=True):
            assert plain.token_ids == cached.token_ids
            pairs = zip(plain.model_logprobs, cached.model_logprobs, strict=True)
            gaps = [abs(a - b) for a, b in pairs]
            assert max(gaps) < 1e-3


def test_rows_that_share_a_cached_head_read_one_copy_and_decode_as_with_a_copy_each(fp32_model):
    """Groups of identical prompts arrive while others decode (each group its own cache entry,
    the groups sharing a shorter head), then a prompt with no cached head: the rows keep one
    copy of what they share, and every row decodes as it does with a copy of the head per row."""
    import time

    from mcprl.serving import Engine
    from mcprl.serving._engine import SamplingParams

    tok = fp32_model.tokenizer
    head = tok.encode("System: you are a careful assistant who answers briefly. " * 10)
    groups = [
        head + tok.encode(f"User: the number {n}; say something true of it.") for n in (7, 31)
    ]
    lone = tok.encode("A prompt that shares nothing with the others.")

    def run(shared: bool):
        engine = Engine(fp32_model, shared_attention=shared)
        try:
            futures = []
            for prompt in groups:
                params = [SamplingParams(temperature=0.0, max_tokens=14 + 3 * j) for j in range(3)]
                futures += [
                    engine.submit(prompt[: len(prompt) - j], p) for j, p in enumerate(params)
                ]
                time.sleep(0.2)
            futures.append(engine.submit(lone, SamplingParams(temperature=0.0, max_tokens=6)))
            return [f.result(timeout=120)[0] for f in futures], dict(engine.stats)
        finally:
            engine.close()

    copies, plain_stats = run(False)
    shared, shared_stats = run(True)
    assert plain_stats["shared_steps"] == 0 and shared_stats["shared_steps"] > 0
    for a, b in zip(copies, shared, strict=True):
        assert a.token_ids == b.token_ids
        drift = [abs(x - y) for x, y in zip(a.model_logprobs, b.model_logprobs, strict=True)]
        assert max(drift) < 1e-3


def test_a_conversations_next_turn_starts_from_its_kept_reply(fp32_model):
    """Three conversations of three turns each (the next prompt is the prompt, the reply and a
    tool's answer), with a prompt that shares nothing arriving mid-way: with the replies' keys
    and values kept, later turns run only what follows the reply, and every turn decodes as it
    does when run whole."""
    import time

    from mcprl.serving import Engine
    from mcprl.serving._engine import SamplingParams

    tok = fp32_model.tokenizer
    head = tok.encode("System: you are a careful assistant who answers briefly. " * 10)

    def run(keep: bool):
        engine = Engine(fp32_model, conversation_cache=keep)
        prompts = [
            head + tok.encode(f"User: the number {n}; say one true thing.") for n in (7, 31, 44)
        ]
        turns = []
        try:
            for turn in range(3):
                params = [SamplingParams(temperature=0.0, max_tokens=6 + 2 * i) for i in range(3)]
                futures = [engine.submit(p, s) for p, s in zip(prompts, params, strict=True)]
                if turn == 1:
                    time.sleep(0.2)
                    lone = tok.encode("A prompt that shares nothing with the others.")
                    futures.append(
                        engine.submit(lone, SamplingParams(temperature=0.0, max_tokens=4))
                    )
                replies = [f.result(timeout=120)[0] for f in futures]
                turns.append(replies)
                prompts = [
                    p + r.token_ids + tok.encode(f"\nTool: result {turn}.\nAssistant:")
                    for p, r in zip(prompts, replies, strict=False)
                ]
            return turns, dict(engine.stats), engine.conversations
        finally:
            engine.close()

    whole, whole_stats, _ = run(False)
    kept, kept_stats, conversations = run(True)
    assert conversations.stats["continued"] == 6  # turns 2 and 3 of each conversation
    assert kept_stats["prefill_tokens"] < whole_stats["prefill_tokens"] / 2
    for a_turn, b_turn in zip(whole, kept, strict=True):
        for a, b in zip(a_turn, b_turn, strict=True):
            assert a.token_ids == b.token_ids
            drift = [abs(x - y) for x, y in zip(a.model_logprobs, b.model_logprobs, strict=True)]
            assert max(drift) < 1e-3


def test_kept_replies_of_a_bfloat16_model_take_half_the_memory_and_decode_the_same():
    """Kept replies are stored in the model's dtype, also beside a float32 cache
    (`kv_dtype=torch.float32`): the keys and values were computed in bfloat16, so the next turns
    decode bit for bit as they did when the replies were kept widened, from half the memory."""
    from mcprl.serving import Engine, load_model
    from mcprl.serving._engine import SamplingParams

    loaded = load_model("smollm2-135m", dtype="bfloat16")
    tok = loaded.tokenizer
    head = tok.encode("System: you are a careful assistant who answers briefly. " * 10)

    def run(kept_dtype):
        engine = Engine(loaded, kv_dtype=torch.float32)
        engine.kept_dtype = kept_dtype
        prompts = [head + tok.encode(f"User: the number {n}; say one true thing.") for n in (7, 31)]
        turns, sizes = [], []
        try:
            for turn in range(3):
                params = [SamplingParams(temperature=0.0, max_tokens=6 + 2 * i) for i in range(2)]
                futures = [engine.submit(p, s) for p, s in zip(prompts, params, strict=True)]
                turns.append([f.result(timeout=120)[0] for f in futures])
                sizes.append(sum(k.nbytes for e in engine.conversations.entries.values()
                                 for k, _ in e.own))  # fmt: skip
                prompts = [
                    p + r.token_ids + tok.encode(f"\nTool: result {turn}.\nAssistant:")
                    for p, r in zip(prompts, turns[-1], strict=True)
                ]
            assert engine.conversations.stats["continued"] == 4
            return turns, sizes
        finally:
            engine.close()

    narrow, narrow_sizes = run(torch.bfloat16)
    wide, wide_sizes = run(torch.float32)
    for a_turn, b_turn in zip(narrow, wide, strict=True):
        for a, b in zip(a_turn, b_turn, strict=True):
            assert a.token_ids == b.token_ids and a.model_logprobs == b.model_logprobs
    assert narrow_sizes == [n // 2 for n in wide_sizes] and narrow_sizes[0] > 0


def test_a_bfloat16_models_cache_is_bfloat16_and_counts_half_the_bytes_a_position():
    """By default the engine keeps keys and values in the model's dtype, on CPU too: half the
    bytes a cached position of a float32 cache, which the batch's memory bound counts."""
    from mcprl.serving import Engine, load_model
    from mcprl.serving._engine import SamplingParams

    loaded = load_model("smollm2-135m", dtype="bfloat16")
    narrow, wide = Engine(loaded), Engine(loaded, kv_dtype=torch.float32)
    try:
        assert narrow.kv_bytes_per_token * 2 == wide.kv_bytes_per_token
        prompt = loaded.tokenizer.encode("User: name a colour.\nAssistant:")
        reply = narrow.submit(prompt, SamplingParams(temperature=0.0, max_tokens=4))
        assert len(reply.result(timeout=120)[0].token_ids) == 4
        (kept,) = narrow.conversations.entries.values()
        assert kept.own[0][0].dtype == torch.bfloat16
    finally:
        narrow.close()
        wide.close()


def test_kept_replies_stay_within_their_memory_budget():
    from mcprl.serving._prefix import Continuation, ConversationCache

    def entry(ids, head=None):
        own = [(torch.zeros(1, 1, len(ids), 4), torch.zeros(1, 1, len(ids), 4))]
        return Continuation(tuple(ids), head, own)

    cache = ConversationCache(max_bytes=3 * 2 * 10 * 4 * 4)  # three 10-token replies
    cache.add(None, entry(range(10)))
    cache.add(None, entry(range(20, 30)))
    assert cache.find(None, [*range(10), 99]).ids == tuple(range(10))
    assert cache.find("other@1", [*range(10), 99]) is None  # another adapter's replies
    cache.add(None, entry([*range(10), 99, 5, 6, 7, 8, 9, 10, 11, 12, 13]))  # moved on: replaces
    assert len(cache.entries) == 2
    cache.add(None, entry(range(40, 50)))
    cache.add(None, entry(range(60, 70)))  # over budget: the least recently used goes
    assert cache.find(None, [*range(20, 30), 1]) is None
    assert cache.bytes <= cache.max_bytes
    cache.drop(None)
    assert not cache.entries and cache.bytes == 0


def test_a_wave_of_groups_each_with_a_long_prompt_of_its_own_runs_each_prompt_once(
    fp32_model, monkeypatch
):
    """Two groups of three attempts, each task opened by a long worked example of its own,
    arrive in one wave: each group's prompt runs through the model once, not once a row, and
    every row decodes as it does when all six are prefilled together."""
    import mcprl.serving._engine as engine_module
    from mcprl.serving import Engine
    from mcprl.serving._engine import SamplingParams

    tok = fp32_model.tokenizer
    tools = tok.encode("System: the tools are add, subtract, multiply and divide. " * 8)
    groups = [tools + tok.encode(f"Example: {n} plus {n} is {2 * n}. " * 16) for n in (7, 12)]
    assert min(len(g) for g in groups) - len(tools) >= engine_module.OWN_HEAD_MINIMUM
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    built = []
    prefix_kv = engine_module.prefix_kv

    def counted(model, ids, **kwargs):
        built.append(len(ids))
        return prefix_kv(model, ids, **kwargs)

    monkeypatch.setattr(engine_module, "prefix_kv", counted)

    def run(apart: bool):
        monkeypatch.setattr(engine_module, "OWN_HEAD_MINIMUM", 128 if apart else 10**9)
        built.clear()
        engine = Engine(fp32_model)
        try:
            with engine.paused():  # one wave
                futures = [engine.submit(g, params) for g in groups for _ in range(3)]
            results = [f.result(timeout=120)[0] for f in futures]
            return results, engine.stats["prefill_tokens"] + sum(built)
        finally:
            engine.close()

    together, together_tokens = run(False)
    apart, apart_tokens = run(True)
    assert apart_tokens < together_tokens / 2
    for a, b in zip(together, apart, strict=True):
        assert a.token_ids == b.token_ids
        drift = [abs(x - y) for x, y in zip(a.model_logprobs, b.model_logprobs, strict=True)]
        assert max(drift) < 1e-3
