"""A run's files on disk: checkpoints, history, trajectories (the storage layout of DESIGN.md).

```
<root>/<project>/<model>/
  model.json                     base model, LoRA config, creation time
  checkpoints/<step:04d>/        adapter weights (safetensors) + optimizer state
  trajectories/<split>/<step:04d>.jsonl
  history.jsonl                  one metrics row per logged step
```

A checkpoint is written into a hidden temporary directory and renamed into place, so a process
killed mid-write leaves the previous checkpoint as the latest and no broken one behind; leftover
temporary directories are removed when the store opens.

One process writes a run at a time: the first write (or `hold_run`) takes an exclusive lock on
`.writer.lock` in the run folder (the `filelock` package; the operating system releases it when
the process ends, killed or not) and records who holds it in `.writer`. A second process that
would write fails at once with `RunLockedError`, naming the holder. Readers take no lock.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from mcprl.errors import RunLockedError
from mcprl.types import TrajectoryGroup, write_groups

__all__ = ["RunStore", "hold_run", "release_run"]

_HELD: dict[Path, FileLock] = {}  # the run folders this process writes
_HELD_LOCK = threading.Lock()


def hold_run(run_dir: str | os.PathLike[str]) -> None:
    """Take the run folder for this process's writes (a no-op when it already holds it); raise
    `RunLockedError`, naming the holder, when another process writes it."""
    folder = Path(run_dir).resolve()
    with _HELD_LOCK:
        if folder in _HELD:
            return
        folder.mkdir(parents=True, exist_ok=True)
        # not thread-local: a run is taken in a worker thread and let go in another
        lock = FileLock(str(folder / ".writer.lock"), timeout=0, thread_local=False)
        try:
            lock.acquire()
        except Timeout:
            holder = folder / ".writer"
            who = holder.read_text(encoding="utf-8").strip() if holder.is_file() else ""
            raise RunLockedError(
                f"{folder} is being written by another process ({who or 'unknown'}); wait for "
                "it to end, or give this run another `name`"
            ) from None
        _HELD[folder] = lock
        command = " ".join(Path(a).name if i == 0 else a for i, a in enumerate(sys.argv))
        (folder / ".writer").write_text(f"pid {os.getpid()}: {command[:200]}\n", encoding="utf-8")


def release_run(run_dir: str | os.PathLike[str]) -> None:
    """Let other processes write the run folder again (when this process is done with it)."""
    with _HELD_LOCK:
        lock = _HELD.pop(Path(run_dir).resolve(), None)
    if lock is not None:
        lock.release()


_DONE = "checkpoint.json"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class RunStore:
    def __init__(
        self, root: str | os.PathLike[str], project: str, model: str, *, read_only: bool = False
    ) -> None:
        """`read_only` (reports, evaluation) creates nothing and leaves a training process's
        unpublished checkpoints alone; a writer clears what a killed process left behind."""
        self.dir = Path(root) / project / model
        self.checkpoints_dir = self.dir / "checkpoints"
        self.read_only = read_only
        if read_only:
            return
        hold_run(self.dir)
        self.checkpoints_dir.mkdir(parents=True, exist_ok=True)
        for leftover in self.checkpoints_dir.glob(".tmp-*"):
            shutil.rmtree(leftover, ignore_errors=True)

    # -- model.json ----------------------------------------------------------------------------

    def read_model_info(self) -> dict[str, Any] | None:
        path = self.dir / "model.json"
        return json.loads(path.read_text()) if path.is_file() else None

    def write_model_info(self, info: dict[str, Any]) -> None:
        info = {"created": time.time(), **info}
        tmp = self.dir / ".model.json.tmp"
        tmp.write_text(json.dumps(info, indent=2))
        tmp.replace(self.dir / "model.json")

    # -- checkpoints ---------------------------------------------------------------------------

    def checkpoint_path(self, step: int) -> Path:
        return self.checkpoints_dir / f"{step:04d}"

    def steps(self) -> list[int]:
        """Steps with a complete checkpoint, ascending."""
        out = []
        if not self.checkpoints_dir.is_dir():
            return out
        for d in self.checkpoints_dir.iterdir():
            if d.is_dir() and d.name.isdigit() and (d / _DONE).is_file():
                out.append(int(d.name))
        return sorted(out)

    def latest_step(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    def write_checkpoint(self, step: int, save: Callable[[Path], None], meta: dict) -> Path:
        """Call `save(tmpdir)`, then publish it as checkpoint `step` in one rename."""
        final = self.checkpoint_path(step)
        tmp = self.checkpoints_dir / f".tmp-{step:04d}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        save(tmp)
        (tmp / _DONE).write_text(json.dumps({"step": step, "time": time.time(), **meta}))
        for f in tmp.iterdir():
            with f.open("rb") as fh:
                os.fsync(fh.fileno())
        _fsync_dir(tmp)
        if final.exists():  # a stale, unpublished directory of the same step
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(self.checkpoints_dir)
        return final

    def delete_checkpoint(self, step: int) -> None:
        shutil.rmtree(self.checkpoint_path(step), ignore_errors=True)

    # -- history and trajectories --------------------------------------------------------------

    def append_history(self, row: dict[str, Any]) -> None:
        with (self.dir / "history.jsonl").open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def history(self) -> list[dict[str, Any]]:
        path = self.dir / "history.jsonl"
        if not path.is_file():
            return []
        rows = []
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    continue  # a row cut short by a crash
        return rows

    def write_trajectories(self, split: str, step: int, groups: Iterable[TrajectoryGroup]) -> Path:
        return write_groups(self.dir / "trajectories" / split / f"{step:04d}.jsonl", groups)
