"""The agent loop, trajectories, running groups, and reference rewards."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from itertools import count

import anyio
import pytest
from openai.types.chat import ChatCompletion
from pydantic import ValidationError

from mcprl import (
    GatherError,
    Model,
    RolloutConfig,
    Trajectory,
    TrajectoryGroup,
    gather_groups,
    read_groups,
    rollout,
    write_groups,
)
from mcprl.mcp import open_session
from mcprl.rewards import answer_matches, calls_matched, reference_reward, scorer
from mcprl.rollout import answer_type, solve_examples, turn_budget
from mcprl.scenarios import (
    Reference,
    ReferenceCall,
    Scenario,
    ScenarioSet,
    bundled_scenarios,
    check_named_arguments,
    guessable,
    named_arguments,
)
from tests.helpers import (
    EXAMPLES,
    LocalChatServer,
    chat_completion,
    fragile_server,
    load_example,
    solved_scenario,
)

pytestmark = pytest.mark.anyio

SCENARIO = Scenario(
    id="mul",
    task="What is 6 times 7?",
    difficulty=1,
    reference=Reference(
        answer="42",
        calls=[ReferenceCall(tool="multiply", arguments={"a": 6, "b": 7})],
    ),
)
MODEL = Model(name="scripted", base_url="http://127.0.0.1:9/v1")
_ids = count()


def call(name: str, arguments: str | dict) -> dict:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {
        "id": f"call_{next(_ids)}",
        "type": "function",
        "function": {"name": name, "arguments": args},
    }


def reply(*calls: dict, content: str | None = None, tokens: bool = True) -> ChatCompletion:
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": content, "tool_calls": list(calls) or None},
        "finish_reason": "tool_calls" if calls else "stop",
    }
    if tokens:
        choice.update(
            {
                "token_ids": [5, 6, 7],
                "prompt_token_ids": [1, 2, 3],
                "mcprl": {
                    "model_logprobs": [-0.1, -0.2, -0.3],
                    "token_logprobs": [-0.1, -0.2, -0.3],
                },
            }
        )
    return ChatCompletion.model_validate(
        {
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": "scripted",
            "choices": [choice],
        }
    )


class ScriptedPolicy:
    """A policy double: an OpenAI-like async client answering from a script."""

    def __init__(self, *script: ChatCompletion, delay: float = 0.0) -> None:
        self.script = list(script)
        self.requests: list[dict] = []
        self.delay = delay
        self.chat = self
        self.completions = self

    async def create(self, **kwargs):
        self.requests.append(kwargs)
        if self.delay:
            await anyio.sleep(self.delay)
        return self.script[min(len(self.requests), len(self.script)) - 1]


@pytest.fixture
def calculator():
    return load_example("calculator").server


async def test_complete_task_ends_the_loop(calculator):
    policy = ScriptedPolicy(
        reply(call("multiply", {"a": 6, "b": 7})),
        reply(call("complete_task", {"summary": "6 times 7 is 42."})),
        reply(call("add", {"a": 1, "b": 1})),  # never reached
    )
    config = RolloutConfig(max_turns=5, turn_budget="fixed")
    t = await rollout(MODEL, SCENARIO, calculator, config, client=policy)
    assert t.metrics["completed"] == 1 and t.metrics["turns"] == 2
    assert t.metrics["ran_out_of_turns"] == 0 and t.metrics["tool_errors"] == 0
    assert t.final_answer() == "6 times 7 is 42."
    roles = [m["role"] for m in t.messages]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert t.messages[3]["content"] == '{"result": 42.0}'  # results_as="json"
    assert t.messages[1]["content"].startswith("Please complete this task: What is 6 times 7?")
    assert "You have 5 turns; in the last one, call complete_task." in t.messages[1]["content"]
    names = [tool["function"]["name"] for tool in t.tools]
    assert "multiply" in names and names[-1] == "complete_task"
    # no answer before looking: the first turn may call every tool but complete_task; the
    # prompt still lists them all, so it stays one prefix from turn to turn
    first = policy.requests[0]["tool_choice"]
    assert first["type"] == "allowed_tools" and first["allowed_tools"]["mode"] == "required"
    allowed = {t["function"]["name"] for t in first["allowed_tools"]["tools"]}
    assert allowed == set(names) - {"complete_task"}
    assert policy.requests[0]["tools"] == policy.requests[1]["tools"] == t.tools
    assert policy.requests[1]["tool_choice"] == "required"
    assert t.trainable and [c.message_index for c in t.choices] == [2, 4]
    assert reference_reward(t, SCENARIO) == 1.0


async def test_results_can_be_shown_as_the_json_the_agent_writes(calculator):
    policy = ScriptedPolicy(
        reply(call("subtract", {"a": 2, "b": 8})),
        reply(call("complete_task", {"answer": -6})),
    )
    config = RolloutConfig(max_turns=2, results_as="json")
    t = await rollout(MODEL, SCENARIO, calculator, config, client=policy)
    assert t.messages[3]["content"] == '{"result": -6.0}'  # the float the tool's schema declares
    assert t.final_answer() == "-6"


async def test_invalid_tool_names_and_arguments_become_error_messages(calculator):
    policy = ScriptedPolicy(
        reply(call("modulo", {"a": 1, "b": 2})),
        reply(call("multiply", "{not json")),
        reply(call("multiply", {"a": 6})),
        reply(call("divide", {"a": 1, "b": 0})),
        reply(call("multiply", {"a": 6, "b": 7})),
        reply(call("complete_task", {"summary": "42"})),
    )
    config = RolloutConfig(max_turns=8, turn_budget="fixed")
    t = await rollout(MODEL, SCENARIO, calculator, config, client=policy)
    tool_texts = [m["content"] for m in t.messages if m["role"] == "tool"]
    assert "no tool named 'modulo'" in tool_texts[0] and "multiply" in tool_texts[0]
    assert "not valid JSON" in tool_texts[1]
    assert "missing required argument(s): b" in tool_texts[2]
    assert "division by zero" in tool_texts[3]
    assert tool_texts[4] == '{"result": 42.0}'
    assert t.metrics["tool_errors"] == 4 and t.metrics["completed"] == 1


async def test_hidden_tools_are_neither_offered_nor_callable(calculator):
    policy = ScriptedPolicy(
        reply(call("divide", {"a": 42, "b": 1})),
        reply(call("multiply", {"a": 6, "b": 7})),
        reply(call("complete_task", {"answer": 42})),
    )
    config = RolloutConfig(max_turns=3, turn_budget="fixed", hidden_tools=["divide"])
    t = await rollout(MODEL, SCENARIO, calculator, config, client=policy)
    names = [tool["function"]["name"] for tool in t.tools]
    assert "divide" not in names and "multiply" in names
    assert policy.requests[0]["tools"] == t.tools
    tool_texts = [m["content"] for m in t.messages if m["role"] == "tool"]
    assert "no tool named 'divide'" in tool_texts[0] and tool_texts[1] == '{"result": 42.0}'


async def test_the_turn_budget_holds(calculator):
    policy = ScriptedPolicy(reply(call("add", {"a": 1, "b": 1})))
    config = RolloutConfig(max_turns=3, turn_budget="fixed")
    t = await rollout(MODEL, SCENARIO, calculator, config, client=policy)
    assert t.metrics["turns"] == 3 and t.metrics["ran_out_of_turns"] == 1
    assert t.metrics["completed"] == 0 and len(policy.requests) == 3
    assert reference_reward(t, SCENARIO) == 0.0
    # by default, a scenario with reference calls gets one turn per call plus one to answer
    policy = ScriptedPolicy(reply(call("add", {"a": 1, "b": 1})))
    t = await rollout(MODEL, SCENARIO, calculator, RolloutConfig(max_turns=6), client=policy)
    assert len(policy.requests) == 2 and "You have 2 turns" in t.messages[1]["content"]
    assert policy.requests[-1]["tool_choice"]["function"]["name"] == "complete_task"


@pytest.mark.parametrize(("difficulty", "turns"), [(1, 2), (3, 4), (5, 6)])
async def test_a_task_without_reference_calls_gets_turns_by_its_difficulty(
    calculator, difficulty, turns
):
    # RULER's normal case: no reference, so the budget comes from the difficulty (1: one call)
    hidden = Scenario(id="h", task="Add 2 and 3.", difficulty=difficulty)
    policy = ScriptedPolicy(reply(call("add", {"a": 2, "b": 3})))
    t = await rollout(MODEL, hidden, calculator, RolloutConfig(max_turns=6), client=policy)
    assert len(policy.requests) == turns and f"You have {turns} turns" in t.messages[1]["content"]
    assert policy.requests[-1]["tool_choice"]["function"]["name"] == "complete_task"
    # never past max_turns, and "fixed" gives every task max_turns
    assert turn_budget(hidden, RolloutConfig(max_turns=3)) == min(3, turns)
    assert turn_budget(hidden, RolloutConfig(max_turns=6, turn_budget="fixed")) == 6


async def test_a_reply_without_tool_calls_ends_the_attempt(calculator):
    policy = ScriptedPolicy(reply(content="It is 42."))
    t = await rollout(MODEL, SCENARIO, calculator, client=policy)
    assert t.metrics["turns"] == 1 and t.metrics["completed"] == 0
    assert t.final_answer() == "It is 42." and reference_reward(t, SCENARIO) == 1.0


async def test_an_endpoint_without_token_ids_gives_a_valid_untrainable_trajectory(calculator):
    def respond(body):
        if len(body["messages"]) > 2:
            finish = [call("complete_task", {"summary": "42"})]
        else:
            finish = [call("multiply", {"a": 6, "b": 7})]
        payload = chat_completion(None)
        payload["choices"][0]["message"]["tool_calls"] = finish
        return 200, payload

    with LocalChatServer(respond) as server:
        baseline = Model(name="hosted", base_url=server.base_url, api_key="k")
        t = await rollout(baseline, SCENARIO, calculator)
    assert t.metrics["completed"] == 1 and not t.trainable
    assert t.metrics["trainable"] == 0 and reference_reward(t, SCENARIO) == 1.0


def _multiply_then_answer(body):
    """A hosted endpoint's reply: `multiply(6, 7)` first, then the answer 42."""
    done = len(body["messages"]) > 2
    payload = chat_completion(None)
    payload["choices"][0]["message"]["tool_calls"] = [
        call("complete_task", {"answer": 42}) if done else call("multiply", {"a": 6, "b": 7})
    ]
    return 200, payload


