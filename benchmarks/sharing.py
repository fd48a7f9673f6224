"""Two mcprl processes on one machine: each one's speed beside the other, against alone.

    python benchmarks/sharing.py [--rounds 3] [--modes adaptive fixed]

The workload is `engine.py --agent`'s: the rollouts of a training step (4 calculator scenarios
x 4 attempts, all concurrent, the default agent loop, MCP over streamable HTTP), `--rounds` of
them in a row. For each mode it runs the workload once alone, then twice at the same time in two
processes, and reports each one's speed beside the other as a ratio of its speed alone.

Modes:
- adaptive: the default; the engine sizes torch's threads to the cores other processes leave
  free (`mcprl.serving._threads`);
- fixed: `--threads` set to this machine's cores in each process, which is what every process
  did before: torch's default of one thread per core, whatever else runs.

Sharing N cores between two equal processes should cost each about half its speed (0.5x).
A pair still running `--cap` times as long as the process alone took (start to end) is stopped,
and its ratio is given as an upper bound.

    python benchmarks/sharing.py --training RUN/trajectories/train/0010.jsonl [--steps 2]

A training step beside another run's rollouts instead, the two phases of two runs that overlap
most: 1 + `--steps` `LoraTrainer.step`s on a run's stored groups in one process, the rollouts
workload in another, started together. Reported, over the time both were busy (from the later
start to the earlier end): the work each did, in seconds of the same work alone, per second:
its speed beside the other against alone (each step or round counts by the share of it that
fell within; the first step and the warm-up round included). Modes: adaptive (the trainer sizes
its threads as the engine does, `ThreadGovernor.settle`/`poll`) and fixed (the trainer at one
thread per core, as before; the rollouts stay adaptive).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def workload(mode: str, rounds: int) -> subprocess.Popen:
    cmd = [sys.executable, str(HERE / "engine.py"), "--agent-json", "--rounds", str(rounds),
           "--device", "cpu"]  # fmt: skip
    if mode == "fixed":
        cmd += ["--threads", str(len(os.sched_getaffinity(0)))]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)


def training(mode: str, groups: str, steps: int) -> subprocess.Popen:
    cmd = [sys.executable, __file__, "--training-child", groups, "--steps", str(steps),
           "--modes", mode]  # fmt: skip
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)


def training_child(groups_path: str, steps: int, mode: str) -> dict:
    sys.path.insert(0, str(ROOT))
    import torch

    from mcprl.serving import fix_threads, resolve_model
    from mcprl.training import LoraTrainer, TrainConfig
    from mcprl.types import read_groups

    if mode == "fixed":
        fix_threads(len(os.sched_getaffinity(0)))
    groups = read_groups(groups_path)
    trainer = LoraTrainer(resolve_model("smollm2-135m"), device="cpu")
    spans = []  # each step's (start, end) in wall-clock time; the first is the allocator's and
    for _ in range(1 + steps):  # the kernels' first use, and slower
        began = time.time()
        trainer.step(groups, TrainConfig())
        spans.append((began, time.time()))
    return {"spans": spans, "threads": torch.get_num_threads()}


def _spans(out: dict) -> list[tuple[float, float]]:
    """A workload's units of work in order: training steps, or the rollouts' warm-up round and
    its timed rounds."""
    return out["spans"] if "spans" in out else [out["warmup_span"], *out["round_spans"]]


def work_within(out: dict, alone: dict, period: tuple[float, float]) -> float:
    """The work `out` did within `period`, in seconds of the same work alone: each unit counts
    by the share of it that fell within, times what that unit took alone."""
    done = 0.0
    for (a, b), (a1, b1) in zip(_spans(out), _spans(alone), strict=True):
        overlap = min(b, period[1]) - max(a, period[0])
        done += max(0.0, overlap) / (b - a) * (b1 - a1)
    return done


def beside_training(args: argparse.Namespace) -> None:
    print("| trainer's threads | step alone s | rollout round alone s | both busy s "
          "| training: speed beside / alone | rollouts: speed beside / alone |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    rollouts_alone = result(workload("adaptive", args.rounds))
    results: list[dict] = [{"rollouts_alone": rollouts_alone}]
    rounds = rollouts_alone["round_spans"]
    round_s = sum(b - a for a, b in rounds) / len(rounds)
    for mode in args.modes:
        alone = result(training(mode, args.training, args.steps))
        pair = [training(mode, args.training, args.steps), workload("adaptive", args.rounds)]
        steps, rollouts = (result(q) for q in pair)
        results.append({"mode": mode, "alone": alone, "beside": steps, "rollouts": rollouts})
        # the time both were busy: from the later start to the earlier end
        ours, theirs = _spans(steps), _spans(rollouts)
        both = (max(ours[0][0], theirs[0][0]), min(ours[-1][1], theirs[-1][1]))
        length = both[1] - both[0]
        step_s = sum(b - a for a, b in alone["spans"][1:]) / args.steps
        trained = work_within(steps, alone, both) / length
        rolled = work_within(rollouts, rollouts_alone, both) / length
        print(
            f"| {mode} | {step_s:.1f} | {round_s:.1f} | {length:.0f} | {trained:.2f}x | "
            f"{rolled:.2f}x |",
            flush=True,
        )
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


def result(proc: subprocess.Popen, timeout: float | None = None) -> dict | None:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return None
    if proc.returncode:
        raise SystemExit(f"the workload failed (exit {proc.returncode})")
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3, help="timed rounds of rollouts per process")
    p.add_argument("--cap", type=float, default=6.0,
                   help="stop a pair after this many times the alone run's wall time")  # fmt: skip
    p.add_argument("--modes", nargs="+", default=["adaptive", "fixed"],
                   choices=["adaptive", "fixed"])  # fmt: skip
    p.add_argument("--training", metavar="GROUPS",
                   help="a training step beside rollouts, on a run's stored groups")  # fmt: skip
    p.add_argument("--steps", type=int, default=2, help="--training: timed steps")
    p.add_argument("--training-child", help=argparse.SUPPRESS)
    p.add_argument("--out", help="--training: the runs' own numbers and time spans, as JSON")
    args = p.parse_args()
    if args.training_child:
        print(json.dumps(training_child(args.training_child, args.steps, args.modes[0])))
        return
    cores = len(os.sched_getaffinity(0))
    print(f"machine: {platform.processor() or platform.machine()}, {cores} cores in this CPU set")
    if args.training:
        print(f"workload: {args.steps} training steps on {args.training}, beside "
              f"{args.rounds} rounds of 16 concurrent calculator attempts\n")  # fmt: skip
        beside_training(args)
        return
    print(f"workload: {args.rounds} rounds of 16 concurrent calculator attempts per process\n")
    print("| mode | alone s | beside another s (two processes) | speed beside / alone | "
          "threads at the end | thread changes |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for mode in args.modes:
        started = time.perf_counter()
        alone = result(workload(mode, args.rounds))
        cap = args.cap * (time.perf_counter() - started)
        pair = [workload(mode, args.rounds), workload(mode, args.rounds)]
        started = time.perf_counter()
        both = [result(q, max(1.0, cap - (time.perf_counter() - started))) for q in pair]
        if None in both:
            print(
                f"| {mode} | {alone['seconds']:.1f} | stopped after {cap:.0f} s | "
                f"< {1 / args.cap:.2f}x | {alone['threads']}; - | {alone['thread_changes']}; - |",
                flush=True,
            )
            continue
        ratios = " / ".join(f"{alone['seconds'] / b['seconds']:.2f}x" for b in both)
        beside = " / ".join(f"{b['seconds']:.1f}" for b in both)
        print(
            f"| {mode} | {alone['seconds']:.1f} | {beside} | {ratios} | "
            f"{alone['threads']}; {' / '.join(str(b['threads']) for b in both)} | "
            f"{alone['thread_changes']}; {' / '.join(str(b['thread_changes']) for b in both)} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
