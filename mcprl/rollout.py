"""The agent loop: one attempt at a scenario, against a real MCP session.

    trajectory = await rollout(model, scenario, "example:calculator", RolloutConfig(max_turns=6))

Each attempt opens its own MCP session (servers may keep per-session state), unless it is
handed an open `MCPSession` (`collect_groups` shares one where every tool is read-only), offers
the server's tools as OpenAI function tools plus `complete_task(answer)`, and loops: one
completion from the policy, then every tool call it made, run through MCP. An unknown tool or bad
arguments become an error tool message and the loop goes on. It stops when the agent calls
`complete_task`, replies without a tool call, runs out of turns, or fills its context.

Five defaults make the loop finishable by a small model (`RolloutConfig`, all switchable):

- `force_final_answer`: the last turn is constrained to `complete_task` (a named tool choice), so
  every attempt that reaches it ends with an answer instead of running out of turns;
- `typed_answer`: `complete_task`'s `answer` argument is typed by what the scenario expects (a
  JSON number where the reference answer is numeric, else a string), so constrained decoding
  keeps it well-formed, and the reference reward checks exactly that argument;
- `turn_budget="reference"`: a scenario whose reference lists the calls that solve it gets one
  turn per call plus one to answer (capped by `max_turns`), so a one-call task ends right after
  its call instead of inviting a wrong second one; a scenario without reference calls (RULER's
  normal case) gets one turn per level of its difficulty plus one, as difficulty is defined for
  the generators (1: a single call; 5: several tools combined), so an attempt at such a task
  reads the same prompt as at the task with its reference;
- `look_before_answer`: until the attempt has called a tool, `complete_task` is not allowed
  (OpenAI's `allowed_tools` tool choice; the prompt still lists every tool), so no attempt ends
  with a guess copied from the task;
- `answer_on_last_turn`: `complete_task` only on the last turn, so an attempt at a chain makes
  one call per turn of its budget instead of answering after its first result;
- `first_tool`: the first turn must call this tool (a named tool choice): the training loop's
  exploration of kinds of task no attempt has solved yet (`RunConfig.explore`); with
  `first_arguments` too, the call's arguments are pinned as well (mcprl's engine; another
  server lets the model choose them): a demonstration of the reference's first call, whose
  tokens are the model's own and are trained on (`RunConfig.demonstrate`); `next_calls` pins
  the calls after it in turn (the reference's whole chain, `RunConfig.demonstrate_calls`), and
  `pinned_answer` the `complete_task` after them (`RunConfig.demonstrate_answer`);
- `retry_repeats` (off here; the training loop's default is `RunConfig.retry_repeats`): a
  reply that repeats a call the attempt made already, tool and arguments alike, is asked for
  again with another seed, so a turn a small model would spend re-reading a result it has
  goes to some other call;
- `results_as="json"`: a tool result whose structured content says the same as its text is shown
  as that JSON (`{"result": -160.0}`, not `-160`), the form the model writes `complete_task`'s
  arguments in, so a copied value keeps its spelling: in `"answer": -160` the sign is the token
  after `":`, as in the result, where after the bare `-160` the model dropped it.

Works against any OpenAI-compatible endpoint. A `TrainableModel`'s endpoint is asked for token
ids and log-probabilities in vLLM's request fields, which mcprl's server answers too, and the
reply is read in either dialect (`mcprl.tokens`): the trajectory is then trainable. Elsewhere it
is still valid for evaluation, and `trajectory.trainable` is False.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field

from mcprl.errors import PreflightError, UsageError
from mcprl.gather import note_turn
from mcprl.mcp import (
    ElicitationPolicy,
    Elicitations,
    MCPSession,
    ResultsAs,
    Sampler,
    ToolInfo,
    describe_elicitation,
    open_session,
    openai_tools,
    tool_info,
)
from mcprl.policy import Policy, policy_client
from mcprl.rewards import call_key, polarity
from mcprl.scenarios import AnswerType, Scenario
from mcprl.tokens import TOKEN_REQUEST, read_choice
from mcprl.types import Trajectory

__all__ = [
    "COMPLETE_TASK",
    "RolloutConfig",
    "answer_type",
    "complete_task_tool",
    "rollout",
    "solve_examples",
    "turn_budget",
]

logger = logging.getLogger(__name__)

COMPLETE_TASK = "complete_task"
TASK_DONE = "Task marked complete."

YES_NO = ["yes", "no"]


def answer_type(scenario: Scenario) -> AnswerType:
    """What `complete_task`'s answer should be: the scenario's `answer_type` where it states one,
    else a number when the reference answer is one, "yes/no" when it is a yes or a no (or true
    or false), else a string."""
    if scenario.answer_type is not None:
        return scenario.answer_type
    ref = scenario.reference
    if ref is None or ref.answer is None:
        return "string"
    if polarity(ref.answer) is not None:
        return "yes/no"
    try:
        float(ref.answer)
    except ValueError:
        return "string"
    return "number"


def complete_task_tool(kind: AnswerType | None) -> dict[str, Any]:
    """The `complete_task` function tool; `kind` None is the untyped `summary` form."""
    if kind is None:
        properties = {"summary": {"type": "string"}}
        required, what = ["summary"], "a short summary of what you did and the final answer"
    else:
        answer = {
            "number": {"type": "number", "description": "the final answer, a number"},
            # an enum: the grammar lets the answer be only one of the two
            "yes/no": {
                "type": "string",
                "enum": YES_NO,
                "description": "the final answer, yes or no",
            },
            "string": {"type": "string", "description": "the final answer"},
        }[kind]
        properties = {"answer": answer}
        required, what = ["answer"], answer["description"]
    return {
        "type": "function",
        "function": {
            "name": COMPLETE_TASK,
            "description": f"Finish: call this once the task is done, with {what}.",
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


# The same for every scenario, so the system prompt and tool block form one prefix that the
# engine's KV cache and the trainer compute once; what varies per scenario goes in the user turn.
DEFAULT_SYSTEM_PROMPT = """\
You are an assistant that completes tasks by calling tools. In each turn, call a tool. Use the \
tool results to work out the answer; do not guess. When the task is done, call complete_task \
with the final answer."""


class RolloutConfig(BaseModel):
    max_turns: int = Field(default=6, ge=1, description="the most turns an attempt may take")
    turn_budget: Literal["reference", "fixed"] = Field(
        default="reference",
        description="reference: reference calls + 1 turns where the scenario lists its calls, "
        "else difficulty + 1 (at most max_turns); fixed: max_turns for every scenario",
    )
    tool_choice: Literal["required", "auto"] = Field(
        default="required",
        description='"required" suits small models: every turn is a call, complete_task ends it',
    )
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="nucleus sampling (1: off)")
    min_p: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="drop tokens less likely than min_p times the likeliest one (0: off). Sent "
        "as `min_p` in the request body, which vLLM, SGLang, llama.cpp and `mcprl serve` read; "
        "a hosted API may reject it",
    )
    max_tokens: int = Field(default=128, ge=1, description="per completion")
    tool_timeout: float = Field(default=30.0, gt=0)
    max_result_chars: int = Field(default=4000, description="tool output kept per call")
    results_as: ResultsAs = Field(
        default="json",
        description="how a tool result whose structured content says the same as its text is "
        'shown: "json" shows the structured content (`{"result": -160}`), in the form the model '
        'writes arguments in, so a value copied into complete_task keeps its spelling; "text" '
        "shows the server's text (`-160`)",
    )
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    seed: int | None = None
    extra_body: dict[str, Any] = Field(default_factory=dict)
    force_final_answer: bool = Field(
        default=True,
        description="the last turn must call complete_task (every attempt ends with an answer)",
    )
    typed_answer: bool = Field(
        default=True,
        description="complete_task(answer) typed by the scenario's expected answer "
        "(number or string); False: the untyped complete_task(summary)",
    )
    share_session: Literal["auto", "never"] = Field(
        default="auto",
        description="auto: when every tool the agent is offered (not in hidden_tools) only "
        "reads (annotated readOnlyHint, "
        "or, without annotations, a name that says it reads: `mcprl.mcp.tool_access`), the "
        "attempts of one collection share one server session (one process over stdio) "
        "instead of starting one each; never: a fresh session per attempt",
    )
    look_before_answer: bool = Field(
        default=True,
        description="complete_task is not allowed before the attempt's first tool call (no "
        "answer guessed before looking). Sent as OpenAI's allowed_tools tool_choice, so the "
        "prompt still lists every tool; turn it off for an endpoint that rejects that",
    )
    answer_on_last_turn: bool = Field(
        default=False,
        description="complete_task is allowed on the last turn only: every turn before it is "
        "a tool call, so an attempt makes as many calls as its turn budget leaves (with "
        'turn_budget="reference", one per reference call) and cannot stop a chain after its '
        "first result. Sent as allowed_tools, as look_before_answer",
    )
    elicitation: ElicitationPolicy = Field(
        default="decline",
        description="how a server's questions to the user (MCP elicitation) are answered: "
        "decline, or accept-defaults (the defaults its schema declares); a scenario's own "
        "scripted answers come first (Scenario.elicitation)",
    )
    sampling_model: str | None = Field(
        default=None,
        description="a LiteLLM model that answers a server's requests for completions (MCP "
        "sampling); None: they are refused",
    )
    sampling_api_base: str | None = Field(
        default=None, description="OpenAI-compatible base URL for sampling_model"
    )
    allow_writes: bool = Field(
        default=False,
        description="offer the agent every tool that may change the server's data (and let "
        "generated scenarios call them); by default a writing tool is offered only where some "
        "scenario of the set calls it in its reference (`mcprl.scenarios.hidden_writers`)",
    )
    hidden_tools: list[str] = Field(
        default_factory=list,
        description="server tools the agent is not offered: `train` and `eval` set it to the "
        "writing tools no scenario of the set calls, unless allow_writes",
    )
    guided_calls: int = Field(
        default=0,
        ge=0,
        description="make the first N of the scenario's reference calls for the attempt before "
        "its first turn (shown as its own calls, never trained on): the loop sets it on some "
        "attempts at chains of calls none has solved yet (guided attempts)",
    )
    first_tool: str | None = Field(
        default=None,
        description="the tool the first turn must call (a named tool choice); the training "
        "loop sets it on some attempts at kinds of task none has solved yet (exploration)",
    )
    first_arguments: dict[str, Any] | None = Field(
        default=None,
        description="with first_tool: the first call's arguments, pinned by mcprl's engine "
        "(`tool_choice.function.arguments`; other servers ignore it): the training loop's "
        "demonstrations of a reference's first call",
    )
    next_calls: list[dict[str, Any]] = Field(
        default_factory=list,
        description="with first_arguments: the calls pinned on the turns after the first, in "
        'order, each {"tool": ..., "arguments": {...}} (mcprl\'s engine): a demonstration of '
        "the reference's whole chain, every call the model's own tokens, trained on",
    )
    pinned_answer: str | None = Field(
        default=None,
        description="with first_arguments: the answer complete_task is pinned to on the turn "
        "after the pinned calls (mcprl's engine), written as complete_task's schema types it: "
        "a demonstration of the whole attempt, the reference's calls and its answer",
    )
    retry_repeats: int = Field(
        default=0,
        ge=0,
        le=9,  # turn + 100 x retry stays inside an attempt's SEED_STRIDE (1000) of seeds
        description="when a turn's reply repeats a call the attempt made already (the same "
        "tool with the same arguments), ask the policy again for that turn, each time with "
        "another seed, up to this many times; a reply that still repeats stands. Only the "
        "reply kept is part of the attempt (and trained on). The training loop sets it on its "
        "attempts (`RunConfig.retry_repeats`); 0: off",
    )
    stop_after_calls: int | None = Field(
        default=None,
        ge=1,
        description="end the attempt as soon as it has made this many tool calls, calls made "
        "for it (guided_calls) included, complete_task not counted: the training loop's "
        "subtask attempts, which practise one step of a chain (`RunConfig.subtasks`). None: "
        "the attempt runs until it answers or its turns run out",
    )
    examples: int = Field(
        default=1,
        ge=0,
        le=8,
        description="worked examples that open every attempt's conversation, after the system "
        "prompt: solved tasks of the set's train split (their reference calls in order, each "
        "with the server's live result, then complete_task with the answer), as "
        "`example_choice` and `mcprl.curriculum.with_worked_examples` pick them. Shown, never "
        "trained on, and not part of the attempt's messages; a trained model is evaluated "
        "with the same number. 0: none",
    )
    example_choice: Literal["kinds", "similar"] = Field(
        default="similar",
        description="kinds: the same worked examples for every task, one per kind of task; "
        "similar: for each task the train tasks most like it, other than itself: first "
        "those whose tools list its quoted text among their choices, then those worded most "
        "like it (numbers, names and quoted text aside)",
    )
    example_messages: list[dict[str, Any]] = Field(
        default_factory=list,
        description="the worked examples' messages (`example_choice` kinds), set from "
        "`examples` where the scenario set is known (`mcprl train` before its first step, "
        "`mcprl eval` before its attempts)",
    )
    worked_examples: dict[str, list[dict[str, Any]]] = Field(
        default_factory=dict,
        description="each worked example's messages (`solve_examples`), by its scenario id, "
        "set as `example_messages` is: what `examples_by_task` names",
    )
    examples_by_task: dict[str, list[str]] = Field(
        default_factory=dict,
        description="the scenario ids of each task's worked examples in `worked_examples`, by "
        "the task's scenario id (`example_choice` similar); a task it lacks (a hindsight task "
        "made during the run) is shown none",
    )


def _assistant_message(message: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.function.name, "arguments": c.function.arguments},
            }
            for c in message.tool_calls
        ]
    return out


def _parse_arguments(raw: str, tool: ToolInfo | None) -> tuple[dict[str, Any] | None, str | None]:
    try:
        args = json.loads(raw) if raw and raw.strip() else {}
    except json.JSONDecodeError as exc:
        return None, f"Error: the arguments are not valid JSON ({exc.msg}); send a JSON object"
    if not isinstance(args, dict):
        return None, "Error: the arguments must be a JSON object"
    if tool is not None:
        missing = [k for k in tool.input_schema.get("required", []) if k not in args]
        if missing:
            return None, f"Error: missing required argument(s): {', '.join(missing)}"
    return args, None


async def rollout(
    model: Policy,
    scenario: Scenario,
    server: Any,
    config: RolloutConfig | None = None,
    *,
    client: Any = None,
) -> Trajectory:
    """One attempt at `scenario` by `model` (a `Model` or `TrainableModel`) on `server`.

    With `server=None` the attempt is a single reply to the task, without tools (AutoRL).
    Pass `client` to share one OpenAI client across attempts; otherwise `policy_client` gives
    one (a trainable model's shared client is left open: other attempts may be using it).
    """
    if client is None:
        async with policy_client(model) as own:
            return await rollout(model, scenario, server, config, client=own)
    config = config or RolloutConfig()
    if server is None:
        return await _single_turn(model, scenario, config, client)
    config = config.model_copy(update={"max_turns": turn_budget(scenario, config)})
    served = model.served_name
    started = time.perf_counter()
    traj = Trajectory(metadata={"scenario_id": scenario.id, "model": served})
    metrics = {"turns": 0, "tool_calls": 0, "tool_errors": 0, "completed": 0, "ran_out_of_turns": 0}
    if config.retry_repeats:
        metrics["repeats_retried"] = 0
    if isinstance(server, MCPSession) and not scenario.elicitation:
        opened: Any = contextlib.nullcontext(server)  # shared by the attempts of a collection
    else:  # a session of its own (where the scenario scripts answers to the server's questions)
        opened = open_session(
            server.spec if isinstance(server, MCPSession) else server,
            max_result_chars=config.max_result_chars,
            elicitation=Elicitations(config.elicitation, scenario.elicitation),
            sampling=sampler(config),
        )
    async with opened as session:
        mcp_tools = [
            tool_info(t) for t in await session.list_tools() if t.name not in config.hidden_tools
        ]
        by_name = {t.name: t for t in mcp_tools}
        if config.first_tool is not None and config.first_tool not in by_name:
            raise UsageError(
                f"first_tool {config.first_tool!r} is not a tool of this server "
                f"(it has {', '.join(by_name) or 'none'})"
            )
        if config.first_arguments is not None and config.first_tool is None:
            raise UsageError(
                "first_arguments pins the arguments of the first call, which needs first_tool "
                "(the tool it calls)"
            )
        if config.next_calls and config.first_arguments is None:
            raise UsageError(
                "next_calls pins the calls after a pinned first call, which needs first_tool "
                "and first_arguments"
            )
        if config.pinned_answer is not None and config.first_arguments is None:
            raise UsageError(
                "pinned_answer pins complete_task after pinned calls, which needs first_tool "
                "and first_arguments"
            )
        unknown = [c.get("tool") for c in config.next_calls if c.get("tool") not in by_name]
        if unknown:
            raise UsageError(
                f"next_calls names {unknown[0]!r}, not a tool of this server "
                f"(it has {', '.join(by_name) or 'none'})"
            )
        if config.first_tool is not None:
            traj.metadata["first_tool"] = config.first_tool  # an exploring attempt
        if config.first_arguments is not None:  # a demonstrated one
            traj.metadata["first_arguments"] = json.dumps(config.first_arguments)
            traj.metadata["demonstrated_calls"] = 1 + len(config.next_calls)
            if config.pinned_answer is not None:
                traj.metadata["demonstrated_answer"] = config.pinned_answer
        kind = answer_type(scenario) if config.typed_answer else None
        traj.tools = [*openai_tools(mcp_tools), complete_task_tool(kind)]
        traj.messages = [
            {"role": "system", "content": _system_prompt(config)},
            {"role": "user", "content": user_message(scenario, config, kind)},
        ]
        if config.examples_by_task:
            ids = config.examples_by_task.get(scenario.id, [])
            shown = [m for i in ids for m in config.worked_examples[i]]
            config = config.model_copy(update={"example_messages": shown})
        if config.example_messages:
            traj.metadata["worked_examples"] = sum(
                m["role"] == "user" for m in config.example_messages
            )
        guided = await _guide(traj, scenario, session, config)
        if guided:
            traj.metadata["guided_calls"] = guided
            config = config.model_copy(update={"max_turns": max(1, config.max_turns - guided)})
        traj.timings["setup_s"] = time.perf_counter() - started
        done = False
        endpoint = _endpoint(model)
        for turn in range(config.max_turns):
            t0 = time.perf_counter()
            response = await _complete(client, served, traj, config, turn, endpoint)
            retry = 0
            while (
                response is not None
                and retry < config.retry_repeats
                and _repeats_call(traj, response)
                and not _pinned_turn(config, turn)
            ):
                retry += 1
                response = await _complete(
                    client, served, traj, config, turn, endpoint, retry=retry
                )
            if retry:
                metrics["repeats_retried"] += retry
                traj.log(f"turn {turn + 1}: asked again {retry} time(s) for a repeated call")
            traj.timings["generate_s"] = traj.timings.get("generate_s", 0.0) + (
                time.perf_counter() - t0
            )
            if response is None:  # the conversation no longer fits the context
                metrics["hit_context_limit"] = 1
                break
            metrics["turns"] += 1
            choice = response.choices[0]
            traj.messages.append(_assistant_message(choice.message))
            traj.choices.append(read_choice(choice, response, len(traj.messages) - 1))
            calls = choice.message.tool_calls or []
            if not calls:
                traj.log(f"turn {turn + 1}: a reply without a tool call ends the attempt")
                break
            t0 = time.perf_counter()
            for call in calls:
                metrics["tool_calls"] += 1
                name = call.function.name
                if name == COMPLETE_TASK:
                    args, error = _parse_arguments(call.function.arguments, None)
                    answer = (args or {}).get("answer", (args or {}).get("summary"))
                    traj.metadata["final_answer"] = _answer_text(answer)
                    text = TASK_DONE if error is None else error
                    done = error is None
                elif name not in by_name:
                    text = f"Error: there is no tool named {name!r}; the tools are: " + ", ".join(
                        [*by_name, COMPLETE_TASK]
                    )
                    error = text
                else:
                    args, error = _parse_arguments(call.function.arguments, by_name[name])
                    if error is None:
                        result = await session.call_tool(
                            name, args, timeout=config.tool_timeout, results_as=config.results_as
                        )
                        text, error = result.text, (result.text if result.is_error else None)
                        if result.elicitations:  # the server asked the user meanwhile
                            text += "\n" + "\n".join(map(describe_elicitation, result.elicitations))
                            traj.metadata.setdefault("elicitations", []).extend(
                                {"tool": name, **e} for e in result.elicitations
                            )
                            metrics["elicitations"] = metrics.get("elicitations", 0) + len(
                                result.elicitations
                            )
                    else:
                        text = error
                if error is not None:
                    metrics["tool_errors"] += 1
                traj.messages.append({"role": "tool", "tool_call_id": call.id, "content": text})
            traj.timings["tools_s"] = traj.timings.get("tools_s", 0.0) + (time.perf_counter() - t0)
            if done:
                metrics["completed"] = 1
                break
            if config.stop_after_calls is not None and _tool_calls(traj) >= config.stop_after_calls:
                traj.log(f"turn {turn + 1}: the step practised is made; the attempt ends")
                break
        else:
            metrics["ran_out_of_turns"] = 1
    traj.metrics = {k: float(v) for k, v in metrics.items()}
    traj.metrics["duration_s"] = time.perf_counter() - started
    traj.metrics["trainable"] = float(traj.trainable)
    return traj


async def _guide(
    traj: Trajectory, scenario: Scenario, session: MCPSession, config: RolloutConfig
) -> int:
    """Make the first `config.guided_calls` reference calls of `scenario` for the attempt: each
    an assistant tool call and the server's real result, as if the model had made them. They
    have no `choices` entry, so no token of theirs is trained on. Returns how many it made."""
    calls = scenario.reference.calls if scenario.reference is not None else []
    k = min(config.guided_calls, max(len(calls) - 1, 0))  # the last call is the model's to make
    for i, call in enumerate(calls[:k]):
        result = await session.call_tool(
            call.tool, call.arguments, timeout=config.tool_timeout, results_as=config.results_as
        )
        call_id = f"guided_{i + 1}"
        traj.messages.append({"role": "assistant", "content": None, "tool_calls": [
            _function_call(call_id, call.tool, json.dumps(call.arguments))]})  # fmt: skip
        traj.messages.append({"role": "tool", "tool_call_id": call_id, "content": result.text})
    return k


async def solve_examples(
    examples: Sequence[Scenario], session: MCPSession, config: RolloutConfig
) -> list[dict[str, Any]]:
    """The given tasks, solved by their references, as the messages of one conversation (the
    worked examples `RolloutConfig.example_messages` takes; `mcprl.curriculum` picks them):
    each task as an attempt's user turn states it, its reference calls one a turn with the
    server's live result (so a result reads as an attempt's would), then complete_task with
    the reference answer."""
    messages: list[dict[str, Any]] = []
    for s in examples:
        if s.reference is None or s.reference.answer is None:
            raise UsageError(f"scenario {s.id!r} has no reference answer to show it solved by")
        kind = answer_type(s) if config.typed_answer else None
        budget = config.model_copy(update={"max_turns": turn_budget(s, config)})
        messages.append({"role": "user", "content": user_message(s, budget, kind)})
        for j, call in enumerate(s.reference.calls):
            result = await session.call_tool(
                call.tool, call.arguments, timeout=config.tool_timeout, results_as=config.results_as
            )
            call_id = f"example_{s.id}_{j + 1}"
            messages.append({"role": "assistant", "content": None, "tool_calls": [
                _function_call(call_id, call.tool, json.dumps(call.arguments))]})  # fmt: skip
            messages.append({"role": "tool", "tool_call_id": call_id, "content": result.text})
        answer = _answer_call(complete_task_tool(kind), str(s.reference.answer))
        call_id = f"example_{s.id}_answer"
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            _function_call(call_id, COMPLETE_TASK, json.dumps(answer["arguments"]))]})  # fmt: skip
        messages.append({"role": "tool", "tool_call_id": call_id, "content": TASK_DONE})
    return messages


def _function_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def sampler(config: RolloutConfig) -> Sampler | None:
    """What answers a server's sampling requests in these attempts (`sampling_model`)."""
    if config.sampling_model is None:
        return None
    return Sampler(config.sampling_model, api_base=config.sampling_api_base)


