"""LLM-written scenarios: an LLM reads the tools and resources and writes practice tasks.

    scenarios = await generate_scenarios(info.tools, info.resources, n=24,
                                         generator="openai/gpt-4.1-mini")

The LLM answers in JSON (a schema where the provider takes one). Replies are validated; tasks
that repeat or nearly repeat earlier ones are dropped; the LLM is asked again for what is still
missing, up to a bounded number of rounds, and otherwise `ScenarioGenerationError` says how far
it got and why.

With `server=` the tasks are proposed, then verified: the LLM writes each task together with the
tool calls it expects and the field of the last result that answers it; mcprl runs those calls
on the server (`verify_proposal`: reading tools only, unless `allow_writes`), and a task whose
calls succeed with stable results gets its reference answer from the result (tag "verified").
The others are kept without a reference, for RULER to score (tag "unverified").
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, get_args

from mcprl.errors import ScenarioGenerationError, UsageError
from mcprl.mcp import ResourceInfo, ServerInfo, ToolInfo
from mcprl.scenarios._dedupe import Deduper
from mcprl.scenarios._screen import server_paths
from mcprl.scenarios._types import AnswerType, Reference, Scenario, ScenarioSet
from mcprl.scenarios._verify import verify_proposal
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
                    "calls": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "tool": {"type": "string"},
                                "arguments": {"type": "object"},
                            },
                            "required": ["tool", "arguments"],
                        },
                    },
                    "answer_from": {"type": "string"},
                    "answer_type": {"type": "string", "enum": list(get_args(AnswerType))},
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

For each task also give `calls`: the tool calls that answer it, in order, with their exact
arguments; and `answer_from`: the field of the last call's result that holds the answer ("count"
for how many records it returns; leave it out when the result is the answer itself); and
`answer_type`: "number" when the answer is a number, "yes/no" when it is a yes or a no, else
"string". The calls are run to check
the task and to record its answer.

Reply with JSON only: {"scenarios": [{"task": "...", "difficulty": 1, "calls": [{"tool": "...",
"arguments": {...}}], "answer_from": "...", "answer_type": "number"}, ...]}
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


def _valid_items(obj: Any) -> tuple[list[_Item], list[str]]:
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
            calls = item.get("calls")
            calls = [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []
            hint, kind = item.get("answer_from"), item.get("answer_type")
            items.append(
                _Item(
                    task.strip(),
                    level,
                    calls,
                    hint if isinstance(hint, str) else None,
                    kind if kind in get_args(AnswerType) else None,
                )
            )
    return items, problems


@dataclass
class _Item:
    task: str
    difficulty: int
    calls: list[dict[str, Any]] = field(default_factory=list)
    answer_from: str | None = None
    answer_type: AnswerType | None = None  # kept where no reference shows it


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
    server: Any = None,
    allow_writes: bool = False,
    **llm_options: Any,
) -> ScenarioSet:
    """Ask an LLM for `n` distinct, valid scenarios; with `server`, verify them on it (see the
    module docstring)."""
    if n < 1:
        raise UsageError(f"n must be at least 1, got {n}")
    if not tools:
        raise ScenarioGenerationError("no tools to write scenarios for")
    llm = generator if isinstance(generator, LLMClient) else _client(generator, llm_options)
    usage = usage if usage is not None else Usage()
    rounds = max_rounds if max_rounds is not None else 3 + 2 * ((n + batch_size - 1) // batch_size)
    system = _SYSTEM + "\n" + _describe_tools(tools, resources)
    if instructions:
        system += f"\n\nAdditional instructions from the user:\n{instructions.strip()}"
    deduper = Deduper()
    accepted: list[_Item] = []
    problems: list[str] = []
    for round_no in range(rounds):
        want = min(batch_size, n - len(accepted))
        ask = f"Write {want} new tasks."
        if accepted:
            recent = "\n".join(f"- {item.task}" for item in accepted[-20:])
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
        fresh = [item for item in items if deduper.add(item.task)]
        accepted.extend(fresh[: n - len(accepted)])
        logger.info("round %d: %d new, %d of %d", round_no + 1, len(fresh), len(accepted), n)
        if len(accepted) >= n:
            if server is None:
                return ScenarioSet(_scenario(i, seed, llm.model) for i in accepted)
            return await _verified(accepted, server, tools, seed, llm.model, allow_writes)
    why = "; ".join(problems[:3]) or "the replies repeated earlier tasks"
    raise ScenarioGenerationError(
        f"got {len(accepted)} of {n} distinct valid scenarios from {llm.model!r} after "
        f"{rounds} rounds (last problems: {why}); try a stronger `generator`, a smaller `n`, "
        "or `grounded`"
    )


def _client(model: str, options: dict[str, Any]) -> LLMClient:
    options.setdefault("temperature", 1.0)
    return LLMClient(model, **options)


def _scenario(
    item: _Item, seed: int, model: str, reference: Reference | None = None, mark: str = ""
) -> Scenario:
    digest = hashlib.sha256(f"{seed}:{item.task}".encode()).hexdigest()[:10]
    tags = ["llm", model, *([mark] if mark else [])]
    return Scenario(
        id=f"llm-{digest}",
        task=item.task,
        difficulty=item.difficulty,
        reference=reference,
        tags=tags,
        # a verified task's type is read off its recorded answer; the others keep the writer's
        answer_type=item.answer_type if reference is None else None,
    )


async def _verified(
    items: list[_Item],
    server: Any,
    tools: Sequence[ToolInfo],
    seed: int,
    model: str,
    allow_writes: bool,
) -> ScenarioSet:
    info = ServerInfo(name=str(server), tools=list(tools))
    paths = server_paths(server)
    out, why = [], Counter()
    for item in items:
        reference, problem = await verify_proposal(
            server, info, item.task, item.calls, item.answer_from,
            allow_writes=allow_writes, paths=paths,
        )  # fmt: skip
        if reference is None:
            why[problem.split(":")[0].split(" (")[0]] += 1
            out.append(_scenario(item, seed, model, mark="unverified"))
        else:
            out.append(_scenario(item, seed, model, reference, mark="verified"))
    verified = sum("verified" in s.tags for s in out)
    logger.info(
        "verified %d of %d proposed tasks on the server; kept %d without a reference (%s)",
        verified, len(out), len(out) - verified,
        "; ".join(f"{n}: {w}" for w, n in why.most_common()) or "none",
    )  # fmt: skip
    return ScenarioSet(out)
