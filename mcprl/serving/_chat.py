"""Chat formatting with tools, and reading tool calls back out of generated text.

The model's own chat template formats the conversation. When the template has no notion of
tools (SmolLM2's has none), tools are described in the system message as a Hermes-style block,
earlier tool calls are written as `<tool_call>{"name": ..., "arguments": ...}</tool_call>`, and
tool results go back as `<tool_response>` blocks. Generated text is parsed the same way into
OpenAI `tool_calls` with fresh ids, for any model.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections import OrderedDict
from typing import Any

__all__ = [
    "TOOL_CALL_BEGIN",
    "TOOL_CALL_END",
    "PromptTokens",
    "parse_tool_calls",
    "render_prompt",
    "render_text",
]

TOOL_CALL_BEGIN = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_SPACE = re.compile(r"\s*")
_DECODER = json.JSONDecoder()

_HERMES = """\
# Tools

You may call one or more functions to help with the user's request. The functions are described \
inside <tools></tools> as JSON signatures:
<tools>
{tools}
</tools>

To call a function, reply with a JSON object with the function name and arguments inside \
<tool_call></tool_call> tags:
<tool_call>
{{"name": "function_name", "arguments": {{"argument": "value"}}}}
</tool_call>"""


def template_supports_tools(tokenizer: Any) -> bool:
    template = getattr(tokenizer, "chat_template", None) or ""
    return "tools" in template


def format_call(name: str, arguments: Any) -> str:
    """A tool call as the model writes one. Arguments given as JSON text are kept as written, so
    a reply the model generated renders back to the same text (and the same tokens, see
    `PromptTokens`); text that is not JSON is kept as a string."""
    if isinstance(arguments, str):
        raw = arguments.strip() or "{}"
        try:
            json.loads(raw)
            body = raw
        except json.JSONDecodeError:
            body = json.dumps(arguments, ensure_ascii=False)
    else:
        body = json.dumps(arguments, ensure_ascii=False)
    payload = f'{{"name": {json.dumps(name, ensure_ascii=False)}, "arguments": {body}}}'
    return f"{TOOL_CALL_BEGIN}\n{payload}\n{TOOL_CALL_END}"


_NOISE = ("title", "$schema")  # schema keys that cost a prompt tokens and tell a model nothing


def _compact(schema: Any) -> Any:
    """A JSON schema as the prompt shows it: without its `title`s (generated noise such as
    "addArguments") and `$schema` (the draft's URL), and with a list of choices that a sibling
    property already spells out written once (`"to_unit": {"enum": "same as from_unit"}` where
    both list the same 40 units). The prompt only: a call's arguments are still held to the
    full schema."""
    if isinstance(schema, dict):
        return {
            k: (_compact(v) if k != "properties" else _properties(v))
            for k, v in schema.items()
            if k not in _NOISE
        }
    if isinstance(schema, list):
        return [_compact(v) for v in schema]
    return schema


def _properties(properties: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    first: dict[str, str] = {}  # an enum's JSON: the property that lists it first
    for name, prop in properties.items():
        prop = _compact(prop)
        choices = prop.get("enum") if isinstance(prop, dict) else None
        if isinstance(choices, list) and len(choices) > 2:
            key = json.dumps(choices)
            if key in first:
                prop = dict(prop, enum=f"same as {first[key]}")
            else:
                first[key] = name
        out[name] = prop
    return out


def _tool_line(tool: dict[str, Any]) -> str:
    fn = dict(tool.get("function", tool))
    if "parameters" in fn:
        fn["parameters"] = _compact(fn["parameters"])
    return json.dumps(fn, ensure_ascii=False)


def _hermes_messages(messages: list[dict[str, Any]], tools: list[dict] | None) -> list[dict]:
    """Rewrite OpenAI tool messages into plain roles the template understands."""
    out: list[dict[str, Any]] = []
    if tools:
        block = _HERMES.format(tools="\n".join(_tool_line(t) for t in tools))
        if messages and messages[0]["role"] in ("system", "developer"):
            first = dict(messages[0], role="system")
            first["content"] = f"{first.get('content') or ''}\n\n{block}".strip()
            messages = [first, *messages[1:]]
        else:
            messages = [{"role": "system", "content": block}, *messages]
    for m in messages:
        role = m["role"]
        content = m.get("content") or ""
        if role == "developer":
            role = "system"
        if role == "assistant" and m.get("tool_calls"):
            calls = [
                format_call(c["function"]["name"], c["function"].get("arguments", ""))
                for c in m["tool_calls"]
            ]
            content = "\n".join([content, *calls]) if content else "\n".join(calls)
        elif role == "tool":
            response = f"<tool_response>\n{content}\n</tool_response>"
            if out and out[-1]["role"] == "user" and out[-1].get("_tool"):
                out[-1]["content"] += "\n" + response
                continue
            out.append({"role": "user", "content": response, "_tool": True})
            continue
        out.append({"role": role, "content": content})
    return [{"role": m["role"], "content": m["content"]} for m in out]


def render_text(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict] | None) -> str:
    """The prompt as text, ending where the assistant's reply begins."""
    if tools and template_supports_tools(tokenizer):
        return tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=False
        )
    return tokenizer.apply_chat_template(
        _hermes_messages(messages, tools), add_generation_prompt=True, tokenize=False
    )


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def render_prompt(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict] | None
) -> list[int]:
    """Token ids of the prompt, ending where the assistant's reply begins."""
    return _encode(tokenizer, render_text(tokenizer, messages, tools))


