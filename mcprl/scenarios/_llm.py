"""LLM-written scenarios: an LLM reads the tools and resources and writes practice tasks.

    scenarios = await generate_scenarios(info.tools, info.resources, n=24,
                                         generator="openai/gpt-4.1-mini")

The LLM answers in JSON (a schema where the provider takes one). Replies are validated; tasks
that repeat or nearly repeat earlier ones are dropped; the LLM is asked again for what is still
missing, up to a bounded number of rounds, and otherwise `ScenarioGenerationError` says how far
it got and why.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from typing import Any

from mcprl.errors import ScenarioGenerationError
from mcprl.mcp._inspect import ResourceInfo, ToolInfo
from mcprl.scenarios._dedupe import Deduper
from mcprl.scenarios._types import Scenario, ScenarioSet
from ruler import JudgeError, LLMClient, Usage, extract_json

__all__ = ["SCENARIOS_SCHEMA", "generate_scenarios"]

logger = logging.getLogger(__name__)

SCENARIOS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "scenarios": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "task": {"type": "string"},
                    "difficulty": {"type": "integer", "minimum": 1, "maximum": 5},
                },
                "required": ["task", "difficulty"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["scenarios"],
    "additionalProperties": False,
}

_SYSTEM = """\
You write practice tasks for an AI agent that can use the tools listed below. The agent will be
trained on these tasks, so they must be realistic requests a user could make, and solvable with
these tools alone.

Rules for every task:
- Write it as the user would, in plain words. Never mention tool names or function syntax.
- Make it self-contained: include every number, name or value the agent needs.
- Make it checkable: ask for a specific result, and ask the agent to finish with a short summary
  of what it did and found.
- Vary the tasks: different goals, values and combinations of tools.
- Give each a difficulty from 1 to 5: 1 needs a single tool call; 3 needs two or three calls whose
  results feed each other; 5 needs several different tools combined with some reasoning.
  Spread the difficulties across the whole range.

Reply with JSON only: {"scenarios": [{"task": "...", "difficulty": 1}, ...]}
"""


def _describe_tools(tools: Sequence[ToolInfo], resources: Sequence[ResourceInfo]) -> str:
    parts = ["Tools:"]
    for t in tools:
        params = json.dumps(t.input_schema.get("properties", {}), ensure_ascii=False)
        parts.append(f"- {t.name}: {t.description.strip()}\n  parameters: {params}")
    if resources:
        parts.append("\nResources the server offers (what data exists):")
        for r in resources:
            text = f"\n  content: {r.text[:1500]}" if r.text else ""
            parts.append(f"- {r.uri} {r.name}: {r.description}{text}")
    return "\n".join(parts)


def _is_scenarios(obj: Any) -> bool:
    return isinstance(obj, dict) and isinstance(obj.get("scenarios"), list)


def _valid_items(obj: Any) -> tuple[list[tuple[str, int]], list[str]]:
    items, problems = [], []
    for n, item in enumerate(obj.get("scenarios", [])):
        if not isinstance(item, dict):
            problems.append(f"scenarios[{n}] is not an object")
            continue
        task, level = item.get("task"), item.get("difficulty")
        if not isinstance(task, str) or not 10 <= len(task.strip()) <= 2000:
            problems.append(f"scenarios[{n}].task must be text of 10 to 2000 characters")
        elif isinstance(level, bool) or not isinstance(level, int) or not 1 <= level <= 5:
            problems.append(f"scenarios[{n}].difficulty must be an integer 1-5, got {level!r}")
        else:
            items.append((task.strip(), level))
    return items, problems


async def generate_scenarios(
    tools: Sequence[ToolInfo],
    resources: Sequence[ResourceInfo] = (),
    n: int = 24,
    generator: str | LLMClient = "openai/gpt-4.1-mini",
    *,
    instructions: str | None = None,
    seed: int = 0,
    max_rounds: int | None = None,
    batch_size: int = 12,
    usage: Usage | None = None,
    **llm_options: Any,
) -> ScenarioSet:
    """Ask an LLM for `n` distinct, valid scenarios (see the module docstring)."""
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    if not tools:
        raise ScenarioGenerationError("no tools to write scenarios for")
    llm = generator if isinstance(generator, LLMClient) else _client(generator, llm_options)
    usage = usage if usage is not None else Usage()
    rounds = max_rounds if max_rounds is not None else 3 + 2 * ((n + batch_size - 1) // batch_size)
    system = _SYSTEM + "\n" + _describe_tools(tools, resources)
    if instructions:
        system += f"\n\nAdditional instructions from the user:\n{instructions.strip()}"
    deduper = Deduper()
    accepted: list[tuple[str, int]] = []
    problems: list[str] = []
    for round_no in range(rounds):
        want = min(batch_size, n - len(accepted))
        ask = f"Write {want} new tasks."
        if accepted:
            recent = "\n".join(f"- {t}" for t, _ in accepted[-20:])
            ask += f" They must differ from these, already written:\n{recent}"
        request = llm.request(
            [{"role": "system", "content": system}, {"role": "user", "content": ask}],
            seed=seed + round_no,
        )
        try:
            reply = await llm.complete(
                request, usage, schema=SCENARIOS_SCHEMA, schema_name="scenarios"
            )
        except JudgeError as exc:
            raise ScenarioGenerationError(
                f"scenario generator {llm.model!r} failed after {len(accepted)} of {n}: {exc}"
            ) from exc
        obj, problem = extract_json(reply, _is_scenarios, what="a 'scenarios' list")
        if obj is None:
            problems = [problem or "unreadable reply"]
            logger.info("round %d: unusable reply: %s", round_no + 1, problem)
            continue
        items, problems = _valid_items(obj)
        fresh = [(t, d) for t, d in items if deduper.add(t)]
        accepted.extend(fresh[: n - len(accepted)])
        logger.info("round %d: %d new, %d of %d", round_no + 1, len(fresh), len(accepted), n)
        if len(accepted) >= n:
            return ScenarioSet(_scenario(t, d, seed, llm.model) for t, d in accepted)
    why = "; ".join(problems[:3]) or "the replies repeated earlier tasks"
    raise ScenarioGenerationError(
        f"got {len(accepted)} of {n} distinct valid scenarios from {llm.model!r} after "
        f"{rounds} rounds (last problems: {why}); try a stronger generator, a smaller -n, or "
        "--grounded"
    )


def _client(model: str, options: dict[str, Any]) -> LLMClient:
    options.setdefault("temperature", 1.0)
    return LLMClient(model, **options)


def _scenario(task: str, difficulty: int, seed: int, model: str) -> Scenario:
    digest = hashlib.sha256(f"{seed}:{task}".encode()).hexdigest()[:10]
    return Scenario(id=f"llm-{digest}", task=task, difficulty=difficulty, tags=["llm", model])
