"""Continuous batching: requests join a running batch at the next token and leave when done.

One float32 engine on the real default model; float32 keeps the arithmetic close enough that a
row's tokens do not depend on which other rows share its batch.
"""

from __future__ import annotations

import json
import math
import queue
import threading
import time
from concurrent.futures import Future
from types import SimpleNamespace

import jsonschema
import pytest
import torch

from mcprl._memory import batch_kv_bytes
from mcprl.serving import Engine, SamplingParams, load_model
from mcprl.serving._chat import parse_tool_calls, render_prompt
from mcprl.serving._engine import _min_p, _Task, _top_p
from mcprl.serving._grammar import CanonicalTokens
from mcprl.serving._lora import AdapterError, LoraLinear
from tests.test_serving import CALC_TOOLS, MODEL


@pytest.fixture(scope="module")
def engine():
    engine = Engine(load_model(MODEL, dtype="float32"), prefix_cache=False)
    yield engine
    engine.close()


def _prompt(engine, text: str, tools=None) -> list[int]:
    return render_prompt(engine.tokenizer, [{"role": "user", "content": text}], tools)


def _wait_for_steps(engine, n: int, timeout: float = 60.0) -> None:
    target = engine.stats["steps"] + n
    deadline = time.monotonic() + timeout
    while engine.stats["steps"] < target:
        assert time.monotonic() < deadline, "the engine made no progress"
        time.sleep(0.005)


def test_a_request_that_joins_mid_batch_gets_the_tokens_it_gets_alone(engine):
    long_prompt, short_prompt = _prompt(engine, "Count slowly."), _prompt(engine, "Name a fruit.")
    long = SamplingParams(max_tokens=40, seed=3, ignore_eos=True)
    short = SamplingParams(max_tokens=12, seed=11, temperature=0.8, n=2)
    alone_long = engine.generate_blocking(long_prompt, long)
    alone_short = engine.generate_blocking(short_prompt, short)

    before = dict(engine.stats)
    running = engine.submit(long_prompt, long)
    _wait_for_steps(engine, 5)  # the long request is decoding
    joined = engine.submit(short_prompt, short).result(timeout=120)
    still = running.result(timeout=120)
    assert [c.token_ids for c in joined] == [c.token_ids for c in alone_short]
    assert [c.token_ids for c in still] == [c.token_ids for c in alone_long]
    for mine, theirs in zip(joined, alone_short, strict=True):
        assert mine.logprobs == pytest.approx(theirs.logprobs, abs=1e-4)
    # the short request joined the running batch instead of waiting for it to end
    steps = engine.stats["steps"] - before["steps"]
    assert steps < 40 + 12 and engine.stats["prefills"] - before["prefills"] == 2


def test_work_run_exclusively_runs_on_the_engine_thread_between_steps(engine):
    """A training step runs on the engine's own thread (one OpenMP team in the process, so
    decoding keeps its speed after training); rows in flight wait for it and go on unchanged;
    its exception reaches the caller and the engine keeps serving."""
    prompt = _prompt(engine, "Count slowly.")
    params = SamplingParams(max_tokens=30, seed=5, ignore_eos=True)
    alone = engine.generate_blocking(prompt, params)

    running = engine.submit(prompt, params)
    _wait_for_steps(engine, 3)
    seen = {}

    def work():
        seen["thread"] = threading.current_thread().name
        seen["batch"] = engine._batch is not None  # the running batch waits, it is not dropped
        steps = engine.stats["steps"]
        time.sleep(0.05)
        seen["steps during"] = engine.stats["steps"] - steps
        return 42

    assert engine.run_exclusive(work) == 42
    assert seen == {"thread": "mcprl-engine", "batch": True, "steps during": 0}
    assert [c.token_ids for c in running.result(timeout=120)] == [c.token_ids for c in alone]

    def fails():
        raise ValueError("the training step failed")

    with pytest.raises(ValueError, match="training step failed"):
        engine.run_exclusive(fails)
    assert engine.run_exclusive(lambda: engine.run_exclusive(lambda: "nested")) == "nested"
    assert engine.generate_blocking(prompt, params)[0].token_ids == alone[0].token_ids