def turn_budget(scenario: Scenario, config: RolloutConfig) -> int:
    """The turns an attempt at `scenario` gets (see `RolloutConfig.turn_budget`)."""
    if config.turn_budget == "fixed":
        return config.max_turns
    ref = scenario.reference
    # difficulty 1 is a single call (the generators' scale), so it stands in for the calls
    calls = len(ref.calls) if ref is not None and ref.calls else scenario.difficulty
    return min(config.max_turns, calls + 1)


def _answer_text(answer: Any) -> str | None:
    if answer is None:
        return None
    if isinstance(answer, float) and answer.is_integer():
        return str(int(answer))
    return answer if isinstance(answer, str) else json.dumps(answer)


def _system_prompt(config: RolloutConfig) -> str:
    # replace, not format: a written prompt may hold braces of its own
    return config.system_prompt.replace("{max_turns}", str(config.max_turns))


def user_message(scenario: Scenario, config: RolloutConfig, kind: AnswerType | None) -> str:
    """The task, then this attempt's rules: its turns, the forced last turn, the answer's type."""
    turns = f"{config.max_turns} turn{'s' if config.max_turns > 1 else ''}"
    rules = f"You have at most {turns}."
    if config.force_final_answer and config.max_turns > 1:
        rules = f"You have {turns}; in the last one, call complete_task."
    if kind == "number":
        rules += " The final answer is a number."
    elif kind == "yes/no":
        rules += " The final answer is yes or no."
    return f"Please complete this task: {scenario.task}\n\n{rules}"


