"""The CPU engine and its OpenAI-compatible server, with the real default model (few tokens)."""

from __future__ import annotations

import concurrent.futures
import json

import httpx
import jsonschema
import openai
import pytest
import torch

from mcprl.rollout import complete_task_tool
from mcprl.serving import load_model, start_server
from mcprl.serving._chat import parse_tool_calls, render_prompt
from mcprl.serving._server import check_bind

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m"

CALC_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "multiply",
            "description": "Multiply two numbers",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "convert_units",
            "description": "Convert a value between units",
            "parameters": {
                "type": "object",
                "properties": {
                    "value": {"type": "number"},
                    "from_unit": {"enum": ["km", "mile", "kg", "lb"], "type": "string"},
                    "to_unit": {"enum": ["km", "mile", "kg", "lb"], "type": "string"},
                },
                "required": ["value", "from_unit", "to_unit"],
            },
        },
    },
]


@pytest.fixture(scope="session")
def server(policy_server):
    return policy_server


@pytest.fixture(scope="session")
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key=server.api_key, max_retries=0)


def http_client(server) -> httpx.Client:
    """A plain HTTP client that sends the server's API key."""
    return httpx.Client(
        base_url=server.base_url, headers={"authorization": f"Bearer {server.api_key}"}
    )


def ask(client, content, **kw):
    kw.setdefault("max_tokens", 12)
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": content}], **kw
    )


def test_a_plain_reply_through_the_official_client(client):
    r = ask(client, "Say hello.", temperature=0)
    choice = r.choices[0]
    assert isinstance(choice.message.content, str) and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert r.usage.completion_tokens == len(choice.model_extra["token_ids"]) <= 12
    assert [m.id for m in client.models.list().data] == [MODEL]


def test_required_tool_calls_are_always_valid(client):
    r = ask(
        client,
        "How many kilometres are 26.2 miles? Then double it.",
        tools=CALC_TOOLS,
        tool_choice="required",
        n=12,
        temperature=1.0,
        seed=5,
        max_tokens=72,
    )
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in CALC_TOOLS}
    for choice in r.choices:
        assert choice.finish_reason == "tool_calls", choice.message
        (call,) = choice.message.tool_calls
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
        assert call.id.startswith("call_")


def test_a_named_tool_choice_calls_that_tool(client):
    choice = {"type": "function", "function": {"name": "convert_units"}}
    r = ask(client, "Multiply 3 by 4.", tools=CALC_TOOLS, tool_choice=choice, max_tokens=72)
    assert r.choices[0].message.tool_calls[0].function.name == "convert_units"


def test_an_answer_ends_its_conversation_and_nothing_of_it_stays_kept(client, server):
    """`final_tools` (mcprl's extension): a reply that calls only these tools ends the
    conversation, so the server forgets its earlier turns' kept keys and values and keeps none
    of its own; a reply calling any other tool is kept, and so is an answer from a client that
    does not send the field."""
    kept = server.engine.conversations
    tools = [*CALC_TOOLS, complete_task_tool("number")]
    final = {"final_tools": ["complete_task"]}

    def turn(messages: list[dict], tool: str, **extra):
        before = set(kept.entries)
        choice = {"type": "function", "function": {"name": tool}}
        r = client.chat.completions.create(
            model=MODEL, messages=messages, tools=tools, tool_choice=choice, seed=4,
            max_tokens=48, extra_body=extra,
        )  # fmt: skip
        message = r.choices[0].message
        assert message.tool_calls[0].function.name == tool
        return message, before - set(kept.entries), set(kept.entries) - before

    task = [{"role": "user", "content": "Multiply 3 by 4."}]
    call, gone, first = turn(task, "multiply", **final)
    assert not gone and len(first) == 1
    after = [
        *task,
        call.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.tool_calls[0].id, "content": '{"result": 12}'},
    ]
    _, gone, added = turn(after, "complete_task", **final)
    assert gone == first and not added
    _, gone, added = turn(task, "complete_task")  # no final_tools: kept, as before
    assert len(added) == 1


