"""Zero-data training ("AutoRL"): from a task described in words to a trained LoRA.

    task_set = await write_task_set("Summarise a support email in one sentence", n=24,
                                    generator="openai/gpt-4.1-mini")
    task_set.save_to(run_dir)       # scenarios.jsonl, system_prompt.txt, task.txt

An LLM (a configured provider, or the local base model) writes `n` diverse inputs for the task,
in batches under a JSON schema, de-duplicated (near-duplicates too), and a system prompt for the
agent. Training then runs the usual loop (`mcprl.train`) with single-turn rollouts (or the tools
of an MCP server when one is given) and RULER rewards under `autorl_rubric(task)`: the default
rubric with the task description added, so the judge knows what good looks like.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mcprl.errors import ScenarioGenerationError, UsageError
from mcprl.scenarios import Deduper, Scenario, ScenarioSet
from ruler import DEFAULT_RUBRIC, JudgeError, LLMClient, Usage, extract_json

if TYPE_CHECKING:
    from mcprl.backends import Inference
    from mcprl.train import TrainingRun

__all__ = ["TaskSet", "autorl_rubric", "prepare_autorl", "write_task_set"]

logger = logging.getLogger(__name__)

_INPUTS_SYSTEM = """\
You create training data for an AI assistant. The assistant's job, in its owner's words:

{task}

Write {k} different inputs the assistant could receive for this job: realistic, self-contained,
varied in topic, length and difficulty. Write only the inputs, never the answers.
Reply with JSON only: {{"inputs": ["...", "..."]}}"""

_PROMPT_SYSTEM = """\
Write the system prompt for an AI assistant whose job, in its owner's words, is:

{task}

The prompt tells the assistant what to do and how to format its reply, in at most 120 words.
Reply with JSON only: {{"system_prompt": "..."}}"""


def autorl_rubric(task: str) -> str:
    """RULER's default rubric with the task description the attempts are judged against."""
    return (
        f"{DEFAULT_RUBRIC.rstrip()}\n\nThe task every attempt was given, in its owner's words:\n"
        f"{task.strip()}\nJudge above all how well each attempt does this task."
    )


class TaskSet:
    """What AutoRL trains on: the task, the inputs as scenarios, and the system prompt."""

    def __init__(self, task: str, system_prompt: str, scenarios: ScenarioSet) -> None:
        self.task, self.system_prompt, self.scenarios = task, system_prompt, scenarios

    def files(self) -> dict[str, str]:
        """The run files it is kept as: task.txt, system_prompt.txt, scenarios.jsonl."""
        return {
            "task.txt": self.task.strip() + "\n",
            "system_prompt.txt": self.system_prompt,
            "scenarios.jsonl": self.scenarios.dumps(),
        }

    def save_to(self, run_dir: str | Path) -> None:
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        for name, text in self.files().items():
            (run_dir / name).write_text(text, encoding="utf-8")


def _inputs_schema(k: int) -> dict[str, Any]:
    item = {"type": "string", "minLength": 8, "maxLength": 300}
    inputs = {"type": "array", "items": item, "minItems": k, "maxItems": k}
    return {
        "type": "object",
        "properties": {"inputs": inputs},
        "required": ["inputs"],
        "additionalProperties": False,
    }


_PROMPT_SCHEMA = {
    "type": "object",
    "properties": {"system_prompt": {"type": "string", "minLength": 20, "maxLength": 800}},
    "required": ["system_prompt"],
    "additionalProperties": False,
}


async def write_task_set(
    task: str,
    *,
    n: int = 24,
    generator: str | LLMClient | None = None,
    inference: Inference | None = None,
    seed: int = 0,
    batch_size: int = 6,
    max_rounds: int | None = None,
    val_fraction: float = 0.25,
    say: Callable[[str], None] | None = None,
) -> TaskSet:
    """Ask `generator` (a LiteLLM model or an `LLMClient`; by default the local base model
    served at `inference`, a registered model's) for the inputs and the system prompt (see the
    module docstring)."""
    say = say or logger.info
    if len(task.strip()) < 10:
        raise UsageError("describe the task in a sentence or more (at least 10 characters)")
    if generator is None:
        if inference is None:
            raise UsageError("no generator: name a LiteLLM model or pass the local endpoint")
        llm = LLMClient(
            f"openai/{inference.base_name}",
            api_base=inference.base_url,
            api_key=inference.api_key,
            temperature=1.0,
        )
    elif isinstance(generator, LLMClient):
        llm = generator
    else:
        llm = LLMClient(generator, temperature=1.0)
    say(f"  writing {n} inputs and a system prompt with {llm.model} …")
    usage = Usage()
    system = _PROMPT_SYSTEM.format(task=task)
    for ask in range(_PROMPT_ASKS):  # a small model's seeded draw can ramble past its budget
        try:
            prompt = await _ask(llm, usage, system, _PROMPT_SCHEMA, seed + _RESEED * ask, 300)
            break
        except _UnusableReply as exc:
            if ask + 1 == _PROMPT_ASKS:
                raise
            logger.info("system prompt, ask %d: %s; asking again with another seed", ask + 1, exc)
    inputs = await _inputs(llm, usage, task, n, seed, batch_size, max_rounds)
    scenarios = ScenarioSet(
        Scenario(
            id="autorl-" + hashlib.sha256(text.encode()).hexdigest()[:10],
            task=text,
            difficulty=1,
            tags=["autorl"],
        )
        for text in inputs
    ).with_split(val_fraction, seed=seed)
    return TaskSet(task, str(prompt["system_prompt"]).strip(), scenarios)


