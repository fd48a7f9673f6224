"""What the remote backend adds to a training step, against the local backend, on loopback.

    python benchmarks/remote.py [--groups 4] [--attempts 6] [--turns 3] [--steps 3]

Both backends train the same LoRA on SmolLM2-135M, on the same step of `--groups` groups of
`--attempts` attempts shaped like the default calculator run's: an agent prompt of ~900 tokens
(system prompt and tool block), `--turns` model turns of ~40 tokens each, with the token ids and
log-probabilities a trainer needs. The local backend trains in this process; the remote one is
`mcprl serve --train` in another process, reached with `RemoteBackend` over HTTP on 127.0.0.1,
with the same thread count. Reported per step (median of `--steps`, after one warm-up step):
wall seconds of `model.train(groups)`, of which the trainer's own (its step and checkpoint, from
the run's history), the rest (for the remote: upload, JSON, polling, adapter swap), the bytes
uploaded, and the ratio; plus the seconds `register` and a `history` read take on each.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio
import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._machine import describe_machine  # noqa: E402
from mcprl import TrainableModel, TrainConfig  # noqa: E402
from mcprl.backends import LocalBackend, RemoteBackend  # noqa: E402
from mcprl.types import Choice, Trajectory, TrajectoryGroup  # noqa: E402


def step_groups(groups: int, attempts: int, turns: int, seed: int) -> list[TrajectoryGroup]:
    """Groups shaped like an agent step's, with differing rewards (every group trains)."""
    rng = random.Random(seed)
    vocab = 49_000
    out = []
    for g in range(groups):
        prompt = [rng.randrange(vocab) for _ in range(900)]
        trajectories = []
        for a in range(attempts):
            context, choices, messages = (
                list(prompt),
                [],
                [
                    {"role": "system", "content": "x" * 3000},
                    {"role": "user", "content": f"Task {g}: add {a} and {g}."},
                ],
            )
            for _ in range(turns):
                reply = [rng.randrange(vocab) for _ in range(40)]
                logprobs = [-rng.random() for _ in reply]
                messages.append({"role": "assistant", "content": "y" * 120})
                choices.append(Choice(message_index=len(messages) - 1, finish_reason="stop",
                                      prompt_token_ids=list(context), token_ids=reply,
                                      logprobs=logprobs, sampling_logprobs=logprobs))  # fmt: skip
                tool = [rng.randrange(vocab) for _ in range(20)]
                messages.append({"role": "tool", "tool_call_id": "c", "content": "42"})
                context += reply + tool
            trajectories.append(Trajectory(messages=messages, choices=choices,
                                           reward=float(a % 3) / 2))  # fmt: skip
        out.append(TrajectoryGroup(scenario_id=f"s{g}", trajectories=trajectories))
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def measure(backend, groups, steps: int, name: str) -> dict[str, float]:
    model = TrainableModel(name=name, project="bench")
    t0 = time.perf_counter()
    await model.register(backend)
    register_s = time.perf_counter() - t0
    config = TrainConfig(learning_rate=1e-4)
    times, sent = [], []
    for i in range(steps + 1):
        before = getattr(backend, "bytes_sent", 0)
        t0 = time.perf_counter()
        await model.train(groups, config)
        if i:  # the first step warms up
            times.append(time.perf_counter() - t0)
            sent.append(getattr(backend, "bytes_sent", 0) - before)
    t0 = time.perf_counter()
    rows = await backend.history(model)
    history_s = time.perf_counter() - t0
    # the trainer's own time (its step and the checkpoint write), as the backend recorded it
    work = [r["train/time_train_s"] + r["train/time_checkpoint_s"] for r in rows[1:]]
    return {"step_s": statistics.median(times), "sent": statistics.median(sent),
            "work_s": statistics.median(work), "register_s": register_s,
            "history_s": history_s}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--groups", type=int, default=4)
    p.add_argument("--attempts", type=int, default=6)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args()
    groups = step_groups(args.groups, args.attempts, args.turns, seed=0)
    threads = os.cpu_count() or 2
    with tempfile.TemporaryDirectory() as tmp:
        with LocalBackend(Path(tmp) / "local") as local:
            here = anyio.run(measure, local, groups, args.steps, "local")
        port, key = free_port(), "bench"
        env = {**os.environ, "MCPRL_API_KEY": key, "PYTHONPATH": str(ROOT)}
        log = open(Path(tmp) / "server.log", "w")  # noqa: SIM115
        server = subprocess.Popen(
            [sys.executable, "-m", "mcprl", "serve", "--train", "--port", str(port),
             "--path", str(Path(tmp) / "remote"), "--threads", str(threads)],
            env=env, stdout=log, stderr=log,
        )  # fmt: skip
        try:
            url = f"http://127.0.0.1:{port}"
            while True:
                try:
                    if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.3)
            there = anyio.run(measure, RemoteBackend(url, api_key=key), groups, args.steps, "r")
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(60)
    tokens = sum(len(c.token_ids) for g in groups for t in g.trajectories for c in t.choices)
    print(describe_machine())
    print(f"\nstep: {args.groups} groups x {args.attempts} attempts x {args.turns} turns "
          f"({tokens} sampled tokens), median of {args.steps} steps after a warm-up\n")  # fmt: skip
    print("| backend | step (s) | of which training (s) | rest of the step (s) | uploaded per "
          "step | register (s) | history read (s) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for name, r in (("local (in process)", here), ("remote (loopback HTTP)", there)):
        print(f"| {name} | {r['step_s']:.2f} | {r['work_s']:.2f} | "
              f"{r['step_s'] - r['work_s']:.2f} | {r['sent'] / 1e6:.2f} MB | "
              f"{r['register_s']:.2f} | {r['history_s']:.3f} |")  # fmt: skip
    extra = (there["step_s"] - there["work_s"]) - (here["step_s"] - here["work_s"])
    print(f"\nremote / local step time: {there['step_s'] / here['step_s']:.2f}x; what the "
          f"remote adds beyond training: {extra:+.2f} s per step")  # fmt: skip


if __name__ == "__main__":
    main()