def test_a_yes_or_no_answer_is_one_of_the_two_and_nothing_else(client):
    """complete_task typed "yes/no" (`mcprl.rollout`): an enum, which the grammar holds every
    sample to, where a small model otherwise answers a yes/no question with a tool's name."""
    finish = complete_task_tool("yes/no")
    choice = {"type": "function", "function": {"name": "complete_task"}}
    r = ask(client, "Is there a commit named Smile?", tools=[finish], tool_choice=choice, n=4,
            seed=2, temperature=1.5, max_tokens=48)  # fmt: skip
    answers = [json.loads(c.message.tool_calls[0].function.arguments) for c in r.choices]
    assert all(a in ({"answer": "yes"}, {"answer": "no"}) for a in answers), answers


def test_pinned_arguments_give_that_exact_call_with_the_models_log_probs(client):
    """mcprl's `function.arguments` extension (demonstrations): every sample is the call with
    those arguments, however unlikely the model finds them, and its log-probabilities are the
    model's (what a trainer's ratio needs), not the pinned distribution's zeros."""
    pinned = {"value": 26.2, "from_unit": 'mile "US"', "to_unit": "km"}
    choice = {"type": "function", "function": {"name": "convert_units", "arguments": pinned}}
    r = ask(client, "Multiply 3 by 4.", tools=CALC_TOOLS, tool_choice=choice, n=3, seed=5,
            logprobs=True, max_tokens=72)  # fmt: skip
    for c in r.choices:
        (call,) = c.message.tool_calls
        assert call.function.name == "convert_units"
        assert call.function.arguments == json.dumps(pinned)  # 26.2, not 26.199999999999999
    model = r.choices[0].model_extra["mcprl"]["model_logprobs"]
    assert min(model) < -1.0  # "mile" for "Multiply 3 by 4." is not what the model would write
    free = ask(client, "Multiply 3 by 4.", tools=CALC_TOOLS, tool_choice=choice | {
        "function": {"name": "convert_units"}}, seed=5, max_tokens=72)  # fmt: skip
    assert (
        free.choices[0].model_extra["prompt_token_ids"]
        == (r.choices[0].model_extra["prompt_token_ids"])
    )  # the prompt is the same: nothing of the pin shows in it


def test_allowed_tools_restricts_the_calls_but_not_the_prompt(client):
    # the prompt lists both tools; only convert_units may be called (OpenAI's allowed_tools)
    only = {"type": "function", "function": {"name": "convert_units"}}
    choice = {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [only]}}
    r = ask(
        client, "Multiply 3 by 4.", tools=CALC_TOOLS, tool_choice=choice, n=6, seed=3,
        temperature=1.0, max_tokens=72,
    )  # fmt: skip
    assert {c.message.tool_calls[0].function.name for c in r.choices} == {"convert_units"}
    both = ask(client, "Multiply 3 by 4.", tools=CALC_TOOLS, tool_choice="required", seed=3)
    assert (
        both.choices[0].model_extra["prompt_token_ids"]
        == (r.choices[0].model_extra["prompt_token_ids"])
    )


def test_top_logprobs_of_tokens_a_grammar_rules_out_are_finite(client):
    choice = {"type": "function", "function": {"name": "multiply"}}
    r = ask(client, "x", tools=CALC_TOOLS, tool_choice=choice, logprobs=True, top_logprobs=3)
    tops = [t.logprob for tok in r.choices[0].logprobs.content for t in tok.top_logprobs]
    assert tops and min(tops) == -9999.0  # vLLM's floor; JSON has no -Infinity


def test_a_json_schema_reply_validates(client):
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
        "required": ["city", "population"],
        "additionalProperties": False,
    }
    r = ask(
        client,
        "Name a city and its population as JSON.",
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
        max_tokens=40,
        n=3,
        seed=1,
    )
    # at temperature 1 a 135M model may ramble inside a string until max_tokens; what ends, ends
    # as valid JSON
    stopped = [c for c in r.choices if c.finish_reason == "stop"]
    assert len(stopped) >= 2
    for choice in stopped:
        jsonschema.validate(json.loads(choice.message.content), schema)