async def test_sampling_settings_reach_the_endpoint_as_vllm_reads_them(calculator):
    with LocalChatServer(_multiply_then_answer) as server:
        hosted = Model(name="hosted", base_url=server.base_url, api_key="k")
        await rollout(hosted, SCENARIO, calculator, RolloutConfig(top_p=0.9, min_p=0.1))
        await rollout(hosted, SCENARIO, calculator, RolloutConfig())
    tuned, plain = server.requests[0], server.requests[-1]
    assert tuned["top_p"] == 0.9 and tuned["min_p"] == 0.1  # min_p: top level, as vLLM reads
    assert "top_p" not in plain and "min_p" not in plain  # off: nothing a hosted API may reject


async def test_only_an_endpoint_that_reads_final_tools_is_told_complete_task_ends_it(calculator):
    """mcprl's server keeps a reply's keys and values for the next turn unless the request
    names the tools that end the conversation (`final_tools`); vLLM and hosted APIs, which
    would warn or refuse, are not sent the field."""

    with LocalChatServer(_multiply_then_answer) as server:
        mcprl = Model(name="m", base_url=server.base_url, api_key="k", extensions=("final_tools",))
        await rollout(mcprl, SCENARIO, calculator)
        told = len(server.requests)
        await rollout(Model(name="hosted", base_url=server.base_url, api_key="k"), SCENARIO,
                      calculator)  # fmt: skip
    assert told == 2 and all(r["final_tools"] == ["complete_task"] for r in server.requests[:2])
    assert all("final_tools" not in r for r in server.requests[2:])


async def test_a_server_dying_mid_attempt_fails_that_attempt_only(tmp_path):
    spec = fragile_server(tmp_path)
    good = ScriptedPolicy(
        reply(call("echo", {"text": "hi"})), reply(call("complete_task", {"summary": "hi"}))
    )
    bad = ScriptedPolicy(reply(call("crash", {})))
    attempts = [
        lambda: rollout(MODEL, SCENARIO, spec, client=good),
        lambda: rollout(MODEL, SCENARIO, spec, client=bad),
        lambda: rollout(MODEL, SCENARIO, spec, client=good),
    ]
    (group,) = await gather_groups([attempts], max_exceptions=1, progress=False)
    assert len(group.trajectories) == 2 and len(group.exceptions) == 1
    error = group.exceptions[0]
    assert error.type == "MCPConnectionError" and "crash" in error.message
    assert "segfault in module foo" in error.message


async def test_max_exceptions_aborts_the_batch():
    async def fails():
        raise RuntimeError("boom")

    async def works():
        return Trajectory(metadata={"scenario_id": "s"})

    with pytest.raises(GatherError, match="2 of 4 attempts failed"):
        await gather_groups([[fails, works], [fails, works]], max_exceptions=1, progress=False)
    groups = await gather_groups(
        [[fails, works], [fails, works]], max_exceptions=0.5, progress=False
    )
    assert [len(g.exceptions) for g in groups] == [1, 1]


async def test_the_concurrency_limit_holds(calculator):
    in_flight = peak = 0

    async def attempt():
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await anyio.sleep(0.02)
        in_flight -= 1
        return Trajectory(metadata={"scenario_id": "s"})

    groups = [[attempt] * 4 for _ in range(3)]
    result = await gather_groups(groups, max_concurrency=3, progress=False)
    assert peak == 3 and sum(len(g.trajectories) for g in result) == 12


async def test_after_each_scores_or_drops_groups(calculator):
    score = scorer({"mul": SCENARIO})

    def attempt(answer):
        policy = ScriptedPolicy(reply(call("complete_task", {"summary": f"It is {answer}"})))
        return lambda: rollout(MODEL, SCENARIO, calculator, client=policy)

    async def keep_informative(group):
        group = await score(group)
        return None if len(set(group.rewards)) == 1 else group  # equal rewards teach nothing

    mixed = [attempt(42), attempt(41)]
    same = [attempt(41), attempt(40)]
    groups = await gather_groups([mixed, same], after_each=keep_informative, progress=False)
    (group,) = groups
    assert sorted(group.rewards) == [0.0, 1.0] and group.scenario_id == "mul"
    assert all("reward_reference" in t.metrics for t in group.trajectories)


async def test_trajectory_groups_round_trip_through_jsonl(calculator, tmp_path):
    policy = ScriptedPolicy(
        reply(call("multiply", {"a": 6, "b": 7})), reply(call("complete_task", {"summary": "42"}))
    )
    t = await rollout(MODEL, SCENARIO, calculator, client=policy)
    t.reward = 0.75
    t.log("a note")
    group = TrajectoryGroup(scenario_id="mul", trajectories=[t, t.model_copy()])
    group.exceptions.append(__import__("mcprl").AttemptError(type="X", message="y"))
    path = write_groups(tmp_path / "t" / "0001.jsonl", [group, group])
    loaded = read_groups(path)
    assert [g.model_dump() for g in loaded] == [group.model_dump(), group.model_dump()]


async def test_the_last_turn_is_forced_to_complete_task_with_a_typed_answer(calculator):
    policy = ScriptedPolicy(
        reply(call("multiply", {"a": 6, "b": 7})),
        reply(call("complete_task", {"answer": 42.0})),
    )
    t = await rollout(MODEL, SCENARIO, calculator, RolloutConfig(max_turns=2), client=policy)
    first, last = policy.requests
    assert first["tool_choice"]["type"] == "allowed_tools"  # no answer before a tool's result
    assert last["tool_choice"] == {"type": "function", "function": {"name": "complete_task"}}
    finish = next(x for x in last["tools"] if x["function"]["name"] == "complete_task")
    assert finish["function"]["parameters"]["properties"]["answer"]["type"] == "number"
    assert "You have 2 turns; in the last one, call complete_task" in t.messages[1]["content"]
    assert "The final answer is a number." in t.messages[1]["content"]
    assert t.messages[0]["content"] == RolloutConfig().system_prompt  # the same for every task
    assert t.final_answer() == "42" and t.metrics["completed"] == 1
    assert reference_reward(t, SCENARIO) == 1.0