async def _single_turn(model: Policy, scenario: Scenario, config: RolloutConfig, client: Any):
    started = time.perf_counter()
    traj = Trajectory(metadata={"scenario_id": scenario.id, "model": model.served_name})
    traj.messages = [{"role": "user", "content": scenario.task}]
    if config.system_prompt:
        traj.messages.insert(0, {"role": "system", "content": _system_prompt(config)})
    response = await _complete(client, model.served_name, traj, config, 0, _endpoint(model))
    if response is None:
        traj.metrics = {"turns": 0.0, "hit_context_limit": 1.0}
    else:
        choice = response.choices[0]
        traj.messages.append(_assistant_message(choice.message))
        traj.choices.append(read_choice(choice, response, len(traj.messages) - 1))
        traj.metrics = {"turns": 1.0, "completed": float(choice.finish_reason == "stop")}
    traj.timings["generate_s"] = traj.metrics["duration_s"] = time.perf_counter() - started
    traj.metrics["trainable"] = float(traj.trainable)
    return traj


def _tool_choice(traj: Trajectory, config: RolloutConfig, turn: int) -> Any:
    """This turn's tool_choice: complete_task alone on a forced last turn; `first_tool` alone on
    the first (with `first_arguments` pinned, where set), and `next_calls` pinned in turn after
    it; every tool but complete_task until the attempt has called one (`look_before_answer`),
    or until the last turn (`answer_on_last_turn`). After the pinned calls, a `pinned_answer`
    pins complete_task and its answer."""
    pinned = config.first_arguments is not None and config.pinned_answer is not None
    if pinned and turn == len(config.next_calls) + 1:
        return {"type": "function", "function": _pinned_answer(traj, config.pinned_answer)}
    if config.force_final_answer and turn == config.max_turns - 1:
        return {"type": "function", "function": {"name": COMPLETE_TASK}}
    if turn == 0 and config.first_tool is not None:
        function: dict[str, Any] = {"name": config.first_tool}
        if config.first_arguments is not None:
            function["arguments"] = config.first_arguments
        return {"type": "function", "function": function}
    if config.first_arguments is not None and 0 < turn <= len(config.next_calls):
        call = config.next_calls[turn - 1]
        function = {"name": call["tool"], "arguments": call["arguments"]}
        return {"type": "function", "function": function}
    others = [t for t in traj.tools if t["function"]["name"] != COMPLETE_TASK]
    looked = any(m["role"] == "tool" for m in traj.messages)
    hold = config.answer_on_last_turn or (config.look_before_answer and not looked)
    if not hold or not others or len(others) == len(traj.tools):
        return config.tool_choice
    allowed = [{"type": "function", "function": {"name": t["function"]["name"]}} for t in others]
    return {
        "type": "allowed_tools",
        "allowed_tools": {"mode": config.tool_choice, "tools": allowed},
    }


