"""Peak memory and time of one training step, per micro-batch budget, on a run's own groups.

    python benchmarks/step_memory.py RUN_DIR/trajectories/train/0001.jsonl [--budgets 2048 1024]
        [--checkpoint-rows on off] [--checkpoint-prefix 2048 512] [--heads on off]
        [--turns on off] [--turn-minimum 256 64] [--packed on off]

Each budget (`TrainConfig.token_budget`: padded tokens per micro-batch) runs one
`LoraTrainer.step` on the stored groups, with a fresh LoRA on SmolLM2-135M, in a process of its
own, so its peak RSS (`VmHWM`) is its own: the model load, then the step. Reported beside the
peak: the RSS before the step (the loaded trainer), the step's wall time and micro-batches.
`--checkpoint-rows on off` runs each budget with and without layer checkpoints for rows longer
than the budget (`TrainConfig.checkpoint_rows`); `--checkpoint-prefix 2048 512` with a shared
prompt head of that many tokens or more checkpointed (`TrainConfig.checkpoint_prefix`, 0: never);
`--heads on off` with and without a group's own head (the tokens its rows share past the step's
prefix, such as its worked example) run once per micro-batch (`mcprl.training._batch.HEAD_MINIMUM`;
off: every row runs it); `--turns on off` with and without the turns some of a group's rows share
(the same call, word for word, and its result) run once for them (`mcprl.training._batch.
TURN_MINIMUM`; off: each row runs its own), `--turn-minimum 256 64` with turns of that many
tokens or more; `--packed on off` with a micro-batch's rows after
shared positions run as one sequence of their tokens and as a padded batch
(`mcprl.training._trainer.PACK_ROWS`). Everything else is `TrainConfig`'s defaults.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _status(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) / 1e6  # kB -> GB
    return float("nan")


def child(
    groups_path: str,
    budget: int,
    dtype: str,
    threads: int | None,
    rows: bool,
    prefix: int | None,
    heads: bool = True,
    turns: bool = True,
    packed: bool = True,
    turn_minimum: int | None = None,
) -> dict:
    import mcprl.training._batch
    import mcprl.training._trainer
    from mcprl.serving import fix_threads, resolve_model
    from mcprl.training import LoraTrainer, TrainConfig
    from mcprl.types import read_groups

    if threads:
        fix_threads(threads)
    if not heads:
        mcprl.training._batch.HEAD_MINIMUM = 1 << 30
    if not turns:
        mcprl.training._batch.TURN_MINIMUM = 1 << 30
    mcprl.training._trainer.PACK_ROWS = packed
    if turns and turn_minimum:
        mcprl.training._batch.TURN_MINIMUM = turn_minimum
    groups = read_groups(groups_path)
    trainer = LoraTrainer(resolve_model("smollm2-135m"), dtype=dtype, device="cpu")
    loaded = _status("VmRSS")
    batches = []
    started = time.perf_counter()
    metrics = trainer.step(
        groups,
        TrainConfig(
            token_budget=budget,
            checkpoint_rows=rows,
            **({} if prefix is None else {"checkpoint_prefix": prefix or None}),
        ),
        lambda done, total: batches.append(total),
    )
    return {
        "budget": budget,
        "checkpoint_rows": rows,
        "checkpoint_prefix": prefix,
        "heads": heads,
        "turns": turns,
        "packed": packed,
        "turn_minimum": mcprl.training._batch.TURN_MINIMUM,
        "loaded_gb": loaded,
        "peak_gb": _status("VmHWM"),
        "after_gb": _status("VmRSS"),
        "seconds": time.perf_counter() - started,
        "micro_batches": batches[-1] if batches else 0,
        "sequences": metrics.get("sequences", 0),
        "trained_tokens": metrics.get("trained_tokens", 0),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("groups", help="a run's stored groups: RUN/trajectories/train/NNNN.jsonl")
    p.add_argument("--budgets", type=int, nargs="+", default=[2048, 1536, 1024])
    p.add_argument("--dtype", default="auto")
    p.add_argument("--threads", type=int, help="CPU threads (default: one per core)")
    p.add_argument(
        "--checkpoint-rows", nargs="+", choices=["on", "off"], default=["on"],
        help="layer checkpoints for rows longer than the budget (default: on, the default)",
    )  # fmt: skip
    p.add_argument(
        "--checkpoint-prefix", type=int, nargs="+", default=[None],
        help="shared heads of this many tokens or more checkpointed, 0: never (default: the "
        "default)",
    )  # fmt: skip
    p.add_argument(
        "--heads", nargs="+", choices=["on", "off"], default=["on"],
        help="a group's own head run once per micro-batch (default: on, the default)",
    )  # fmt: skip
    p.add_argument(
        "--turns", nargs="+", choices=["on", "off"], default=["on"],
        help="a turn some rows share run once for them (default: on, the default)",
    )  # fmt: skip
    p.add_argument(
        "--turn-minimum", type=int, nargs="+", default=[0],
        help="tokens a shared turn takes at least (default: TURN_MINIMUM)",
    )  # fmt: skip
    p.add_argument(
        "--packed", nargs="+", choices=["on", "off"], default=["on"],
        help="a micro-batch's rows run as one sequence (default: on, the default)",
    )  # fmt: skip
    p.add_argument("--child", type=int, help=argparse.SUPPRESS)
    p.add_argument("--prefix", type=int, help=argparse.SUPPRESS)
    p.add_argument("--rows", choices=["on", "off"], default="on", help=argparse.SUPPRESS)
    p.add_argument("--own-heads", choices=["on", "off"], default="on", help=argparse.SUPPRESS)
    p.add_argument("--own-turns", choices=["on", "off"], default="on", help=argparse.SUPPRESS)
    p.add_argument("--own-packed", choices=["on", "off"], default="on", help=argparse.SUPPRESS)
    p.add_argument("--own-minimum", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        rows, heads, turns = args.rows == "on", args.own_heads == "on", args.own_turns == "on"
        out = child(
            args.groups, args.child, args.dtype, args.threads, rows, args.prefix, heads, turns,
            args.own_packed == "on", args.own_minimum,
        )  # fmt: skip
        print(json.dumps(out))
        return
    print(f"groups: {args.groups}; dtype {args.dtype}; threads {args.threads or 'default'}\n")
    print("| token budget | long rows checkpointed | head checkpointed from | groups' own heads "
          "| shared turns | packed | micro-batches | trainer loaded | peak RSS | after "
          "| step s |")  # fmt: skip
    print("| ---: | --- | ---: | --- | --- | --- | ---: | ---: | ---: | ---: | ---: |")
    configs = [(budget, rows, prefix, heads, turns, packed, minimum) for budget in args.budgets
               for rows in args.checkpoint_rows for prefix in args.checkpoint_prefix
               for heads in args.heads for turns in args.turns
               for packed in args.packed for minimum in args.turn_minimum]  # fmt: skip
    for budget, rows, prefix, heads, turns, packed, minimum in configs:
        out = subprocess.run(
            [sys.executable, __file__, args.groups, "--child", str(budget),
             "--rows", rows, "--own-heads", heads, "--own-turns", turns,
             "--own-packed", packed, "--own-minimum", str(minimum), "--dtype", args.dtype,
             *(["--prefix", str(prefix)] if prefix is not None else []),
             *(["--threads", str(args.threads)] if args.threads else [])],
            check=True, capture_output=True, text=True, cwd=ROOT,
        )  # fmt: skip
        r = json.loads(out.stdout.strip().splitlines()[-1])
        head = "default" if prefix is None else (prefix or "never")
        print(
            f"| {budget} | {rows} | {head} | {heads} | {turns} "
            f"({r['turn_minimum'] if turns == 'on' else '-'}) | {packed} | {r['micro_batches']} | "
            f"{r['loaded_gb']:.2f} GB | **{r['peak_gb']:.2f} GB** | "
            f"{r['after_gb']:.2f} GB | {r['seconds']:.1f} |",
            flush=True,
        )
    print(f"\n{r['sequences']:.0f} sequences, {r['trained_tokens']:.0f} trained tokens")


if __name__ == "__main__":
    main()
