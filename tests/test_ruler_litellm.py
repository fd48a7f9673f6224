"""RULER through LiteLLM: its mock-response path, and a real HTTP endpoint on 127.0.0.1."""

from __future__ import annotations

import json
import random

import pytest

from ruler import Judge, JudgeAPIError, RetryPolicy, score_group
from tests.helpers import LocalChatServer, chat_completion, judge_ids, scores_reply

pytestmark = pytest.mark.anyio


def attempt(answer: str) -> list[dict]:
    return [
        {"role": "system", "content": "You answer arithmetic questions."},
        {"role": "user", "content": "What is 6 times 7?"},
        {"role": "assistant", "content": answer},
    ]


async def test_litellm_mock_response_path_gives_scores_usage_and_cost():
    reply = scores_reply({"1": 0.95, "2": 0.05}, order=["2", "1"])
    result = await score_group(
        [attempt("42"), attempt("41")],
        judge="openai/gpt-4o-mini",
        extra_params={"mock_response": reply},
        cache=False,
        shuffle=False,  # the scripted reply names the attempts by their place
    )
    assert result.rewards == [0.95, 0.05]
    assert result.usage.judge_calls == 1 and result.usage.total_tokens > 0
    assert result.usage.cost_usd is not None and result.usage.cost_usd > 0


def _shuffled_judge(rng: random.Random):
    """A judge endpoint that prefers the answer 42 and lists ids in a random order."""

    def respond(body: dict) -> tuple[int, dict]:
        text = body["messages"][1]["content"]
        ids = judge_ids(body["messages"])
        scores = {}
        for tid in ids:
            part = text.split(f'id="{tid}">', 1)[1].split("</trajectory_", 1)[0]
            scores[tid] = 1.0 if '"42"' in part else 0.25
        order = ids[:]
        rng.shuffle(order)
        return 200, chat_completion(scores_reply(scores, order=order))

    return respond


async def test_real_http_endpoint_with_shuffled_ids():
    rng = random.Random(3)
    answers = ["41", "42", "40", "43", "42 is wrong, 44"]
    group = [attempt(a) for a in answers]
    with LocalChatServer(_shuffled_judge(rng)) as server:
        judge = Judge("openai/local-judge", api_base=server.base_url, api_key="local", cache=False)
        for _ in range(3):  # three different shuffles, same verdict
            result = await judge.score(group)
            assert result.rewards == [0.25, 1.0, 0.25, 0.25, 0.25]
    body = server.requests[0]
    assert body["model"] == "local-judge"
    assert body["response_format"]["type"] == "json_schema"
    assert len({json.dumps(r["messages"]) for r in server.requests}) == 1
    assert result.usage.prompt_tokens == 100 and result.usage.completion_tokens == 20


async def test_real_http_endpoint_5xx_is_retried():
    state = {"n": 0}
    ok = _shuffled_judge(random.Random(0))

    def flaky(body: dict) -> tuple[int, dict]:
        state["n"] += 1
        if state["n"] == 1:
            return 503, {"error": {"message": "overloaded", "type": "server_error"}}
        return ok(body)

    with LocalChatServer(flaky) as server:
        judge = Judge(
            "openai/local-judge",
            api_base=server.base_url,
            api_key="local",
            cache=False,
            retry=RetryPolicy(initial_delay=0.01),
        )
        result = await judge.score([attempt("42"), attempt("41")])
    assert result.rewards == [1.0, 0.25]
    assert state["n"] == 2


async def test_real_http_endpoint_auth_failure_is_not_retried():
    def deny(body: dict) -> tuple[int, dict]:
        return 401, {"error": {"message": "invalid api key", "type": "invalid_request_error"}}

    with LocalChatServer(deny) as server:
        judge = Judge(
            "openai/local-judge",
            api_base=server.base_url,
            api_key="wrong",
            cache=False,
        )
        with pytest.raises(JudgeAPIError) as info:
            await judge.score([attempt("42"), attempt("41")])
    assert info.value.status_code == 401
    assert len(server.requests) == 1
    assert "openai/local-judge" in str(info.value) and "API key" in str(info.value)


async def test_unreachable_endpoint_raises_after_retries():
    judge = Judge(
        "openai/local-judge",
        api_base="http://127.0.0.1:9/v1",
        api_key="local",
        cache=False,
        retry=RetryPolicy(max_attempts=2, initial_delay=0.01),
    )
    with pytest.raises(JudgeAPIError, match="after 2 attempts"):
        await judge.score([attempt("42"), attempt("41")])


async def test_a_local_endpoint_needs_no_api_key():
    with LocalChatServer(_shuffled_judge(random.Random(1))) as server:
        judge = Judge("openai/local-judge", api_base=server.base_url, cache=False)
        result = await judge.score([attempt("42"), attempt("41")])
    assert result.rewards == [1.0, 0.25]


async def test_a_failing_endpoint_is_tried_exactly_as_often_as_the_retry_policy_says():
    def broken(body: dict) -> tuple[int, dict]:
        return 500, {"error": {"message": "boom", "type": "server_error"}}

    with LocalChatServer(broken) as server:
        judge = Judge(
            "openai/local-judge",
            api_base=server.base_url,
            cache=False,
            retry=RetryPolicy(max_attempts=3, initial_delay=0.01),
        )  # no extra_params: LiteLLM's and the OpenAI client's own retries must be off
        for _ in range(2):
            with pytest.raises(JudgeAPIError, match="after 3 attempts"):
                await judge.score([attempt("42"), attempt("41")])
    assert len(server.requests) == 6  # 3 per group, not 3 × the libraries' retries


def test_the_prompt_budget_follows_the_judges_context_window_where_litellm_knows_it():
    assert Judge("ollama_chat/llama3").max_prompt_chars == int(8192 * 0.8 * 3)
    assert Judge("ollama/llama2").max_prompt_chars == int(4096 * 0.8 * 3)
    assert Judge("hosted_vllm/my-own-model").max_prompt_chars == 120_000  # unknown: the default
    assert Judge("openai/gpt-4.1-mini").max_prompt_chars == 120_000  # larger: capped
    assert Judge("ollama/llama3", max_prompt_chars=5000).max_prompt_chars == 5000


async def test_a_price_given_for_an_unpriced_judge_counts_its_cost():
    reply = scores_reply({"1": 0.9, "2": 0.1})
    result = await score_group(
        [attempt("42"), attempt("41")],
        judge="openai/my-local-judge",
        extra_params={"mock_response": reply},
        cache=False,
        price=(1.0, 4.0),
    )
    usage = result.usage
    expected = (usage.prompt_tokens * 1.0 + usage.completion_tokens * 4.0) / 1e6
    assert usage.total_tokens > 0 and usage.cost_usd == pytest.approx(expected)