def test_work_waiting_for_a_closed_engine_fails_instead_of_hanging():
    engine = SimpleNamespace(  # what close() and run_exclusive() use, with a worker long gone
        _closed=False, _queue=queue.Queue(), _worker=threading.Thread(target=lambda: None)
    )
    engine._worker.start()
    task = _Task(lambda: 1, Future())
    engine._queue.put(task)  # queued, never taken
    Engine.close(engine)
    with pytest.raises(RuntimeError, match="engine was closed"):
        task.future.result(timeout=5)
    with pytest.raises(RuntimeError, match="engine is closed"):
        Engine.run_exclusive(engine, lambda: 1)


def test_rows_leave_when_done_and_the_batch_goes_on(engine):
    prompt = _prompt(engine, "Say hello.")
    futures = [
        engine.submit(prompt, SamplingParams(max_tokens=m, seed=m, ignore_eos=True))
        for m in (3, 25, 9)
    ]
    lengths = [len(f.result(timeout=120)[0].token_ids) for f in futures]
    assert lengths == [3, 25, 9]
    assert all(f.result()[0].finish_reason == "length" for f in futures)


def test_rows_after_one_that_leaves_keep_their_own_keys_and_values_without_a_new_buffer():
    from mcprl.serving._kv import GrowingCache

    cache = GrowingCache(kv_dtype=torch.float32)
    keys, values = torch.randn(5, 3, 7, 4), torch.randn(5, 3, 7, 4)
    cache.update(keys, values, 0)
    buffer = cache.layers[0]._k.data_ptr()
    cache.batch_select_indices(torch.tensor([0, 2, 4]))
    layer = cache.layers[0]
    assert torch.equal(layer.keys, keys[[0, 2, 4]]) and torch.equal(layer.values, values[[0, 2, 4]])
    assert layer._k.data_ptr() == buffer  # moved within its buffer, nothing allocated
    more = torch.randn(3, 3, 1, 4)  # the next token's keys still land in the right rows
    cache.update(more, more, 0)
    assert torch.equal(layer.keys[:, :, -1:], more)
    assert torch.equal(layer.keys[:, :, :7], keys[[0, 2, 4]])
    cache.batch_select_indices(torch.tensor([2, 0]))  # another order: gathered anew
    assert torch.equal(layer.keys[:, :, :7], keys[[4, 0]])


@pytest.mark.parametrize("shared", [False, True], ids=["own keys", "shared prefix"])
def test_one_query_attention_over_a_bfloat16_cache_gives_float32_attention_rounded(shared):
    """Over a bfloat16 cache, one query token's attention runs in torch's fused kernel, reading
    the cache's strided views in place and merging a shared prefix by log-sum-exp: the float32
    path's result over the same keys, to bfloat16 rounding, and masked-out padding counts for
    nothing."""
    from mcprl.serving._kv import GrowingCache, cpu_attention

    torch.manual_seed(0)
    rows, kv_heads, groups, dim, length = 4, 3, 3, 16, 9
    cache = GrowingCache(kv_dtype=torch.bfloat16)
    cache.update(
        torch.randn(rows, kv_heads, length, dim), torch.randn(rows, kv_heads, length, dim), 0
    )
    layer = cache.layers[0]
    assert layer.keys.dtype == torch.bfloat16 and not layer.keys.is_contiguous()  # headroom
    mask = torch.ones(rows, 1, 1, length, dtype=torch.bool)
    mask[1, ..., :3] = False  # row 1 is left-padded
    query = torch.randn(rows, kv_heads * groups, 1, dim).bfloat16()
    head = [tuple(torch.randn(1, kv_heads, 5, dim).bfloat16() for _ in range(2))]
    module = SimpleNamespace(layer_idx=0)

    def attend(keys, values, prefix):
        kw = {"shared_prefix": prefix} if shared else {}
        return cpu_attention(module, query, keys, values, mask, scaling=0.25, **kw)[0]

    got = attend(layer.keys, layer.values, head)
    wide = [(k.float(), v.float()) for k, v in head]
    want = attend(layer.keys.float(), layer.values.float(), wide)  # the float32 path
    assert got.dtype == torch.bfloat16 and got.shape == (rows, 1, kv_heads * groups, dim)
    torch.testing.assert_close(got.float(), want.float(), atol=1.6e-2, rtol=1.6e-2)
    layer.keys[1, :, :3] = 50.0  # what the padding holds does not matter
    layer.values[1, :, :3] = -50.0
    assert torch.equal(attend(layer.keys, layer.values, head), got)


