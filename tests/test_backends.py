"""One contract for every `Backend`: `FakeBackend` (the test double), `LocalBackend` (the engine
and trainer in this process) and `RemoteBackend` (a client of `mcprl serve --train` running in
another process on loopback). Also: a server killed mid-step loses nothing, a wrong API key is
told how to fix it, a real `mcprl train --backend URL` step, and ART's documented training loop
with only its import line changed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest

from mcprl import TrainableModel, TrainConfig, Trajectory, TrajectoryGroup
from mcprl.backends import BackendError, LocalBackend, RemoteBackend
from mcprl.tokens import TOKEN_REQUEST
from tests.fakes import FakeBackend
from tests.helpers import LocalChatServer, free_port

ROOT = Path(__file__).resolve().parent.parent
KEY = "contract-test-key"


def _scripted(body: dict) -> tuple[int, dict]:
    """A policy that answers with mcprl's token data: enough for the fake backend."""
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": "Hello there."},
        "finish_reason": "stop",
        "token_ids": [5, 6, 7],
        "prompt_token_ids": [1, 2, 3, 4],
        "mcprl": {"token_logprobs": [-0.5] * 3, "model_logprobs": [-0.5] * 3},
    }
    return 200, {"id": "c", "object": "chat.completion", "created": 0, "model": body["model"],
                 "choices": [choice]}  # fmt: skip