async def test_a_yes_or_no_task_takes_yes_or_no_and_a_pinned_true_is_a_yes(calculator):
    """A reference answer that is a yes or a no (or true or false) types complete_task's answer
    as one of "yes" and "no", and the task says so; a demonstration pins it in that form."""
    asks = Scenario(id="yn", task="Is 6 times 7 more than 40?", difficulty=1,
                    reference=Reference(answer="True", calls=[]))  # fmt: skip
    assert answer_type(asks) == "yes/no" and answer_type(SCENARIO) == "number"
    policy = ScriptedPolicy(
        reply(call("multiply", {"a": 6, "b": 7})), reply(call("complete_task", {"answer": "yes"}))
    )
    config = RolloutConfig(max_turns=2, first_tool="multiply", first_arguments={"a": 6, "b": 7},
                           pinned_answer="True")  # fmt: skip
    t = await rollout(MODEL, asks, calculator, config, client=policy)
    last = policy.requests[-1]
    finish = next(x for x in last["tools"] if x["function"]["name"] == "complete_task")
    assert finish["function"]["parameters"]["properties"]["answer"]["enum"] == ["yes", "no"]
    assert last["tool_choice"]["function"]["arguments"] == {"answer": "yes"}
    assert "The final answer is yes or no." in t.messages[1]["content"]
    assert reference_reward(t, asks) == 1.0


def test_a_task_without_a_reference_answer_takes_the_answer_type_it_states():
    """A RULER task has no reference answer to type `complete_task` by: it may say what kind of
    answer it wants, and otherwise takes a string; where it says, that wins over the reference."""
    hidden = Scenario(id="h", task="What is 6 times 7?", difficulty=1)
    assert answer_type(hidden) == "string"
    assert answer_type(hidden.model_copy(update={"answer_type": "number"})) == "number"
    assert answer_type(SCENARIO) == "number"
    assert answer_type(SCENARIO.model_copy(update={"answer_type": "string"})) == "string"
    line = '{"id": "h", "task": "What is 6 times 7?", "difficulty": 1, "answer_type": "number"}'
    assert answer_type(Scenario.model_validate_json(line)) == "number"
    with pytest.raises(ValueError, match="answer_type"):
        Scenario(id="h", task="?", difficulty=1, answer_type="integer")


async def test_a_first_tool_names_the_first_turns_call_and_no_other(calculator):
    policy = ScriptedPolicy(
        reply(call("multiply", {"a": 6, "b": 7})),
        reply(call("complete_task", {"answer": 42.0})),
    )
    config = RolloutConfig(max_turns=2, first_tool="multiply")
    t = await rollout(MODEL, SCENARIO, calculator, config, client=policy)
    first, last = policy.requests
    assert first["tool_choice"] == {"type": "function", "function": {"name": "multiply"}}
    assert last["tool_choice"]["function"]["name"] == "complete_task"
    assert first["tools"] == t.tools  # the prompt still lists every tool
    assert t.metadata["first_tool"] == "multiply" and reference_reward(t, SCENARIO) == 1.0
    with pytest.raises(ValueError, match=r"first_tool 'modulo' is not a tool.*add, subtract"):
        bad = RolloutConfig(first_tool="modulo")
        await rollout(MODEL, SCENARIO, calculator, bad, client=ScriptedPolicy(policy.script[0]))


async def test_a_repeated_call_is_asked_for_again_with_another_seed_and_only_the_kept_reply_counts(
    calculator,
):
    chain = SCENARIO.model_copy(update={"reference": Reference(answer="1764", calls=[
        ReferenceCall(tool="multiply", arguments={"a": 6, "b": 7}),
        ReferenceCall(tool="multiply", arguments={"a": 42, "b": 42}),
    ])})  # fmt: skip
    script = (
        reply(call("multiply", {"a": 6, "b": 7})),
        reply(call("multiply", '{"b": 7, "a": 6}')),  # the same call, spelled otherwise
        reply(call("multiply", {"a": 42, "b": 42})),
        reply(call("complete_task", {"answer": 1764.0})),
    )
    policy = ScriptedPolicy(*script)
    config = RolloutConfig(retry_repeats=2, seed=5000)
    t = await rollout(MODEL, chain, calculator, config, client=policy)
    assert [r["seed"] for r in policy.requests] == [5000, 5001, 5101, 5002]
    made = [c["function"]["arguments"] for m in t.messages for c in m.get("tool_calls") or []]
    assert made[:2] == ['{"a": 6, "b": 7}', '{"a": 42, "b": 42}']  # the repeat is not in it
    assert len(t.choices) == 3 and reference_reward(t, chain) == 1.0
    assert t.metrics["repeats_retried"] == 1

    # a reply that repeats after every retry stands; off (the default), no reply is retried
    stuck = ScriptedPolicy(script[0], script[1], script[1], script[1], script[3])
    t = await rollout(MODEL, chain, calculator, config, client=stuck)
    assert len(stuck.requests) == 5 and t.metrics["repeats_retried"] == 2
    assert t.metrics["tool_calls"] == 3  # multiply twice (the repeat ran), complete_task
    off = ScriptedPolicy(*script)
    t = await rollout(MODEL, chain, calculator, RolloutConfig(seed=5000), client=off)
    assert len(off.requests) == 3 and "repeats_retried" not in t.metrics
    with pytest.raises(ValueError, match="retry_repeats"):
        RolloutConfig(retry_repeats=10)  # its seeds would meet the next attempt's


async def test_first_arguments_pin_the_first_call_and_mark_the_attempt_demonstrated(calculator):
    policy = ScriptedPolicy(
        reply(call("multiply", {"a": 6, "b": 7})),
        reply(call("complete_task", {"answer": 42.0})),
    )
    pinned = {"a": 6, "b": 7}
    config = RolloutConfig(max_turns=2, first_tool="multiply", first_arguments=pinned)
    t = await rollout(MODEL, SCENARIO, calculator, config, client=policy)
    first, last = policy.requests
    assert first["tool_choice"] == {
        "type": "function", "function": {"name": "multiply", "arguments": pinned}}  # fmt: skip
    assert "arguments" not in last["tool_choice"]["function"]  # the answer is the policy's
    assert json.loads(t.metadata["first_arguments"]) == pinned
    with pytest.raises(ValueError, match=r"first_arguments .* needs first_tool"):
        bad = RolloutConfig(first_arguments=pinned)
        await rollout(MODEL, SCENARIO, calculator, bad, client=ScriptedPolicy(policy.script[0]))


async def test_next_calls_pin_the_calls_after_the_first_in_turn(calculator):
    square = [{"tool": "multiply", "arguments": {"a": 42, "b": 42}}]
    policy = ScriptedPolicy(
        reply(call("multiply", {"a": 6, "b": 7})),
        reply(call("multiply", {"a": 42, "b": 42})),
        reply(call("complete_task", {"answer": 1764.0})),
    )
    config = RolloutConfig(max_turns=3, turn_budget="fixed", first_tool="multiply",
                           first_arguments={"a": 6, "b": 7}, next_calls=square)  # fmt: skip
    t = await rollout(MODEL, SCENARIO, calculator, config, client=policy)
    pins = [r["tool_choice"].get("function", {}).get("arguments") for r in policy.requests]
    assert pins == [{"a": 6, "b": 7}, {"a": 42, "b": 42}, None]  # the answer is the policy's
    assert t.metadata["demonstrated_calls"] == 2
    with pytest.raises(ValueError, match=r"next_calls .* needs first_tool and first_arguments"):
        bad = RolloutConfig(first_tool="multiply", next_calls=square)
        await rollout(MODEL, SCENARIO, calculator, bad, client=ScriptedPolicy(policy.script[0]))
    with pytest.raises(ValueError, match=r"next_calls names 'modulo', not a tool"):
        bad = config.model_copy(update={"next_calls": [{"tool": "modulo", "arguments": {}}]})
        await rollout(MODEL, SCENARIO, calculator, bad, client=ScriptedPolicy(policy.script[0]))


@pytest.mark.parametrize("typed", [True, False])
async def test_a_pinned_answer_pins_complete_task_after_the_pinned_calls(calculator, typed):
    """A demonstration of the whole attempt: the call, then complete_task with the reference's
    answer, typed as the attempt's complete_task takes it (a number, or the untyped summary)."""
    policy = ScriptedPolicy(
        reply(call("multiply", {"a": 6, "b": 7})),
        reply(call("complete_task", {"answer": 42} if typed else {"summary": "42"})),
    )
    config = RolloutConfig(max_turns=2, first_tool="multiply", first_arguments={"a": 6, "b": 7},
                           pinned_answer="42", typed_answer=typed)  # fmt: skip
    t = await rollout(MODEL, SCENARIO, calculator, config, client=policy)
    last = policy.requests[-1]["tool_choice"]["function"]
    assert last == {"name": "complete_task",
                    "arguments": {"answer": 42} if typed else {"summary": "42"}}  # fmt: skip
    assert t.metadata["demonstrated_answer"] == "42" == t.metadata["final_answer"]
    with pytest.raises(ValueError, match=r"pinned_answer .* needs first_tool and first_arguments"):
        bad = RolloutConfig(first_tool="multiply", pinned_answer="42")
        await rollout(MODEL, SCENARIO, calculator, bad, client=ScriptedPolicy(policy.script[0]))