def test_logprobs_match_a_teacher_forced_forward_pass(client, server):
    messages = [{"role": "user", "content": "Count from one to five."}]
    r = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=10,
        temperature=1.0,
        seed=3,
        n=2,
        logprobs=True,
    )
    engine = server.engine
    for choice in r.choices:
        prompt = choice.model_extra["prompt_token_ids"]
        tokens = choice.model_extra["token_ids"]
        assert prompt == render_prompt(engine.tokenizer, messages, None)
        ids = torch.tensor([prompt + tokens])
        with torch.inference_mode():
            logits = engine.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
        expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]
        model_lp = torch.tensor(choice.model_extra["mcprl"]["model_logprobs"])
        sampled_lp = torch.tensor([t.logprob for t in choice.logprobs.content])
        # bfloat16 weights: cached decoding and one full pass round differently; stated bound.
        assert (model_lp - expected).abs().max() < 0.3, (model_lp, expected)
        assert (model_lp - expected).abs().mean() < 0.06, (model_lp, expected)
        # At temperature 1 with no top-p or grammar, both distributions are the same.
        assert torch.allclose(sampled_lp, model_lp, atol=1e-4)


def test_float32_logprobs_match_a_teacher_forced_pass_tightly():
    from mcprl.serving import Engine, SamplingParams

    loaded = load_model(MODEL, dtype="float32")
    engine = Engine(loaded)
    try:
        prompt = render_prompt(loaded.tokenizer, [{"role": "user", "content": "Hi!"}], None)
        params = SamplingParams(max_tokens=8, temperature=1.0, seed=9, n=3)
        for c in engine.generate_blocking(prompt, params):
            ids = torch.tensor([prompt + c.token_ids])
            with torch.inference_mode():
                logits = loaded.model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
            want = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c.token_ids)[:, None])
            assert torch.allclose(torch.tensor(c.model_logprobs), want[:, 0], atol=2e-3)
    finally:
        engine.close()


def test_the_same_seed_gives_the_same_output(client):
    kw = {"temperature": 1.0, "seed": 42, "max_tokens": 16}
    a, b = ask(client, "Tell me a fact.", **kw), ask(client, "Tell me a fact.", **kw)
    c = ask(client, "Tell me a fact.", **{**kw, "seed": 43})
    assert a.choices[0].model_extra["token_ids"] == b.choices[0].model_extra["token_ids"]
    assert a.choices[0].model_extra["token_ids"] != c.choices[0].model_extra["token_ids"]


def test_concurrent_requests_all_complete_in_a_shared_batch(client, server):
    before = server.engine.stats["prefills"]
    prompts = [f"Write the number {i} in words." for i in range(8)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda p: ask(client, p, max_tokens=8, seed=1), prompts))
    assert all(r.choices[0].message.content for r in replies)
    assert server.engine.stats["prefills"] - before < 8  # requests were batched together


