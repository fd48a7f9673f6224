"""`ruler score` from the command line, against a judge endpoint on 127.0.0.1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ruler.cli import main, read_groups
from tests.helpers import LocalChatServer, chat_completion, judge_ids, scores_reply

EXAMPLE = Path(__file__).parent.parent / "examples" / "ruler" / "groups.jsonl"


def _judge(body: dict) -> tuple[int, dict]:
    ids = judge_ids(body["messages"])
    scores = {tid: round(1.0 - 0.2 * n, 2) for n, tid in enumerate(ids)}
    return 200, chat_completion(scores_reply(scores, order=list(reversed(ids))))


@pytest.fixture
def judge_server():
    with LocalChatServer(_judge) as server:
        yield server


def test_example_file_is_valid():
    groups = read_groups(EXAMPLE)
    assert len(groups) == 3
    assert [len(g["trajectories"]) for _, g in groups] == [4, 3, 2]


def test_score_the_example_file(judge_server, tmp_path, capsys):
    out = tmp_path / "scored.jsonl"
    args = ["score", str(EXAMPLE), "--judge", "openai/local", "--api-base", judge_server.base_url]
    code = main([*args, "--api-key", "k", "--out", str(out), "--no-cache", "--no-shuffle"])
    printed = capsys.readouterr().out
    assert code == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["line"] for r in rows] == [1, 2, 3]
    first = rows[0]
    ids = [s["trajectory_id"] for s in first["scores"]]
    assert ids == ["direct", "detour", "wrong", "no-tools"]
    assert [s["score"] for s in first["scores"]] == [1.0, 0.8, 0.6, 0.4]
    assert first["tools"] and first["usage"]["judge_calls"] == 1
    assert "direct" in printed and "1.00" in printed and "3 groups scored" in printed


def test_a_second_pass_in_reverse_order_cancels_a_judge_that_scores_by_position(
    judge_server, tmp_path, capsys
):
    """The endpoint scores attempts by where they are shown (1.0, 0.8, ...): shuffled, the
    scores no longer follow the file's order; with two passes every attempt of a group gets
    the same mean, and the passes' agreement (-1) shows the judge was guessing."""
    out = tmp_path / "scored.jsonl"
    args = ["score", str(EXAMPLE), "--judge", "openai/local", "--api-base", judge_server.base_url]
    assert main([*args, "--api-key", "k", "--out", str(out), "--no-cache", "--seed", "3"]) == 0
    shuffled = [[s["score"] for s in json.loads(line)["scores"]] for line in out.open()]
    assert sorted(shuffled[0], reverse=True) == [1.0, 0.8, 0.6, 0.4]
    assert shuffled[0] != [1.0, 0.8, 0.6, 0.4]  # seed 3 moves the first attempt
    assert main([*args, "--api-key", "k", "--out", str(out), "--no-cache", "--passes", "2"]) == 0
    rows = [json.loads(line) for line in out.open()]
    first = rows[0]
    assert [s["score"] for s in first["scores"]] == pytest.approx([0.7] * 4)
    assert first["agreement"] == pytest.approx(-1.0)
    assert first["usage"]["judge_calls"] == 2
    assert "agreement -1.00" in capsys.readouterr().out


def test_default_output_path_is_next_to_the_input(judge_server, tmp_path):
    src = tmp_path / "mine.jsonl"
    src.write_text(EXAMPLE.read_text())
    args = ["score", str(src), "--judge", "openai/local", "--api-base", judge_server.base_url]
    assert main([*args, "--api-key", "k", "--no-cache"]) == 0
    assert len((tmp_path / "mine.scored.jsonl").read_text().splitlines()) == 3


BAD_FILES = {
    "not json": ("{not json}\n", "line 1: not valid JSON"),
    "not a group": ('{"hello": 1}\n', "line 1: not a group"),
    "one trajectory": ('[[{"role": "user", "content": "hi"}]]\n', "line 1: a group needs at least"),
    "bad message on line 2": (
        EXAMPLE.read_text().splitlines()[0] + '\n[[{"role": "user"}], [{"content": "x"}]]\n',
        "line 2: trajectory 1",
    ),
    "empty": ("\n\n", "no groups found"),
    "not UTF-8 on line 2": (
        EXAMPLE.read_text().splitlines()[0] + '\n[[{"role": "user", "content": "caf\udce9"}]]\n',
        "line 2: not UTF-8 text (byte 0xe9",
    ),
}


@pytest.mark.parametrize("name", list(BAD_FILES))
def test_bad_input_exits_non_zero_naming_the_line(name, tmp_path, capsys):
    text, message = BAD_FILES[name]
    src = tmp_path / "bad.jsonl"
    src.write_bytes(text.encode("utf-8", "surrogateescape"))
    code = main(["score", str(src), "--judge", "openai/local", "--api-base", "http://127.0.0.1:9"])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert not (tmp_path / "bad.scored.jsonl").exists()


def test_missing_input_file(tmp_path, capsys):
    assert main(["score", str(tmp_path / "nope.jsonl"), "--judge", "openai/x"]) == 2
    assert "no such file" in capsys.readouterr().err


def test_unreachable_judge_exits_non_zero(tmp_path, capsys):
    out = tmp_path / "o.jsonl"
    args = ["score", str(EXAMPLE), "--judge", "openai/local", "--api-base", "http://127.0.0.1:9/v1"]
    code = main([*args, "--api-key", "k", "--retries", "1", "--out", str(out), "--no-cache"])
    err = capsys.readouterr().err
    assert code == 1
    assert "openai/local" in err and "is the judge running" in err
    assert "0 of 3 groups written" in err


def test_console_script_runs(judge_server, tmp_path):
    out = tmp_path / "o.jsonl"
    cmd = [sys.executable, "-m", "ruler.cli", "score", str(EXAMPLE), "--judge", "openai/local"]
    cmd += ["--api-base", judge_server.base_url, "--api-key", "k", "--out", str(out)]
    env = {**os.environ, "RULER_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "3 groups scored" in proc.stdout
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert again.stdout.count("(cached)") == 3
