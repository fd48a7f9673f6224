"""Experiment trackers: a run's history rows, sent where the user follows experiments.

    trackers = open_trackers(["csv"], run_dir, name="calc/agent", config={...})
    for row in new_rows:            # the rows `history.jsonl` gets, as they are appended
        for t in trackers:
            t.log(row)
    close_trackers(trackers)

- `csv`: `metrics.csv` in the run directory, rewritten from every row so far (a resumed run's
  columns stay aligned); needs nothing.
- `tensorboard`: event files under `<run>/tensorboard/` (`tensorboard --logdir .mcprl`); needs
  the `tensorboard` package.
- `wandb`: a Weights & Biases run named after the project and model, resumed with the run;
  needs the `wandb` package and a login (`wandb login`, or WANDB_MODE=offline).

`history.jsonl` is always written; trackers are copies of it. A missing package is found before
the run starts (`open_trackers` raises `ValueError` naming the install command).

`TrackerObserver(kinds)` follows a `mcprl.train.TrainingRun`'s events: it checks the packages
when made, opens the trackers when the loop starts (with the history so far), logs each row the
run appends and closes them when the run ends.
"""

from __future__ import annotations

import csv
import hashlib
import importlib.util
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from mcprl.errors import UsageError

__all__ = [
    "TRACKERS",
    "Tracker",
    "TrackerObserver",
    "check_trackers",
    "close_trackers",
    "open_trackers",
]

TRACKERS = ("csv", "tensorboard", "wandb")


class Tracker(Protocol):
    def log(self, row: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def _numbers(row: dict[str, Any]) -> dict[str, float]:
    """The finite numeric metrics of a history row (the step is passed apart)."""
    out = {}
    for key, value in row.items():
        if key == "step" or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isfinite(value):
            out[key] = float(value)
    return out


class CsvTracker:
    """`metrics.csv`: one row per history row, a column per metric seen so far."""

    def __init__(self, run_dir: Path, history: Iterable[dict[str, Any]] = ()) -> None:
        self.path = run_dir / "metrics.csv"
        self.rows: list[dict[str, Any]] = list(history)  # a resumed run's rows so far

    def log(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        columns = ["step", *sorted({k for r in self.rows for k in _numbers(r)})]
        tmp = self.path.with_suffix(".csv.tmp")
        with tmp.open("w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=columns, restval="")
            writer.writeheader()
            for r in self.rows:
                writer.writerow({"step": r.get("step"), **_numbers(r)})
        tmp.replace(self.path)

    def close(self) -> None:
        return None


class TensorBoardTracker:
    def __init__(self, run_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def log(self, row: dict[str, Any]) -> None:
        for key, value in _numbers(row).items():
            self.writer.add_scalar(key, value, global_step=int(row.get("step", 0)))
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    def __init__(self, run_dir: Path, name: str, config: dict[str, Any]) -> None:
        import wandb

        # one W&B run per mcprl run, found again on resume
        run_id = hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:16]
        project = name.split("/")[0]
        self.run = wandb.init(
            project=f"mcprl-{project}", name=name, id=run_id, resume="allow", config=config
        )

    def log(self, row: dict[str, Any]) -> None:
        self.run.log(_numbers(row), step=int(row.get("step", 0)))

    def close(self) -> None:
        self.run.finish()


_NEEDS = {"tensorboard": "tensorboard", "wandb": "wandb"}


def check_trackers(names: Iterable[str]) -> None:
    """Raise `ValueError` for an unknown tracker or one whose package is missing."""
    for name in names:
        if name not in TRACKERS:
            raise UsageError(f"`trackers={name}`: unknown; choose from {', '.join(TRACKERS)}")
        package = _NEEDS.get(name)
        if package and importlib.util.find_spec(package) is None:
            raise UsageError(
                f"`trackers={name}` needs the {package} package: pip install {package} "
                "(or leave the tracker out: history.jsonl and `trackers=csv` need nothing)"
            )


def open_trackers(
    names: Iterable[str],
    run_dir: Path,
    *,
    name: str,
    config: dict[str, Any],
    history: Iterable[dict[str, Any]] = (),
) -> list[Tracker]:
    """The trackers named; `history` (rows logged before a resume) goes into the CSV file."""
    names = list(dict.fromkeys(names))
    check_trackers(names)
    trackers: list[Tracker] = []
    for kind in names:
        if kind == "csv":
            trackers.append(CsvTracker(run_dir, history))
        elif kind == "tensorboard":
            trackers.append(TensorBoardTracker(run_dir))
        else:
            trackers.append(WandbTracker(run_dir, name, config))
    return trackers


def close_trackers(trackers: Iterable[Tracker]) -> None:
    for tracker in trackers:
        tracker.close()


class TrackerObserver:
    """The trackers of a `TrainingRun`, fed from its events (see the module docstring)."""

    def __init__(self, kinds: Iterable[str]) -> None:
        self.kinds = list(kinds)
        check_trackers(self.kinds)  # before the run does any work
        self.trackers: list[Tracker] = []

    async def __call__(self, event: Any) -> None:
        from mcprl.train import RowRecorded, RunEnded, RunStarted

        if isinstance(event, RunStarted):
            config = event.run.config
            self.trackers = open_trackers(
                self.kinds,
                event.run.run_dir,
                name=f"{config.project}/{config.name}",
                config=config.model_dump(mode="json", exclude={"rubric"}),
                history=event.rows,
            )
        elif isinstance(event, RowRecorded):
            for tracker in self.trackers:
                tracker.log(event.row)
        elif isinstance(event, RunEnded):
            close_trackers(self.trackers)
            self.trackers = []
