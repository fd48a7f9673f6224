"""The judge stand-in of benchmarks/judge_standin.py, through `ruler` as a real judge is."""

from __future__ import annotations

import json

import pytest

from benchmarks.judge_standin import StandinJudge, serve
from mcprl.scenarios import Reference, ReferenceCall, Scenario, ScenarioSet
from ruler import Judge

pytestmark = pytest.mark.anyio

MULTIPLY = ReferenceCall(tool="multiply", arguments={"a": 6, "b": 7})
TASK = Scenario(id="mul", task="What is 6 times 7?", difficulty=1,
                reference=Reference(answer="42", calls=[MULTIPLY]))  # fmt: skip


def _attempt(tool: str, answer: str) -> list[dict]:
    def call(name: str, args: dict) -> dict:
        return {"id": name, "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)}}  # fmt: skip

    return [
        {"role": "user", "content": f"Please complete this task: {TASK.task}\n\nUse the tools."},
        {"role": "assistant", "content": None, "tool_calls": [call(tool, {"a": 6, "b": 7})]},
        {"role": "tool", "tool_call_id": tool, "content": "42" if tool == "multiply" else "13"},
        {"role": "assistant", "content": None,
         "tool_calls": [call("complete_task", {"answer": answer})]},
    ]  # fmt: skip


async def test_the_stand_in_scores_right_answers_progress_and_nothing_apart():
    judge = StandinJudge(ScenarioSet([TASK]), error_rate=0.0)
    server, url = serve(judge)
    try:
        ruler = Judge("openai/standin", api_base=url, api_key="x", cache=False)
        attempts = [_attempt("multiply", "42"), _attempt("multiply", "41"), _attempt("add", "13")]
        result = await ruler.score(attempts)
        assert [s.score for s in result.scores] == [0.95, 0.30, 0.05]
        assert judge.stats["right"] == 1 and judge.stats["progress"] == 1

        judge.error_rate = 1.0  # every score drawn at random, the same for the same prompt
        first = [s.score for s in (await ruler.score(attempts)).scores]
        again = [s.score for s in (await ruler.score(attempts)).scores]
        assert first == again and judge.stats["random"] == 6
    finally:
        server.shutdown()


@pytest.mark.parametrize("model", ["hosted_vllm/standin", "ollama_chat/standin"])
async def test_open_judges_served_by_vllm_or_ollama_score_through_litellm(model):
    """The stand-in speaks vLLM's OpenAI API and Ollama's /api/chat: LiteLLM reaches both."""
    judge = StandinJudge(ScenarioSet([TASK]), error_rate=0.0)
    server, url = serve(judge)
    try:
        api_base = url.removesuffix("/v1") if model.startswith("ollama") else url
        ruler = Judge(model, api_base=api_base, cache=False)
        attempts = [_attempt("add", "13"), _attempt("multiply", "42")]
        result = await ruler.score(attempts)
        assert [s.score for s in result.scores] == [0.05, 0.95]
        assert result.usage.total_tokens > 0 and ruler.spent.judge_calls == 1
    finally:
        server.shutdown()
