"""The test-suite guard: no test can reach a remote LLM provider (or anything off this machine)."""

from __future__ import annotations

import socket

import pytest

from ruler import Judge, JudgeAPIError, RetryPolicy
from tests.conftest import RemoteCallBlocked


def test_connections_off_loopback_are_refused():
    with socket.socket() as s, pytest.raises(RemoteCallBlocked, match="only loopback"):
        s.connect(("93.184.216.34", 443))
    with pytest.raises(socket.gaierror, match="not loopback"):
        socket.getaddrinfo("api.openai.com", 443)


def test_loopback_stays_reachable():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        with socket.create_connection(server.getsockname(), timeout=5):
            pass


@pytest.mark.anyio
async def test_a_judge_call_to_a_remote_provider_fails_at_once():
    judge = Judge(
        "openai/gpt-4.1-mini",
        api_key="sk-test",
        cache=False,
        retry=RetryPolicy(max_attempts=1),
        extra_params={"max_retries": 0},
    )
    messages = [
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": x}] for x in ("a", "b")
    ]
    with pytest.raises(JudgeAPIError):
        await judge.score(messages)
