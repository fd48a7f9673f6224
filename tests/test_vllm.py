"""`VLLMBackend` against a stand-in that speaks vLLM's HTTP API (tests/vllm_standin.py): the
process and adapter management, the vLLM dialect of token data, and one `mcprl train` step."""

from __future__ import annotations

import pytest

from mcprl import TrainableModel, TrainConfig
from mcprl.backends import VLLMBackend
from tests.vllm_standin import VLLMStandIn


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    runs = tmp_path_factory.mktemp("vllm") / "runs"
    runs.mkdir()
    server = VLLMStandIn("smollm2-135m", adapter_dirs=[runs])
    server.runs = runs
    yield server
    server.close()


@pytest.mark.slow
@pytest.mark.anyio
async def test_vllm_backend_loads_each_checkpoint_by_path_and_trains_on_vllm_replies(standin):
    from tests.test_backends import _attempts

    standin.calls.clear()
    backend = VLLMBackend(standin.runs, vllm_url=standin.url, api_key="vllm-key", sleep_mode=True)
    model = TrainableModel(name="agent", project="v")
    await backend.check_model("smollm2-135m")
    with pytest.raises(ValueError, match="serves smollm2-135m, not 'Qwen/x'"):
        await backend.check_model("Qwen/x")
    await model.register(backend)
    checkpoint0 = (standin.runs / "v" / "agent" / "checkpoints" / "0000").resolve()
    assert standin.calls == [("load_lora_adapter", {"lora_name": "agent@0",
                                                    "lora_path": str(checkpoint0)})]  # fmt: skip
    group = await _attempts(model, 2)  # vLLM's dialect: ids at the top level, logprobs content
    assert all(t.trainable for t in group.trajectories)
    result = await model.train([group], config=TrainConfig(learning_rate=1e-3))
    assert result.step == 1 and model.get_inference_name() == "agent@1"
    names = [name for name, _ in standin.calls]
    assert names[1:] == ["sleep", "wake_up", "load_lora_adapter", "unload_lora_adapter"]
    assert standin.calls[3][1]["lora_path"].endswith("checkpoints/0001")
    assert (await _attempts(model, 1)).trajectories[0].trainable
    backend.close()


def test_an_absent_vllm_server_is_named_with_the_fix(tmp_path):
    from tests.helpers import free_port

    backend = VLLMBackend(tmp_path, vllm_url=f"http://127.0.0.1:{free_port()}")
    import anyio

    with pytest.raises(ValueError, match=r"no vLLM server answers.*`vllm_url`"):
        anyio.run(backend.check_model, "smollm2-135m")


@pytest.mark.slow
def test_mcprl_train_runs_a_step_through_vllm(standin, capsys):
    from mcprl.cli import main

    standin.calls.clear()
    code = main(["train", "example:calculator", "--backend", "vllm", "--vllm-url", standin.url,
                 "--api-key", "vllm-key", "--path", str(standin.runs), "--name", "cli",
                 "--steps", "1", "--groups-per-step", "1", "--rollouts-per-group", "2",
                 "--oversample", "1", "--max-val", "1", "--val-attempts", "1", "--max-tokens",
                 "48", "--no-report", "-q"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 0, err[-3000:]
    assert "inference on vLLM" in err and "step 1/1:" in err
    run = standin.runs / "calculator" / "cli"
    assert (run / "checkpoints" / "0001" / "adapter_config.json").is_file()
    loaded = [body["lora_name"] for name, body in standin.calls if name == "load_lora_adapter"]
    assert loaded == ["cli@0", "cli@1"]  # each checkpoint, by path, through vLLM's endpoint
