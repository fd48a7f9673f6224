"""Does the model read an answer out of a listing, with the call made for it?

    python benchmarks/reading_probe.py [--sizes 1,2,4,8] [--model base] [--path RUNS --project P
                                       --model NAME@STEP] [--attempts 4] [--seed 1000]

A probe of the step after the call on `mcp-server-git` (installed by `public_servers.py`):
repositories holding the first N commits of the bench repository (`public_servers.COMMITS`),
and for each the questions the grounded generator asks of a `git_log` listing: the author of
each of the newest four commits, "is there a commit named …?" (one yes, one no) and "how many
commits are there?". Every attempt's first call is `git_log` of that repository, pinned (a
demonstration: `RolloutConfig.first_tool` and `first_arguments`); what the model answers after
it is its own. It prints the successes by listing size and kind of question for each model.
If a short listing is read and a long one is not, a curriculum over result length is worth
building; if neither is read, the length is not what stops learning.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).parent))
from public_servers import COMMITS, public_servers

from mcprl.backends import LocalBackend
from mcprl.evaluate import backend_models, evaluate_models
from mcprl.rollout import RolloutConfig
from mcprl.scenarios import Reference, ReferenceCall, Scenario


def _repository(path: Path, n: int) -> Path:
    """A repository of the bench repository's first `n` commits (the same ids)."""
    path.mkdir(parents=True)
    git = lambda *a, **env: subprocess.run(  # noqa: E731
        ["git", *a], cwd=path, check=True, capture_output=True, env={**os.environ, **env}
    )
    git("init", "-q", "-b", "main")
    for name, text, message, author, date in COMMITS[:n]:
        (path / name).write_text(text)
        git("add", name)
        email = author.split()[0].lower() + "@example.com"
        dates = {"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
        git("commit", "-q", "-m", message, f"--author={author} <{email}>", **dates,
            GIT_COMMITTER_NAME=author, GIT_COMMITTER_EMAIL=email)  # fmt: skip
    return path


def _questions(repo: Path, n: int) -> list[Scenario]:
    call = [ReferenceCall(tool="git_log", arguments={"repo_path": str(repo)})]
    asks = [("lookup", f'what is the author of the commit "{message}"?', author)
            for _, _, message, author, _ in COMMITS[:n][::-1][:4]]  # fmt: skip
    asks += [("exists", f'is there a commit named "{COMMITS[0][2]}"?', "yes"),
             ("exists", 'is there a commit named "Add plum jam"?', "no"),
             ("count", "how many commits are there?", str(n))]  # fmt: skip
    return [
        Scenario(
            id=f"n{n}-{i}",
            task=f'For repo path "{repo}", {text}',
            difficulty=1,
            tags=["probe", kind],
            split="val",
            reference=Reference(answer=answer, calls=call, needs_calls=True),
        )
        for i, (kind, text, answer) in enumerate(asks)
    ]


async def _probe(args: argparse.Namespace, backend, root: Path) -> dict:
    # the server's executable: each size gets a repository of its own
    git = public_servers()["git (mcp-server-git)"].split()[0]
    models = await backend_models(args.model, backend, project=args.project)
    table: dict = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for n in args.sizes:
        repo = _repository(root / f"r{n}", n)
        pinned = {"first_tool": "git_log", "first_arguments": {"repo_path": str(repo)}}
        config = RolloutConfig().model_copy(update=pinned)
        scenarios = _questions(repo, n)
        _, groups = await evaluate_models(
            models, scenarios, f"{git} --repository {repo}", config, attempts=args.attempts,
            seed=args.seed, progress=False,
        )  # fmt: skip
        kind = {s.id: s.tags[1] for s in scenarios}
        for model, gs in groups.items():
            for g in gs:
                cell = table[model][f"{n} commits, {kind[g.scenario_id]}"]
                cell[0] += sum(t.metrics.get("success", 0) == 1 for t in g.trajectories)
                cell[1] += len(g.trajectories)
        so_far = {m: {k: f"{a} of {b}" for k, (a, b) in c.items()} for m, c in table.items()}
        print(json.dumps(so_far), flush=True)
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1,2,4,8", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--model", action="append", help="as `mcprl eval --model` (default base)")
    parser.add_argument("--path", default=".mcprl", help="where the runs of --model live")
    parser.add_argument("--project", default="learning")
    parser.add_argument("--attempts", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1000)
    args = parser.parse_args()
    args.model = args.model or ["base"]
    with tempfile.TemporaryDirectory() as root, LocalBackend(args.path) as backend:
        table = anyio.run(_probe, args, backend, Path(root))
    for model, cells in table.items():
        print(f"\n{model}")
        for key, (ok, total) in cells.items():
            print(f"  {key}: {ok} of {total}")


if __name__ == "__main__":
    main()