def test_rows_after_a_finished_one_decode_what_they_decode_alone(engine):
    prompt = _prompt(engine, "Say hello.")
    params = [SamplingParams(max_tokens=m, seed=m, temperature=0.9) for m in (20, 4, 9, 30)]
    alone = [engine.generate_blocking(prompt, p)[0].token_ids for p in params]
    together = [f.result(timeout=120)[0].token_ids for f in
                [engine.submit(prompt, p) for p in params]]  # fmt: skip
    assert together == alone


def test_a_long_prompt_waits_for_room_instead_of_padding_every_row_to_its_length(
    engine, monkeypatch
):
    """Rows are padded to the longest: a long prompt joining short rows would make each hold its
    length. Over `max_batch_kv_bytes` it waits until rows leave, and those behind it wait too;
    every request still gets the tokens it gets alone."""
    short_prompt = _prompt(engine, "Say hello.")
    long_prompt = _prompt(engine, "Repeat after me: " + "the quick brown fox jumps. " * 30)
    short = SamplingParams(max_tokens=24, seed=5, ignore_eos=True)
    long = SamplingParams(max_tokens=6, seed=7, ignore_eos=True)
    alone_short = engine.generate_blocking(short_prompt, short)[0].token_ids
    alone_long = engine.generate_blocking(long_prompt, long)[0].token_ids
    per_token = engine.kv_bytes_per_token
    budget = 4 * (len(short_prompt) + 40) * per_token  # four short rows fit, not a long one
    assert 2 * len(long_prompt) * per_token > budget
    monkeypatch.setattr(engine, "max_batch_kv_bytes", budget)
    held = []  # per step: (rows, bytes of keys and values with padding)
    step = engine._step

    def watched():
        batch = engine._batch
        held.append((len(batch.rows), len(batch.rows) * batch.mask.shape[1] * per_token))
        step()

    monkeypatch.setattr(engine, "_step", watched)
    waits = engine.stats["kv_waits"]
    first = [engine.submit(short_prompt, short) for _ in range(3)]
    _wait_for_steps(engine, 3)
    behind = [engine.submit(long_prompt, long), engine.submit(short_prompt, short)]
    results = [f.result(timeout=120)[0].token_ids for f in first + behind]
    assert results == [alone_short] * 3 + [alone_long, alone_short]
    assert engine.stats["kv_waits"] > waits
    assert all(size <= budget for rows, size in held if rows > 1)


def test_the_batch_bound_by_default_follows_the_memory_available(engine):
    """By default ("auto"), 1 GiB of keys and values on a CPU, 512 MiB where memory is short."""
    assert engine.max_batch_kv_bytes == batch_kv_bytes("cpu")
    assert engine.max_batch_kv_bytes in (1 << 30, 512 << 20)


def test_an_idle_engine_hands_freed_memory_back_once(engine, monkeypatch):
    """glibc keeps freed memory in its arenas (a git training process held 6.5 GB there):
    a second after its last work, the engine trims them, once, and not while it works."""
    import mcprl.serving._engine as engine_module

    trims = []
    monkeypatch.setattr(engine_module, "return_freed_memory", lambda: trims.append(1))
    monkeypatch.setattr(engine, "trim_after_s", 0.2)
    monkeypatch.setattr(engine, "trim_every_s", None)
    prompt = _prompt(engine, "Say hello.")
    engine.submit(prompt, SamplingParams(max_tokens=3, seed=0)).result(timeout=120)
    deadline = time.monotonic() + 10
    while not trims and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.6)  # ... and not again while idle
    assert trims == [1]
    engine.submit(prompt, SamplingParams(max_tokens=3, seed=1)).result(timeout=120)
    time.sleep(0.6)
    assert trims == [1, 1]


