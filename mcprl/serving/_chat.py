"""Chat formatting with tools, and reading tool calls back out of generated text.

The model's own chat template formats the conversation. When the template has no notion of
tools (SmolLM2's has none), tools are described in the system message as a Hermes-style block,
earlier tool calls are written as `<tool_call>{"name": ..., "arguments": ...}</tool_call>`, and
tool results go back as `<tool_response>` blocks. Generated text is parsed the same way into
OpenAI `tool_calls` with fresh ids, for any model.
"""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from typing import Any

__all__ = ["TOOL_CALL_BEGIN", "TOOL_CALL_END", "parse_tool_calls", "render_prompt"]

TOOL_CALL_BEGIN = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)

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
    if isinstance(arguments, str):
        with contextlib.suppress(json.JSONDecodeError):  # else keep the text as generated
            arguments = json.loads(arguments) if arguments.strip() else {}
    payload = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{TOOL_CALL_BEGIN}\n{payload}\n{TOOL_CALL_END}"


def _compact(schema: Any) -> Any:
    """A JSON schema without its `title`s: generated noise (\"addArguments\") that costs tokens."""
    if isinstance(schema, dict):
        return {
            k: (_compact(v) if k != "properties" else {p: _compact(s) for p, s in v.items()})
            for k, v in schema.items()
            if k != "title"
        }
    if isinstance(schema, list):
        return [_compact(v) for v in schema]
    return schema


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


def render_prompt(
    tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict] | None
) -> list[int]:
    """Token ids of the prompt, ending where the assistant's reply begins."""
    if tools and template_supports_tools(tokenizer):
        ids = tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=True
        )
    else:
        ids = tokenizer.apply_chat_template(
            _hermes_messages(messages, tools), add_generation_prompt=True, tokenize=True
        )
    if hasattr(ids, "keys"):  # transformers may return a BatchEncoding
        ids = ids["input_ids"]
    return list(ids)


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
        args = obj.get("arguments", obj.get("parameters", {}))
        kept.append(text[last : match.start()])
        last = match.end()
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {
                    "name": obj["name"],
                    "arguments": args if isinstance(args, str) else json.dumps(args),
                },
            }
        )
    kept.append(text[last:])
    content = "".join(kept).strip()
    return (content or None), calls