async def test_answer_on_last_turn_holds_complete_task_back_until_the_last_turn(calculator):
    """A chain of two calls: the policy would answer after the first result; with
    answer_on_last_turn the second turn may only call a tool, the third only answer."""
    calls = [ReferenceCall(tool="multiply", arguments={"a": 6, "b": 7}),
             ReferenceCall(tool="multiply", arguments={"a": 42, "b": 42})]  # fmt: skip
    reference = Reference(answer="1764", calls=calls)
    chain = Scenario(id="c", task="What is 6 times 7, squared?", difficulty=2, reference=reference)
    script = (
        reply(call("multiply", {"a": 6, "b": 7})),
        reply(call("multiply", {"a": 42, "b": 42})),
        reply(call("complete_task", {"answer": 1764.0})),
    )
    policy = ScriptedPolicy(*script)
    held = RolloutConfig(answer_on_last_turn=True)
    t = await rollout(MODEL, chain, calculator, held, client=policy)
    kinds = [r["tool_choice"]["type"] for r in policy.requests]
    assert kinds == ["allowed_tools", "allowed_tools", "function"]  # 3 turns: 2 calls + answer
    allowed = {
        x["function"]["name"] for x in policy.requests[1]["tool_choice"]["allowed_tools"]["tools"]
    }
    assert "complete_task" not in allowed and "multiply" in allowed
    assert reference_reward(t, chain) == 1.0
    free = ScriptedPolicy(*script)
    await rollout(MODEL, chain, calculator, RolloutConfig(), client=free)
    assert free.requests[1]["tool_choice"] == "required"  # by default it may answer after one


async def test_text_answers_and_the_switches_of_the_final_turn(calculator):
    text = Scenario(id="t", task="Who?", difficulty=1, reference=Reference(answer="Mary Shelley"))
    policy = ScriptedPolicy(reply(call("complete_task", {"answer": "It was Mary Shelley"})))
    t = await rollout(MODEL, text, calculator, RolloutConfig(max_turns=3), client=policy)
    finish = t.tools[-1]["function"]["parameters"]["properties"]
    assert finish["answer"]["type"] == "string" and reference_reward(t, text) == 1.0

    plain = RolloutConfig(
        max_turns=2, force_final_answer=False, typed_answer=False, look_before_answer=False
    )
    policy = ScriptedPolicy(reply(call("add", {"a": 1, "b": 1})))
    t = await rollout(MODEL, SCENARIO, calculator, plain, client=policy)
    assert [r["tool_choice"] for r in policy.requests] == ["required", "required"]
    assert "summary" in t.tools[-1]["function"]["parameters"]["properties"]
    assert (
        t.metrics["ran_out_of_turns"] == 1
        and "must be complete_task" not in t.messages[0]["content"]
    )


def _attempt(
    task: str,
    turns: Sequence[tuple[str, dict, str]],
    answer: str | None,
    metadata: dict | None = None,
) -> Trajectory:
    """An attempt at `task` that made `turns` (tool, arguments, result), one a turn, and
    answered `answer`."""
    messages = [{"role": "user", "content": task}]
    for name, args, result in turns:
        c = call(name, args)
        messages.append({"role": "assistant", "content": None, "tool_calls": [c]})
        messages.append({"role": "tool", "tool_call_id": c["id"], "content": result})
    return Trajectory(messages=messages, metadata={"final_answer": answer} | (metadata or {}))


def test_reward_parts_put_the_answer_first_and_give_partial_credit_toward_it():
    from mcprl.rewards import ReferenceReward, reward_parts

    def attempt(*turns: tuple[str, dict, str]) -> Trajectory:
        answer = turns[-1][1].get("answer") if turns[-1][0] == "complete_task" else None
        return _attempt(SCENARIO.task, turns, answer)

    right = attempt(("multiply", {"a": 6, "b": 7}, "42"), ("complete_task", {"answer": "42"}, ""))
    lucky = attempt(("complete_task", {"answer": "42"}, ""))
    called = attempt(("multiply", {"a": 6, "b": 7}, "42"), ("complete_task", {"answer": "7"}, ""))
    copied = attempt(("add", {"a": 6, "b": 7}, "13"), ("complete_task", {"answer": "13"}, ""))
    misread = attempt(
        ("multiply", {"a": 6, "b": 17}, "102"), ("complete_task", {"answer": "102"}, "")
    )
    as_json = attempt(  # the same, with the result shown as JSON (results_as="json")
        ("multiply", {"a": 6, "b": 17}, '{"result": 102.0}'),
        ("complete_task", {"answer": "102"}, ""),
    )
    erred = attempt(("divide", {"a": 6, "b": 0}, "Error: division by zero"),
                    ("complete_task", {"answer": "0"}, ""))  # fmt: skip
    repeated = attempt(
        ("multiply", {"a": 6, "b": 7}, "42"),
        ("multiply", {"a": 6, "b": 7}, "42"),
        ("complete_task", {"answer": "7"}, ""),
    )
    scores = {
        n: reward_parts(t, SCENARIO) for n, t in locals().items() if isinstance(t, Trajectory)
    }
    assert scores["right"].reward == scores["lucky"].reward == 1.0
    assert scores["called"].reward == pytest.approx(0.3)  # the reference call, no answer
    assert scores["misread"].reward == pytest.approx(0.15 + 0.1)  # right tool, other numbers
    assert scores["misread"].reward > scores["copied"].reward  # ... beats the wrong tool
    assert scores["as_json"].reward == scores["misread"].reward
    assert scores["copied"].reward == pytest.approx(0.1)  # reported its own tool's result
    # ... which, counting only the right tools' results, is no step toward the answer
    strict = reward_parts(copied, SCENARIO, ReferenceReward(report_any_tool=False))
    assert strict.reward == 0.0 and not strict.reported
    assert reward_parts(misread, SCENARIO, ReferenceReward(report_any_tool=False)).reported
    assert scores["erred"].reward == 0.0  # an error is not a result
    assert scores["repeated"].reward == scores["called"].reward  # repeating earns nothing
    assert scores["repeated"].repeated_calls == 1
    assert max(s.reward for s in scores.values() if not s.answer) < 1.0
    custom = reward_parts(called, SCENARIO, ReferenceReward(calls_weight=0.6, report_weight=0))
    assert custom.reward == pytest.approx(0.6)
    with pytest.raises(ValueError, match="keep it below 1"):
        ReferenceReward(calls_weight=0.7, report_weight=0.3)


def test_calls_made_for_a_guided_attempt_earn_it_no_credit():
    """A guided attempt starts after reference calls the loop made for it: they move its chain
    on, but only the calls after them are its own. Credited with them, a failed guided attempt
    outscored its group's own attempts and trained its garbage answer up (the catalog, L200)."""
    from mcprl.rewards import reward_parts

    chain = Scenario(
        id="avg",
        task="What is the average of 2 and 4?",
        difficulty=2,
        reference=Reference(
            answer="3",
            calls=[
                ReferenceCall(tool="add", arguments={"a": 2, "b": 4}),
                ReferenceCall(tool="divide", arguments={"a": 6, "b": 2}),
            ],
        ),
    )

    def attempt(turns: list[tuple[str, dict, str]], answer: str, guided: int = 0) -> Trajectory:
        return _attempt(chain.task, turns, answer, {"guided_calls": guided} if guided else {})

    add = ("add", {"a": 2, "b": 4}, "6")
    divide = ("divide", {"a": 6, "b": 2}, "3")
    wrong = ("multiply", {"a": 9, "b": 9}, "81")
    guided_garbage = reward_parts(attempt([add, wrong], "177793657589", guided=1), chain)
    own_first_call = reward_parts(attempt([add], "6"), chain)
    assert guided_garbage.calls == 0.5  # its chain got as far as the call made for it ...
    assert guided_garbage.reward == pytest.approx(0.0)  # ... which earns it nothing
    assert own_first_call.reward == pytest.approx(0.15 + 0.1)  # the policy's own first call
    # the call after those made for it is its own; repeating one made for it earns nothing
    next_call = reward_parts(attempt([add, divide], "4", guided=1), chain)
    assert next_call.reward == pytest.approx(0.15)
    repeat = reward_parts(attempt([add, add], "5", guided=1), chain)
    assert repeat.reward == pytest.approx(0.0) and repeat.repeated_calls == 1
    # a chain completed and answered is a success however it started
    assert reward_parts(attempt([add, divide], "3", guided=1), chain).reward == 1.0