def test_a_busy_engine_hands_back_what_finished_rows_freed_at_most_so_often(engine, monkeypatch):
    """Within a rollout phase the engine is never idle: glibc kept every freed cache, and a
    catalog step's process grew to 10 GB. Where rows finish while others run, it trims, no
    more often than `trim_every_s`."""
    import mcprl.serving._engine as engine_module

    trims = []
    monkeypatch.setattr(engine_module, "return_freed_memory", lambda: trims.append(1))
    monkeypatch.setattr(engine, "trim_after_s", 3600.0)  # no idle trim in this test
    prompt = _prompt(engine, "Count to twenty.")

    def run(every: float) -> int:
        monkeypatch.setattr(engine, "trim_every_s", every)
        before = len(trims)
        futures = [
            engine.submit(prompt, SamplingParams(max_tokens=m, seed=m, ignore_eos=True))
            for m in (2, 4, 6, 30)
        ]
        for f in futures:
            f.result(timeout=120)
        return len(trims) - before

    assert run(0.0) >= 3  # the rows that finish before the last one, each time
    assert run(3600.0) == 0


def test_min_p_rows_draw_only_likely_tokens(engine):
    prompt = _prompt(engine, "Write a strange poem about numbers.")
    strict = SamplingParams(
        max_tokens=24, seed=5, temperature=1.3, min_p=0.3, top_logprobs=1, ignore_eos=True
    )
    (kept,) = engine.generate_blocking(prompt, strict)
    # under min_p 0.3 every drawn token is at least 0.3 times as likely as the likeliest one
    for logp, top in zip(kept.logprobs, kept.top_logprobs, strict=True):
        assert logp >= top[0][1] + math.log(0.3) - 1e-5


@pytest.mark.parametrize(("rule", "off"), [(_min_p, 0.0), (_top_p, 1.0)])
def test_min_p_and_top_p_leave_the_rows_without_them_bit_for_bit(rule, off):
    """A row that asks for no min_p (top_p) beside one that does keeps its log-probabilities
    exactly: normalized a second time, they rounded anew, and a draw at temperature 1.3 moved to
    the next token id. (On an Intel Xeon, float32 matrix products also round differently for
    1, 2-5 and 16+ rows, so a row's tokens there depend on the batch's shape: docs/serving.md.)"""
    torch.manual_seed(0)
    logp = torch.log_softmax(torch.randn(2, 49152) * 3, dim=-1)
    out = rule(logp.clone(), torch.tensor([0.3 if rule is _min_p else 0.5, off]))
    assert torch.equal(out[1], logp[1])
    assert (out[0] == float("-inf")).sum() > 0  # the other row is cut


def test_grammar_rows_and_free_rows_mixed_in_one_batch_all_keep_their_rules(engine):
    tools = CALC_TOOLS
    grammar = engine.grammars.compile(tools, "required", None)
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    constrained = _prompt(engine, "Multiply 6 by 7.", tools)
    free = _prompt(engine, "Tell me a story.")
    futures = []
    for seed in range(6):
        if seed % 2:
            futures.append(("free", engine.submit(free, SamplingParams(max_tokens=30, seed=seed))))
        params = SamplingParams(max_tokens=72, seed=seed, temperature=1.0)
        futures.append(("tool", engine.submit(constrained, params, grammar=grammar)))
        time.sleep(0.05)  # arrive while others decode
    for kind, future in futures:
        (completion,) = future.result(timeout=180)
        if kind == "free":
            assert completion.token_ids
            continue
        _, calls = parse_tool_calls(completion.text)
        assert len(calls) == 1 and completion.finish_reason == "stop", completion.text
        fn = calls[0]["function"]
        jsonschema.validate(json.loads(fn["arguments"]), schemas[fn["name"]])


def _accepts(engine, grammar, text: str) -> bool:
    """Whether `grammar` lets `text` be written, token by token."""
    matcher = engine.grammars.matcher(grammar)
    return all(matcher.accept_token(t) for t in _encode(engine, text))


