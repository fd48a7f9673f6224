"""Token data in two dialects (mcprl's server and vLLM), asked for by rollouts of a trainable
model, and a run that stops before any work when its policy's endpoint gives none."""

from __future__ import annotations

import pytest
from openai.types.chat import ChatCompletion

from mcprl.model import Model, TrainableModel
from mcprl.rollout import RolloutConfig, rollout
from mcprl.scenarios import Reference, Scenario
from mcprl.tokens import TokenDataError, check_token_data, read_choice
from tests.fakes import FakeBackend
from tests.helpers import LocalChatServer, chat_completion, load_example

pytestmark = pytest.mark.anyio


def _vllm_reply(*, token_ids: bool) -> dict:
    """A chat completion as vLLM returns it with logprobs, return_tokens_as_token_ids and (if
    `token_ids`) return_token_ids: the prompt's ids at the top level."""
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": "OK."},
        "finish_reason": "stop",
        "logprobs": {
            "content": [
                {"token": "token_id:11", "logprob": -0.25, "bytes": [79, 75], "top_logprobs": []},
                {"token": "token_id:13", "logprob": -1.5, "bytes": [46], "top_logprobs": []},
            ]
        },
    }
    if token_ids:
        choice["token_ids"] = [11, 13]
    return {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [choice], "prompt_token_ids": [1, 2, 3],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }  # fmt: skip


@pytest.mark.parametrize("token_ids", [True, False])
def test_a_vllm_reply_is_read_into_trainable_token_data(token_ids):
    response = ChatCompletion.model_validate(_vllm_reply(token_ids=token_ids))
    choice = read_choice(response.choices[0], response, 3)
    assert choice.prompt_token_ids == [1, 2, 3]  # top level, where vLLM puts it
    assert choice.token_ids == [11, 13]  # given, or read from the tokens spelled token_id:N
    assert choice.sampling_logprobs == choice.logprobs == [-0.25, -1.5]
    assert (choice.message_index, choice.finish_reason) == (3, "stop")


def test_an_mcprl_reply_is_read_too():
    body = chat_completion("OK.")
    body["choices"][0] |= {
        "token_ids": [5], "prompt_token_ids": [1, 2],
        "mcprl": {"token_logprobs": [-0.1], "model_logprobs": [-0.3]},
    }  # fmt: skip
    response = ChatCompletion.model_validate(body)
    choice = read_choice(response.choices[0], response, 1)
    assert (choice.prompt_token_ids, choice.token_ids) == ([1, 2], [5])
    assert (choice.sampling_logprobs, choice.logprobs) == ([-0.1], [-0.3])


async def test_an_endpoint_without_token_data_is_named_before_any_work():
    from openai import AsyncOpenAI

    with LocalChatServer(lambda body: (200, chat_completion("OK"))) as plain:
        client = AsyncOpenAI(base_url=plain.base_url, api_key="x")
        with pytest.raises(TokenDataError) as info:
            await check_token_data(client, "agent@0")
        await client.close()
    (request,) = plain.requests
    assert request["return_token_ids"] is True and request["logprobs"] is True
    assert request["return_tokens_as_token_ids"] is True
    message = str(info.value)
    assert "'agent@0' returned no prompt token ids, no completion token ids, no log-prob" in message
    assert "vLLM" in message


async def test_vllm_replies_pass_the_check():
    from openai import AsyncOpenAI

    with LocalChatServer(lambda body: (200, _vllm_reply(token_ids=True))) as vllm:
        client = AsyncOpenAI(base_url=vllm.base_url, api_key="x")
        await check_token_data(client, "agent@0")
        await client.close()


async def test_only_a_trainable_models_rollouts_ask_for_token_data(tmp_path):
    def finish(body: dict) -> tuple[int, dict]:
        call = {"id": "c1", "type": "function",
                "function": {"name": "complete_task", "arguments": '{"answer": 5}'}}  # fmt: skip
        reply = _vllm_reply(token_ids=True)
        reply["choices"][0]["message"] = {"role": "assistant", "content": None,
                                          "tool_calls": [call]}  # fmt: skip
        return 200, reply

    scenario = Scenario(id="s", task="Add 2 and 3.", difficulty=1, reference=Reference(answer="5"))
    server = load_example("calculator").server
    config = RolloutConfig(max_turns=1)
    with LocalChatServer(finish) as policy:
        trainable = await TrainableModel(name="agent").register(
            FakeBackend(tmp_path, policy.base_url)
        )
        trajectory = await rollout(trainable, scenario, server, config)
        plain = Model(name="baseline", base_url=policy.base_url)
        await rollout(plain, scenario, server, config)
    asked, not_asked = policy.requests
    assert asked["return_token_ids"] is True and asked["logprobs"] is True
    assert "return_token_ids" not in not_asked and "logprobs" not in not_asked
    assert trajectory.trainable  # the vLLM dialect was read