class _Server:
    """`mcprl serve --train` in a subprocess; `restart()` kills it (SIGKILL) and starts it again
    on the same port and path."""

    def __init__(self, path: Path, key: str = KEY) -> None:
        self.path, self.key, self.port = path, key, free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = {**os.environ, "MCPRL_API_KEY": self.key, "PYTHONPATH": str(ROOT)}
        self.path.mkdir(parents=True, exist_ok=True)
        self.log = self.path.parent / "server.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mcprl", "serve", "--train", "--port", str(self.port),
             "--path", str(self.path), "--threads", "1"],
            env=env, stdout=subprocess.DEVNULL, stderr=self.log.open("a"),
        )  # fmt: skip
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited: {self.log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise RuntimeError("the server did not start in 300 s")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def restart(self) -> None:
        self.kill()
        self.start()


@pytest.fixture(scope="module")
def remote_server(tmp_path_factory) -> Iterator[_Server]:
    server = _Server(tmp_path_factory.mktemp("served") / "runs")
    server.start()
    yield server
    server.kill()


@pytest.fixture(scope="module")
def local_backend(tmp_path_factory) -> Iterator[LocalBackend]:
    with LocalBackend(tmp_path_factory.mktemp("local") / "runs") as backend:
        yield backend


async def _attempts(model: TrainableModel, n: int) -> TrajectoryGroup:
    """`n` attempts at one prompt through the model's endpoint, as ART builds them."""
    client = model.openai_client()
    group = TrajectoryGroup(scenario_id="hello")
    for i in range(n):
        t = Trajectory(messages_and_choices=[{"role": "user", "content": "Say hello."}])
        reply = await client.chat.completions.create(
            model=model.get_inference_name(), messages=t.messages(), max_tokens=6,
            temperature=1.0, seed=i, **TOKEN_REQUEST,
        )  # fmt: skip
        t.messages_and_choices.append(reply.choices[0])
        t.reward = float(i == 0)
        group.trajectories.append(t)
    await client.close()
    return group


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["fake", "local", "remote"])
async def test_every_backend_keeps_the_same_contract(kind, request, tmp_path):
    if kind == "fake":
        chat = LocalChatServer(_scripted).__enter__()
        request.addfinalizer(lambda: chat.__exit__(None))
        backend = FakeBackend(tmp_path / "runs", chat.base_url)
    elif kind == "local":
        backend = request.getfixturevalue("local_backend")
    else:
        server = request.getfixturevalue("remote_server")
        backend = RemoteBackend(server.url, api_key=KEY)
    model = TrainableModel(name=f"contract-{kind}", project="p")

    await backend.check_model(model.base_model)
    with pytest.raises(ValueError, match="no-such-model"):
        await backend.check_model("./no-such-model")
    assert await model.register(backend) is model
    assert await model.get_step() == 0 and model.served_name == f"contract-{kind}@0"

    group = await _attempts(model, 2)
    assert all(t.trainable for t in group.trajectories), "replies carry token data"

    await backend.write_file(model, "scenarios.jsonl", '{"id": "a", "task": "Say hello."}\n')
    assert (await backend.read_file(model, "scenarios.jsonl")).startswith('{"id": "a"')
    assert await backend.read_file(model, "task.txt") is None
    with pytest.raises(ValueError, match="not a run file"):
        await backend.write_file(model, "history.jsonl", "{}")

    result = await model.train([group], config=TrainConfig(learning_rate=1e-3))
    assert result.step == 1 and await model.get_step() == 1
    assert model.get_inference_name() == f"contract-{kind}@1"
    again = await _attempts(model, 1)  # the new checkpoint answers
    assert again.trajectories[0].trainable
    earlier = await backend.serve_checkpoint(model, 0)  # for evaluating an earlier step
    base = await backend.base_inference(model.base_model)
    client = model.openai_client()
    for name in (earlier, base.base_name):
        reply = await client.chat.completions.create(
            model=name, messages=[{"role": "user", "content": "Hi"}], max_tokens=2
        )
        assert reply.choices[0].message.content is not None
    assert earlier == f"contract-{kind}@0" and base.base_name == "smollm2-135m"
    with pytest.raises(ValueError, match="no checkpoint of step 9"):
        await backend.serve_checkpoint(model, 9)

    await model.log([group], split="val")
    rows = await backend.history(model)
    assert [r["step"] for r in rows] == [1, 1]
    assert "train/reward_mean" in rows[0] and rows[1]["val/reward"] == 0.5
    stored = await backend.trajectories(model, "train")
    assert (
        list(stored) == [1]
        and stored[1][0].trajectories[0].messages == group.trajectories[0].messages
    )
    assert list(await backend.trajectories(model, "val")) == [1]

    assert await backend.list_checkpoints(model) == [0, 1]
    copy = await backend.download_checkpoint(model, 1, tmp_path / "copy")
    assert (copy / "adapter_config.json").is_file()
    with pytest.raises(ValueError, match="no checkpoint of step 7"):
        await backend.download_checkpoint(model, 7, tmp_path / "copy7")
    assert await model.delete_checkpoints(keep_last=1, keep_best_by=None) == [0]
    assert await backend.list_checkpoints(model) == [1]

    resumed = TrainableModel(name=f"contract-{kind}", project="p")
    assert await resumed.register(backend) is resumed and resumed.step == 1


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_server_killed_mid_step_resumes_and_trains_the_step_once(tmp_path):
    server = _Server(tmp_path / "runs")
    server.start()
    try:
        backend = RemoteBackend(server.url, api_key=KEY, retry_for=300)
        model = await TrainableModel(name="agent", project="kill").register(backend)
        group = await _attempts(model, 2)
        started = tmp_path / "runs" / "kill" / "agent" / "trajectories" / "train" / "0001.jsonl"
        result = {}

        async def train() -> None:
            result["r"] = await model.train([group], config=TrainConfig(learning_rate=1e-3))

        async with anyio.create_task_group() as tg:
            tg.start_soon(train)
            with anyio.fail_after(120):
                while not started.is_file():  # the server has the groups: the step began
                    await anyio.sleep(0.05)
            await anyio.to_thread.run_sync(server.restart)
        assert result["r"].step == 1 and await model.get_step() == 1
        rows = await backend.history(model)
        assert [r["step"] for r in rows if "train/reward_mean" in r] == [1]  # trained once
        assert await backend.list_checkpoints(model) == [0, 1]
        # a retry of the finished step is answered, not trained again
        again = await backend.train(model, [group], TrainConfig())
        assert again.step == 2  # the server was at 1: this is a new step
    finally:
        server.kill()


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_wrong_api_key_gets_401_and_the_fix(remote_server):
    backend = RemoteBackend(remote_server.url, api_key="wrong")
    with pytest.raises(
        BackendError, match=r"refused the API key \(401\): set MCPRL_API_KEY"
    ) as info:
        await backend.register(TrainableModel(name="x"))
    assert info.value.status == 401
    reply = httpx.post(f"{remote_server.url}/v1/chat/completions", json={}, timeout=10)
    assert reply.status_code == 401 and "MCPRL_API_KEY" in reply.json()["error"]["message"]