class PromptTokens:
    """Prompts that keep the tokens the conversation's earlier replies were sampled as.

    Tokenizing a rendered conversation again does not always give back the tokens the model
    sampled: the same text can be spelled with other tokens (a constrained model often writes
    `{` and `"` where the tokenizer would write `{"`). Then a multi-turn attempt's next prompt
    does not extend its previous prompt and reply, and the trainer must carry each turn as its
    own sequence, with the whole conversation before it again. Here every reply is remembered
    with its text; a prompt that starts with a remembered prompt-and-reply text reuses those ids
    and tokenizes only the rest (which starts after the reply's end-of-turn token). A prompt
    that starts with none is tokenized whole, as `render_prompt` does.
    """

    def __init__(self, tokenizer: Any, capacity: int = 1024) -> None:
        self.tokenizer = tokenizer
        self.capacity = capacity
        self._seen: OrderedDict[str, list[int]] = OrderedDict()
        self._lock = threading.Lock()
        self.reused = 0  # prompts that continued a remembered reply

    def render(self, messages: list[dict[str, Any]], tools: list[dict] | None) -> list[int]:
        text = render_text(self.tokenizer, messages, tools)
        with self._lock:
            known = max((k for k in self._seen if text.startswith(k)), key=len, default="")
            if known:
                self._seen.move_to_end(known)
                self.reused += 1
            ids = list(self._seen.get(known, []))
        return ids + _encode(self.tokenizer, text[len(known) :])

    def remember(self, prompt_ids: list[int], reply_ids: list[int]) -> None:
        ids = list(prompt_ids) + list(reply_ids)
        text = self.tokenizer.decode(
            ids, skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        with self._lock:
            self._seen[text] = ids
            self._seen.move_to_end(text)
            while len(self._seen) > self.capacity:
                self._seen.popitem(last=False)


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """Split generated text into content and OpenAI-style tool calls.

    A block that is not valid JSON with a string "name" is left in the content, so nothing the
    model wrote is lost.
    """
    calls = []
    kept = []
    last = 0
    for match in _CALL.finditer(text):
        try:
            obj = json.loads(match.group(1))
        except json.JSONDecodeError:
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            continue
        key = "arguments" if "arguments" in obj else "parameters"
        args = obj.get(key, {})
        if not isinstance(args, str):  # the arguments as the model wrote them
            args = _raw_member(match.group(1), key) or json.dumps(args)
        kept.append(text[last : match.start()])
        last = match.end()
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {
                    "name": obj["name"],
                    "arguments": args,
                },
            }
        )
    kept.append(text[last:])
    content = "".join(kept).strip()
    return (content or None), calls


def _raw_member(text: str, key: str) -> str | None:
    """The source text of `key`'s value in the JSON object `text`, as written; None if absent."""
    try:
        i = _SPACE.match(text, text.index("{") + 1).end()
        while text[i] != "}":
            name, i = _DECODER.raw_decode(text, i)
            i = _SPACE.match(text, i).end() + 1  # past the colon
            start = _SPACE.match(text, i).end()
            _, i = _DECODER.raw_decode(text, start)
            if name == key:
                return text[start:i]
            i = _SPACE.match(text, i).end()
            if text[i] == ",":
                i = _SPACE.match(text, i + 1).end()
    except (ValueError, IndexError):
        pass
    return None