# how often the system prompt is asked for, each time with another seed, before giving up;
# the seeds of later asks lie far from those of the inputs' rounds (seed + 1 + round)
_PROMPT_ASKS = 3
_RESEED = 1000


class _UnusableReply(ScenarioGenerationError):
    """The generator answered, but not with the JSON asked for (cut off, or off the schema)."""


async def _ask(
    llm: LLMClient, usage: Usage, system: str, schema: dict, seed: int, max_tokens: int
) -> dict:
    request = llm.request(
        [{"role": "system", "content": system}, {"role": "user", "content": "Go."}],
        seed=seed,
        # a cap for sensible text within the schema's lengths; a model that rambles in short
        # tokens can still reach it before the JSON closes (the caller asks again)
        max_tokens=max_tokens,
    )
    try:
        reply = await llm.complete(request, usage, schema=schema, schema_name="reply")
    except JudgeError as exc:
        raise ScenarioGenerationError(f"the generator {llm.model} failed: {exc}") from exc
    keys = schema["required"]
    obj, problem = extract_json(
        reply,
        lambda o: isinstance(o, dict) and all(k in o for k in keys),
        what=f"an object with {', '.join(keys)}",
    )
    if obj is None:
        raise _UnusableReply(f"the generator {llm.model} gave no usable reply: {problem}")
    return obj


async def _inputs(
    llm: LLMClient,
    usage: Usage,
    task: str,
    n: int,
    seed: int,
    batch_size: int,
    max_rounds: int | None,
) -> list[str]:
    deduper = Deduper()
    accepted: list[str] = []
    rounds = max_rounds if max_rounds is not None else 4 + 3 * ((n + batch_size - 1) // batch_size)
    for round_no in range(rounds):
        k = min(batch_size, n - len(accepted))
        system = _INPUTS_SYSTEM.format(task=task, k=k)
        try:
            schema, budget = _inputs_schema(k), 40 + 110 * k  # 300 chars <= ~100 tokens each
            obj = await _ask(llm, usage, system, schema, seed + 1 + round_no, budget)
        except ScenarioGenerationError as exc:
            logger.info("round %d: %s", round_no + 1, exc)
            continue
        texts = [t.strip() for t in obj.get("inputs", []) if isinstance(t, str)]
        fresh = [t for t in texts if len(t) >= 8 and deduper.add(t)]
        accepted.extend(fresh[: n - len(accepted)])
        if len(accepted) >= n:
            return accepted
    raise ScenarioGenerationError(
        f"got {len(accepted)} of {n} distinct inputs from {llm.model} in {rounds} rounds; ask "
        "for fewer (`n`), describe the task more fully, or use a stronger `generator`"
    )


async def prepare_autorl(
    run: TrainingRun, task: str, *, n: int = 24, generator: Any = None
) -> None:
    """Prepare an AutoRL `run` (a `TrainingRun`): write its inputs and system prompt with
    `generator` (default: the run's own base model) unless the run has them, make the system
    prompt the agent's (followed by the tool rules when the run has a server), then run its
    preflight checks."""
    from mcprl.rollout import DEFAULT_SYSTEM_PROMPT

    model, backend = run.model, run.backend
    if await backend.read_file(model, "scenarios.jsonl") is None:
        await model.register(backend)  # the local model may be the writer
        written = await write_task_set(
            task, n=n, generator=generator, inference=model.inference, seed=run.config.seed,
            say=run.say,
        )  # fmt: skip
        for name, text in written.files().items():
            await backend.write_file(model, name, text)
    prompt = await backend.read_file(model, "system_prompt.txt") or ""
    if run.server is not None:  # the agent loop's rules for tools come after the task's
        prompt = f"{prompt.strip()}\n\n{DEFAULT_SYSTEM_PROMPT}"
    run.config.rollout.system_prompt = prompt
    await run.prepare()