def test_a_remote_backend_that_is_not_there_says_so_in_time():
    backend = RemoteBackend(f"http://127.0.0.1:{free_port()}", retry_for=0.5)
    with pytest.raises(BackendError, match=r"did not answer for 0 s.*mcprl serve --train"):
        anyio.run(backend.get_step, TrainableModel(name="x"))
    with pytest.raises(ValueError, match="give the server's URL"):
        RemoteBackend("gpu-box:8000")


@pytest.mark.slow
def test_mcprl_train_runs_a_step_on_a_remote_backend(remote_server, tmp_path, monkeypatch, capsys):
    from mcprl.cli import main

    monkeypatch.setenv("MCPRL_API_KEY", KEY)
    code = main(["train", "example:calculator", "--backend", remote_server.url, "--path",
                 str(tmp_path), "--name", "remote", "--steps", "1", "--groups-per-step", "1",
                 "--rollouts-per-group", "2", "--oversample", "1", "--max-val", "1",
                 "--val-attempts", "1", "--max-tokens", "48", "-q"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 0, err[-3000:]
    assert "step 1/1:" in err and "training and inference on http://127.0.0.1" in err
    served = remote_server.path / "calculator" / "remote"
    assert (served / "checkpoints" / "0001" / "adapter_config.json").is_file()
    assert (served / "trajectories" / "train" / "0001.jsonl").is_file()
    assert json.loads((served / "run_config.json").read_text())["steps"] == 1
    here = tmp_path / "calculator" / "remote"  # the records, copied for the report
    assert (here / "report.html").is_file() and (here / "history.jsonl").is_file()
    assert not (here / "checkpoints").exists()

    one = tmp_path / "one.jsonl"  # evaluate both steps of the remote run, on one scenario
    one.write_text('{"id": "x", "task": "Add 2 and 3.", "split": "val", "difficulty": 1, '
                   '"reference": {"answer": "5"}}\n')  # fmt: skip
    code = main(["eval", "example:calculator", "--backend", remote_server.url, "--path",
                 str(tmp_path), "--model", "remote@0", "--model", "remote", "--scenarios",
                 str(one), "--max-turns", "2", "--max-tokens", "32", "-q"])  # fmt: skip
    captured = capsys.readouterr()
    out = captured.out
    assert code == 0, captured.err[-3000:]
    assert "| remote@0 |" in out and "| remote@1 |" in out


@pytest.mark.slow
@pytest.mark.anyio
async def test_arts_documented_loop_runs_with_only_the_import_changed(local_backend):
    import mcprl as art  # was: import art

    # from here on, ART's documented training loop (art.openpipe.ai, "ART Client"), unchanged
    # but for the backend, the model and a reward that fits a 135M model
    model = art.TrainableModel(name="agent-001", project="my-agentic-task",
                               base_model="smollm2-135m")  # fmt: skip
    backend = local_backend
    await model.register(backend)

    scenarios = ["hello", "world!"]

    async def rollout(model: art.Model, scenario: str) -> art.Trajectory:
        openai_client = model.openai_client()
        trajectory = art.Trajectory(
            messages_and_choices=[
                {"role": "system", "content": "Repeat the user's word."},
                {"role": "user", "content": scenario},
            ]
        )
        chat_completion = await openai_client.chat.completions.create(
            messages=trajectory.messages(), model=model.get_inference_name(), max_tokens=8
        )
        choice = chat_completion.choices[0]
        trajectory.messages_and_choices.append(choice)
        trajectory.reward = float(len(choice.message.content or "") % 3)
        return trajectory

    for _ in range(await model.get_step(), 1):
        train_groups = await art.gather_trajectory_groups(
            (art.TrajectoryGroup(rollout(model, scenario) for _ in range(4))
             for scenario in scenarios),
            pbar_desc="gather",
        )  # fmt: skip
        assert len(train_groups) == 2 and len(train_groups[0]) == 4
        await model.delete_checkpoints()
        await model.train(train_groups, config=art.TrainConfig(learning_rate=1e-5))
    assert await model.get_step() == 1
    assert all(t.trainable for g in train_groups for t in g.trajectories)
    await model.openai_client().close()  # the client the rollouts shared


@pytest.fixture
def run_held_elsewhere(tmp_path) -> Iterator[tuple[Path, int]]:
    """Another process writing the run folder `tmp_path/p/m` (it holds the run's lock)."""
    root = Path(__file__).resolve().parent.parent
    code = (
        "import sys, time; from mcprl.backends._store import hold_run; hold_run(sys.argv[1]); "
        "print('held', flush=True); time.sleep(120)"
    )
    path = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path / "p" / "m")],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        yield tmp_path, holder.pid
    finally:
        holder.kill()
        holder.wait(30)


