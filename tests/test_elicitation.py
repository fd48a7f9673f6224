"""A server's questions to the user during a call (MCP elicitation): answered by policy or by
a scenario's script, never left unanswered, and recorded where the agent and judge read."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from mcp import types as mcp_types

from mcprl import Model
from mcprl.mcp import Elicitations, open_session
from mcprl.rollout import RolloutConfig, rollout
from mcprl.scenarios import Scenario
from tests.helpers import LocalChatServer

pytestmark = pytest.mark.anyio

ASKS = f"{sys.executable} {Path(__file__).parent / 'servers' / 'asks.py'}"


def _form(message: str, schema: dict) -> mcp_types.ElicitRequestFormParams:
    return mcp_types.ElicitRequestFormParams(message=message, requested_schema=schema)


TIME = {"type": "object", "properties": {"time": {"type": "string", "default": "19:00"}}}
CONFIRM = {"type": "object", "properties": {"confirm": {"type": "boolean"}},
           "required": ["confirm"]}  # fmt: skip


async def test_the_policy_declines_accepts_defaults_or_follows_the_script():
    decline = Elicitations()
    assert (await decline(None, _form("When?", TIME))).action == "decline"
    defaults = Elicitations("accept-defaults")
    result = await defaults(None, _form("When?", TIME))
    assert (result.action, result.content) == ("accept", {"time": "19:00"})
    assert (await defaults(None, _form("Sure?", CONFIRM))).action == "decline"  # no default
    scripted = Elicitations("decline", [{"time": "12:30"}, {"action": "cancel"}])
    assert (await scripted(None, _form("When?", TIME))).content == {"time": "12:30"}
    assert (await scripted(None, _form("When?", TIME))).action == "cancel"
    assert (await scripted(None, _form("When?", TIME))).action == "decline"  # script used up
    url = mcp_types.ElicitRequestURLParams(message="Sign in", url="https://x.example/login",
                                           elicitation_id="e1")  # fmt: skip
    assert (await Elicitations("accept-defaults", [{"a": 1}])(None, url)).action == "decline"
    assert [s["action"] for s in scripted.seen] == ["accept", "cancel", "decline"]


async def test_a_real_server_gets_its_answer_and_the_result_says_what_was_asked():
    async with open_session(ASKS) as session:
        result = await session.call_tool("book_table", {"people": 4})
        assert "not booked" in result.text and "(decline)" in result.text
        assert [e["action"] for e in result.elicitations] == ["decline"]
        assert "What time should the table for 4 be?" in result.elicitations[0]["message"]
    async with open_session(ASKS, elicitation="accept-defaults") as session:
        result = await session.call_tool("book_table", {"people": 2})
        assert result.text.strip() == "booked a table for 2 at 19:00"
        assert result.elicitations[0]["content"] == {"time": "19:00"}
        again = await session.call_tool("cancel_booking", {"name": "Ada"})
        assert "kept the booking" in again.text  # a required answer with no default: declined


def _books(body: dict) -> tuple[int, dict]:
    """A policy that books a table for 3, then answers with the tool's text."""
    results = [m["content"] for m in body["messages"] if m["role"] == "tool"]
    name, args = (
        ("complete_task", {"answer": results[-1][:40]})
        if results
        else ("book_table", {"people": 3})
    )
    call = {"id": "c1", "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)}}  # fmt: skip
    choice = {
        "index": 0,
        "finish_reason": "tool_calls",
        "message": {"role": "assistant", "content": None, "tool_calls": [call]},
    }
    return 200, {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                 "choices": [choice]}  # fmt: skip


async def test_a_scenarios_scripted_answer_reaches_the_server_and_the_trajectory():
    scenario = Scenario(id="b", task="Book a table for 3.", difficulty=1,
                        elicitation=[{"time": "20:15"}])  # fmt: skip
    with LocalChatServer(_books) as policy:
        model = Model(name="m", base_url=policy.base_url, api_key="x")
        config = RolloutConfig(max_turns=2, look_before_answer=False)
        traj = await rollout(model, scenario, ASKS, config)
    tool_text = next(m["content"] for m in traj.messages if m["role"] == "tool")
    assert "booked a table for 3 at 20:15" in tool_text
    assert "[the server asked the user: 'What time should the table for 3 be?'" in tool_text
    assert traj.metadata["elicitations"][0]["tool"] == "book_table"
    assert traj.metadata["elicitations"][0]["content"] == {"time": "20:15"}
    assert traj.metrics["elicitations"] == 1.0


async def test_a_sampling_request_is_refused_at_once_or_answered_by_the_configured_model():
    from benchmarks.judge_standin import StandinJudge, serve
    from mcprl.mcp import Sampler
    from mcprl.scenarios import ScenarioSet

    async with open_session(ASKS) as session:
        result = await session.call_tool("summarize", {"text": "a long story"}, timeout=20)
        assert "no summary" in result.text and "Sampling not supported" in result.text
    standin, url = serve(StandinJudge(ScenarioSet([])))  # answers "OK" to any plain prompt
    try:
        sampler = Sampler("openai/standin", api_base=url)
        async with open_session(ASKS, sampling=sampler) as session:
            result = await session.call_tool("summarize", {"text": "a long story"}, timeout=20)
        assert result.text.strip() == "summary: OK"
        assert sampler.seen[0]["messages"] == [{"role": "user", "content": "a long story"}]
        broken = Sampler("openai/standin", api_base="http://127.0.0.1:9/v1")
        broken.llm.retry.max_attempts = 1
        async with open_session(ASKS, sampling=broken) as session:
            result = await session.call_tool("summarize", {"text": "x"}, timeout=30)
        assert "the client's model failed" in result.text
    finally:
        standin.shutdown()
