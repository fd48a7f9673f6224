"""The `mcprl` command line: tools and scenarios."""

from __future__ import annotations

import json

import pytest

from mcprl.cli import main
from mcprl.scenarios import ScenarioSet
from tests.helpers import LocalChatServer, chat_completion


def test_tools_lists_names_arguments_and_resources(capsys):
    assert main(["tools", "example:catalog"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("catalog: 5 tools, 1 resource\n")
    assert "search_books(query: string, limit?: integer)" in out
    assert "aggregate(book_ids: array, field: price|pages|rating|year|in_stock" in out
    assert "catalog://about" in out


def test_tools_json_is_machine_readable(capsys):
    assert main(["tools", "example:calculator", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["name"] == "calculator"
    assert {t["name"] for t in data["tools"]} >= {"add", "convert_units"}


def test_tools_reports_a_server_that_cannot_start(capsys):
    assert main(["tools", "python -c 'import sys; sys.exit(\"no config\")'"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("mcprl: error: could not start MCP server") and "no config" in err


def test_scenarios_without_a_provider_uses_the_grounded_generator(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("MCPRL_GENERATOR", raising=False)
    out = tmp_path / "cat.jsonl"
    assert main(["scenarios", "example:catalog", "-n", "6", "-o", str(out), "--seed", "3"]) == 0
    captured = capsys.readouterr()
    assert "no LLM provider is configured" in captured.err and "grounded" in captured.err
    assert "wrote 6 scenarios" in captured.out and "difficulty 1:" in captured.out
    scenarios = ScenarioSet.load(out)
    assert len(scenarios) == 6 and all(s.reference for s in scenarios)
    assert {s.split for s in scenarios} == {"train", "val"}


def test_scenarios_with_an_llm_generator_on_a_local_endpoint(tmp_path, capsys):
    counter = iter(range(100))

    def respond(body):
        k = next(counter)
        items = [{"task": f"Convert {k * 10 + j} km to miles.", "difficulty": 1} for j in range(4)]
        return 200, chat_completion(json.dumps({"scenarios": items}))

    out = tmp_path / "calc.jsonl"
    with LocalChatServer(respond) as server:
        args = ["scenarios", "example:calculator", "-n", "4", "-o", str(out)]
        code = main([*args, "--generator", "openai/local", "--api-base", server.base_url])
    assert code == 0
    assert [s.task for s in ScenarioSet.load(out)] == [
        f"Convert {j} km to miles." for j in range(4)
    ]
    assert "Convert 0 km to miles." in capsys.readouterr().out


def test_scenarios_needs_an_output_file(capsys):
    with pytest.raises(SystemExit):
        main(["scenarios", "example:calculator"])
    assert "-o/--output" in capsys.readouterr().err


def test_loop_flags_reach_the_rollout_config():
    from mcprl.cli._options import run_config
    from mcprl.cli._parser import build_parser

    args = build_parser().parse_args(["train", "example:calculator", "--results-as", "text"])
    assert run_config(args).rollout.results_as == "text"
    default = build_parser().parse_args(["train", "example:calculator", "--early-answer"])
    config = run_config(default).rollout
    assert config.results_as == "json" and config.look_before_answer is False


def test_sampling_flags_reach_the_rollout_config_of_train_and_eval():
    from mcprl.cli._options import ROLLOUT, given, run_config
    from mcprl.cli._parser import build_parser

    flags = ["--temperature", "0.8", "--top-p", "0.95", "--min-p", "0.1"]
    config = run_config(build_parser().parse_args(["train", "example:calculator", *flags])).rollout
    assert (config.temperature, config.top_p, config.min_p) == (0.8, 0.95, 0.1)
    ev = build_parser().parse_args(
        ["eval", "example:calculator", "--model", "base", "--dtype", "float32", *flags]
    )
    assert given(ev, ROLLOUT) == {"temperature": 0.8, "top_p": 0.95, "min_p": 0.1}
    assert ev.dtype == "float32"


def test_training_flags_reach_the_train_config():
    from mcprl.cli._options import run_config
    from mcprl.cli._parser import build_parser

    args = build_parser().parse_args(
        ["train", "example:calculator", "--positive-weight", "0.1", "--scale-rewards", "none"]
    )
    train = run_config(args).train
    assert train.positive_weight == 0.1 and train.scale_rewards == "none"
    assert (
        run_config(build_parser().parse_args(["train", "example:calculator"])).train.positive_weight
        == 1.0
    )


@pytest.mark.parametrize("flag", ["--step", "--stepz"])
def test_a_flag_is_exact_and_a_wrong_one_gets_its_commands_usage(flag, capsys):
    """`--step 3` was taken as `--steps 3` (argparse's prefix matching), and `--stepz` got the
    top-level usage instead of `train`'s."""
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "example:calculator", flag, "3"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "usage: mcprl train" in err
    assert f"unrecognized arguments: {flag} 3 (did you mean --steps?)" in err


def test_piped_output_gets_one_line_per_phase_not_redraws(tmp_path):
    """Piped to a file, the bars redrew every second: a quick run wrote 121 KB of log."""
    import re
    import subprocess
    import sys

    out = tmp_path / "s.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "mcprl.cli", "scenarios", "example:calculator", "--grounded",
         "-n", "4", "-o", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "\r" not in done.stderr and "\x1b" not in done.stderr
    assert re.search(r"^scenarios for calculator: 4/4 in \d+ s, 4 tried", done.stderr, re.M)


def test_a_logged_phase_writes_a_line_when_it_starts_and_one_when_it_ends(capsys):
    from mcprl._progress import progress_bar

    with progress_bar(total=2, desc="training", unit="attempt") as bar:
        bar.update(2)
        bar.refresh()
        bar.set_postfix_str("reward 0.5")
    assert [*progress_bar([1, 2], desc="listing")] == [1, 2]
    with progress_bar(total=3, desc="judging", enabled=False) as bar:
        bar.update(3)
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" in ")[0] for line in lines] == [
        "training: 2 attempts …",
        "training: 2/2 attempts",
        "listing: 2 …",
        "listing: 2/2",
    ]
    assert lines[1].endswith(", reward 0.5")


# `mcprl train` options that are not settings of the run (RunConfig): how to reach the server,
# where its scenarios come from, which backend runs it and how, and what is displayed
_NOT_RUN_SETTINGS = {
    "-h", "--header", "--scenarios", "-n", "--generator", "--path", "--quick",
    "--dtype", "--device", "--threads", "--max-batch-kv-mb", "--backend", "--api-key",
    "--vllm-url", "--vllm-sleep", "--trainer", "-q", "--oauth-client-id", "--oauth-scope",
    "--oauth-issuer",
}  # fmt: skip


def _flat(config) -> dict:
    out = {}
    for key, value in config.model_dump().items():
        if isinstance(value, dict):
            out |= {f"{key}.{k}": v for k, v in value.items()}
        else:
            out[key] = value
    return out


def _values(action) -> list[list[str]]:
    if action.nargs == 0:
        return [[]]
    if action.choices:
        return [[c] for c in action.choices]
    if action.type is int:
        return [["3"], ["1"], ["2"]]
    if action.metavar == "IN,OUT":
        return [["0.5,2"]]
    if action.type is float:
        return [["0.37"], ["1.5"], ["2"]]
    return [["some-value"]]


def test_every_train_option_sets_a_run_setting_whose_default_lives_in_the_config():
    """Each setting is declared once: a flag left out keeps RunConfig's own default, and every
    other option of `mcprl train` changes one setting of the run."""
    from mcprl.cli._options import run_config
    from mcprl.cli._parser import build_parser
    from mcprl.errors import UsageError
    from mcprl.train import RunConfig

    parser = build_parser()
    argv = ["train", "example:calculator", "--project", "p"]
    base = run_config(parser.parse_args(argv))
    assert base == RunConfig(project="p")
    unmapped = []
    for action in parser.commands["train"]._actions:
        flag = action.option_strings[-1] if action.option_strings else None
        if flag is None or set(action.option_strings) & _NOT_RUN_SETTINGS:
            continue
        changed = set()
        for value in _values(action):
            try:
                config = run_config(parser.parse_args([*argv, flag, *value]))
            except UsageError:  # out of the setting's range: the config refused it
                continue
            changed |= {k for k, v in _flat(config).items() if _flat(base)[k] != v}
        if not changed:
            unmapped.append(flag)
    assert unmapped == []


def test_library_errors_name_settings_and_the_cli_names_their_flags():
    """Library messages name a setting as `field` or `field=value`; the CLI prints the flag."""
    from mcprl.cli._options import flags_for

    assert flags_for("resume with `lora.r=8` `lora.alpha=16`, or another `name`") == (
        "resume with --lora-r 8 --lora-alpha 16, or another --name"
    )
    assert flags_for("off with `rollout.look_before_answer=False`") == "off with --early-answer"
    assert flags_for("(`allow_writes=True` calls them)") == "(--allow-writes calls them)"
    # a command, or a name that is no setting, stays as written
    assert flags_for("see `mcprl scenarios --grounded` and `complete_task`") == (
        "see `mcprl scenarios --grounded` and `complete_task`"
    )


def test_serve_bounds_the_batch_memory_it_is_told_and_refuses_a_size_it_cannot_read(
    monkeypatch, capsys, tmp_path
):
    """`mcprl serve --max-batch-kv-mb` reaches the engine in bytes (0: no bound, default auto),
    `serve --train` passes it to the server it starts, and a size that is not a number fails
    before any model loads, naming the flag."""
    import uvicorn

    import mcprl.serving
    from mcprl.backends import LocalBackend
    from mcprl.cli._commands import cmd_serve
    from mcprl.cli._parser import build_parser

    parser = build_parser()
    assert parser.parse_args(["serve"]).max_batch_kv_mb == "auto"
    assert parser.parse_args(["serve", "--max-batch-kv-mb", "0"]).max_batch_kv_mb is None
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--max-batch-kv-mb", "lots"])
    err = capsys.readouterr().err
    assert "--max-batch-kv-mb" in err and "megabytes" in err

    engines = []

    class Engine:
        def __init__(self, loaded, **kwargs):
            engines.append(kwargs)

        def close(self):
            pass

    monkeypatch.setattr(mcprl.serving, "load_model", lambda *a, **k: None)
    monkeypatch.setattr(mcprl.serving, "Engine", Engine)
    monkeypatch.setattr(mcprl.serving, "build_app", lambda *a, **k: None)
    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: None)
    assert cmd_serve(parser.parse_args(["serve", "--max-batch-kv-mb", "256"])) == 0
    assert engines == [{"max_batch_size": 32, "max_batch_kv_bytes": 256 * 2**20}]

    servers = []
    monkeypatch.setattr(mcprl.serving, "LocalServer", lambda *a, **k: servers.append(k))
    LocalBackend(tmp_path, device="cpu", max_batch_kv_bytes=None)._local_server("m", [])
    assert servers[0]["max_batch_kv_bytes"] is None


@pytest.mark.parametrize(
    "command", [["train", "example:calculator"], ["eval", "example:calculator", "--model", "base"]]
)
def test_train_and_eval_bound_their_engines_batch_memory_on_request(monkeypatch, command):
    """`mcprl train --max-batch-kv-mb 512` (and `eval`) gives the local backend's engine the
    smaller batch a machine short of memory needs; the default stays auto; with a backend
    elsewhere, whose server decides its own batch, the flag is refused by name."""
    import mcprl.backends
    from mcprl.cli import _machine
    from mcprl.cli._machine import open_backend
    from mcprl.cli._parser import build_parser
    from mcprl.errors import UsageError

    made = []
    monkeypatch.setattr(mcprl.backends, "LocalBackend", lambda *a, **k: made.append(k))
    # threads are process-wide: a count fixed here would hold for every later test
    monkeypatch.setattr(_machine, "set_threads", lambda args: None)
    parser = build_parser()
    open_backend(parser.parse_args([*command, "--max-batch-kv-mb", "512", "--device", "cpu"]))
    open_backend(parser.parse_args(command))
    assert [k["max_batch_kv_bytes"] for k in made] == [512 << 20, "auto"]
    remote = [*command, "--backend", "http://gpu-box:8000", "--max-batch-kv-mb", "512"]
    with pytest.raises(UsageError, match=r"--max-batch-kv-mb.*leave the flag out"):
        open_backend(parser.parse_args(remote))