def test_an_answer_the_policy_gives_whatever_the_task_is_counted_as_a_stock_answer():
    """A right answer that most attempts at another task of its kind gave where it was wrong
    is counted (`stock_answer`, and said on the step's console line), and stays right; one
    that varies with the task is no stock answer, and a kind starts with nothing to compare
    with."""
    from mcprl.collect import summarize
    from mcprl.console import _step_line

    log = "Author: Ben Ode\nMessage: Add soup\n\nAuthor: Chloe Park\nMessage: Add curry"

    def task(sid: str, answer: str) -> Scenario:
        calls = [ReferenceCall(tool="git_log", arguments={}, result=log)]
        ref = Reference(answer=answer, needs_calls=True, calls=calls)
        return Scenario(id=sid, task=f"Who wrote {sid}?", difficulty=1, reference=ref,
                        tags=["grounded", "lookup"])  # fmt: skip

    soup, curry = task("soup", "Ben Ode"), task("curry", "Chloe Park")
    by_id = {"soup": soup, "curry": curry}

    def group(sid: str, *answers: str) -> TrajectoryGroup:
        trajectories = []
        for answer in answers:
            c = call("git_log", {})
            messages = [{"role": "assistant", "content": None, "tool_calls": [c]},
                        {"role": "tool", "tool_call_id": c["id"], "content": log}]  # fmt: skip
            trajectories.append(Trajectory(messages=messages, metadata={"final_answer": answer}))
        return TrajectoryGroup(trajectories=trajectories, scenario_id=sid)

    def stock(score, g: TrajectoryGroup) -> list[float]:
        scored = anyio.run(score, g)
        assert [t.reward for t in scored.trajectories] == [
            1.0 if answer_matches(t.final_answer(), by_id[g.scenario_id].reference) else
            pytest.approx(0.3) for t in scored.trajectories
        ]  # fmt: skip  # rewards as without the count
        return [t.metrics["stock_answer"] for t in scored.trajectories]

    score = scorer(by_id)
    first = group("curry", "Ben Ode", "Ben Ode", "Ben Ode", "Chloe Park")
    assert stock(score, first) == [0.0] * 4  # the first of its kind: nothing to compare with
    soup_group = group("soup", "Ben Ode", "Ben Ode", "Chloe Park", "Ben Ode")
    assert stock(score, soup_group) == [1.0, 1.0, 0.0, 1.0]  # 3 of 4 said it at curry
    summary = summarize([soup_group], by_id)
    assert summary["stock_answer"] == 0.75 and summary["success"] == 0.75
    row = {"step": 4, **{f"train/{k}": v for k, v in summary.items()}, "train/attempts": 4.0}
    assert "success 75% (3 by an answer it also gave to other tasks, where wrong)" in _step_line(
        row, 10, "reward"
    )
    # an answer that varies with the task is none: curry's attempts said Chloe Park
    varied = scorer(by_id)
    stock(varied, group("curry", "Chloe Park", "Chloe Park", "Ben Ode", "Chloe Park"))
    assert stock(varied, group("soup", "Ben Ode", "Ben Ode")) == [0.0, 0.0]


def test_a_right_guess_about_the_servers_data_is_not_a_success():
    """A yes or no is right half the time without looking: where the reference `needs_calls`
    (grounded tasks), the answer counts only after a good call of each tool it calls (no error,
    and something in its result)."""
    from mcprl.collect import summarize
    from mcprl.rewards import reward_parts

    exists = Scenario(
        id="exists",
        task='For table "orders", is there a column named "status"?',
        difficulty=1,
        reference=Reference(
            answer="yes",
            calls=[ReferenceCall(tool="describe_table", arguments={"table_name": "orders"})],
            needs_calls=True,
        ),
    )

    def attempt(calls: list[tuple[str, dict, str]], answer: str) -> Trajectory:
        messages = [{"role": "user", "content": exists.task}]
        for name, args, result in calls:
            c = call(name, args)
            messages.append({"role": "assistant", "content": None, "tool_calls": [c]})
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": result})
        return Trajectory(messages=messages, metadata={"final_answer": answer})

    looked = attempt([("describe_table", {"table_name": "orders"}, "id, status")], "yes")
    other_table = attempt([("describe_table", {"table_name": "items"}, "id, status")], "yes")
    guessed = attempt([("list_tables", {}, "orders, items")], "yes")
    failed = attempt([("describe_table", {"table_name": "order"}, "Error: no table")], "yes")
    told = attempt([("describe_table", {"table_name": "x"}, "Database error: no table x")], "yes")
    empty = attempt([("describe_table", {"table_name": "x"}, "[]")], "yes")  # no such table
    wrong = attempt([("describe_table", {"table_name": "orders"}, "id, status")], "no")
    parts = {n: reward_parts(t, exists) for n, t in locals().items() if isinstance(t, Trajectory)}
    assert parts["looked"].answer == parts["other_table"].answer == 1.0
    assert parts["looked"].reward == 1.0 and parts["looked"].guessed == 0.0
    for name in ("guessed", "failed", "told", "empty"):  # no good call of describe_table: a guess
        assert parts[name].answer == 0.0 and parts[name].guessed == 1.0
        assert parts[name].reward < 1.0
    assert parts["guessed"].reward == 0.0  # and the failed call is the right tool: 0.5 * 0.3
    assert parts["failed"].reward == pytest.approx(0.15)
    assert parts["wrong"].guessed == 0.0 and parts["wrong"].reward == pytest.approx(0.3)
    # the success rate counts the guesses out, and says how many there were
    group = TrajectoryGroup(trajectories=[looked, guessed, failed, wrong], scenario_id="exists")
    anyio.run(scorer({"exists": exists}), group)
    summary = summarize([group], [exists])
    assert summary["success"] == 0.25 and summary["guessed_answer"] == 0.5
    # the same answers to a task that does not need the calls: the guess counts
    free = exists.model_copy(
        update={"reference": exists.reference.model_copy(update={"needs_calls": False})}
    )
    assert reward_parts(guessed, free).answer == 1.0
    # an empty result found nothing: it bears out a "no" (and a 0), not a "yes"
    absent = exists.model_copy(update={"reference": exists.reference.model_copy(
        update={"answer": "no"})})  # fmt: skip
    found_nothing = attempt([("describe_table", {"table_name": "orders"}, "[]")], "no")
    assert reward_parts(found_nothing, absent).answer == 1.0
    # ... from the reference's own call: nothing found about another table is no look at this one
    elsewhere = attempt([("describe_table", {"table_name": "order"}, "[]")], "no")
    assert reward_parts(elsewhere, absent).answer == 0.0
    assert reward_parts(elsewhere, absent).guessed == 1.0


def test_a_write_counts_only_when_it_wrote_what_the_task_asks():
    """A note saved under a made-up title, then counted, answers the count but wrote nothing the
    task asked: where a reference call `match`es arguments (a write's title and text, as the task
    names them), only a call that carries those values counts, each such call by one of its own.
    The same call with other arguments still earns the call's partial credit."""
    from mcprl.rewards import reward_parts

    task = 'Create a note "Dentist" (Tuesday 3pm) and a note "Garden" (water the basil). How many?'

    def create(title: str, body: str) -> ReferenceCall:
        args = {"title": title, "body": body, "tags": ["health"]}
        return ReferenceCall(tool="create_note", arguments=args, match=named_arguments(task, args))

    chain = Scenario(
        id="two-notes",
        task=task,
        difficulty=3,
        reference=Reference(
            answer="2",
            calls=[
                create("Dentist", "Tuesday 3pm"),
                create("Garden", "water the basil"),
                ReferenceCall(tool="list_notes", arguments={}),
            ],
            needs_calls=True,
        ),
    )
    # the task names the title and the text; the tags and ids are not the task's to check
    assert chain.reference.calls[0].match == ["title", "body"]
    assert named_arguments("Delete note 1", {"note_id": 1, "tags": ["work"]}) == []

    def note(title: str, body: str) -> tuple[str, dict, str]:
        return "create_note", {"title": title, "body": body}, '{"id": 1}'

    listed = ("list_notes", {}, '{"count": 2}')
    as_asked = _attempt(
        task, [note("dentist ", "Tuesday  3pm"), note("Garden", "water the basil"), listed], "2"
    )
    made_up = _attempt(
        task, [note("car service", "oil"), note("Garden", "water the basil"), listed], "2"
    )
    one_twice = _attempt(task, [note("Garden", "water the basil")] * 2 + [listed], "2")
    right = reward_parts(as_asked, chain)  # case and spacing aside, what the task names
    assert right.answer == 1.0 and right.reward == 1.0 and right.guessed == 0.0
    for attempt in (made_up, one_twice):
        parts = reward_parts(attempt, chain)
        assert parts.answer == 0.0 and parts.guessed == 1.0 and parts.reward < 1.0
    # without `match` (any arguments: the check before writes were read) the made-up title passed
    loose = chain.model_copy(deep=True)
    for c in loose.reference.calls:
        c.match = None
    assert reward_parts(made_up, loose).answer == 1.0
    # a match naming an argument the call lacks is a mistake in the scenario, said as such
    with pytest.raises(ValidationError, match="match names title, which delete_note"):
        ReferenceCall(tool="delete_note", arguments={"note_id": 1}, match=["title"])