def _pinned_answer(traj: Trajectory, answer: str) -> dict[str, Any]:
    """complete_task with `answer` pinned, typed as the attempt's complete_task takes it."""
    tool = next(t for t in traj.tools if t["function"]["name"] == COMPLETE_TASK)
    return _answer_call(tool, answer)


def _answer_call(tool: dict[str, Any], answer: str) -> dict[str, Any]:
    """A call of complete_task `tool` with `answer` typed as its schema takes it (a number where
    it says so, else the text; the untyped form's `summary`)."""
    schema = tool["function"]["parameters"]
    key = schema["required"][0]
    value: Any = answer
    if schema["properties"][key].get("type") == "number":
        value = float(answer)
        value = int(value) if value.is_integer() and abs(value) < 1e15 else value
    elif schema["properties"][key].get("enum") == YES_NO:
        value = polarity(answer) or answer
    return {"name": COMPLETE_TASK, "arguments": {key: value}}


def _call_key(name: str, raw: str) -> tuple[str, str]:
    """`call_key` of a call as the model wrote it (arguments that are not JSON: as written)."""
    try:
        args = json.loads(raw) if raw and raw.strip() else {}
    except json.JSONDecodeError:
        return name, raw
    return call_key(name, args)


def _repeats_call(traj: Trajectory, response: Any) -> bool:
    """Whether the reply calls a tool (not complete_task) with the same arguments as a call
    already in the attempt (its own, or one made or pinned for it)."""
    made = {
        _call_key(c["function"]["name"], c["function"]["arguments"])
        for m in traj.messages
        if m.get("role") == "assistant"
        for c in m.get("tool_calls") or []
    }
    calls = response.choices[0].message.tool_calls or []
    keys = [_call_key(c.function.name, c.function.arguments) for c in calls]
    return any(name != COMPLETE_TASK and (name, args) in made for name, args in keys)


