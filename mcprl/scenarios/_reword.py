"""Task text in a user's words: an LLM rewrites grounded tasks from their verified calls.

    scenarios, kept = await reword_tasks(grounded, generator="openai/gpt-4.1-mini")

Only the text changes: the reference calls and the answer stay the ones the server returned. A
rewrite is kept only if every value the task gave is still in it, word for word, and it names no
tool; otherwise the generated text stays, and the count of those is returned.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import anyio

from mcprl.scenarios._types import Scenario, ScenarioSet
from ruler import JudgeError, LLMClient, Usage, extract_json

__all__ = ["reword_tasks"]

logger = logging.getLogger(__name__)

TASK_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"task": {"type": "string"}},
    "required": ["task"],
    "additionalProperties": False,
}

_SYSTEM = """\
You rewrite practice tasks for an AI agent so that they read like requests a person would type.
You get a task written from tool calls, and the calls. Write one request for the same result.
- Keep every value exactly as written: the same numbers (same digits), names and text.
- Never mention tool names, function names or parameter names.
- Say what the person wants, not how to get it; keep the order of the steps where one result
  feeds the next. End with the question.
Reply with JSON only: {"task": "..."}"""


def _forms(value: Any) -> list[str]:
    """How a value may be written in a task: 58.0 may read 58."""
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, float) and value.is_integer():
        return [json.dumps(value), str(int(value))]
    if isinstance(value, (int, float)):
        return [json.dumps(value)]
    if isinstance(value, str):
        return [value]
    return []


def _given_values(scenario: Scenario) -> list[list[str]]:
    """The values the task text states (each in the forms it may take)."""
    out = []
    for call in scenario.reference.calls if scenario.reference else []:
        for value in call.arguments.values():
            forms = [f for f in _forms(value) if f and f in scenario.task]
            if forms:
                out.append(forms)
    return out


def _acceptable(text: str, scenario: Scenario) -> str | None:
    """Why a rewrite cannot replace the task, or None when it can."""
    if not 10 <= len(text) <= 1000:
        return "its length"
    for forms in _given_values(scenario):
        if not any(f in text for f in forms):
            return f"it lost the value {forms[0]!r}"
    for call in scenario.reference.calls if scenario.reference else []:
        if "_" in call.tool and re.search(rf"\b{re.escape(call.tool)}\b", text):
            return f"it names the tool {call.tool!r}"
    return None


async def reword_tasks(
    scenarios: ScenarioSet | list[Scenario],
    generator: str | LLMClient,
    *,
    seed: int = 0,
    usage: Usage | None = None,
    **llm_options: Any,
) -> tuple[ScenarioSet, int]:
    """The scenarios with their task text rewritten where the rewrite keeps every given value,
    and how many kept their generated text. An LLM that fails leaves the text as it was."""
    llm = generator if isinstance(generator, LLMClient) else LLMClient(generator, **llm_options)
    usage = usage if usage is not None else Usage()
    items = list(scenarios)
    out = list(items)
    kept = 0

    async def one(i: int, scenario: Scenario) -> None:
        nonlocal kept
        calls = [
            {"tool": c.tool, "arguments": c.arguments}
            for c in (scenario.reference.calls if scenario.reference else [])
        ]
        ask = f"Task: {scenario.task}\nCalls: {json.dumps(calls, ensure_ascii=False)}"
        request = llm.request(
            [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": ask}],
            seed=seed + i,
        )
        try:
            reply = await llm.complete(request, usage, schema=TASK_SCHEMA, schema_name="task")
        except JudgeError as exc:
            logger.info("rewording %s failed: %s", scenario.id, exc)
            kept += 1
            return
        obj, _ = extract_json(reply, lambda o: isinstance(o, dict) and "task" in o, "a 'task'")
        text = obj["task"].strip() if obj and isinstance(obj["task"], str) else ""
        why = _acceptable(text, scenario) if text else "no task in the reply"
        if why:
            logger.info("kept the generated text of %s: the rewrite failed on %s", scenario.id, why)
            kept += 1
            return
        out[i] = scenario.model_copy(update={"task": text, "tags": [*scenario.tags, "reworded"]})

    async with anyio.create_task_group() as tg:
        for i, scenario in enumerate(items):
            tg.start_soon(one, i, scenario)
    return ScenarioSet(out), kept
