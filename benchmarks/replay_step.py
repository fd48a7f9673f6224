"""Replay one recorded training step under other settings, and evaluate what each update made.

A run keeps every step's attempts (`trajectories/train/NNNN.jsonl`) and the adapter and
optimizer state after every step (`checkpoints/NNNN`). This script loads the checkpoint before
step S, takes step S's update again from step S's recorded attempts under each variant's
training settings, saves the result as checkpoint S of a copy of the run (one copy a variant),
and evaluates it with `mcprl eval`. The attempts are the same for every variant, so the update
alone differs: the way to ask why one step's update broke a model, and what would not have.

    python benchmarks/replay_step.py RUN_DIR --step 4 --server example:catalog \
        --variant "as-run=" --variant "neg05=negative_weight=0.5" --out /tmp/replay \
        --eval-args "--examples 1 --example-choice similar --attempts 2 --seed 1000"

A variant is `NAME=KEY=VALUE,KEY=VALUE` over `TrainConfig` fields (`negative_weight`,
`learning_rate`, `scale_rewards`, `beta`, ...); the learning rate is the one the run used at that
step unless a variant sets it (`lr_scale=0.5` halves it); `drop_explored_failures=true` leaves
out the explored attempts (a first tool pinned for them) that fell below their group's mean.
`as-run=` (no settings) replays the step as recorded: its adapter should match the run's own
checkpoint S (printed). Results, one line a variant, in `OUT/replay.json`. The evaluations size
their own threads; `--threads 1` for the update where other work shares the machine.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from mcprl.training import TrainConfig


def _variant(text: str) -> tuple[str, dict[str, object]]:
    name, _, settings = text.partition("=")
    values: dict[str, object] = {}
    for item in filter(None, settings.split(",")):
        key, _, raw = item.partition("=")
        try:
            values[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            values[key.strip()] = raw.strip()
    return name, values


def _adapter_distance(a: Path, b: Path) -> float:
    """The L2 norm of the difference between two adapters' weights."""
    from safetensors.torch import load_file

    x, y = (load_file(str(p / "adapter_model.safetensors")) for p in (a, b))
    return float(sum(((x[k].float() - y[k].float()) ** 2).sum() for k in x) ** 0.5)


def replay(run_dir: Path, step: int, name: str, values: dict, out: Path) -> dict:
    from mcprl.backends._store import RunStore
    from mcprl.serving import resolve_model
    from mcprl.training import LoraTrainer
    from mcprl.types import read_groups

    config = json.loads((run_dir / "run_config.json").read_text())
    before = run_dir / "checkpoints" / f"{step - 1:04d}"
    recorded = json.loads((run_dir / "checkpoints" / f"{step:04d}" / "checkpoint.json").read_text())
    settings = dict(config["train"], learning_rate=recorded["metrics"]["learning_rate"])
    scale = float(values.pop("lr_scale", 1.0))
    drop_explored = bool(values.pop("drop_explored_failures", False))
    settings.update(values)
    settings["learning_rate"] = float(settings["learning_rate"]) * scale
    train = TrainConfig(**settings)

    project, model = run_dir.parent.name, run_dir.name
    copy = out / name / project / model
    shutil.rmtree(out / name, ignore_errors=True)
    copy.mkdir(parents=True)
    for f in ("model.json", "run_config.json", "scenarios.jsonl"):
        shutil.copy(run_dir / f, copy / f)
    shutil.copytree(before, copy / "checkpoints" / before.name)

    base = json.loads((run_dir / "model.json").read_text())["base_model"]
    trainer = LoraTrainer(str(resolve_model(base)), adapter_path=before, dtype="auto")
    trainer.load_state(before)
    groups = read_groups(run_dir / "trajectories" / "train" / f"{step:04d}.jsonl")
    if drop_explored:  # explored attempts (a first tool pinned, not demonstrated) below the mean
        for g in groups:
            mean = sum(t.reward for t in g.trajectories) / max(len(g.trajectories), 1)
            g.trajectories = [
                t
                for t in g.trajectories
                if not ("first_tool" in t.metadata and "demonstrated_calls" not in t.metadata)
                or t.reward >= mean
            ]
    started = time.perf_counter()
    metrics = trainer.step(groups, train)
    store = RunStore(out / name, project, model)
    path = store.write_checkpoint(step, trainer.save, {"metrics": metrics, "replayed": True})
    return {
        "variant": name,
        "settings": values
        | ({"lr_scale": scale} if scale != 1.0 else {})
        | ({"drop_explored_failures": True} if drop_explored else {}),
        "learning_rate": train.learning_rate,
        "grad_norm": metrics.get("grad_norm"),
        "moved": _adapter_distance(before, path),
        "from_recorded": _adapter_distance(run_dir / "checkpoints" / f"{step:04d}", path),
        "train_s": round(time.perf_counter() - started, 1),
        "dir": str(out / name),
        "project": project,
        "model": f"{model}@{step}",
    }


def evaluate(row: dict, server: str, eval_args: str) -> dict:
    output = Path(row["dir"]) / "eval"
    cmd = [
        sys.executable, "-m", "mcprl", "eval", server, "--model", row["model"],
        "--path", row["dir"], "--project", row["project"], "--output", str(output), "-q",
        *shlex.split(eval_args),
    ]  # fmt: skip
    subprocess.run(cmd, check=True)
    newest = max(output.iterdir(), key=lambda d: d.name)  # a folder per evaluation, by time
    return json.loads((newest / "results.json").read_text())[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--step", type=int, required=True)
    parser.add_argument("--server", required=True)
    parser.add_argument("--variant", action="append", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--eval-args", default="--attempts 2 --seed 1000")
    parser.add_argument(
        "--threads",
        type=int,
        help="torch threads for the replayed update; beside another busy process give 1 "
        "(one step took 306 s beside an evaluation with torch's default 2, 48 s alone)",
    )
    args = parser.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for text in args.variant:
        name, values = _variant(text)
        row = replay(args.run_dir, args.step, name, values, args.out)
        print(json.dumps(row), flush=True)
        row["eval"] = evaluate(row, args.server, args.eval_args)
        print(json.dumps({"variant": name, "eval": row["eval"]}), flush=True)
        rows.append(row)
        (args.out / "replay.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
