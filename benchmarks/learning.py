"""Does training help? `mcprl train` as a user runs it, then `mcprl eval` over held-out seeds.

    python benchmarks/learning.py                                  # the default run, calculator
    python benchmarks/learning.py --server example:catalog
    python benchmarks/learning.py --variant lr1e-3="--lr 1e-3" --variant flat="--sampling uniform"

For each variant (a name and extra `mcprl train` flags; `default` is the command with no flags):

1. `mcprl train SERVER --path DIR --name VARIANT FLAGS` runs in a subprocess, exactly the
   command a user types, and its wall time is taken;
2. `mcprl eval SERVER --model base --model VARIANT --seed S` compares the base model and the
   trained adapter on the val split, once per evaluation seed (`--seeds`, from 1000: seeds that
   training never used), with the same attempts per scenario as the run's own evaluations,
   and with the variant's flags that say how attempts are made (`--dtype`, `--temperature`,
   `--min-p`, ...: the base model is measured as the trained one is).

It prints, per variant, val success and reward as mean ± sd over the seeds, the difference to the
base model in points and in units of the base model's seed-to-seed sd, the run's wall time and
its in-loop history (val success per evaluation, groups trained per step). Results go to
`benchmarks/results/learning-<server>.json`; `benchmarks/RESULTS.md` keeps the table.

A run takes half an hour or more. Given the `--path` of an interrupted one, `--resume` keeps the
variants that finished training there (their wall time is kept beside them) and the evaluations
that finished, and does only the rest (a training cut off midway resumes from its last
checkpoint, and its wall time then counts only the resumed part).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._machine import describe_machine  # noqa: E402


def _mcprl(*args: str, log: Path) -> float:
    """Run the `mcprl` CLI; return its wall time. Output goes to `log` (and errors raise)."""
    started = time.perf_counter()
    with log.open("a", encoding="utf-8") as out:
        out.write(f"\n$ mcprl {shlex.join(args)}\n")
        out.flush()
        done = subprocess.run(
            [sys.executable, "-m", "mcprl.cli", *args], stdout=out, stderr=subprocess.STDOUT
        )
    if done.returncode != 0:
        raise SystemExit(f"mcprl {shlex.join(args)} failed (exit {done.returncode}); see {log}")
    return time.perf_counter() - started


# `mcprl train` flags that `mcprl eval` takes too, and that change how an attempt is made
_EVAL_VALUED = ("--dtype", "--device", "--temperature", "--top-p", "--min-p", "--max-turns",
                "--max-tokens", "--results-as", "--examples", "--example-choice")  # fmt: skip
_EVAL_SWITCHES = ("--early-answer", "--answer-last", "--fresh-sessions", "--allow-writes")


def eval_flags(train_flags: list[str]) -> list[str]:
    """The flags of a training command that its evaluations must repeat."""
    out, it = [], iter(train_flags)
    for flag in it:
        name = flag.split("=", 1)[0]
        if name in _EVAL_SWITCHES:
            out.append(flag)
        elif name in _EVAL_VALUED:
            out += [flag] if "=" in flag else [flag, next(it, "")]
    return out


def _eval(server: str, path: Path, project: str, models: list[str], seed: int, log: Path,
          attempts: int, resume: bool = False, flags: list[str] = ()
          ) -> dict[str, dict[str, float]]:  # fmt: skip
    out = path / "evals" / f"seed{seed}-{'-'.join(models)}"
    done = sorted(out.glob("*/results.json")) if resume else []
    if not done:
        named = [a for m in models for a in ("--model", m)]
        _mcprl("eval", server, "--path", str(path), "--project", project, *named,
               "--seed", str(seed), "--attempts", str(attempts), "--output", str(out), "-q",
               *flags, log=log)  # fmt: skip
        done = sorted(out.glob("*/results.json"))
    results = done[-1]
    return {row["model"]: row["metrics"] for row in json.loads(results.read_text())}


def _sd(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def _history(run_dir: Path) -> dict[str, list]:
    rows = [json.loads(line) for line in (run_dir / "history.jsonl").read_text().splitlines()]
    return {
        "val_success": [(r["step"], r.get("val/success")) for r in rows if "val/attempts" in r],
        "train_success": [(r["step"], r.get("train/success")) for r in rows if "train/groups" in r],
        # the attempts the loop did not start (explored, demonstrated, guided): successes, of
        "train_own": [
            (r["step"], r["train/own_successes"], r["train/own_attempts"])
            for r in rows
            if "train/own_attempts" in r
        ],
        "train_judged_success": [
            (r["step"], r["train/judged_success"]) for r in rows if "train/judged_success" in r
        ],
        "groups_trained": [
            (r["step"], r.get("train/groups_trained")) for r in rows if "train/groups" in r
        ],
        "no_update_steps": [r["step"] for r in rows if r.get("train/skipped_update")],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--server", default="example:calculator")
    p.add_argument("--seeds", type=int, default=3, help="evaluation seeds (1000, 1001, ...)")
    p.add_argument("--attempts", type=int, default=2, help="eval attempts per val scenario")
    p.add_argument(
        "--variant",
        action="append",
        metavar="NAME=FLAGS",
        help="a run with extra `mcprl train` flags (repeatable; default: one run, no flags)",
    )
    p.add_argument("--path", help="where the runs go (default: a temporary directory)")
    p.add_argument("--out", help="results JSON (default benchmarks/results/learning-<server>.json)")
    p.add_argument(
        "--judge-standin",
        metavar="SCENARIOS",
        help="serve the judge stand-in (benchmarks/judge_standin.py) knowing these scenarios' "
        "answers; a variant's flags may then name its URL as {standin}, e.g. "
        "--variant ruler='--reward ruler --judge openai/standin --judge-api-base {standin}'",
    )
    p.add_argument("--standin-error-rate", type=float, default=0.1)
    p.add_argument(
        "--eval-scenarios",
        metavar="FILE",
        help="evaluate on this file's val scenarios (default: the run's own): for runs that "
        "train on scenarios with their references hidden, e.g. --variant hidden='--scenarios "
        "no-refs.jsonl ...' --eval-scenarios scenarios/calculator.jsonl",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="with --path: keep the trainings and evaluations that finished there; do the rest",
    )
    args = p.parse_args()

    variants = dict(v.split("=", 1) for v in (args.variant or ["default="]))
    standin = judge = None
    if args.judge_standin:
        from benchmarks.judge_standin import StandinJudge, serve
        from mcprl.scenarios import ScenarioSet

        judge = StandinJudge(ScenarioSet.load(args.judge_standin),
                             error_rate=args.standin_error_rate)  # fmt: skip
        standin, url = serve(judge)
        os.environ.setdefault("OPENAI_API_KEY", "standin")  # LiteLLM asks for one
        variants = {k: v.replace("{standin}", url) for k, v in variants.items()}
    if args.resume and not args.path:
        p.error("--resume needs the --path of the interrupted run")
    slug = args.server.replace("example:", "").replace("/", "_").replace(":", "_")
    out_file = Path(args.out or ROOT / "benchmarks" / "results" / f"learning-{slug}.json")
    out_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = None if args.path else tempfile.TemporaryDirectory()
    path = Path(args.path or tmp.name)
    log = path / "learning.log"
    path.mkdir(parents=True, exist_ok=True)
    project = "learning"
    results: dict = {"machine": describe_machine(), "server": args.server, "runs": {}}
    seeds = [1000 + i for i in range(args.seeds)]
    print(f"{results['machine']}\nruns in {path}, log {log}", flush=True)
    for name, flags in variants.items():
        train_args = ["train", args.server, "--path", str(path), "--project", project,
                      "--name", name, "-q", *shlex.split(flags)]  # fmt: skip
        timed = path / f"{name}.train_seconds"
        if args.resume and timed.exists():
            seconds = float(timed.read_text())
            print(f"{name}: trained before ({seconds / 60:.1f} min), kept", flush=True)
        else:
            if args.resume and (path / project / name).exists():
                print(f"{name}: resuming its training from the last checkpoint; the wall time "
                      "counts only what is left", flush=True)  # fmt: skip
            seconds = _mcprl(*train_args, log=log)
            timed.write_text(f"{seconds}\n")
        flags_of_eval = eval_flags(shlex.split(flags))
        if args.eval_scenarios:
            flags_of_eval += ["--scenarios", args.eval_scenarios]
        evals = [_eval(args.server, path, project, ["base", name], s, log, args.attempts,
                       args.resume, flags_of_eval) for s in seeds]  # fmt: skip
        base_key = next(k for k in evals[0] if "@" not in k)
        trained_key = next(k for k in evals[0] if "@" in k)
        run = {
            "flags": flags,
            "train_seconds": seconds,
            "history": _history(path / project / name),
            "base": {k: [e[base_key].get(k, 0.0) for e in evals] for k in ("success", "reward")},
            "trained": {
                k: [e[trained_key].get(k, 0.0) for e in evals] for k in ("success", "reward")
            },
            # successes and attempts per number of calls a task needs, over the seeds
            "by_calls": {
                "base": _by_calls([e[base_key] for e in evals]),
                "trained": _by_calls([e[trained_key] for e in evals]),
            },
            # the questions answered yes or no, beside what a constant answer scores on them
            "yes_no": {
                "base": _yes_no([e[base_key] for e in evals]),
                "trained": _yes_no([e[trained_key] for e in evals]),
            },
        }
        results["runs"][name] = run
        out_file.write_text(json.dumps(results, indent=2))
        _report_run(name, run)
    if standin is not None:  # what the stand-in scored: how many right, progress, random
        results["judge_standin"] = dict(judge.stats, error_rate=args.standin_error_rate)
        out_file.write_text(json.dumps(results, indent=2))
        standin.shutdown()
    _report(results)
    if tmp is not None:
        tmp.cleanup()


def _by_calls(metrics: list[dict[str, float]]) -> dict[str, list[int]]:
    from mcprl._stats import chain_counts

    out: dict[str, list[int]] = {}
    for m in metrics:
        for n, (k, checked) in chain_counts(m).items():
            done = out.setdefault(str(n), [0, 0])
            out[str(n)] = [done[0] + k, done[1] + checked]
    return out


def _yes_no(metrics: list[dict[str, float]]) -> dict[str, int] | None:
    """Successes, checked attempts and the better constant answer's successes on the yes/no
    questions, summed over the seeds; None where the val set has none."""
    keys = {"successes": "successes_yes_no", "checked": "checked_attempts_yes_no",
            "constant": "constant_yes_no"}  # fmt: skip
    if not any(m.get("checked_attempts_yes_no") for m in metrics):
        return None
    return {k: int(sum(m.get(key, 0.0) for m in metrics)) for k, key in keys.items()}


def _describe_yes_no(run: dict) -> str:
    b, t = (run.get("yes_no") or {}).get("base"), (run.get("yes_no") or {}).get("trained")
    if not b or not t:
        return ""
    return (
        f"; yes/no questions base {b['successes']} of {b['checked']}, trained {t['successes']} "
        f"of {t['checked']} (always the same answer: {t['constant']})"
    )


def _report_run(name: str, run: dict) -> None:
    b, t = run["base"]["success"], run["trained"]["success"]
    delta = statistics.mean(t) - statistics.mean(b)
    sd = _sd(b)
    print(
        f"{name}: val success base {statistics.mean(b):.1%} ± {sd:.1%} -> trained "
        f"{statistics.mean(t):.1%} ± {_sd(t):.1%} ({delta * 100:+.1f} points"
        + (f", {delta / sd:+.1f} base sd" if sd else "")
        + f"); train {run['train_seconds'] / 60:.1f} min{_describe_yes_no(run)}; "
        f"by calls needed (successes, attempts) "
        f"{json.dumps(run['by_calls'])}; history {json.dumps(run['history'])}",
        flush=True,
    )


def _report(results: dict) -> None:
    print(f"\n{results['machine']}\nserver {results['server']}")
    print("| run | flags | val success base | val success trained | Δ points | Δ / base sd "
          "| val reward base → trained | train time |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for name, run in results["runs"].items():
        b, t = run["base"]["success"], run["trained"]["success"]
        delta = statistics.mean(t) - statistics.mean(b)
        sd = _sd(b)
        rb, rt = run["base"]["reward"], run["trained"]["reward"]
        print(
            f"| {name} | `{run['flags'] or '(defaults)'}` | {statistics.mean(b):.1%} ± {sd:.1%} "
            f"| {statistics.mean(t):.1%} ± {_sd(t):.1%} | {delta * 100:+.1f} | "
            + (f"{delta / sd:+.1f}" if sd else "–")
            + f" | {statistics.mean(rb):.3f} → {statistics.mean(rt):.3f} | "
            f"{run['train_seconds'] / 60:.1f} min |"
        )


if __name__ == "__main__":
    main()
