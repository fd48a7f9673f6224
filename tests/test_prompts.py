"""Multi-turn prompts keep the tokens earlier replies were sampled as (`PromptTokens`)."""

from __future__ import annotations

import pytest

from mcprl.serving._chat import (
    PromptTokens,
    format_call,
    parse_tool_calls,
    render_prompt,
    render_text,
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"],
            },
        },
    }
]
MESSAGES = [
    {"role": "system", "content": "Call tools."},
    {"role": "user", "content": "Add 5760 and 625."},
]
# How a grammar-constrained model may write a call: its own spacing ...
REPLY = '<tool_call>\n{"name": "add", "arguments": {"a": 5760,"b": 625}}\n</tool_call>'


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from mcprl.serving._models import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model("smollm2-135m"))


def spelled_by_characters(tokenizer, text: str) -> list[int]:
    """... and its own tokens: one per character, not the tokenizer's merges."""
    return [i for ch in text for i in tokenizer(ch, add_special_tokens=False)["input_ids"]]


def next_turn(reply_text: str) -> list[dict]:
    content, calls = parse_tool_calls(reply_text)
    assistant = {"role": "assistant", "content": content, "tool_calls": calls}
    tool = {"role": "tool", "tool_call_id": calls[0]["id"], "content": "6385"}
    return [*MESSAGES, assistant, tool]


def test_the_first_prompt_is_the_chat_template_tokenized(tokenizer):
    prompts = PromptTokens(tokenizer)
    ids = prompts.render(MESSAGES, TOOLS)
    assert ids == render_prompt(tokenizer, MESSAGES, TOOLS)
    plain = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
    plain = plain["input_ids"] if hasattr(plain, "keys") else plain
    assert PromptTokens(tokenizer).render(MESSAGES, None) == list(plain)


def test_the_next_prompt_extends_the_sampled_tokens(tokenizer):
    prompts = PromptTokens(tokenizer)
    first = prompts.render(MESSAGES, TOOLS)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    reply = [*spelled_by_characters(tokenizer, REPLY), end]
    assert reply[:-1] != tokenizer(REPLY, add_special_tokens=False)["input_ids"]
    prompts.remember(first, reply)

    messages = next_turn(tokenizer.decode(reply[:-1]))
    second = prompts.render(messages, TOOLS)
    assert second[: len(first) + len(reply)] == first + reply
    assert tokenizer.decode(second) == render_text(tokenizer, messages, TOOLS)  # same text
    assert prompts.reused == 1
    # Tokenized afresh, the conversation would not extend what the model saw and wrote.
    fresh = render_prompt(tokenizer, messages, TOOLS)
    assert fresh[: len(first) + len(reply)] != first + reply


def test_tool_calls_render_back_as_the_model_wrote_them():
    content, calls = parse_tool_calls(REPLY)
    assert content is None and calls[0]["function"]["arguments"] == '{"a": 5760,"b": 625}'
    assert format_call("add", calls[0]["function"]["arguments"]) == REPLY
    nested = '<tool_call>{"arguments": { "q": ["}", {"x": 1}] }, "name": "find"}</tool_call>'
    assert parse_tool_calls(nested)[1][0]["function"]["arguments"] == '{ "q": ["}", {"x": 1}] }'
    # arguments given as a dict, or as text that is not JSON, render as before
    assert format_call("add", {"a": 1}) == (
        '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'
    )
    assert '"arguments": "a=1"' in format_call("add", "a=1")
    assert '"arguments": {}' in format_call("add", "")


def test_remembered_replies_are_bounded(tokenizer):
    prompts = PromptTokens(tokenizer, capacity=2)
    first = prompts.render(MESSAGES, TOOLS)
    for n in range(3):
        prompts.remember(first, tokenizer(f"reply {n}", add_special_tokens=False)["input_ids"])
    assert len(prompts._seen) == 2


def test_a_list_of_choices_two_arguments_share_is_shown_once(tokenizer):
    units = ["meter", "foot", "inch", "mile"]
    convert = {
        "type": "function",
        "function": {
            "name": "convert",
            "description": "Convert a length",
            "parameters": {
                "$schema": "http://json-schema.org/draft-07/schema#",
                "title": "convertArguments",
                "type": "object",
                "properties": {
                    "value": {"type": "number"},
                    "from_unit": {"type": "string", "enum": units},
                    "to_unit": {"type": "string", "enum": units},
                    "title": {"type": "string", "enum": ["a", "b", "c"]},  # a property's name
                },
            },
        },
    }
    text = render_text(tokenizer, MESSAGES, [convert])
    assert text.count('"meter"') == 1
    assert '"to_unit": {"type": "string", "enum": "same as from_unit"}' in text
    assert '"title": {"type": "string", "enum": ["a", "b", "c"]}' in text
    assert "$schema" not in text and "convertArguments" not in text
    assert convert["function"]["parameters"]["properties"]["to_unit"]["enum"] == units  # as given