def test_tool_call_numbers_have_bounded_length(engine):
    """A small model can write digits until its token limit; the grammar stops a number at 12
    digits before its point, 17 after it (a float's repr, copied whole) and 3 in its exponent,
    in every offered tool."""
    grammar = engine.grammars.compile(CALC_TOOLS, "required", None)

    def accepts(text: str) -> bool:
        return _accepts(engine, grammar, text)

    head = '<tool_call>\n{"name": "multiply", "arguments": {"a": '
    assert accepts(head + '123456789012.123456789012, "b": -2e10}}\n</tool_call>')
    assert accepts(head + '37.285714285714285, "b": 1}}\n</tool_call>')  # as a tool returned it
    assert not accepts(head + "1234567890123")
    assert not accepts(head + "2.123456789012345678")
    assert accepts(head + '1.5e308, "b": 2E-12}}\n</tool_call>')
    assert not accepts(head + "79.795373999999E+6105")  # float64 ends at 1e308
    other = '<tool_call>\n{"name": "convert_units", "arguments": {"value": 1.5'
    assert accepts(other) and not accepts(other + "123456789012345678")


def test_tool_call_arguments_are_compact_json(engine):
    """Calls come out spaced as the chat template shows them; a trained small model filled free
    whitespace with tabs (`{"a":\t52`) and lost its number copying there."""
    grammar = engine.grammars.compile(CALC_TOOLS, "required", None)

    def accepts(text: str) -> bool:
        return _accepts(engine, grammar, text)

    head = '<tool_call>\n{"name": "multiply", "arguments": '
    assert accepts(head + '{"a": 12, "b": 32}}\n</tool_call>')
    for spaced in ('{"a":\t52', '{"a":12', '{ "a"', '{"a": 12 ,', '{"a":  12'):
        assert not accepts(head + spaced), spaced


def _encode(engine, text: str) -> list[int]:
    return engine.tokenizer.encode(text, add_special_tokens=False)


def _one_token(engine, text: str) -> int:
    (token,) = _encode(engine, text)
    return token


def test_a_token_the_grammar_would_merge_with_what_follows_is_respelled(engine):
    """`c` can only go on as `co…` (`convert_units`), which the tokenizer writes as longer
    tokens; `}` before the forced `}` is `}}`. Whole tokens stand, and the check leaves the
    matcher as it was."""
    grammar = engine.grammars.compile(CALC_TOOLS, "required", None)
    respellings = CanonicalTokens(engine.tokenizer, engine.grammars.vocab_size).respellings
    name = engine.grammars.matcher(grammar)
    assert all(name.accept_token(t) for t in _encode(engine, '<tool_call>\n{"name": "'))
    convert, multiply = _one_token(engine, "convert"), _one_token(engine, "multiply")
    assert convert in respellings(name, _one_token(engine, "c"))
    assert respellings(name, _one_token(engine, "con")) == [convert]  # forced: `vert_units"`
    assert respellings(name, _one_token(engine, "multi")) == [multiply]
    assert respellings(name, convert) is None and respellings(name, multiply) is None
    assert name.accept_token(multiply)  # the checks consumed nothing

    end = engine.grammars.matcher(grammar)
    text = '<tool_call>\n{"name": "multiply", "arguments": {"a": 12, "b": 3'
    assert all(end.accept_token(t) for t in _encode(engine, text))
    assert respellings(end, _one_token(engine, "}")) == [_one_token(engine, "}}")]
    assert respellings(end, _one_token(engine, "}}")) is None
    assert respellings(end, _one_token(engine, "4")) is None


def test_constrained_calls_come_out_as_the_tokenizer_spells_them(engine, monkeypatch):
    """With `canonical` on, a call sampled under a grammar is its text's own encoding: the
    model is never conditioned on fragments like `c`+`om`+`ple`+`te` it has not seen."""
    canonical = CanonicalTokens(engine.tokenizer, engine.grammars.vocab_size)
    monkeypatch.setattr(engine, "canonical", canonical)  # off by default
    grammar = engine.grammars.compile(CALC_TOOLS, "required", None)
    prompt = _prompt(engine, "Convert 5 km to miles, or multiply 6 by 7.", CALC_TOOLS)
    params = SamplingParams(max_tokens=72, seed=5, temperature=1.0, n=8)
    for completion in engine.generate_blocking(prompt, params, grammar=grammar):
        body = completion.token_ids[:-1]  # without the stop token
        assert completion.finish_reason == "stop", completion.text
        assert _encode(engine, engine.tokenizer.decode(body)) == body, completion.text


