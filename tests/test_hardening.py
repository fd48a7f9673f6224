"""What a hostile run folder, a hostile web page or a careless user must not be able to do."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

from mcprl.console import Console
from mcprl.errors import CheckpointError
from mcprl.training._trainer import load_optimizer_state, save_optimizer_state

# -- checkpoints never run code ----------------------------------------------------------------


def _trained_optimizer() -> torch.optim.Optimizer:
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(layer.parameters(), lr=1e-2, betas=(0.9, 0.99))
    for _ in range(2):
        layer(torch.randn(5, 4)).pow(2).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    return optimizer


def test_optimizer_state_round_trips_through_safetensors_and_json(tmp_path):
    optimizer = _trained_optimizer()
    save_optimizer_state(tmp_path, optimizer.state_dict(), updates=2)
    assert {p.name for p in tmp_path.iterdir()} == {"trainer_state.json", "optimizer.safetensors"}
    state, updates = load_optimizer_state(tmp_path)
    assert updates == 2
    fresh = torch.optim.AdamW(torch.nn.Linear(4, 3).parameters(), lr=1.0)
    fresh.load_state_dict(state)
    before, after = optimizer.state_dict(), fresh.state_dict()
    assert after["param_groups"][0]["lr"] == 1e-2 and list(after["param_groups"][0]["betas"]) == [
        0.9,
        0.99,
    ]
    for index, entry in before["state"].items():
        for key, value in entry.items():
            assert torch.equal(after["state"][index][key], value), key


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "pwned"))


def test_a_planted_pickle_in_a_checkpoint_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "ran.txt"
    checkpoint = tmp_path / "0001"
    checkpoint.mkdir()
    with (checkpoint / "trainer_state.pt").open("wb") as f:
        pickle.dump({"optimizer": _Payload(marker), "updates": 1}, f)
    with pytest.raises(CheckpointError, match="could run code"):
        load_optimizer_state(checkpoint)
    assert not marker.exists()


def test_an_old_plain_trainer_state_still_resumes(tmp_path):
    optimizer = _trained_optimizer()
    torch.save({"optimizer": optimizer.state_dict(), "updates": 3}, tmp_path / "trainer_state.pt")
    state, updates = load_optimizer_state(tmp_path)
    assert updates == 3 and set(state["state"]) == set(optimizer.state_dict()["state"])


def test_a_checkpoint_without_optimizer_state_names_the_fix(tmp_path):
    with pytest.raises(CheckpointError, match=r"no optimizer state.*delete that checkpoint"):
        load_optimizer_state(tmp_path)


# -- the model server: who may call, and with what --------------------------------------------

MODEL = "smollm2-135m"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def guarded(policy_server, tmp_path_factory):
    """A second app on the shared engine: a key, and adapters only from one directory."""
    from mcprl.serving import start_server

    allowed = tmp_path_factory.mktemp("allowed-adapters")
    with start_server(policy_server.engine, MODEL, api_key="k3y", adapter_dirs=[allowed]) as handle:
        handle.allowed = allowed
        yield handle


def _post(handle, path, body=None, *, key="k3y", headers=None, content=None):
    import httpx

    sent = {"authorization": f"Bearer {key}"} if key else {}
    sent |= headers or {}
    with httpx.Client(base_url=handle.base_url, timeout=60) as http:
        if content is not None:
            return http.post(path, content=content, headers=sent)
        return http.post(path, json=body, headers=sent)


def test_the_servers_a_run_starts_need_their_random_key(policy_server):
    assert len(policy_server.api_key) >= 32
    r = _post(policy_server, "/chat/completions", CHAT, key=None)
    assert r.status_code == 401
    r = _post(policy_server, "/chat/completions", CHAT, key="local")
    assert r.status_code == 401


@pytest.mark.parametrize(
    ("headers", "why"),
    [
        ({"host": "attacker.example:8000"}, "Host"),  # DNS rebinding
        ({"origin": "https://attacker.example"}, "cross-origin"),
        ({"sec-fetch-site": "cross-site"}, "cross-site"),
    ],
    ids=["wrong-host", "cross-origin", "cross-site"],
)
def test_browser_pages_and_rebound_names_are_refused(guarded, tmp_path, headers, why):
    body = {"lora_name": "evil", "lora_path": str(guarded.allowed)}
    for path, sent in (("/load_lora_adapter", body), ("/chat/completions", CHAT)):
        r = _post(guarded, path, sent, headers=headers)
        assert r.status_code == 403 and why in r.json()["error"]["message"]


def test_a_same_origin_request_is_served(guarded):
    origin = f"http://{guarded.host}:{guarded.port}"
    r = _post(guarded, "/chat/completions", CHAT, headers={"origin": origin})
    assert r.status_code == 200


def test_a_text_plain_simple_request_is_refused(guarded):
    import json

    r = _post(
        guarded,
        "/chat/completions",
        content=json.dumps(CHAT),
        headers={"content-type": "text/plain"},
    )
    assert r.status_code == 415 and "application/json" in r.json()["error"]["message"]


def test_adapters_load_only_from_allowed_directories(guarded, policy_server, tmp_path):
    outside = tmp_path / "adapter"
    outside.mkdir()
    (outside / "adapter_config.json").write_text("{}")
    r = _post(guarded, "/load_lora_adapter", {"lora_name": "x", "lora_path": str(outside)})
    assert r.status_code == 403 and "--allow-adapter-dir" in r.json()["error"]["message"]
    sneaky = str(guarded.allowed / ".." / outside.name)
    r = _post(guarded, "/load_lora_adapter", {"lora_name": "x", "lora_path": sneaky})
    assert r.status_code == 403


def test_a_directory_allowed_later_is_allowed_where_it_really_lies(guarded, tmp_path):
    real = tmp_path / "moved-run"
    real.mkdir()
    (real / "adapter_config.json").write_text("{}")
    link = guarded.allowed / "linked-run"  # under the allowed directory, but points outside
    link.symlink_to(real, target_is_directory=True)
    body = {"lora_name": "moved", "lora_path": str(link)}
    r = _post(guarded, "/load_lora_adapter", body)
    assert r.status_code == 403 and "--allow-adapter-dir" in r.json()["error"]["message"]
    guarded.allow_adapter_dir(link)  # what the local backend does for a run it was named
    r = _post(guarded, "/load_lora_adapter", body)
    assert r.status_code == 400 and "could not load the adapter" in r.json()["error"]["message"]
    sibling = tmp_path / "other"
    sibling.mkdir()
    (sibling / "adapter_config.json").write_text("{}")
    r = _post(guarded, "/load_lora_adapter", {"lora_name": "o", "lora_path": str(sibling)})
    assert r.status_code == 403  # only that directory, not its neighbours


def test_a_server_with_no_adapter_directory_loads_none(policy_server, tmp_path):
    from mcprl.serving import start_server

    with start_server(policy_server.engine, MODEL, api_key="k3y") as handle:
        r = _post(handle, "/load_lora_adapter", {"lora_name": "x", "lora_path": str(tmp_path)})
    assert r.status_code == 403 and "loads no adapters" in r.json()["error"]["message"]


def _raw_request(handle, head: bytes, body_parts, timeout: float = 30.0) -> bytes:
    import socket

    with socket.create_connection((handle.host, handle.port), timeout=timeout) as s:
        s.sendall(head)
        try:
            for part in body_parts:
                s.sendall(part)
        except OSError:  # the server answered and closed before reading it all
            pass
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
            if b"\r\n\r\n" in reply and b"}" in reply:
                break
        return reply


def test_a_huge_body_is_refused_before_it_is_read(guarded):
    size = 200 * 1024 * 1024
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{guarded.port}\r\n"
        f"Authorization: Bearer k3y\r\nContent-Type: application/json\r\n"
        f"Content-Length: {size}\r\n\r\n"
    ).encode()
    # only 1 MB is ever sent: a server that read the whole body would wait for the rest
    reply = _raw_request(guarded, head, [b" " * (1024 * 1024)])
    assert reply.startswith(b"HTTP/1.1 413")


def test_a_huge_chunked_body_is_cut_off_at_the_limit(guarded):
    from mcprl.serving._server import MAX_BODY_BYTES

    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{guarded.port}\r\n"
        f"Authorization: Bearer k3y\r\nContent-Type: application/json\r\n"
        f"Transfer-Encoding: chunked\r\n\r\n"
    ).encode()
    chunk = 1024 * 1024
    parts = [f"{chunk:x}\r\n".encode() + b" " * chunk + b"\r\n"] * (MAX_BODY_BYTES // chunk + 2)
    reply = _raw_request(guarded, head, parts)
    assert reply.startswith(b"HTTP/1.1 413")


@pytest.mark.parametrize(
    ("path", "body", "text"),
    [
        ("/chat/completions", CHAT | {"seed": 2**80}, "seed"),
        ("/chat/completions", [CHAT], "JSON object"),
        ("/load_lora_adapter", ["x"], "JSON object"),
        ("/load_lora_adapter", {"lora_name": ["a"], "lora_path": "p"}, "strings"),
        ("/unload_lora_adapter", {"lora_name": ["a", "b"]}, "lora_name"),
        ("/chat/completions", CHAT | {"n": 32}, "n may be at most"),
    ],
    ids=["seed-overflow", "array-body", "array-adapter-body", "list-name", "list-unload", "big-n"],
)
def test_malformed_requests_get_a_400_not_a_500(guarded, path, body, text):
    r = _post(guarded, path, body)
    assert r.status_code == 400, r.text
    assert text in r.json()["error"]["message"]


def test_errors_never_echo_a_huge_input(guarded, caplog):
    huge = "/nope/" + "a" * 100_000
    r = _post(guarded, "/load_lora_adapter", {"lora_name": "x", "lora_path": huge})
    assert r.status_code == 403
    assert len(r.text) < 1000 and "more characters" in r.text
    assert all(len(rec.getMessage()) < 1000 for rec in caplog.records)


# -- a failing judge stops the run instead of training on nothing ----------------------------


def _judge_failing_on(marker: str):
    """Answers the preflight ping; replies junk to every scoring request whose text has
    `marker`, and ranks the others in the order shown."""
    from tests.helpers import chat_completion, judge_ids, scores_reply

    def respond(body: dict) -> tuple[int, dict]:
        if len(body["messages"]) < 2:
            return 200, chat_completion("OK")
        if marker in body["messages"][1]["content"]:
            return 200, chat_completion("I think they are all fine!")
        ids = judge_ids(body["messages"])
        return 200, chat_completion(scores_reply({t: 1.0 - 0.5 * i for i, t in enumerate(ids)}))

    return respond


async def _one_step(backend, marker: str, said: list[str]):
    from mcprl.scenarios import ScenarioSet
    from mcprl.train import RunConfig, TrainingRun
    from tests.helpers import LocalChatServer, load_example
    from tests.test_curriculum import _policy, _scenario, _summary

    scenarios = ScenarioSet([_scenario(f"mixed{i}") for i in range(4)] + [_scenario("val")])
    for s in scenarios.scenarios:
        s.split = "val" if s.id == "val" else "train"
    with LocalChatServer(_policy) as policy, LocalChatServer(_judge_failing_on(marker)) as judge:
        backend.base_url = policy.base_url
        config = RunConfig(steps=1, groups_per_step=4, rollouts_per_group=2, oversample=1,
                           eval_every=0, reward="ruler", judge="openai/j",
                           judge_api_base=judge.base_url, write_report=False)  # fmt: skip
        run = TrainingRun(config, load_example("calculator").server, backend, say=said.append,
                          progress=False, observers=[Console(said.append)])  # fmt: skip
        await run.prepare(scenarios)
        summary = _summary(run)
        await run._step(summary)
    return summary


@pytest.mark.anyio
async def test_a_judge_that_always_fails_stops_the_run_before_training(tmp_path):
    from mcprl.errors import JudgeFailedError
    from tests.fakes import FakeBackend

    backend = FakeBackend(tmp_path)
    with pytest.raises(JudgeFailedError, match=r"failed on 4 of 4 groups of step 1") as info:
        await _one_step(backend, "Task", [])
    assert "no valid scores" in str(info.value)  # the judge's own last error
    assert backend.trained == []  # nothing trained, nothing checkpointed


@pytest.mark.anyio
async def test_a_group_lost_to_the_judge_is_counted_and_said(tmp_path):
    from tests.fakes import FakeBackend

    said: list[str] = []
    backend = FakeBackend(tmp_path)
    summary = await _one_step(backend, "Task mixed0:", said)
    (groups,) = backend.trained
    assert {g.scenario_id for g in groups} == {"mixed1", "mixed2", "mixed3"}
    assert backend.rows[0]["train/groups_dropped"] == 1
    assert summary.groups_dropped == {1: 1}
    assert "1 lost to the judge" in said[-1]


# -- careless input gets a one-line answer, before any work -----------------------------------


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--steps", "-1"], "--steps -1: must be greater than or equal to 0"),
        (["--max-turns", "0"], "--max-turns 0: must be greater than or equal to 1"),
        (["--lr", "-1"], "--lr -1.0: must be greater than 0"),
        (["--temperature", "-3"], "--temperature -3.0: must be greater than or equal to 0"),
        (["--max-val", "0"], "--max-val 0: must be greater than or equal to 1"),
        (
            ["--reward", "ruler", "--val-attempts", "1"],
            "--val-attempts: RULER compares attempts: it must be 2 or more",
        ),
    ],
    ids=["steps", "max-turns", "lr", "temperature", "max-val", "val-attempts"],
)
def test_out_of_range_options_get_one_line_naming_the_option(tmp_path, capsys, flags, message):
    from mcprl.cli import main

    code = main(["train", "example:calculator", "--path", str(tmp_path), *flags])
    err = capsys.readouterr().err
    assert code == 2 and err.strip() == f"mcprl: error: {message}"
    assert not any(tmp_path.iterdir())  # checked before anything was started or written


def test_a_scenario_file_that_is_not_utf8_names_the_file_and_line(tmp_path):
    from mcprl.errors import ScenarioFileError
    from mcprl.scenarios import ScenarioSet

    path = tmp_path / "s.jsonl"
    path.write_bytes(b'{"id": "a", "task": "Add 2 and 3."}\n{"id": "b", "task": "caf\xe9"}\n')
    with pytest.raises(ScenarioFileError, match=r"s\.jsonl line 2: not UTF-8 text \(byte 0xe9"):
        ScenarioSet.load(path)


def test_a_mistyped_model_leaves_nothing_behind_and_the_corrected_command_works(tmp_path, capsys):
    from mcprl.cli import main

    runs = tmp_path / "runs"
    argv = ["train", "example:calculator", "--path", str(runs), "--steps", "0", "--eval-every",
            "0", "--max-val", "1", "--val-attempts", "1", "--max-tokens", "8", "--no-report",
            "-q"]  # fmt: skip
    assert main([*argv, "--model", "no-such-model-xyz"]) == 1
    err = capsys.readouterr().err
    assert "--model 'no-such-model-xyz' is not 'smollm2-135m'" in err
    assert "HF_HUB_OFFLINE" in err  # the tests run with the hub off: it says so, at once
    assert not runs.exists() or not any(runs.rglob("*.json*"))
    assert main([*argv, "--model", "./no/such/dir"]) == 1
    assert "no such directory" in capsys.readouterr().err
    assert main(argv) == 0  # the default model: the run starts as if nothing had happened