def _tool_calls(traj: Trajectory) -> int:
    """The tool calls in the attempt so far, those made for it included, complete_task not."""
    return sum(
        c["function"]["name"] != COMPLETE_TASK
        for m in traj.messages
        if m["role"] == "assistant"
        for c in m.get("tool_calls") or []
    )


def _pinned_turn(config: RolloutConfig, turn: int) -> bool:
    """Whether this turn's call is pinned by the loop (a demonstration's), not the policy's."""
    return config.first_arguments is not None and turn <= len(config.next_calls)


@dataclass(frozen=True)
class _Endpoint:
    """What a policy's endpoint is asked beyond OpenAI's fields."""

    trainable: bool = False  # token ids and log-probabilities (`mcprl.tokens`)
    final_tools: bool = False  # mcprl's `final_tools`: an answer's reply is not kept for more


def _endpoint(model: Policy) -> _Endpoint:
    extensions = getattr(model, "extensions", ())  # optional in `Policy`
    return _Endpoint(trainable=_trainable(model), final_tools="final_tools" in extensions)


def _trainable(model: Policy) -> bool:
    return bool(getattr(model, "wants_token_data", False))


async def _complete(
    client: Any,
    served: str,
    traj: Trajectory,
    config: RolloutConfig,
    turn: int,
    endpoint: _Endpoint = _Endpoint(),
    *,
    retry: int = 0,
):
    """One completion; a trainable model's endpoint is asked for token ids and log-probs, and
    mcprl's server is told that a `complete_task` call ends the conversation.
    `retry`: the how-manieth request for this turn (each with its own seed)."""
    import openai

    messages = traj.messages
    if config.example_messages and messages and messages[0]["role"] == "system":
        messages = [messages[0], *config.example_messages, *messages[1:]]
    kwargs: dict[str, Any] = {
        "model": served,
        "messages": messages,
        "temperature": config.temperature,
        "max_tokens": config.max_tokens,
    }
    if config.top_p < 1.0:
        kwargs["top_p"] = config.top_p
    if traj.tools:
        kwargs.update(tools=traj.tools, tool_choice=_tool_choice(traj, config, turn))
        choice = kwargs["tool_choice"]
        pinned = choice.get("function", {}).get("arguments") if isinstance(choice, dict) else None
        if pinned is not None:
            # a pinned call is written whole, however long: a token is at least one character
            # (an `aggregate` over 21 ids cut at 128 tokens was no call at all)
            kwargs["max_tokens"] = max(config.max_tokens, len(json.dumps(pinned)) + 64)
    if config.seed is not None:
        # an attempt's seeds are SEED_STRIDE (1000) apart: turns and retries stay inside
        kwargs["seed"] = config.seed + turn + 100 * retry
    if endpoint.trainable:
        kwargs["logprobs"] = TOKEN_REQUEST["logprobs"]
    extra = {**(TOKEN_REQUEST["extra_body"] if endpoint.trainable else {}), **config.extra_body}
    if endpoint.final_tools and traj.tools:
        extra.setdefault("final_tools", [COMPLETE_TASK])
    if config.min_p > 0.0:
        extra.setdefault("min_p", config.min_p)
    if extra:
        kwargs["extra_body"] = extra
    try:
        response = await client.chat.completions.create(**kwargs)
    except openai.BadRequestError as exc:
        if "context" in str(exc).lower():
            traj.log(f"turn {turn + 1}: stopped at the context limit ({exc})")
            return None
        choice = kwargs.get("tool_choice")
        if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
            raise PreflightError(
                f"the endpoint of {served!r} rejected OpenAI's allowed_tools tool_choice ({exc}),"
                " which mcprl sends so that an attempt cannot answer before its first tool "
                "call; turn that off with `rollout.look_before_answer=False`"
            ) from exc
        raise
    usage = getattr(response, "usage", None)
    note_turn(getattr(usage, "completion_tokens", None) or 0)  # the progress bar moves per turn
    return response
