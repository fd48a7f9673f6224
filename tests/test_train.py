"""`mcprl train` and `mcprl eval` end to end: the real tiny model, the calculator over stdio.

The only double is the RULER judge (a scripted OpenAI-compatible endpoint on loopback), so that
every group carries a signal and the step must change the adapter. One run is shared by the
tests that inspect it.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from mcprl import read_groups
from mcprl.cli import main
from mcprl.scenarios import ScenarioSet
from tests.helpers import LocalChatServer, chat_completion, judge_ids, scores_reply

ROOT = Path(__file__).resolve().parent.parent


def _judge(body: dict) -> tuple[int, dict]:
    """Answers the preflight ping with OK; ranks each group's attempts in the order shown."""
    ids = judge_ids(body["messages"]) if len(body["messages"]) > 1 else []
    if not ids:
        return 200, chat_completion("OK")
    scores = {tid: round(0.9 - 0.8 * i / max(len(ids) - 1, 1), 3) for i, tid in enumerate(ids)}
    return 200, chat_completion(scores_reply(scores))


def _small_scenarios(path: Path) -> Path:
    """Two one-call training tasks and one val task from the curated calculator set."""
    easy = [
        s for s in ScenarioSet.load(ROOT / "scenarios" / "calculator.jsonl") if s.difficulty == 1
    ]
    train = [s for s in easy if s.split == "train"][:2]
    val = [s for s in easy if s.split == "val"][:1]
    ScenarioSet(train + val).save(path)
    return path


TRAIN_ARGS = [
    "--steps", "1", "--groups-per-step", "2", "--rollouts-per-group", "2", "--max-turns", "2",
    "--max-tokens", "24", "--eval-every", "0", "--val-attempts", "2", "-q",
]  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("train")
    scenarios = _small_scenarios(tmp / "calc.jsonl")
    with LocalChatServer(_judge) as judge:
        argv = [
            "train", "example:calculator", "--path", str(tmp / "runs"), "--scenarios",
            str(scenarios), "--reward", "ruler", "--judge", "openai/scripted-judge",
            "--judge-api-base", judge.base_url, *TRAIN_ARGS, "--tracker", "csv",
        ]  # fmt: skip
        code = main(argv)
        scored = [r for r in judge.requests if len(r["messages"]) > 1]
    return {"code": code, "run": tmp / "runs" / "calculator" / "agent", "tmp": tmp,
            "argv": argv, "judged": len(scored)}  # fmt: skip


def test_one_step_writes_checkpoint_history_trajectories_and_report(trained, capsys):
    run = trained["run"]
    assert trained["code"] == 0
    assert (run / "checkpoints" / "0001" / "adapter_model.safetensors").is_file()
    rows = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
    step_rows = [r for r in rows if r["step"] == 1 and "train/loss" in r]
    assert len(step_rows) == 1
    row = step_rows[0]
    for key in ("time/rollout_s", "time/judge_s", "train/time_train_s", "train/turns"):
        assert key in row, key
    assert row["train/trained_tokens"] > 0
    # the baseline (step 0) and the final evaluation (step 1) are both there
    assert [r["step"] for r in rows if "val/attempts" in r] == [0, 1]
    groups = (run / "trajectories" / "train" / "0001.jsonl").read_text().splitlines()
    assert len(groups) == 2
    assert trained["judged"] >= 2  # both training groups went to the judge
    html = (run / "report.html").read_text()
    for png in ("val.png", "train_reward.png", "scores.png", "behaviour.png", "time.png"):
        assert f'src="{png}"' in html and (run / png).stat().st_size > 1000
    assert "Best" in html and "Worst" in html


def test_the_run_keeps_its_settings_and_a_csv_copy_of_its_history(trained):
    run = trained["run"]
    settings = json.loads((run / "run_config.json").read_text())
    assert settings["steps"] == 1 and settings["trackers"] == ["csv"]
    rows = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
    with (run / "metrics.csv").open() as f:
        table = list(csv.DictReader(f))
    assert [r["step"] for r in table] == [str(r["step"]) for r in rows]
    assert float(next(r for r in table if r["train/loss"])["train/trained_tokens"]) > 0


