"""On a GPU, the engine and the trainer compute what they compute on the CPU.

Skipped where torch sees no CUDA device (CI has none). On a GPU machine the rest of the suite
runs there too: `load_model`, `LocalServer` and `LoraTrainer` pick the GPU by default, so
`pytest tests/test_engine.py tests/test_serving.py tests/test_training.py` exercises CUDA.
"""

from __future__ import annotations

import pytest
import torch

from mcprl.serving import Engine, SamplingParams, load_model
from mcprl.serving._chat import render_prompt
from tests.test_serving import MODEL

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _prompt(tokenizer, text: str) -> list[int]:
    return render_prompt(tokenizer, [{"role": "user", "content": text}], None)


def test_the_engine_on_the_gpu_picks_the_tokens_it_picks_on_the_cpu():
    texts = ["Name three colours.", "What is 12 times 7?", "Write a short greeting."]
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    picked = {}
    for device in ("cpu", "cuda"):
        engine = Engine(load_model(MODEL, dtype="float32", device=device), prefix_cache=False)
        try:
            assert str(engine.device).startswith(device)
            futures = [engine.submit(_prompt(engine.tokenizer, t), params) for t in texts]
            picked[device] = [f.result(timeout=120)[0] for f in futures]
        finally:
            engine.close()
    for cpu, gpu in zip(picked["cpu"], picked["cuda"], strict=True):
        # greedy float32 decoding: the same tokens, log-probabilities within rounding
        assert gpu.token_ids == cpu.token_ids
        assert gpu.logprobs == pytest.approx(cpu.logprobs, abs=1e-3)


def test_a_bfloat16_engine_on_the_gpu_batches_32_requests_without_dropping_any():
    engine = Engine(load_model(MODEL, dtype="bfloat16", device="cuda"))
    try:
        prompt = _prompt(engine.tokenizer, "Tell me about the sea.")
        futures = [
            engine.submit(prompt, SamplingParams(max_tokens=24, seed=i, ignore_eos=True))
            for i in range(32)
        ]
        completions = [f.result(timeout=120)[0] for f in futures]
    finally:
        engine.close()
    assert all(len(c.token_ids) == 24 for c in completions)
    assert len({tuple(c.token_ids) for c in completions}) > 16  # seeded draws differ per row


def test_a_training_step_on_the_gpu_follows_the_cpu_gradient():
    from mcprl.serving import resolve_model
    from mcprl.training import LoraTrainer, TrainConfig
    from mcprl.types import Choice, Trajectory, TrajectoryGroup

    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(100, 40000, (64,), generator=g).tolist()
    group = TrajectoryGroup(
        trajectories=[
            Trajectory(
                reward=float(i % 2),
                choices=[
                    Choice(
                        message_index=2,
                        prompt_token_ids=prompt,
                        token_ids=torch.randint(100, 40000, (16,), generator=g).tolist(),
                        logprobs=[-2.0] * 16,
                    )
                ],
            )
            for i in range(4)
        ]
    )
    config = TrainConfig(learning_rate=1e-12, max_grad_norm=None, share_prefix=False)
    grads, devices = [], []
    for device in ("cpu", "cuda"):
        torch.manual_seed(0)  # the same LoRA initialisation on both
        trainer = LoraTrainer(resolve_model(MODEL), dtype="float32", device=device)
        metrics = trainer.step([group], config)
        assert metrics.get("trained_tokens", 0) > 0
        devices.append(next(p.device.type for p in trainer.params))
        state = trainer.optimizer.state
        grads.append(torch.cat([state[p]["exp_avg"].flatten().cpu() for p in trainer.params]))
    assert devices == ["cpu", "cuda"]
    cosine = torch.nn.functional.cosine_similarity(grads[0], grads[1], dim=0)
    assert cosine > 0.999