def test_a_second_writer_of_a_run_fails_at_once_naming_the_first(run_held_elsewhere):
    from mcprl.backends._store import RunStore
    from mcprl.errors import RunLockedError

    root, pid = run_held_elsewhere
    started = time.monotonic()
    with pytest.raises(RunLockedError, match=rf"another process \(pid {pid}: "):
        RunStore(root, "p", "m")
    with pytest.raises(RunLockedError):
        anyio.run(FakeBackend(root).claim, TrainableModel(name="m", project="p"))
    assert time.monotonic() - started < 5  # at once, not after a wait
    assert RunStore(root, "p", "m", read_only=True).history() == []  # readers are not held up


def test_mcprl_train_on_a_run_another_process_writes_stops_before_any_work(
    run_held_elsewhere, capsys
):
    from mcprl.cli import main

    root, pid = run_held_elsewhere
    code = main(["train", "example:calculator", "--path", str(root), "--project", "p",
                 "--name", "m", "--steps", "1", "-q"])  # fmt: skip
    assert code == 1
    err = capsys.readouterr().err
    assert "is being written by another process" in err and f"pid {pid}" in err
    assert not (root / "p" / "m" / "run_config.json").exists()


def test_the_lock_goes_with_the_process_that_held_it(tmp_path):
    from mcprl.backends._store import RunStore

    root = Path(__file__).resolve().parent.parent
    code = "import sys; from mcprl.backends._store import hold_run; hold_run(sys.argv[1])"
    env = {**os.environ, "PYTHONPATH": str(root)}
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "p" / "m")], env=env, check=True)
    RunStore(tmp_path, "p", "m").append_history({"step": 0})  # its exit freed the run


def test_the_trainers_and_servers_a_backend_plugs_in_have_the_declared_interfaces():
    """`LocalBackend(trainer=..., inference=...)` takes anything with the protocols' methods;
    mcprl's own trainer and both servers must keep them."""
    import inspect

    from mcprl.backends import InferenceServer, Trainer, VLLMServer
    from mcprl.serving import LocalServer
    from mcprl.training import LoraTrainer

    for cls, protocol, members in [
        (LoraTrainer, Trainer, ["step", "save", "load_state"]),
        (LocalServer, InferenceServer, ["paused", "close"]),
        (VLLMServer, InferenceServer, ["paused", "close"]),
    ]:
        for name in members:
            assert hasattr(protocol, name) and hasattr(cls, name), (cls, name)
        if hasattr(protocol, "step"):
            wanted = list(inspect.signature(protocol.step).parameters)
            assert list(inspect.signature(cls.step).parameters) == wanted