def test_a_grammar_that_has_ended_is_not_asked_again(engine):
    """With ignore_eos a row goes on past its grammar's end: unconstrained, and no crash."""
    grammar = engine.grammars.compile(CALC_TOOLS[:1], "required", None)
    prompt = _prompt(engine, "Multiply 2 by 3.", CALC_TOOLS[:1])
    params = SamplingParams(max_tokens=90, seed=0, ignore_eos=True)
    (completion,) = engine.generate_blocking(prompt, params, grammar=grammar)
    assert len(completion.token_ids) == 90 and completion.finish_reason == "length"
    assert parse_tool_calls(completion.text)[1]  # the call it made first is there


def test_decoding_with_an_adapter_keeps_no_autograd_graph(engine, tmp_path):
    """A graph kept alive by the KV cache grew a training run's memory by 2 GB every 10 s."""
    from tests.test_serving import _random_adapter

    engine.load_adapter("graph@1", _random_adapter(tmp_path / "a", seed=0))
    try:
        prompt = _prompt(engine, "Count to twenty.")
        future = engine.submit(prompt, SamplingParams(max_tokens=30, ignore_eos=True), "graph@1")
        _wait_for_steps(engine, 3)
        with engine.paused():
            batch = engine._batch
            if batch is not None:  # still decoding: its cache holds no graph
                keys = batch.cache.layers[0].keys
                assert not keys.requires_grad and keys.grad_fn is None
        future.result(timeout=120)
        adapted = [m for m in engine.model.modules() if isinstance(m, LoraLinear)]
        assert adapted and not any(w.requires_grad for m in adapted for w in m.weights["graph@1"])
    finally:
        engine.unload_adapter("graph@1")
    assert not any(isinstance(m, LoraLinear) for m in engine.model.modules())  # base restored


def test_an_adapter_is_served_as_peft_computes_it(engine, tmp_path):
    """The engine's own LoRA layers give the log-probabilities of peft's model (float32)."""
    from peft import PeftModel

    from tests.test_serving import _random_adapter

    path = _random_adapter(tmp_path / "a", seed=1)
    prompt = _prompt(engine, "Name three colours.")
    engine.load_adapter("same@1", path)
    try:
        params = SamplingParams(max_tokens=12, temperature=1.0, seed=5, ignore_eos=True)
        (served,) = engine.generate_blocking(prompt, params, adapter="same@1")
        (base,) = engine.generate_blocking(prompt, params)
    finally:
        engine.unload_adapter("same@1")
    peft_model = PeftModel.from_pretrained(load_model(MODEL, "float32", "cpu").model, path)
    ids = torch.tensor([prompt + served.token_ids])
    with torch.inference_mode():
        logits = peft_model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
    want = torch.log_softmax(logits, -1).gather(-1, torch.tensor(served.token_ids)[:, None])
    assert torch.allclose(torch.tensor(served.model_logprobs), want[:, 0], atol=2e-3)
    assert served.token_ids != base.token_ids  # the adapter was in use


@pytest.mark.parametrize(
    ("setting", "named"),
    [({"use_dora": True}, "use_dora"), ({"peft_type": "IA3"}, "IA3"), ({"bias": "all"}, "bias")],
)
def test_an_adapter_the_engine_cannot_serve_is_refused_by_name(engine, tmp_path, setting, named):
    from tests.test_serving import _random_adapter

    path = _random_adapter(tmp_path / "a", seed=2)
    config_file = tmp_path / "a" / "adapter_config.json"
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**config, **setting}))
    with pytest.raises(AdapterError, match=named):
        engine.load_adapter("odd@1", path)
    assert "odd@1" not in engine.adapters
    assert not any(isinstance(m, LoraLinear) for m in engine.model.modules())


