"""Training throughput of mcprl's GRPO trainer against TRL's GRPOTrainer, side by side.

    pip install trl          # the baseline; not a dependency of mcprl
    python benchmarks/training.py [--sequences 8] [--prompt 256] [--completion 128] [--steps 4]
                                  [--device auto|cpu|cuda]

Both train the same LoRA (r=8, alpha=16, every attention and MLP projection) on SmolLM2-135M,
on the same batch: --sequences sequences of --prompt prompt tokens and --completion completion
tokens, one optimizer step per batch, token-level loss normalisation (TRL's "dapo"), no KL. For
TRL the step is its own `compute_loss` (which also computes entropies, as it does in training),
backward and optimizer step, on inputs shaped as its generation phase produces them. Each
configuration runs in a fresh process so its peak memory (max RSS) is its own.

With `--shared N` the prompts share their first N tokens, as agent prompts share the system
prompt and tool block, and mcprl runs twice: with every sequence's prompt run in full (the
baseline) and with the shared prefix run once per update (`TrainConfig.share_prefix`), both in
the trainer's default micro-batches (`TrainConfig.token_budget`); TRL is left out (it has no
such mode):

    python benchmarks/training.py --shared 800 --prompt 900 --completion 60 --sequences 24

Reported: sequence tokens (prompt + completion) per second, the median over --steps steps after
one warm-up step; the ratio to TRL in the same dtype; peak RSS; and model FLOP/s by the usual
6 x parameters x tokens count, as a fraction of the machine's peak matmul FLOP/s.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _machine import default_dtypes, peak_gflops, sync  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

MODEL = "smollm2-135m"


def _batch(args, vocab: int):
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(100, vocab, (args.sequences, args.prompt), generator=g)
    prompt[:, : args.shared] = prompt[0, : args.shared]
    completion = torch.randint(100, vocab, (args.sequences, args.completion), generator=g)
    rewards = [float(i % 3) / 2 for i in range(args.sequences)]
    return prompt, completion, rewards


def _group(args, vocab: int):
    from mcprl.types import Choice, Trajectory, TrajectoryGroup

    prompt, completion, rewards = _batch(args, vocab)
    return TrajectoryGroup(
        trajectories=[
            Trajectory(
                reward=r,
                choices=[
                    Choice(
                        message_index=2,
                        prompt_token_ids=prompt[i].tolist(),
                        token_ids=completion[i].tolist(),
                        logprobs=[-2.0] * args.completion,
                    )
                ],
            )
            for i, r in enumerate(rewards)
        ]
    )


def run_mcprl(args, dtype: str) -> list[float]:
    from mcprl.serving import resolve_model
    from mcprl.training import LoraTrainer, TrainConfig

    trainer = LoraTrainer(resolve_model(MODEL), dtype=dtype, device=args.device)
    group = _group(args, trainer.model.config.vocab_size)
    # the whole batch in one micro-batch, as TRL runs it; with --shared, the trainer's default
    # micro-batches, as `mcprl train` runs it (24 agent prompts in one pass do not fit in memory)
    whole = args.sequences * (args.prompt + args.completion)
    config = TrainConfig(
        learning_rate=1e-5,
        token_budget=TrainConfig().token_budget if args.shared else max(64, whole),
        share_prefix=args.share,
    )
    times = []
    for _ in range(args.steps + 1):
        start = time.perf_counter()
        trainer.step([group], config)
        sync(args.device)
        times.append(time.perf_counter() - start)
    return times[1:]


def run_trl(args, dtype: str) -> list[float]:
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from mcprl.serving import resolve_model

    path = resolve_model(MODEL)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(args.device)
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    model = get_peft_model(
        model, LoraConfig(r=8, lora_alpha=16, target_modules=targets, task_type="CAUSAL_LM")
    )
    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out,
            per_device_train_batch_size=args.sequences,
            num_generations=args.sequences,
            max_completion_length=args.completion,
            loss_type="dapo",
            beta=0.0,
            learning_rate=1e-5,
            bf16=dtype == "bfloat16",
            use_cpu=args.device == "cpu",
            report_to=[],
            logging_steps=10**6,
            save_strategy="no",
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=lambda completions, **kw: [0.0] * len(completions),
            args=config,
            train_dataset=Dataset.from_list([{"prompt": "hi"}] * args.sequences),
            processing_class=AutoTokenizer.from_pretrained(path),
        )
        trainer.create_optimizer()
        trainer.current_gradient_accumulation_steps = 1
        model.train()
        prompt, completion, rewards = _batch(args, model.config.vocab_size)
        adv = torch.tensor(rewards) - sum(rewards) / len(rewards)
        inputs = {
            "prompt_ids": prompt,
            "prompt_mask": torch.ones_like(prompt),
            "completion_ids": completion,
            "completion_mask": torch.ones_like(completion),
            "advantages": adv / (adv.std() + 1e-4),
            "old_per_token_logps": torch.full(completion.shape, -2.0),
            "num_items_in_batch": torch.tensor(float(completion.numel())),
        }
        inputs = {k: v.to(args.device) for k, v in inputs.items()}
        times = []
        for _ in range(args.steps + 1):
            start = time.perf_counter()
            with trainer.accelerator.autocast():
                loss = trainer.compute_loss(model, inputs)
            trainer.accelerator.backward(loss)
            trainer.optimizer.step()
            trainer.optimizer.zero_grad()
            sync(args.device)
            times.append(time.perf_counter() - start)
        return times[1:]


def child(args) -> None:
    runner = {"mcprl": run_mcprl, "mcprl-shared": run_mcprl, "trl": run_trl}[args.child]
    args.share = args.child == "mcprl-shared"
    times = runner(args, args.dtype)
    # VmHWM, not ru_maxrss: the latter keeps the parent's high-water mark across fork + exec.
    status = Path("/proc/self/status").read_text()
    peak_mb = int(next(x for x in status.splitlines() if x.startswith("VmHWM")).split()[1]) / 1024
    gpu_mb = torch.cuda.max_memory_allocated() / 2**20 if args.device.startswith("cuda") else None
    print(json.dumps({"median_s": statistics.median(times), "peak_mb": peak_mb, "gpu_mb": gpu_mb}))


def gradient_agreement(args) -> float:
    """Cosine similarity of the bfloat16 and float32 trainers' gradients on one batch."""
    from mcprl.serving import resolve_model
    from mcprl.training import LoraTrainer, TrainConfig

    grads = []
    for dtype in ("float32", "bfloat16"):
        torch.manual_seed(0)
        trainer = LoraTrainer(resolve_model(MODEL), dtype=dtype, device=args.device)
        group = _group(args, trainer.model.config.vocab_size)
        config = TrainConfig(learning_rate=1e-12, max_grad_norm=None, share_prefix=False)
        trainer.step([group], config)
        state = trainer.optimizer.state
        grads.append(torch.cat([state[p]["exp_avg"].flatten().float() for p in trainer.params]))
    return float(torch.nn.functional.cosine_similarity(grads[0], grads[1], dim=0))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sequences", type=int, default=8)
    p.add_argument("--prompt", type=int, default=256)
    p.add_argument("--completion", type=int, default=128)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--dtypes", nargs="+", default=default_dtypes()[::-1])
    p.add_argument("--shared", type=int, default=0, help="prompt tokens all sequences share")
    p.add_argument("--child", choices=["mcprl", "mcprl-shared", "trl"])
    p.add_argument("--dtype")
    p.add_argument("--device", default="auto", help="auto (a GPU where present), cpu or cuda")
    args = p.parse_args()
    from mcprl.serving import pick_device

    args.device = pick_device(args.device)
    if args.child:
        child(args)
        return
    from mcprl.serving import load_model

    params = sum(t.numel() for t in load_model(MODEL, dtype="float32").model.parameters())
    tokens = args.sequences * (args.prompt + args.completion)
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}; "
        f"{MODEL} ({params / 1e6:.0f}M), LoRA r=8 alpha=16 on all projections; batch "
        f"{args.sequences} x ({args.prompt} prompt + {args.completion} completion) = {tokens} "
        f"tokens; median of {args.steps} steps"
    )
    if args.device.startswith("cuda"):
        print(f"device: {torch.cuda.get_device_name()}")
    peaks = {d: peak_gflops(getattr(torch, d), device=args.device) for d in args.dtypes}
    print("peak matmul: " + ", ".join(f"{d} {g:.0f} GFLOP/s" for d, g in peaks.items()))
    systems = ("mcprl", "mcprl-shared") if args.shared else ("trl", "mcprl")
    names = {
        "trl": "TRL GRPOTrainer",
        "mcprl": "mcprl LoraTrainer" + (", prefix per sequence" if args.shared else ""),
        "mcprl-shared": f"mcprl LoraTrainer, {args.shared}-token prefix once",
    }
    if "bfloat16" in args.dtypes and not args.shared:
        cosine = gradient_agreement(args)
        print(f"bfloat16 vs float32 gradient of the mcprl trainer: cosine {cosine:.4f}")
    base = systems[0]
    print(f"\n| dtype | trainer | tokens/s | vs {names[base]} | peak RSS (MB) | peak GPU (MB) "
          "| model GFLOP/s | of peak |")  # fmt: skip
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for dtype in args.dtypes:
        rates = {}
        for system in systems:
            cmd = [
                sys.executable,
                __file__,
                "--child",
                system,
                "--dtype",
                dtype,
                "--sequences",
                str(args.sequences),
                "--prompt",
                str(args.prompt),
                "--completion",
                str(args.completion),
                "--steps",
                str(args.steps),
                "--shared",
                str(args.shared),
                "--device",
                args.device,
            ]
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode != 0:
                print(f"| {dtype} | {system} | failed: {out.stderr.strip()[-300:]} | | | | | |")
                continue
            result = json.loads(out.stdout.strip().splitlines()[-1])
            rate = tokens / result["median_s"]
            rates[system] = rate
            flops = 6 * params * rate / 1e9
            ratio = f"{rate / rates[base]:.2f}x" if base in rates else "-"
            gpu = f"{result['gpu_mb']:.0f}" if result.get("gpu_mb") else "-"
            print(
                f"| {dtype} | {names[system]} | {rate:.0f} | {ratio} | {result['peak_mb']:.0f} | "
                f"{gpu} | {flops:.1f} | {flops / peaks[dtype]:.1%} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
