"""The engine's shared-prefix KV cache: same tokens and log-probabilities, less prefill."""

from __future__ import annotations

import pytest
import torch

from mcprl.serving._prefix import PrefixCache, common_prefix_length


def _kv(ids: list[int]):
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

    def build(ids):
        built.append(ids)
        return _kv(ids)

    n, kv = cache.lookup("a@1", [[*head, 1], [*head, 2]], build)
    assert n == 10 and built == [head] and kv[0][0].shape[2] == 10
    n, _ = cache.lookup("a@1", [[*head, 3, 4]], build)  # one row reuses, never builds
    assert n == 10 and len(built) == 1
    n, _ = cache.lookup("a@2", [[*head, 1], [*head, 2]], build)  # another adapter: its own
    assert n == 10 and len(built) == 2
    assert cache.lookup("a@1", [[5] * 20], build) == (0, None)  # one row, nothing cached
    assert cache.lookup("a@1", [[1, 2, 9], [1, 2, 8]], build) == (0, None)  # too short to keep
    cache.drop("a@1")
    assert all(key[0] != "a@1" for key in cache.entries)


def test_a_much_longer_shared_prefix_gets_its_own_entry():
    cache = PrefixCache(min_tokens=4, slack=2)
    head = list(range(10))
    cache.lookup(None, [[*head, 1], [*head, 2]], _kv)
    longer = head + list(range(50, 60))
    n, _ = cache.lookup(None, [[*longer, 1], [*longer, 2]], _kv)
    assert n == 20 and len(cache.entries) == 2


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
