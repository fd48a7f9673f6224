"""Training through Unsloth (`UnslothTrainer`), and which trainer a backend picks.

Unsloth runs only on CUDA and cannot be installed here, so these tests put a stand-in for its
`FastLanguageModel` in `sys.modules`: it loads the model with transformers and wraps it with peft,
and keeps the two parts of Unsloth's contract the trainer relies on: the calls that load a model
and a LoRA, and a forward pass that returns the last hidden states in place of the logits while
`UNSLOTH_RETURN_HIDDEN_STATES=1`. What the stand-in cannot show is Unsloth's own kernels at work:
that is for a GPU machine (README, "On a GPU").
"""

from __future__ import annotations

import importlib.machinery
import logging
import os
import sys
import types
from types import SimpleNamespace

import pytest
import torch

from mcprl.training import LoraTrainer, TrainConfig, pick_trainer, trainer_factory
from tests.test_training import _on_policy_group


class FakeUnsloth:
    """`unsloth.FastLanguageModel`'s loading calls, recorded; `refuse` makes loading fail as
    Unsloth does for a model it does not support."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []
        self.refuse = False

    def module(self) -> types.ModuleType:
        module = types.ModuleType("unsloth")
        module.__spec__ = importlib.machinery.ModuleSpec("unsloth", None)
        fake = self

        class FastLanguageModel:
            @staticmethod
            def from_pretrained(model_name, **kwargs):
                from transformers import AutoModelForCausalLM, AutoTokenizer

                fake.calls.append(("from_pretrained", {"model_name": model_name, **kwargs}))
                if fake.refuse:
                    raise NotImplementedError(f"Unsloth: {model_name} not supported yet")
                model = AutoModelForCausalLM.from_pretrained(model_name, dtype=kwargs["dtype"])
                model.forward = types.MethodType(_hidden_states_as_logits, model)
                return model, AutoTokenizer.from_pretrained(model_name)

            @staticmethod
            def get_peft_model(model, **kwargs):
                from peft import LoraConfig, get_peft_model

                fake.calls.append(("get_peft_model", kwargs))
                config = LoraConfig(
                    r=kwargs["r"],
                    lora_alpha=kwargs["lora_alpha"],
                    lora_dropout=kwargs["lora_dropout"],
                    target_modules=kwargs["target_modules"],
                    task_type="CAUSAL_LM",
                )
                return get_peft_model(model, config)

            @staticmethod
            def patch_peft_model(model, use_gradient_checkpointing=True):
                fake.calls.append(
                    ("patch_peft_model", {"use_gradient_checkpointing": use_gradient_checkpointing})
                )
                return model

        module.FastLanguageModel = FastLanguageModel
        return module


def _hidden_states_as_logits(self, input_ids=None, attention_mask=None, **kwargs):
    """Unsloth's patched CausalLM forward: hidden states (after the final norm) as `.logits`
    under its switch, logits otherwise."""
    hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    if os.environ.get("UNSLOTH_RETURN_HIDDEN_STATES", "0") == "1":
        return SimpleNamespace(logits=hidden)
    return SimpleNamespace(logits=self.lm_head(hidden))


@pytest.fixture
def unsloth(monkeypatch):
    fake = FakeUnsloth()
    monkeypatch.setitem(sys.modules, "unsloth", fake.module())
    monkeypatch.delenv("UNSLOTH_RETURN_HIDDEN_STATES", raising=False)
    return fake


@pytest.fixture(scope="module")
def base_path():
    from mcprl.serving import resolve_model

    return resolve_model("smollm2-135m")


def _one_step_gradient(trainer: LoraTrainer, share_prefix: bool = True) -> torch.Tensor:
    prompt = trainer.tokenizer.encode("You are a helpful assistant with tools. " * 4)
    groups = [
        _on_policy_group(trainer, [*prompt, 21 + g], [[11, 12, 13], [14, 15, 16, 17]], [1, 0])
        for g in range(2)
    ]
    config = TrainConfig(max_grad_norm=None, learning_rate=1e-9, share_prefix=share_prefix)
    trainer.step(groups, config)
    state = trainer.optimizer.state
    return torch.cat([state[p]["exp_avg"].flatten() for p in trainer.params])


@pytest.mark.slow
def test_a_step_through_unsloth_gives_peft_s_gradient_and_checkpoint(unsloth, base_path, tmp_path):
    from mcprl.training import UnslothTrainer

    torch.manual_seed(0)
    plain = _one_step_gradient(LoraTrainer(base_path), share_prefix=False)
    torch.manual_seed(0)
    trainer = UnslothTrainer(base_path, device="cpu", dtype="float32", max_seq_length=4096)
    through_unsloth = _one_step_gradient(trainer)  # asks to share the prefix: rows run whole
    torch.testing.assert_close(through_unsloth, plain)
    assert "UNSLOTH_RETURN_HIDDEN_STATES" not in os.environ  # the switch is put back
    loaded, peft = unsloth.calls
    asked = {"model_name": base_path, "max_seq_length": 4096, "dtype": torch.float32}
    assert loaded == ("from_pretrained", {**asked, "load_in_4bit": False})
    assert peft[0] == "get_peft_model" and peft[1]["use_gradient_checkpointing"] == "unsloth"
    assert peft[1]["r"] == 8 and "down_proj" in peft[1]["target_modules"]

    trainer.save(tmp_path)  # peft's format: vLLM loads it by path
    assert (tmp_path / "adapter_config.json").is_file()
    unsloth.calls.clear()
    resumed = UnslothTrainer(base_path, adapter_path=tmp_path, device="cpu", dtype="float32")
    resumed.load_state(tmp_path)
    assert [name for name, _ in unsloth.calls] == ["from_pretrained", "patch_peft_model"]
    assert unsloth.calls[1][1] == {"use_gradient_checkpointing": "unsloth"}
    assert resumed.updates == 1 and resumed.params  # the saved LoRA, trainable
    for mine, saved in zip(resumed.params, trainer.params, strict=True):
        torch.testing.assert_close(mine, saved)


def test_auto_picks_unsloth_only_on_a_gpu_beside_vllm(unsloth):
    assert pick_trainer("auto", "cuda", separate_inference=True) == "unsloth"
    assert pick_trainer("auto", "cuda:1", separate_inference=True) == "unsloth"
    assert pick_trainer("auto", "cpu", separate_inference=True) == "peft"
    assert pick_trainer("auto", "cuda", separate_inference=False) == "peft"  # the local backend
    assert pick_trainer("unsloth", "cuda", separate_inference=True) == "unsloth"
    assert pick_trainer("peft", "cuda", separate_inference=True) == "peft"


def test_auto_trains_with_peft_where_unsloth_is_not_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "unsloth", None)  # an import of it fails
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)
    assert pick_trainer("auto", "cuda", separate_inference=True) == "peft"
    with pytest.raises(ValueError, match=r"Unsloth is not installed.*`trainer=peft`"):
        pick_trainer("unsloth", "cuda", separate_inference=True)


@pytest.mark.parametrize(
    ("device", "inference", "says"),
    [
        ("cpu", True, r"CUDA GPU only, and this run's device is cpu: use `trainer=peft`"),
        ("cuda", False, r"needs `backend=vllm`.*use `trainer=peft`"),
    ],
)
def test_an_unsloth_request_it_cannot_serve_is_refused_with_the_fix(
    unsloth, device, inference, says
):
    with pytest.raises(ValueError, match=says):
        pick_trainer("unsloth", device, separate_inference=inference)
    with pytest.raises(ValueError, match="choose one of auto, peft, unsloth"):
        pick_trainer("deepspeed", device, separate_inference=inference)


def test_auto_falls_back_to_peft_for_a_model_unsloth_refuses(
    unsloth, monkeypatch, caplog, base_path
):
    made = []
    monkeypatch.setattr(
        "mcprl.training._unsloth.LoraTrainer",
        lambda path, lora, **kw: made.append(("peft", path, kw)) or "peft-trainer",
    )
    unsloth.refuse = True
    picked, make = trainer_factory("auto", "cuda", "bfloat16", separate_inference=True)
    assert picked == "unsloth"
    with caplog.at_level(logging.WARNING):
        assert make(base_path, None, None) == "peft-trainer"
    assert f"Unsloth could not load {base_path} (NotImplementedError" in caplog.text
    assert made == [("peft", str(base_path), {"adapter_path": None, "dtype": "bfloat16",
                                              "device": "cuda"})]  # fmt: skip
    _, make = trainer_factory("unsloth", "cuda", "bfloat16", separate_inference=True)
    with pytest.raises(NotImplementedError, match="not supported yet"):
        make(base_path, None, None)  # asked for by name: no quiet fallback


def test_mcprl_train_refuses_unsloth_on_the_local_backend(capsys):
    from mcprl.cli import main

    code = main(["train", "example:calculator", "--trainer", "unsloth", "--steps", "1"])
    err = capsys.readouterr().err
    assert code == 2
    assert "--trainer unsloth needs --backend vllm" in err