def test_the_bundled_notes_writes_check_what_they_write():
    """Every note the bundled notes tasks create is checked by its title and text."""
    notes = ScenarioSet.load(bundled_scenarios("example:notes"))
    creates = [c for s in notes for c in s.reference.calls if c.tool == "create_note"]
    assert creates and all(c.match == ["title", "body"] for c in creates)
    reads = [c for s in notes for c in s.reference.calls if c.tool in ("list_notes", "get_note")]
    assert reads and all(c.match is None for c in reads)
    # "Do I have any notes about X?" (0) counts only from a search of X
    zeros = [s for s in notes if s.reference.answer == "0" and len(s.reference.calls) == 1]
    assert zeros and all(s.reference.calls[0].match == ["query"] for s in zeros)


def test_a_yes_no_or_zero_counts_only_from_a_call_for_what_the_task_names():
    """On a server with no notes, every search says "count": 0, so a 0 answers "Do I have any
    notes about lisbon?" after a search of "lion" too. Where the answer is a yes, a no or a 0,
    the calls must ask for what the task names; any other answer is the server's data, and the
    calls take any arguments."""
    from mcprl.rewards import reward_parts

    task = 'Do I have any notes about "Lisbon" yet? Search and tell me how many.'
    search = ReferenceCall(tool="search_notes", arguments={"query": "lisbon", "limit": 5})
    zero = check_named_arguments(
        Reference(answer="0", calls=[search], needs_calls=True), task, writes=()
    )
    assert zero.calls[0].match == ["query"]  # the task names the query, not the limit
    scenario = Scenario(id="lisbon", task=task, difficulty=1, reference=zero)
    nothing = '{"count": 0, "notes": []}'
    asked = _attempt(task, [("search_notes", {"query": "LISBON"}, nothing)], "0")
    other = _attempt(task, [("search_notes", {"query": "lion"}, nothing)], "0")
    assert reward_parts(asked, scenario).answer == 1.0
    wrong = reward_parts(other, scenario)
    assert wrong.answer == 0.0 and wrong.guessed == 1.0
    # a count the server has to hold is its own evidence: any search that finds it will do
    two = check_named_arguments(
        Reference(answer="2", calls=[search], needs_calls=True), task, writes=()
    )
    assert two.calls[0].match is None
    for answer in ("yes", "No", "false", "0", "0.0"):
        assert guessable(answer), answer
    for answer in ("2", "0.5", "not yet", "Lisbon"):
        assert not guessable(answer), answer
    # whole words only: "art" is not named by "a party"
    assert named_arguments("Notes from a party", {"query": "art"}) == []


def test_reference_answers_numbers_and_text():
    ref = Reference(answer="42.1648128", tolerance=0.001)
    assert answer_matches("About 42.16 km.", ref)
    assert not answer_matches("About 41 km.", ref)
    assert answer_matches("Total: 1,512 bottles", Reference(answer="1512"))
    assert answer_matches("It was Mary Shelley.", Reference(answer="Mary Shelley"))
    assert not answer_matches("It was Percy Shelley.", Reference(answer="Mary Shelley"))
    assert not answer_matches(None, ref)
    assert not answer_matches("It was Ben Oder.", Reference(answer="Ben Ode"))  # whole words


def test_a_text_answer_that_also_names_a_rival_from_the_results_is_wrong():
    """ "Ben Ode (Chloe Park)" named two authors of a git log and scored as Chloe Park's; a
    rival is another value of the field that holds the answer, in text or JSON results."""
    log = "\n\n".join(f"Commit: {i}\nAuthor: {who}\nMessage: {what}" for i, (who, what) in
                       enumerate([("Ben Ode", "Add soup"), ("Chloe Park", "Add curry"),
                                  ("Ben Ode Jr", "Add tea")]))  # fmt: skip
    ref = Reference(answer="Chloe Park", calls=[ReferenceCall(tool="git_log", result=log)])
    assert answer_matches("Chloe Park", ref)
    assert answer_matches("The author of Add curry is Chloe Park.", ref)  # other fields: fine
    assert not answer_matches("Ben Ode (Chloe Park)", ref)
    assert not answer_matches("Chloe Park or Ben Ode Jr", ref)
    # a value that contains the answer, or that it contains, is no rival
    ben = Reference(answer="Ben Ode", calls=[ReferenceCall(tool="git_log", result=log)])
    assert answer_matches("Ben Ode", ben) and not answer_matches("Ben Ode, Chloe Park", ben)
    rows = json.dumps([{"title": "Emma", "author": "Jane Austen"},
                       {"title": "Dracula", "author": "Bram Stoker"}])  # fmt: skip
    emma = Reference(answer="Emma", calls=[ReferenceCall(tool="search", result=rows)])
    assert answer_matches("Emma, by Jane Austen", emma)
    assert not answer_matches("Emma or Dracula", emma)
    # no results to read: as before
    assert answer_matches("Ben Ode (Chloe Park)", Reference(answer="Chloe Park"))


@pytest.mark.parametrize(
    "answer, expected, right",
    [
        ("True", "yes", True),  # what a model whose tools speak JSON says
        ("Yes, the table has it.", "yes", True),
        ("false", "no", True),
        ("There is no such column.", "no", True),
        ("Yes, or no.", "yes", False),  # both: not an answer
        ("The column is not there.", "no", False),  # "not" says neither
        ("Notebook", "no", False),  # nor does a word that starts with one
        ("I see eyes", "yes", False),
        ("no", "yes", False),
    ],
)
def test_a_yes_or_no_is_read_as_such(answer, expected, right):
    assert answer_matches(answer, Reference(answer=expected)) is right


def test_a_number_is_right_only_to_the_precision_its_reference_is_written_in():
    """A 1% tolerance took 75.5 for an average of 75 and anything from 58459 to 59639 for
    59049; the check now reads the reference as written."""
    assert not answer_matches("The average is 75.5.", Reference(answer="75"))
    assert answer_matches("The average is 75.", Reference(answer="75"))
    assert answer_matches("75.0", Reference(answer="75"))
    assert not answer_matches("58500", Reference(answer="59049"))
    # a decimal: half a unit of its last place, so the tool's unrounded result is right
    assert answer_matches("32.885424", Reference(answer="32.8854"))
    assert answer_matches("63.666666666666664", Reference(answer="63.6667"))
    assert not answer_matches("32.89", Reference(answer="32.8854"))
    # a tolerance the scenario names is relative, as it says
    assert answer_matches("32.89", Reference(answer="32.8854", tolerance=0.001))


def test_reference_calls_match_with_tolerance():
    t = Trajectory(
        messages=[
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [call("multiply", {"a": 6.0, "b": 7})],
            }
        ]
    )
    ref = Reference(
        calls=[
            ReferenceCall(tool="multiply", arguments={"a": 6, "b": 7}),
            ReferenceCall(tool="add", arguments={"a": 42, "b": 1}),
        ]
    )
    assert calls_matched(t, ref) == 0.5
    assert calls_matched(t, ref, tool_only=0.5) == 0.5  # no add call: nothing more
    t.messages[0]["tool_calls"].append(call("add", {"a": 40, "b": 1}))
    assert calls_matched(t, ref, tool_only=0.5) == 0.75  # add, other numbers: half a call
    for name in ("subtract", "divide"):  # calling tools beyond the reference's count
        t.messages[0]["tool_calls"].append(call(name, {"a": 1, "b": 1}))
    assert calls_matched(t, ref, tool_only=0.5) == 0.5  # ... earns no tool-only credit