def test_resuming_with_another_lora_shape_is_refused(trained, capsys):
    argv = [*trained["argv"], "--lora-r", "16"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "has a LoRA of r=8, alpha=16, not r=16, alpha=16" in err
    assert "--lora-r 8 --lora-alpha 16" in err


def test_the_step_changed_the_adapter_weights(trained):
    ckpt = trained["run"] / "checkpoints"
    before = load_file(ckpt / "0000" / "adapter_model.safetensors")
    after = load_file(ckpt / "0001" / "adapter_model.safetensors")
    assert before.keys() == after.keys()
    changed = {k for k in before if not (before[k] == after[k]).all()}
    # B starts at zero (the step-0 adapter equals the base model), so a first step moves every B
    lora_b = {k for k in before if "lora_B" in k}
    assert lora_b and lora_b <= changed


def test_running_again_resumes_without_repeating_work(trained, capsys):
    history = (trained["run"] / "history.jsonl").read_text()
    with LocalChatServer(_judge) as judge:
        argv = list(trained["argv"])
        argv[argv.index("--judge-api-base") + 1] = judge.base_url
        assert main(argv) == 0
    out = capsys.readouterr()
    assert "resuming at step 1" in out.err
    assert "done at step 1 of 1 (0 steps this run)" in out.out
    assert (trained["run"] / "history.jsonl").read_text() == history


def test_eval_puts_checkpoints_and_the_base_model_side_by_side(trained, capsys):
    out_dir = trained["tmp"] / "evals"
    argv = [
        "eval", "example:calculator", "--path", str(trained["tmp"] / "runs"), "--model",
        "agent@0", "--model", "agent", "--model", "base", "--max-turns", "2", "--max-tokens",
        "24", "--output", str(out_dir), "-q",
    ]  # fmt: skip
    assert main(argv) == 0
    table = capsys.readouterr().out
    for name in ("agent@0", "agent@1", "smollm2-135m"):
        assert f"| {name} |" in table
    assert "success" in table
    (saved,) = out_dir.iterdir()
    results = json.loads((saved / "results.json").read_text())
    assert [r["model"] for r in results] == ["agent@0", "agent@1", "smollm2-135m"]
    assert all(r["metrics"]["attempts"] == 1 for r in results)  # the one val scenario


def test_eval_shows_worked_examples_and_says_when_a_run_trained_with_another_number(
    trained, capsys
):
    out_dir = trained["tmp"] / "evals-examples"
    argv = [
        "eval", "example:calculator", "--path", str(trained["tmp"] / "runs"), "--model", "agent",
        "--examples", "2", "--max-turns", "2", "--max-tokens", "24", "--output", str(out_dir),
        "-q",
    ]  # fmt: skip
    assert main(argv) == 0
    note = "agent trained with 1 worked examples and this evaluation shows 2: `--examples 1`"
    assert note in " ".join(capsys.readouterr().err.split())
    (saved,) = out_dir.iterdir()
    (attempts,) = read_groups(saved / "agent@1.jsonl")[0].trajectories
    assert attempts.metadata["worked_examples"] == 2
    assert attempts.messages[1]["content"].startswith("Please complete this task:")


def test_eval_names_what_it_cannot_find(trained, capsys):
    argv = ["eval", "example:calculator", "--path", str(trained["tmp"] / "runs"), "--model",
            "nosuchrun"]  # fmt: skip
    assert main(argv) == 2
    assert "neither a run of project" in capsys.readouterr().err
    argv[-1] = "agent@9"
    assert main(argv) == 2
    assert "no checkpoint for that step" in capsys.readouterr().err


def _interrupt(
    tmp_path: Path, when: str, *extra: str, quiet: bool = True
) -> tuple[int, str, str, list[str]]:
    """Run `mcprl train`, press Ctrl-C once a stderr line starts with `when`; return the code,
    stdout, stderr and the lines seen before the signal."""
    flags = [a for a in TRAIN_ARGS if quiet or a != "-q"]
    scenarios = _small_scenarios(tmp_path / "calc.jsonl")
    argv = [
        sys.executable, "-m", "mcprl.cli", "train", "example:calculator", "--path",
        str(tmp_path / "runs"), "--scenarios", str(scenarios), "--reward", "reference",
        "--max-val", "1", *flags, "--val-attempts", "1", *extra,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    seen = ""  # read by character: a progress bar's text ends with \r, not a newline
    deadline = time.monotonic() + 240
    while when not in seen and time.monotonic() < deadline:
        char = proc.stderr.read(1)
        if not char:
            break
        seen += char
    lines = seen.splitlines(keepends=True)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err, lines


def test_ctrl_c_stops_cleanly_and_the_run_resumes(tmp_path):
    code, out, err, lines = _interrupt(tmp_path, "eval at step 0")  # after the baseline
    assert code == 130, "".join(lines) + err  # a script can tell it was cut short
    assert "stopping:" in err
    assert "stopped early at step 0" in out
    assert "resume: mcprl train" in out
    run = tmp_path / "runs" / "calculator" / "agent"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["0000"]
    assert not list((run / "checkpoints").glob(".*"))  # no half-written checkpoint


def test_ctrl_c_in_the_baseline_evaluation_exits_130_without_an_abort(tmp_path):
    # progress bars on (no -q), one thread: what a first run on a busy laptop looks like
    extra = ("--threads", "1")
    code, out, err, lines = _interrupt(tmp_path, "eval 0:", *extra, quiet=False)  # its bar
    assert code == 130, "".join(lines) + err
    assert "the evaluation in progress is dropped" in err  # the message fits the phase
    assert "terminate called" not in err and "Traceback" not in err
    assert "stopped early at step 0" in out


def _junk_judge(body: dict) -> tuple[int, dict]:
    """Passes the preflight ping, then never gives a usable verdict."""
    if len(body["messages"]) < 2:
        return 200, chat_completion("OK")
    return 200, chat_completion('{"scores": "all good"')


def test_a_judge_that_never_answers_usably_fails_the_run_and_keeps_no_step(tmp_path, capsys):
    scenarios = _small_scenarios(tmp_path / "calc.jsonl")
    with LocalChatServer(_junk_judge) as judge:
        code = main([
            "train", "example:calculator", "--path", str(tmp_path / "runs"), "--scenarios",
            str(scenarios), "--reward", "ruler", "--judge", "openai/junk", "--judge-api-base",
            judge.base_url, *TRAIN_ARGS,
        ])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1
    assert "the judge failed on 1 of 1 groups" in err and "no valid scores" in err
    checkpoints = tmp_path / "runs" / "calculator" / "agent" / "checkpoints"
    assert not (checkpoints / "0001").exists()
