"""OAuth 2.1 against a local protected server (tests/servers/oauth_guarded.py): client
credentials for headless runs, `mcprl login` with the authorization-code flow, refresh of
expired tokens, the message when no token is at hand, and no secret written to disk."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import httpx2
import pytest

from mcprl.cli import main
from mcprl.mcp import OAuthClient, ServerSpec, TokenFile, open_session
from mcprl.scenarios import Reference, ReferenceCall, Scenario, ScenarioSet
from mcprl.train import TrainingRun
from tests.fakes import FakeBackend, scripted_config
from tests.helpers import LocalChatServer, free_port

SERVER = Path(__file__).parent / "servers" / "oauth_guarded.py"
SECRET = "s3cret"


def _start(lifetime: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(SERVER), str(port), str(lifetime)],
                            stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 30
    while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
        assert proc.poll() is None and time.monotonic() < deadline, "the OAuth server did not start"
        time.sleep(0.05)
    return proc, f"http://127.0.0.1:{port}"


@pytest.fixture
def oauth_server(tmp_path, monkeypatch):
    """The protected calculator, its tokens valid for 2 s; logins kept under tmp_path."""
    monkeypatch.setenv("MCPRL_CONFIG_DIR", str(tmp_path / "config"))
    proc, base = _start(lifetime=2)
    try:
        yield base
    finally:
        proc.terminate()
        proc.wait(10)


def _stats(base: str) -> dict:
    with urllib.request.urlopen(f"{base}/stats") as r:
        return json.loads(r.read())


def test_client_credentials_from_the_command_line(oauth_server, monkeypatch, capsys):
    url = f"{oauth_server}/mcp"
    monkeypatch.setenv("MCPRL_OAUTH_CLIENT_SECRET", SECRET)
    assert main(["tools", url, "--oauth-client-id", "mcprl-ci"]) == 0
    out = capsys.readouterr()
    assert "add(" in out.out and SECRET not in out.out + out.err
    assert _stats(oauth_server)["client_credentials"] == 1
    assert not (Path(os.environ["MCPRL_CONFIG_DIR"]) / "tokens").exists()  # kept in memory

    monkeypatch.setenv("MCPRL_OAUTH_CLIENT_SECRET", "wrong")
    assert main(["tools", url, "--oauth-client-id", "mcprl-ci", "--timeout", "10"]) == 1
    err = capsys.readouterr().err
    assert "its OAuth authorization failed" in err and "--oauth-client-id" in err
    monkeypatch.delenv("MCPRL_OAUTH_CLIENT_SECRET")
    assert main(["tools", url, "--oauth-client-id", "mcprl-ci"]) == 2
    assert "set its secret in $MCPRL_OAUTH_CLIENT_SECRET" in capsys.readouterr().err


def test_without_a_token_the_run_stops_before_training_and_names_the_fix(oauth_server, capsys):
    url = f"{oauth_server}/mcp"
    code = main(["train", url, "--path", str(Path(os.environ["MCPRL_CONFIG_DIR"]) / "runs"), "-q"])
    err = capsys.readouterr().err
    assert code == 1
    assert "HTTP 401 Unauthorized" in err and f"`mcprl login {url}`" in err
    assert "--oauth-client-id" in err and "--header" in err
    assert "model" not in err.split("error:")[0]  # before the model loads


def _browser(opened: list[str]):
    """A user who approves at once: follows the authorization URL to the loopback redirect."""

    def open_url(url: str, *args, **kwargs) -> bool:
        opened.append(url)
        threading.Thread(target=lambda: httpx2.get(url, follow_redirects=True), daemon=True).start()
        return True

    return open_url


def test_login_keeps_refreshable_tokens_that_later_commands_send(oauth_server, monkeypatch, capsys):
    url = f"{oauth_server}/mcp"
    opened: list[str] = []
    monkeypatch.setattr("webbrowser.open", _browser(opened))
    assert main(["login", url, "--timeout", "30"]) == 0
    out = capsys.readouterr().out
    assert "Logged in to" in out and len(opened) == 1
    assert "code_challenge_method=S256" in opened[0] and "resource=" in opened[0]
    stored = TokenFile(url)
    assert stat.S_IMODE(stored.path.stat().st_mode) == 0o600
    assert stored.read()["tokens"]["refresh_token"]
    stats = _stats(oauth_server)
    assert stats["registered"] == 1 and stats["authorization_code"] == 1

    time.sleep(2.5)  # the access token expires: the next command refreshes it first
    assert main(["tools", url]) == 0
    assert "add(" in capsys.readouterr().out
    assert _stats(oauth_server)["refresh_token"] == 1

    assert main(["logout", url]) == 0
    assert not stored.path.exists()
    assert main(["tools", url, "--timeout", "10"]) == 1
    assert "mcprl login" in capsys.readouterr().err

    # a client registered beforehand: no registration, and its id in the authorization request
    assert main(["login", url, "--client-id", "pre-registered", "--timeout", "30"]) == 0
    assert "client_id=pre-registered" in opened[-1]
    assert _stats(oauth_server)["registered"] == 1  # still only the first login's
    assert TokenFile(url).read()["client_info"]["client_id"] == "pre-registered"


@pytest.mark.anyio
async def test_an_expired_token_is_replaced_mid_session_without_losing_a_call(oauth_server):
    spec = ServerSpec.parse(f"{oauth_server}/mcp").with_oauth(
        OAuthClient(client_id="mcprl-ci", client_secret=SECRET)
    )
    async with open_session(spec) as session:
        assert (await session.call_tool("add", {"a": 1, "b": 2})).text.strip().endswith("3")
        time.sleep(2.5)
        result = await session.call_tool("add", {"a": 2, "b": 2})
        assert not result.is_error and "4" in result.text
    assert _stats(oauth_server)["client_credentials"] == 2


def _adds(body: dict) -> tuple[int, dict]:
    """A policy that calls add(2, 3), then answers with its result."""
    results = [m["content"] for m in body["messages"] if m["role"] == "tool"]
    if results:
        name, args = "complete_task", {"answer": json.loads(results[-1])["result"]}
    else:
        name, args = "add", {"a": 2, "b": 3}
    call = {"id": "c1", "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)}}  # fmt: skip
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": None, "tool_calls": [call]},
        "finish_reason": "tool_calls",
        "token_ids": [1, 2],
        "prompt_token_ids": [3],
        "mcprl": {"model_logprobs": [-0.5, -0.5], "token_logprobs": [-0.5, -0.5]},
    }
    return 200, {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
                 "choices": [choice]}  # fmt: skip


@pytest.mark.anyio
async def test_a_training_run_with_client_credentials_outlives_its_tokens(oauth_server, tmp_path):
    """Two steps against the protected server, a token lifetime apart: every attempt's calls
    go through (a new token replaces the expired one), and no secret reaches the run's files."""
    spec = (
        ServerSpec.parse(f"{oauth_server}/mcp")
        .with_oauth(OAuthClient(client_id="mcprl-ci", client_secret=SECRET))
        .with_headers({"X-Api-Key": "hdr-s3cret-value"})
    )
    call = ReferenceCall(tool="add", arguments={"a": 2, "b": 3})
    scenarios = ScenarioSet(
        [Scenario(id=f"t{i}", task=f"Task {i}: add 2 and 3.", difficulty=1, split="train",
                  reference=Reference(answer="5", calls=[call])) for i in range(3)]
        + [Scenario(id="v", task="Add 2 and 3.", difficulty=1, split="val",
                    reference=Reference(answer="5", calls=[call]))]
    )  # fmt: skip
    with LocalChatServer(_adds) as policy:
        backend = FakeBackend(tmp_path / "runs", policy.base_url)
        config = scripted_config(steps=2, groups_per_step=1, rollouts_per_group=2, oversample=1)
        run = TrainingRun(config, spec, backend, say=lambda _: None, progress=False)
        await run.prepare(scenarios)
        await run._step(_summary(run))
        time.sleep(2.5)  # every token the run holds expires
        await run._step(_summary(run))
    for groups in backend.trained:
        for t in groups[0].trajectories:
            assert t.metrics["tool_errors"] == 0 and t.reward == 1.0
    # the run's sessions share a token while it lasts: a new one after it expired, not per call
    assert 2 <= _stats(oauth_server)["client_credentials"] <= 3
    written = "".join(p.read_text(errors="replace") for p in (tmp_path / "runs").rglob("*")
                      if p.is_file())  # fmt: skip
    assert written and SECRET not in written and "hdr-s3cret-value" not in written


def _summary(run: TrainingRun):
    from mcprl.train import RunSummary

    return RunSummary(project="p", name="n", run_dir=str(run.run_dir), reward=run.reward.name,
                      judge=None, first_step=0, last_step=0, target_steps=2)  # fmt: skip