@pytest.mark.slow
async def test_a_real_rollout_with_the_tiny_model_records_the_served_tokens(
    calculator, policy_server
):
    import openai

    client = openai.AsyncOpenAI(base_url=policy_server.base_url, api_key=policy_server.api_key)
    returned = []
    create = client.chat.completions.create

    async def recording(**kwargs):
        response = await create(**kwargs)
        returned.append(response)
        return response

    client.chat.completions.create = recording
    model = Model(name="smollm2-135m", base_url=policy_server.base_url)
    config = RolloutConfig(max_turns=2, max_tokens=64, seed=0)
    async with client:
        t = await rollout(model, SCENARIO, calculator, config, client=client)
    assert 1 <= t.metrics["turns"] <= 2 and t.trainable
    for choice, response in zip(t.choices, returned, strict=True):
        extra = response.choices[0].model_extra
        assert choice.token_ids == extra["token_ids"]
        assert choice.prompt_token_ids == extra["prompt_token_ids"]
        assert choice.logprobs == extra["mcprl"]["model_logprobs"]
    # every turn was a call of an offered tool (tool_choice "required" is enforced)
    assert all(m.get("tool_calls") for m in t.messages if m["role"] == "assistant")
    # each turn's prompt goes on from the tokens the model saw and sampled before: one sequence
    assert t.metrics["turns"] == 2
    first, second = t.choices
    seen = first.prompt_token_ids + first.token_ids
    assert second.prompt_token_ids[: len(seen)] == seen


async def test_rewards_mix_ruler_and_references_and_judge_failures_are_not_zeros(calculator):
    from ruler import Judge, JudgeAPIError
    from tests.helpers import ScriptedJudge, scores_reply

    def attempt(answer):
        policy = ScriptedPolicy(reply(call("complete_task", {"summary": f"It is {answer}"})))
        return lambda: rollout(MODEL, SCENARIO, calculator, client=policy)

    judge = Judge(
        "test/judge", completion_fn=ScriptedJudge(scores_reply({"1": 0.8, "2": 0.4})), cache=False
    )
    mix = scorer({"mul": SCENARIO}, judge=judge, reference_weight=1.0, ruler_weight=1.0)
    (group,) = await gather_groups([[attempt(42), attempt(41)]], after_each=mix, progress=False)
    by_answer = {t.final_answer(): t for t in group.trajectories}
    assert by_answer["It is 42"].metrics["reward_reference"] == 1.0
    rewards = sorted(t.reward for t in group.trajectories)
    assert rewards in ([0.2, 0.9], [0.4, 0.7])  # (ref + ruler) / 2, ids follow finish order

    refusing = Judge(
        "test/judge",
        cache=False,
        completion_fn=ScriptedJudge(JudgeAPIError("no", model="test/judge", status_code=401)),
    )
    only_ruler = scorer({"mul": SCENARIO}, judge=refusing, reference_weight=0, ruler_weight=1)
    with pytest.raises(JudgeAPIError):
        await gather_groups([[attempt(42), attempt(41)]], after_each=only_ruler, progress=False)
    dropping = scorer(
        {"mul": SCENARIO},
        judge=refusing,
        reference_weight=0,
        ruler_weight=1,
        drop_failed_groups=True,
    )
    kept = await gather_groups([[attempt(42), attempt(41)]], after_each=dropping, progress=False)
    assert kept == []


@pytest.mark.anyio
async def test_trainable_model_handles(tmp_path):
    from mcprl import TrainableModel
    from tests.fakes import FakeBackend

    with pytest.raises(ValueError, match="letters, digits"):
        TrainableModel(name="bad name/../x")
    model = TrainableModel(name="agent", project="calc")
    with pytest.raises(RuntimeError, match="not registered with a backend"):
        await model.get_step()
    backend = FakeBackend(tmp_path, "http://127.0.0.1:1234/v1")
    await model.register(backend)
    assert await model.get_step() == 0 and model.served_name == "agent@0"
    await model.train([])
    assert await model.get_step() == 1 and model.get_inference_name() == "agent@1"
    assert str(model.openai_client().base_url) == "http://127.0.0.1:1234/v1/"


WHOAMI_SERVER = f"""
import os, sys
sys.path.insert(0, {str(EXAMPLES)!r})
from _compat import READS, make_server, serve
with open({{started!r}}, "a") as f:  # one line per process started
    f.write(str(os.getpid()) + "\\n")
server = make_server("whoami", "says which process answers")

@server.tool({{annotations}})
def {{name}}() -> str:
    \"\"\"The server's process id.\"\"\"
    return str(os.getpid())

serve(server)
"""


class _AskOnce(ScriptedPolicy):
    """Calls `whoami`, then completes: per conversation, so attempts may run at once."""

    async def create(self, **kwargs):
        self.requests.append(kwargs)
        if kwargs["messages"][-1]["role"] == "tool":
            return reply(call("complete_task", {"answer": "done"}))
        return reply(call(kwargs["tools"][0]["function"]["name"], {}))


class _ScriptedModel:
    """A model whose client is a policy double (for `collect_groups`); `_AskOnce` unless given."""

    served_name = "scripted"

    def __init__(self, policy: ScriptedPolicy | None = None):
        self.policy = policy

    def openai_client(self):
        policy = self.policy if self.policy is not None else _AskOnce()

        class _Client:
            async def __aenter__(self):
                return policy

            async def __aexit__(self, *exc):
                return None

        return _Client()


@pytest.mark.parametrize(
    ("name", "annotated", "reads"),
    [("whoami", True, True), ("get_pid", False, True), ("whoami", False, False)],
)
async def test_attempts_share_one_server_process_only_when_every_tool_only_reads(
    tmp_path, name, annotated, reads
):
    """Read-only by its annotation, or without one by a name that says it reads (`get_pid`);
    `whoami` with no annotation may write, as far as anyone can tell."""
    from mcprl.collect import collect_groups

    path, started = tmp_path / "whoami.py", tmp_path / "started.txt"
    annotations = "annotations=READS" if annotated else ""
    path.write_text(WHOAMI_SERVER.format(annotations=annotations, started=str(started), name=name))
    task = Scenario(id="w", task="Who answers?", difficulty=1)
    config = RolloutConfig(max_turns=2)

    async def collect(attempts: int, cfg: RolloutConfig = config):
        return await collect_groups(
            _ScriptedModel(), [task], f"{sys.executable} {path}", cfg,
            attempts=attempts, seed=0, max_concurrency=attempts, progress=False,
        )  # fmt: skip

    def processes() -> int:
        return len(started.read_text().split())

    groups = await collect(3)
    pids = {t.messages[3]["content"] for t in groups[0].trajectories}
    assert len(groups[0].trajectories) == 3
    assert len(pids) == (1 if reads else 3)
    # the tools are listed once per collection where they are shared, and once per server
    # (not per collection) where they are not: a writing server starts one process per attempt
    assert processes() == (1 if reads else 4)
    await collect(2)
    assert processes() == (2 if reads else 6)
    if reads:  # and a user can ask for a process per attempt anyway
        groups = await collect(2, config.model_copy(update={"share_session": "never"}))
        assert len({t.messages[3]["content"] for t in groups[0].trajectories}) == 2


async def test_attempts_share_one_server_process_when_the_tools_that_write_are_not_offered(
    tmp_path,
):
    """A server with a tool that may write (git's `git_commit` beside its `git_log`): attempts
    share one process once that tool is hidden from the agent, since no attempt can call it."""
    from mcprl.collect import collect_groups

    path, started = tmp_path / "whoami.py", tmp_path / "started.txt"
    source = WHOAMI_SERVER.format(annotations="", started=str(started), name="get_pid")
    writer = '@server.tool()\ndef reset_pid() -> str:\n    """Forget the pid."""\n    return "ok"\n'
    path.write_text(source.replace("serve(server)", writer + "\nserve(server)"))
    task = Scenario(id="w", task="Who answers?", difficulty=1)

    async def pids(hidden: list[str]) -> set[str]:
        groups = await collect_groups(
            _ScriptedModel(), [task], f"{sys.executable} {path}",
            RolloutConfig(max_turns=2, hidden_tools=hidden),
            attempts=3, seed=0, max_concurrency=3, progress=False,
        )  # fmt: skip
        return {t.messages[3]["content"] for t in groups[0].trajectories}

    assert len(await pids([])) == 3  # the agent may call reset_pid: a process per attempt
    assert len(await pids(["reset_pid"])) == 1


