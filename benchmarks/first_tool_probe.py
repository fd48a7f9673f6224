"""Which tool does a model call first, task by task? The chance, not a sample.

    python benchmarks/first_tool_probe.py --run RUN_DIR [--adapter base|DIR ...]
        [--replay RUN_DIR [--lr-by-signal] [--set train.FIELD=JSON ...] [--probe-at 3,4,6,10]
         [--only-name] [--contrast]]

For each one-call task among the run's scenarios (`scenarios.jsonl`), the probe writes the
prompt an attempt's first turn sees (a stored first turn of the run, with the task swapped in:
same system prompt, tool block and turn budget), then the opening of a call up to the tool's
name (`<tool_call>\n{"name": "`), and reads the model's next-token distribution there. A
tool's chance is the mass of the tokens that spell a prefix of its name, over the mass of every
token that spells a prefix of a tool offered on the first turn (what the grammar lets through;
`complete_task` is held back until a tool was called). At temperature 1 that is the chance
that a sampled attempt's first call is that tool. It prints, for each tool that some task's
reference starts with, the mean chance of the right tool over those tasks and of the others.

`--adapter` probes checkpoints (`RUN/checkpoints/0004`) or the base model. `--replay` trains a
new adapter on another run's stored training groups, step by step, as that run's trainer did
(same groups, learning rate and schedule), with the settings changed by `--set` or
`--lr-by-signal`, and probes it after the steps of `--probe-at`: off-policy (the groups are
what the original policy sampled), so it screens a setting in minutes; learning is measured by
`learning.py`. `--only-name` trains on each attempt cut after its tool name's first token (the
choice alone); `--contrast` holds the groups of a step back until the held groups' best
attempts start with two or more different tools, then trains on them together. The catalog's
first-tool collapse was found so (RESULTS.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch

from mcprl.rewards import is_informative, winning_tool
from mcprl.serving import resolve_model
from mcprl.train import RunConfig, scheduled_lr
from mcprl.training import LoraConfig, LoraTrainer, TrainConfig
from mcprl.types import TrajectoryGroup


def _first_turn(run: Path) -> tuple[list[int], list[int], str, list[str]]:
    """A stored first turn of a one-call task: its prompt ids, the ids of its call's opening up
    to the name, its task and the tools offered."""
    by_id = {}
    for line in (run / "scenarios.jsonl").read_text().splitlines():
        s = json.loads(line)
        by_id[s["id"]] = s
    for path in sorted((run / "trajectories" / "train").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            group = json.loads(line)
            calls = ((by_id.get(group["scenario_id"]) or {}).get("reference") or {}).get("calls")
            if not calls or len(calls) != 1:
                continue
            for traj in group["trajectories"]:
                if traj["choices"]:
                    choice = traj["choices"][0]
                    names = [t["function"]["name"] for t in traj["tools"]]
                    task = by_id[group["scenario_id"]]["task"]
                    return choice["prompt_token_ids"], choice["token_ids"], task, names
    raise SystemExit(f"{run}: no stored first turn of a one-call task to copy the prompt from")


class Probe:
    def __init__(self, run: Path, base: str) -> None:
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(base)
        prompt, completion, task, names = _first_turn(run)
        text = self.tok.decode(prompt)
        opening = self.tok.decode(completion)
        cut = opening.index('"name": "') + len('"name": "')
        head = self.tok(opening[:cut], add_special_tokens=False)["input_ids"]
        for n in range(1, len(completion) + 1):  # the call's own spelling of its opening
            if self.tok.decode(completion[:n]) == opening[:cut]:
                head = completion[:n]
                break
        self.names = [n for n in names if n != "complete_task"]
        vocab = [self.tok.decode([i]) for i in range(len(self.tok))]
        self.allowed = {n: [i for i, s in enumerate(vocab) if s and n.startswith(s)]
                        for n in self.names}  # fmt: skip
        self.tasks = []
        for line in (run / "scenarios.jsonl").read_text().splitlines():
            s = json.loads(line)
            calls = (s.get("reference") or {}).get("calls") or []
            if len(calls) == 1 and calls[0]["tool"] in self.names:
                ids = self.tok(text.replace(task, s["task"]), add_special_tokens=False)
                self.tasks.append((calls[0]["tool"], ids["input_ids"] + list(head)))
        if not self.tasks:
            raise SystemExit(f"{run}: no one-call task with a reference call")

    @torch.no_grad()
    def __call__(self, model) -> dict[str, dict[str, float]]:
        """For each reference tool: the mean chance of each tool over its tasks."""
        was_training = model.training
        model.eval()
        sums: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        counts: dict[str, int] = defaultdict(int)
        for i in range(0, len(self.tasks), 12):
            chunk = self.tasks[i : i + 12]
            width = max(len(ids) for _, ids in chunk)
            ids = torch.tensor([ids + [0] * (width - len(ids)) for _, ids in chunk])
            mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for _, ids in chunk])
            logits = model(input_ids=ids, attention_mask=mask).logits
            for row, (right, prompt) in enumerate(chunk):
                p = torch.softmax(logits[row, len(prompt) - 1].float(), -1)
                mass = {n: float(p[self.allowed[n]].sum()) for n in self.names}
                total = sum(mass.values())
                for n, m in mass.items():
                    sums[right][n] += m / total
                counts[right] += 1
        model.train(was_training)
        return {r: {n: v / counts[r] for n, v in tools.items()} for r, tools in sums.items()}

    def line(self, label: str, chances: dict[str, dict[str, float]]) -> str:
        parts = []
        for right, tools in sorted(chances.items()):
            other = max((n for n in tools if n != right), key=tools.get)
            parts.append(f"{right} tasks: right {tools[right]:.3f} ({other} {tools[other]:.3f})")
        return f"{label} | " + " | ".join(parts)


def _load(base: str, adapter: str | None, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=dtype)
    if adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter)
    return model


def _up_to_the_name(group: TrajectoryGroup, tok) -> TrajectoryGroup:
    """The group with each attempt cut to its first call's opening and the name's first token
    (`--only-name`): the update then comes from the choice of tool alone."""
    out = []
    for traj in group.trajectories:
        first = traj.choices[0] if traj.choices else None
        ids = first.token_ids if first is not None else None
        cut = next(
            (n for n in range(1, len(ids or ())) if tok.decode(ids[:n]).endswith('"name": "')),
            None,
        )
        if cut is None:  # no call: nothing of a tool choice to train
            out.append(traj.model_copy(update={"choices": []}))
            continue
        short = first.model_copy(
            update={"token_ids": ids[: cut + 1], "logprobs": first.logprobs[: cut + 1]}
        )
        out.append(traj.model_copy(update={"choices": [short]}))
    return group.model_copy(update={"trajectories": out})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", type=Path, required=True, help="a run folder (its scenarios)")
    ap.add_argument("--adapter", action="append", default=[], help="base, or a checkpoint")
    ap.add_argument("--replay", type=Path, help="a run whose training groups to train on")
    ap.add_argument("--set", action="append", default=[], help="train.FIELD=JSON")
    ap.add_argument("--lr-by-signal", action="store_true")
    ap.add_argument(
        "--only-name",
        action="store_true",
        help="train on each attempt's first call up to its name's first token, nothing after",
    )
    ap.add_argument(
        "--contrast",
        action="store_true",
        help="hold a step's groups back until the held groups' winners start with two or more "
        "different tools, then train on them together",
    )
    ap.add_argument("--probe-at", default="3,4,6,10")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    args = ap.parse_args()
    base = resolve_model("smollm2-135m")
    probe = Probe(args.run, base)
    print(f"{len(probe.tasks)} one-call tasks of {args.run}", flush=True)
    for adapter in args.adapter:
        model = _load(base, None if adapter == "base" else adapter, getattr(torch, args.dtype))
        print(probe.line(adapter, probe(model)), flush=True)
    if args.replay is None:
        return
    config = RunConfig.model_validate_json((args.replay / "run_config.json").read_text())
    train = config.train.model_dump()
    for item in args.set:
        key, value = item.split("=", 1)
        train[key.removeprefix("train.")] = json.loads(value)
    trainer = LoraTrainer(base, LoraConfig(**config.lora.model_dump()), dtype="auto")
    at = {int(s) for s in args.probe_at.split(",")}
    held: list[TrajectoryGroup] = []
    for step in range(1, config.steps + 1):
        path = args.replay / "trajectories" / "train" / f"{step:04d}.jsonl"
        groups = [TrajectoryGroup.model_validate_json(s) for s in path.read_text().splitlines()]
        if args.only_name:
            groups = [_up_to_the_name(g, probe.tok) for g in groups]
        lr = scheduled_lr(train["learning_rate"], config.lr_schedule, step, config.steps)
        if args.contrast:
            held += [g for g in groups if is_informative(g, train["informative"])]
            if len({winning_tool(g) for g in held}) < 2:
                print(f"step {step}: {len(held)} groups held, no update", flush=True)
                continue
            groups, held = held, []
        signal = sum(is_informative(g, train["informative"]) for g in groups)
        if args.lr_by_signal and signal:
            lr *= min(1.0, signal / config.groups_per_step)
        metrics = trainer.step(groups, TrainConfig(**{**train, "learning_rate": lr}))
        label = f"step {step}: {signal} groups, lr {lr:.2e}, {metrics.get('sequences', 0):.0f} seqs"
        print(probe.line(label, probe(trainer.model)) if step in at else label, flush=True)


if __name__ == "__main__":
    sys.exit(main())
