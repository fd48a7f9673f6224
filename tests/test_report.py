"""`mcprl report`: plots and a readable page from a run's files, checked in a real browser."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from mcprl.backends import RunStore
from mcprl.cli import main
from mcprl.report import write_report
from mcprl.types import Trajectory, TrajectoryGroup


def _attempt(reward: float, answer: str) -> Trajectory:
    return Trajectory(
        messages=[
            {"role": "system", "content": "You have calculator tools."},
            {"role": "user", "content": "Add 2 and 3 <b>now</b>."},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function",
                     "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "5"},
            {"role": "assistant", "content": answer},
        ],
        reward=reward,
        metrics={"turns": 2.0, "tool_errors": 0.0, "reward_ruler": reward, "completed": 1.0},
        metadata={"scenario_id": "add-2-3", "final_answer": answer},
    )  # fmt: skip


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    store = RunStore(tmp_path, "calc", "agent")
    store.write_model_info({"base_model": "smollm2-135m"})
    for step in range(4):
        if step:
            store.append_history({
                "step": step, "train/reward_mean": 0.2 * step, "train/reward_std": 0.1,
                "train/turns": 3 - step * 0.5, "train/tool_errors": 1 / step,
                "time/rollout_s": 30.0, "time/judge_s": 5.0, "train/time_train_s": 12.0,
                "train/time_checkpoint_s": 0.3, "train/success": 0.1 * step,
                "train/reward_answer": 0.1 * step, "train/reward_calls": 0.3 * step,
                "train/reward_reported": 0.2, "train/groups_drawn": 6.0,
                "train/groups_trained": 0.0 if step == 2 else 4.0,
                "train/skipped_update": 1.0 if step == 2 else 0.0,
                **({"train/own_successes": 0.0, "train/own_attempts": 6.0} if step == 3 else {}),
                **({} if step == 2 else {"train/loss": -0.1, "train/grad_norm": 0.5,
                                        "train/kl": 0.0, "train/clip_fraction": 0.01,
                                        "train/abs_logprob_drift": 0.02}),
            })  # fmt: skip
            explored = _attempt(0.1, "It is 6, I think")
            explored.metadata["first_tool"] = "add"
            group = TrajectoryGroup(
                scenario_id="add-2-3", trajectories=[_attempt(0.9, "2 + 3 = 5"), explored]
            )
            store.write_trajectories("train", step, [group])
        store.append_history({"step": step, "val/attempts": 8.0, "val/success": 0.1 * step,
                              "val/reward": 0.15 * step, "val/time_s": 40.0})  # fmt: skip
    return store.dir


def test_report_shows_settings_trainer_metrics_and_each_attempts_outcome(run_dir: Path):
    from mcprl.scenarios import Reference, Scenario, ScenarioSet
    from mcprl.train import RunConfig

    config = RunConfig(project="calc", steps=3, trackers=["csv"])
    config.train.push_down_below = 0.05
    (run_dir / "run_config.json").write_text(config.model_dump_json())
    ScenarioSet(
        [Scenario(id="add-2-3", task="Add 2 and 3.", difficulty=1, reference=Reference(answer="5"))]
    ).save(run_dir / "scenarios.jsonl")
    html = write_report(run_dir).read_text()
    assert (run_dir / "trainer.png").stat().st_size > 5000 and 'src="trainer.png"' in html
    assert "<td>LoRA</td><td>r 8, alpha 16</td>" in html
    assert "<td>steps</td><td>3</td>" in html
    assert "<td>learning rate</td><td>0.002, linear</td>" in html
    assert "push down below 0.05, cap failures True, solved failures x0.0</td>" in html
    assert "stop: called complete_task · answer 2 + 3 = 5 · reference 5" in html
    assert "answer It is 6, I think · reference 5 · exploring: first call add, chosen by" in html
    assert "<td>sampling</td><td>fresh, oversample 1.5, explore 0.5</td>" in html
    assert "evaluation" in html  # the time chart's phases are in its caption


def test_report_has_plots_a_summary_and_the_best_and_worst_attempts(run_dir: Path):
    out = write_report(run_dir)
    html = out.read_text()
    pngs = ("val.png", "train_reward.png", "train_success.png", "scores.png",
            "reward_parts.png", "signal.png", "behaviour.png", "time.png")  # fmt: skip
    for png in pngs:
        assert (run_dir / png).stat().st_size > 5000, png
        assert f'src="{png}"' in html
    assert "2 of 3 steps updated the model.</b> No update at step 2: every group" in html
    assert "and of the model&#x27;s own: the attempts whose start the loop chose" in html
    assert "step 0" in html and "step 3" in html  # baseline and latest evaluation
    assert "<td>attempts</td><td>8</td><td>8</td>" in html  # counts are whole numbers
    best, worst = html.split("<h3>Best</h3>")[1].split("<h3>Worst</h3>")
    assert "2 + 3 = 5" in best and "It is 6" in worst
    assert "&lt;b&gt;now&lt;/b&gt;" in html  # conversation text is escaped, not rendered
    assert "→ add(" in html


def test_report_says_which_steps_lost_groups_to_the_judge(run_dir: Path):
    store = RunStore(run_dir.parent.parent, "calc", "agent")
    store.append_history({"step": 3, "train/groups_dropped": 2.0})
    assert "The judge failed on 2 groups</b> (step 3: 2)" in write_report(run_dir).read_text()


def test_report_escapes_every_field_of_a_hostile_run_folder(tmp_path: Path):
    store = RunStore(tmp_path, "calc", "agent")
    store.write_model_info({"base_model": "<script>alert('model')</script>"})
    store.append_history({"step": 1, "train/reward_mean": 0.5})
    evil = "<script>alert(1)</script>"
    attempt = Trajectory(
        messages=[
            {"role": evil, "content": evil},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": evil, "arguments": evil}}]},
        ],
        reward=1.0,
        metadata={"scenario_id": evil},
    )  # fmt: skip
    store.write_trajectories(
        "train", 1, [TrajectoryGroup(scenario_id=evil, trajectories=[attempt])]
    )
    html = write_report(store.dir).read_text()
    assert "<script>" not in html and "&lt;script&gt;alert(1)" in html


def test_report_cli_takes_project_slash_model(run_dir: Path, capsys):
    assert main(["report", "calc/agent", "--path", str(run_dir.parent.parent)]) == 0
    assert str(run_dir / "report.html") in capsys.readouterr().out


def test_report_of_a_directory_that_is_not_a_run_says_so(tmp_path: Path, capsys):
    assert main(["report", "nope/agent", "--path", str(tmp_path)]) == 1
    assert "not a training run" in capsys.readouterr().err


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(_chromium() is None, reason="headless Chromium is not installed")
def test_report_renders_in_headless_chromium(run_dir: Path, tmp_path: Path):
    from matplotlib.image import imread

    page = write_report(run_dir)
    shot = tmp_path / "report.png"
    subprocess.run(
        [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--screenshot={shot}", "--window-size=1200,1800", page.as_uri()],
        check=True, capture_output=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    pixels = imread(shot)
    assert pixels.shape[0] == 1800 and pixels.shape[1] == 1200
    # plots drawn: many distinct colours, and not a blank page
    colours = {tuple(p) for p in (pixels[::7, ::7, :3] * 255).astype(int).reshape(-1, 3)}
    assert len(colours) > 50, len(colours)
    json.dumps(str(shot))


def test_a_single_reply_without_tools_is_described_as_such():
    from mcprl.report import _stop_reason
    from mcprl.types import Choice

    reply = Trajectory(
        messages=[
            {"role": "user", "content": "Summarise."},
            {"role": "assistant", "content": "ok"},
        ],
        metrics={"completed": 1.0},
    )
    assert _stop_reason(reply) == "the reply ended on its own"  # never "called complete_task"
    reply.choices = [Choice(message_index=1, finish_reason="length")]
    assert _stop_reason(reply) == "the reply was cut at the token limit"


def test_the_reports_val_table_shows_success_counts_and_whether_they_moved_beyond_noise():
    from mcprl.report import _summary_table

    def val(step: int, successes: int) -> dict:
        return {"step": step, "val/attempts": 24.0, "val/success": successes / 24,
                "val/successes": float(successes), "val/checked_attempts": 24.0}  # fmt: skip

    table = _summary_table([val(0, 3), {"step": 1, "train/loss": 0.1}, val(10, 13)])
    assert "3 of 24 (12%, 95% CI 4–31%)" in table and "13 of 24 (54%, 95% CI 35–72%)" in table
    assert "Val success from step 0 to 10: +42 points (95% CI" in table
    assert "within the noise" not in table
    old = _summary_table([{"step": 0, "val/attempts": 24.0, "val/success": 0.125}])
    assert "12%" in old  # a history written before the counts still reads


def test_the_reports_val_table_sets_yes_no_successes_beside_a_constant_answer():
    """A trained "yes" habit scores on yes/no questions without reading: the report shows the
    yes/no successes at the first and latest step beside what a constant answer scores."""
    from mcprl.report import _summary_table

    def val(step: int, yes_no: int) -> dict:
        return {"step": step, "val/attempts": 24.0, "val/success": yes_no / 24,
                "val/successes": float(yes_no), "val/checked_attempts": 24.0,
                "val/successes_yes_no": float(yes_no), "val/checked_attempts_yes_no": 12.0,
                "val/constant_yes_no": 8.0}  # fmt: skip

    table = _summary_table([val(0, 0), val(10, 5)])
    assert "<td>yes/no questions</td><td>0 of 12 (always the same answer: 8)</td>" in table
    assert "<td>5 of 12 (always the same answer: 8)</td>" in table
    assert "yes/no" not in _summary_table([{"step": 0, "val/attempts": 24.0, "val/success": 0.1}])