async def test_an_endpoint_that_rejects_allowed_tools_gets_an_error_naming_the_switch(
    calculator,
):
    import httpx
    import openai

    from mcprl.errors import PreflightError

    class Rejects(ScriptedPolicy):
        async def create(self, **kwargs):
            self.requests.append(kwargs)
            if isinstance(kwargs["tool_choice"], dict):
                request = httpx.Request("POST", "http://127.0.0.1:9/v1/chat/completions")
                response = httpx.Response(400, request=request)
                raise openai.BadRequestError(
                    "tool_choice: unknown type", response=response, body=None
                )
            return reply(call("complete_task", {"answer": 42}))

    with pytest.raises(PreflightError, match=r"`rollout\.look_before_answer=False`"):
        await rollout(MODEL, SCENARIO, calculator, RolloutConfig(max_turns=2), client=Rejects())
    config = RolloutConfig(max_turns=2, look_before_answer=False)
    t = await rollout(MODEL, SCENARIO, calculator, config, client=Rejects())
    assert t.metrics["completed"] == 1


async def test_attempts_sharing_a_trainable_models_client_leave_it_open(tmp_path):
    """ART's loop calls `rollout(model, ...)` on a TrainableModel, whose `openai_client()` is
    shared: the first attempt to end must not close it under the others (it did, and the rest
    failed with APIConnectionError)."""
    import threading
    import time

    from mcprl import TrainableModel
    from tests.fakes import FakeBackend

    arrivals = count()
    lock = threading.Lock()

    def respond(body):
        with lock:
            k = next(arrivals)
        time.sleep(0.05 * k)  # attempts end one after another, the others still waiting
        return 200, chat_completion("The answer is 42.", body["model"])

    with LocalChatServer(respond) as chat:
        model = TrainableModel(name="agent", project="p")
        await model.register(FakeBackend(tmp_path, chat.base_url))
        done = []

        async def attempt() -> None:
            done.append(await rollout(model, SCENARIO, None))

        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(attempt)
        client = model.openai_client()
        assert len(done) == 4 and all(t.messages[-1]["role"] == "assistant" for t in done)
        assert not client.is_closed()
        # a plain model's client is the attempt's own, and closed with it
        plain = Model(name="agent@0", base_url=chat.base_url, api_key="x")
        trajectory = await rollout(plain, SCENARIO, None)
        assert "42" in trajectory.messages[-1]["content"]


async def test_a_pinned_call_gets_the_tokens_to_be_written_whole(calculator):
    """A demonstration's pinned call longer than `max_tokens` is asked for with room enough
    (cut short, it would be no call at all); the model's own turns keep `max_tokens`."""
    long = {"a": 1.0 + 1e-12, "b": 2.0 + 1e-12}  # written out, longer than the 8 tokens below
    policy = ScriptedPolicy(reply(call("add", long)), reply(call("complete_task", {"answer": 3})))
    config = RolloutConfig(first_tool="add", first_arguments=long, max_tokens=8)
    await rollout(MODEL, SCENARIO, calculator, config, client=policy)
    first, second = policy.requests
    assert first["max_tokens"] >= len(json.dumps(long)) and second["max_tokens"] == 8


async def test_worked_examples_open_every_request_and_are_not_the_attempts_own(calculator):
    chain = [("add", {"a": 2, "b": 3}, "5"), ("multiply", {"a": 5, "b": 4}, "20")]
    scenarios = [solved_scenario("one", chain[:1], "5"), solved_scenario("two", chain, "20")]
    config = RolloutConfig()
    async with open_session(calculator) as session:
        shown = await solve_examples(scenarios, session, config)
    roles = [m["role"] for m in shown]
    assert roles == ["user", *["assistant", "tool"] * 2, "user", *["assistant", "tool"] * 3]
    assert shown[0]["content"].startswith("Please complete this task: Task one?")
    assert "You have 2 turns" in shown[0]["content"]  # as that task's attempt is told
    assert shown[2]["content"] == '{"result": 5.0}'  # live, as an attempt's result reads
    answer = shown[3]["tool_calls"][0]["function"]
    assert answer["name"] == "complete_task" and json.loads(answer["arguments"]) == {"answer": 5}
    policy = ScriptedPolicy(
        reply(call("multiply", {"a": 6, "b": 7})),
        reply(call("complete_task", {"answer": 42})),
    )
    config = config.model_copy(update={"example_messages": shown})
    t = await rollout(MODEL, SCENARIO, calculator, config, client=policy)
    for request in policy.requests:  # every turn's prompt opens with them
        sent = request["messages"]
        assert sent[0]["role"] == "system" and sent[1 : 1 + len(shown)] == shown
        assert sent[1 + len(shown) :] == t.messages[1 : len(sent) - len(shown)]
    assert [m["role"] for m in t.messages] == ["system", "user", *["assistant", "tool"] * 2]
    assert t.metadata["worked_examples"] == 2 and t.choices[0].message_index == 2
    assert reference_reward(t, SCENARIO) == 1.0  # the examples' calls are not the attempt's


async def test_a_task_opens_with_its_own_worked_examples_where_each_task_has_some(calculator):
    chain = [("add", {"a": 2, "b": 3}, "5")]
    async with open_session(calculator) as session:
        shown = await solve_examples([solved_scenario("one", chain, "5")], session, RolloutConfig())
    config = RolloutConfig(examples=1, example_choice="similar", worked_examples={"one": shown},
                           examples_by_task={SCENARIO.id: ["one"]})  # fmt: skip
    for scenario, opens_with, examples in [
        (SCENARIO, shown, 1),
        (SCENARIO.model_copy(update={"id": "made-later"}), [], 0),  # none for a task it lacks
    ]:
        policy = ScriptedPolicy(reply(call("complete_task", {"answer": 42})))
        t = await rollout(MODEL, scenario, calculator, config, client=policy)
        sent = policy.requests[0]["messages"]
        assert sent[1 : 1 + len(opens_with)] == opens_with
        assert sent[1 + len(opens_with)]["content"].startswith("Please complete this task:")
        assert t.metadata.get("worked_examples", 0) == examples


async def test_a_replacement_group_starts_as_soon_as_a_group_ties_beside_slower_ones():
    slow_may_finish = anyio.Event()

    def attempt(sid: str, wait: anyio.Event | None = None, reward: float = 0.0):
        async def run():
            if wait is not None:
                await wait.wait()
            return Trajectory(reward=reward, metadata={"scenario_id": sid})

        return run

    async def stand_in():
        slow_may_finish.set()  # the slow group ends only once its replacement has run
        return Trajectory(reward=1.0, metadata={"scenario_id": "stand-in"})

    offered: list[str | None] = []

    def more(group):
        offered.append(group.scenario_id if group is not None else None)
        if group is not None and group.scenario_id == "tied":
            return [stand_in, attempt("stand-in", reward=0.0)]
        return None

    slow = [attempt("slow", slow_may_finish, 1.0), attempt("slow", reward=0.0)]
    tied = [attempt("tied"), attempt("tied")]
    with anyio.fail_after(10):  # a replacement that waited for the slow group would hang
        groups = await gather_groups([slow, tied], more=more, progress=False)
    assert [g.scenario_id for g in groups] == ["slow", "tied", "stand-in"]
    assert offered == ["tied", "stand-in", "slow"]


async def test_reserve_scenarios_get_the_seeds_of_their_place_in_the_order(calculator):
    """Which group ties first decides when a stand-in starts, never which seeds it gets."""
    from mcprl.collect import collect_groups

    class Answers(ScriptedPolicy):
        async def create(self, **kwargs):
            asked = next(m["content"] for m in kwargs["messages"] if m["role"] == "user")
            task = next(t.task for t in tasks if t.task in asked)
            self.requests.append((task, kwargs["seed"]))  # the first turn's seed is the attempt's
            return reply(call("complete_task", {"answer": "1"}))

    policy = Answers()
    model = _ScriptedModel(policy)
    tasks = [Scenario(id=f"s{i}", task=f"Task number {i}.", difficulty=1) for i in range(4)]
    groups = await collect_groups(
        model, tasks[:2], calculator, RolloutConfig(max_turns=1), attempts=2, seed=5000,
        max_concurrency=4, progress=False, reserve=tasks[2:],
        replace=lambda group: group is not None and group.scenario_id == "s1",
    )  # fmt: skip
    assert [g.scenario_id for g in groups] == ["s0", "s1", "s2"]  # s2 stood in for s1; no s3
    assert set(policy.requests) == {
        (f"Task number {i}.", 5000 + (2 * i + a) * 1000) for i in range(3) for a in (0, 1)
    }