def test_a_fresh_adapter_samples_the_base_models_tokens_in_a_batch(engine, tmp_path):
    """A run's step 0 (LoRA B = 0) is the base model: with the same seeds its attempts are the
    base's, token for token, also when the rows share a batch (float32; in bfloat16 the batch's
    shape moves the rounding, and a token can flip: docs/serving.md)."""
    from peft import LoraConfig, get_peft_model

    path = tmp_path / "zero"
    base = load_model(MODEL, dtype="float32").model
    get_peft_model(
        base, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear")
    ).save_pretrained(path)
    prompts = [_prompt(engine, f"What is {a} plus {b}?") for a, b in [(3, 4), (12, 30)]]
    params = SamplingParams(max_tokens=16, temperature=1.0, seed=1234)
    engine.load_adapter("zero@0", str(path))
    try:
        as_base = [engine.submit(p, params) for p in prompts]
        as_adapter = [engine.submit(p, params, adapter="zero@0") for p in prompts]
        tokens = [[f.result(timeout=120)[0].token_ids for f in fs] for fs in (as_base, as_adapter)]
    finally:
        engine.unload_adapter("zero@0")
    assert tokens[0] == tokens[1]


def test_threads_are_sized_on_the_engine_thread_only(engine):
    from mcprl.serving._threads import ThreadGovernor

    class Busy:  # another process uses 1.5 of 2 cores
        cores = 2

        @staticmethod
        def others() -> float:
            return 1.5

    before, governor = torch.get_num_threads(), engine.governor
    engine.governor = ThreadGovernor(most=2, every_s=0, use=Busy())
    try:
        engine.poll_threads()  # not the engine's thread: torch's count there would not change
        assert engine.governor.threads == 2
        assert engine.run_exclusive(lambda: (engine.poll_threads(), torch.get_num_threads())) == (
            None,
            1,
        )
        assert engine.governor.threads == 1 and engine.governor.changes == 1
    finally:
        engine.run_exclusive(lambda: torch.set_num_threads(before))
        engine.governor = governor


def test_caches_of_an_adapter_a_step_replaces_are_released(engine):
    class Recorder:
        def __init__(self):
            self.dropped = []

        def drop(self, adapter):
            self.dropped.append(adapter)

    prefix, conversations = engine.prefix_cache, engine.conversations
    engine.prefix_cache, engine.conversations = Recorder(), Recorder()
    try:
        engine.release_caches("agent@3")
        assert engine.prefix_cache.dropped == ["agent@3"] == engine.conversations.dropped
    finally:
        engine.prefix_cache, engine.conversations = prefix, conversations


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_linear_layers_give_the_same_bits_and_leave_gradients_to_plain_linear(dtype):
    from mcprl.serving._packed import pack_linear, packable

    if not packable(torch.device("cpu"), dtype):
        pytest.skip(f"this torch cannot pack {dtype} weights for oneDNN")
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 96).to(dtype)
    layer.requires_grad_(False)
    rows = torch.randn(3, 5, 64, dtype=dtype)
    plain = layer(rows)
    assert pack_linear(layer) == 96 * 64 * rows.element_size()
    assert pack_linear(layer) == 0  # once
    with torch.inference_mode():
        assert torch.equal(layer(rows), plain)  # the packed kernel, same numbers
    assert torch.equal(layer(rows), plain)
    last = rows[:, -1:]  # a strided slice, as a prefill's `logits_to_keep=1` passes it
    with torch.inference_mode():
        assert torch.equal(layer(last), plain[:, -1:])
    # a caller that wants the input's gradient (a trainer) gets plain `linear`'s graph
    wanted, expected = rows.clone().requires_grad_(), rows.clone().requires_grad_()
    layer(wanted).sum().backward()
    torch.nn.functional.linear(expected, layer.weight, layer.bias).sum().backward()
    assert torch.equal(wanted.grad, expected.grad)


def test_the_engine_packs_its_output_layer_once_on_cpu(engine):
    packed = [m for m in engine.model.modules() if hasattr(m, "_packed")]
    assert packed == [engine.model.get_output_embeddings()]
    assert engine.packed_bytes == 49152 * 576 * 4  # float32 here
    # float32 weights read from the model's file are mapped, not swapped: they stay plain
    assert engine._swapped.layers == []