def _random_adapter(path, seed: int) -> str:
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    base = load_model(MODEL, dtype="float32").model
    config = LoraConfig(
        r=8, lora_alpha=64, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    get_peft_model(base, config).save_pretrained(path)
    return str(path)


def test_an_adapter_loads_changes_the_output_and_unloads(client, server, tmp_path):
    path = _random_adapter(tmp_path / "a1", seed=0)
    base_before = ask(client, "What is the capital of France?", temperature=0, max_tokens=12)
    http = http_client(server)
    assert http.post("/load_lora_adapter", json={"lora_name": "m@1", "lora_path": path}).is_success
    assert [m.id for m in client.models.list().data] == [MODEL, "m@1"]
    tuned = client.chat.completions.create(
        model="m@1",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        temperature=0,
        max_tokens=12,
    )
    base_again = ask(client, "What is the capital of France?", temperature=0, max_tokens=12)
    ids = lambda r: r.choices[0].model_extra["token_ids"]  # noqa: E731
    assert ids(tuned) != ids(base_before)
    assert ids(base_again) == ids(base_before)  # the base model is untouched
    assert http.post("/unload_lora_adapter", json={"lora_name": "m@1"}).is_success
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(
            model="m@1", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
    after = ask(client, "What is the capital of France?", temperature=0, max_tokens=12)
    assert ids(after) == ids(base_before)


def test_two_adapters_can_be_resident_at_once(client, server, tmp_path):
    http = http_client(server)
    for name, seed in (("x@1", 1), ("x@2", 2)):
        body = {"lora_name": name, "lora_path": _random_adapter(tmp_path / name, seed)}
        assert http.post("/load_lora_adapter", json=body).is_success
    outs = [
        client.chat.completions.create(
            model=name,
            messages=[{"role": "user", "content": "Name a colour."}],
            temperature=0,
            max_tokens=8,
        )
        .choices[0]
        .model_extra["token_ids"]
        for name in ("x@1", "x@2")
    ]
    assert outs[0] != outs[1]
    for name in ("x@1", "x@2"):
        assert http.post("/unload_lora_adapter", json={"lora_name": name}).is_success


BAD_REQUESTS = [
    ("malformed JSON", b"{not json", 400, "not valid JSON"),
    ("messages not a list", {"model": MODEL, "messages": "hi"}, 400, "messages"),
    (
        "wrong type",
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "temperature": "hot"},
        400,
        "temperature",
    ),
    (
        "unknown model",
        {"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]},
        404,
        "not found",
    ),
    (
        "max_tokens beyond context",
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 10**6},
        400,
        "context",
    ),
    (
        "uncompilable tool schema",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "x"}],
            "tool_choice": "required",
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "parameters": {
                            "type": "object",
                            "properties": {"x": {"$ref": "#/$defs/missing"}},
                        },
                    },
                }
            ],
        },
        400,
        "grammar",
    ),
    (
        "required without tools",
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "tool_choice": "required"},
        400,
        "needs at least one tool",
    ),
    (
        "allowed_tools naming a tool not offered",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "x"}],
            "tools": CALC_TOOLS,
            "tool_choice": {
                "type": "allowed_tools",
                "allowed_tools": {
                    "mode": "required",
                    "tools": [{"type": "function", "function": {"name": "divide"}}],
                },
            },
        },
        400,
        "'divide', which is not among the tools",
    ),
    (
        "pinned arguments that are not an object",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "x"}],
            "tools": CALC_TOOLS,
            "tool_choice": {
                "type": "function",
                "function": {"name": "multiply", "arguments": [3, 4]},
            },
        },
        400,
        "arguments",
    ),
    (
        "streaming",
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stream": True},
        400,
        "stream",
    ),
]


@pytest.mark.parametrize(
    ("name", "body", "status", "text"), BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS]
)
def test_each_bad_request_gets_its_error_and_the_server_goes_on(
    server, client, name, body, status, text
):
    http = http_client(server)
    if isinstance(body, bytes):
        r = http.post(
            "/chat/completions", content=body, headers={"content-type": "application/json"}
        )
    else:
        r = http.post("/chat/completions", json=body)
    assert r.status_code == status
    error = r.json()["error"]
    assert text in error["message"] and error["code"] == status
    assert ask(client, "Still there?", max_tokens=2).choices[0].message.content is not None


def test_an_api_key_is_enforced_and_required_off_loopback(server):
    with pytest.raises(ValueError, match="API key"):
        check_bind("0.0.0.0", None)
    check_bind("0.0.0.0", "secret")  # allowed with a key
    with start_server(server.engine, MODEL, api_key="secret") as guarded:
        denied = openai.OpenAI(base_url=guarded.base_url, api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            denied.models.list()
        allowed = openai.OpenAI(base_url=guarded.base_url, api_key="secret", max_retries=0)
        assert allowed.models.list().data[0].id == MODEL


def test_tool_calls_parse_back_from_text():
    text = 'Sure.\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'
    content, calls = parse_tool_calls(text)
    assert content == "Sure."
    assert calls[0]["function"] == {"name": "add", "arguments": '{"a": 1}'}
    broken, none = parse_tool_calls("<tool_call>{oops</tool_call>")
    assert none == [] and broken == "<tool_call>{oops</tool_call>"