def test_a_bfloat16_layers_adapter_is_multiplied_in_float32_and_rounded_as_peft_rounds(tmp_path):
    from safetensors.torch import save_file

    from mcprl.serving._lora import ServedAdapters

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32)).to(torch.bfloat16).requires_grad_(False)
    a, b = torch.randn(4, 64) * 0.1, torch.randn(32, 4) * 0.1
    save_file(
        {"base_model.model.0.lora_A.weight": a, "base_model.model.0.lora_B.weight": b},
        str(tmp_path / "adapter_model.safetensors"),
    )
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8}))
    adapters = ServedAdapters(model)
    adapters.load("a", tmp_path)
    down, up = model[0].weights["a"]
    assert down.dtype == up.dtype == torch.float32  # kept in float32 under bfloat16 weights
    adapters.use("a")
    x = torch.randn(5, 1, 64, dtype=torch.bfloat16)
    with torch.inference_mode():
        served = model(x)
    # peft: float32 adapter weights, the product added to the base output in float32, rounded
    base = torch.nn.functional.linear(x, model[0].base.weight, model[0].base.bias)
    want = (base.float() + (x.float() @ a.t() @ b.t()) * (8 / 4)).to(torch.bfloat16)
    assert served.dtype == torch.bfloat16
    assert (served.float() - want.float()).abs().max() <= 2**-7 * want.abs().max()


def test_swapped_weights_free_the_plain_weight_and_restore_it_bit_for_bit():
    from mcprl.serving._packed import SwappedWeights, packable

    if not packable(torch.device("cpu"), torch.bfloat16):
        pytest.skip("this torch cannot pack bfloat16 weights for oneDNN")
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 96), torch.nn.Linear(96, 64), torch.nn.Linear(64, 64, bias=False)
    ).to(torch.bfloat16)
    model.requires_grad_(False)
    tied = torch.nn.Linear(64, 64, bias=False).to(torch.bfloat16).requires_grad_(False)
    tied.weight = model[2].weight  # a weight another layer shares is left alone
    model.append(tied)
    rows = torch.randn(5, 64, dtype=torch.bfloat16)
    plain, weights = model(rows), [m.weight.clone() for m in model]
    # a trainer reading the served weights shares their storage (`share_base_weights`)
    trainer = torch.nn.Parameter(torch.empty(0, dtype=torch.bfloat16), requires_grad=False)
    trainer.data = model[0].weight.data

    swapped = SwappedWeights(model)
    assert swapped.layers == [model[0], model[1]]
    swapped.pack()
    assert model[0].weight.untyped_storage().nbytes() == 0  # the plain weight's memory is gone
    assert trainer.untyped_storage().nbytes() == 0
    with pytest.raises(RuntimeError, match="run_exclusive"):
        model(rows.clone().requires_grad_())  # a gradient through it is refused by name
    with torch.inference_mode():
        assert torch.equal(model(rows), plain)  # the packed kernel, the same bits
    swapped.unpack()
    assert all(torch.equal(m.weight, w) for m, w in zip(model, weights, strict=True))
    assert torch.equal(trainer, weights[0])
    # plain again: a caller that wants gradients gets plain `linear`'s
    wanted = rows.clone().requires_grad_()
    model(wanted).float().sum().backward()
    assert wanted.grad is not None
    swapped.pack()  # and packs again, as often as the engine swaps
    with torch.inference_mode():
        assert torch.equal(model(rows), plain)


def test_the_engine_decodes_from_swapped_weights_and_trains_on_plain_ones(policy_server):
    engine = policy_server.engine
    if not engine._swapped or not engine._swapped.layers:
        pytest.skip("the served weights cannot be swapped here (not bfloat16 on a CPU)")
    layers = engine._swapped.layers
    assert len(layers) == 210  # SmolLM2-135M's projections, 7 in each of 30 layers
    before = engine.run_exclusive(lambda: [m.weight.clone() for m in layers[:3]])
    prompt = engine.tokenizer.encode("Hello")
    params = SamplingParams(max_tokens=3, temperature=0.0)
    first = engine.generate_blocking(prompt, params)[0].token_ids
    # decoding left the packed weights in place of the plain ones
    assert engine._swapped.packed
    assert sum(m.weight.untyped_storage().nbytes() for m in layers) == 0
    # exclusive work (a training step) reads the plain weights, exactly as they were
    after = engine.run_exclusive(lambda: [m.weight.clone() for m in layers[:3]])
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert engine.generate_blocking(prompt, params)[0].token_ids == first
    assert engine.stats["swaps"] >= 3
