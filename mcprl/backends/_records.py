"""The `Backend` methods over a `RunStore` on this machine: history, trajectories, run files and
checkpoints. `LocalBackend` (and the server behind `RemoteBackend`) inherit them; a backend
that keeps its runs in a directory needs only `register`, `inference`, `get_step` and `train`.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from mcprl.backends._protocol import check_run_file, check_split
from mcprl.backends._store import RunStore, hold_run
from mcprl.errors import UsageError
from mcprl.model import TrainableModel
from mcprl.types import TrajectoryGroup, read_groups

__all__ = ["StoredRuns"]


class StoredRuns:
    """Runs kept under `self.path` (`<path>/<project>/<name>/`, DESIGN.md's layout)."""

    path: Path

    def _current_step(self, model: TrainableModel) -> int:
        """The step `model` serves now (registered models only)."""
        raise NotImplementedError

    def _reader(self, model: TrainableModel) -> RunStore:
        return RunStore(self.path, model.project, model.name, read_only=True)

    async def log(
        self,
        model: TrainableModel,
        metrics: dict[str, float],
        split: str = "val",
        groups: list[TrajectoryGroup] | None = None,
    ) -> None:
        step = self._current_step(model)
        store = RunStore(self.path, model.project, model.name)
        if groups is not None:
            store.write_trajectories(check_split(split), step, groups)
        store.append_history({"step": step, **{f"{split}/{k}": v for k, v in metrics.items()}})

    async def history(self, model: TrainableModel) -> list[dict[str, Any]]:
        return self._reader(model).history()

    async def trajectories(
        self, model: TrainableModel, split: str
    ) -> dict[int, list[TrajectoryGroup]]:
        folder = self._reader(model).dir / "trajectories" / check_split(split)
        return {
            int(p.stem): read_groups(p) for p in sorted(folder.glob("*.jsonl")) if p.stem.isdigit()
        }

    async def read_file(self, model: TrainableModel, name: str) -> str | None:
        path = self._reader(model).dir / check_run_file(name, write=False)
        return path.read_text(encoding="utf-8") if path.is_file() else None

    async def claim(self, model: TrainableModel) -> None:
        """Hold the run for this process's writes (`RunLockedError` if another writes it)."""
        hold_run(self._reader(model).dir)

    async def write_file(self, model: TrainableModel, name: str, text: str) -> None:
        folder = self._reader(model).dir
        hold_run(folder)
        tmp = folder / f".{check_run_file(name, write=True)}.tmp"
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(folder / name)

    async def list_checkpoints(self, model: TrainableModel) -> list[int]:
        return self._reader(model).steps()

    async def delete_checkpoints(
        self, model: TrainableModel, keep_last: int = 1, keep_best_by: str | None = "val/reward"
    ) -> list[int]:
        """Delete checkpoints but the latest `keep_last`, the one served, and the best by a
        history metric (`keep_best_by`)."""
        store = self._reader(model)
        steps = store.steps()
        keep = set(steps[-keep_last:]) if keep_last > 0 else set()
        keep.add(self._current_step(model))
        if keep_best_by:
            scored = [(r[keep_best_by], r["step"]) for r in store.history() if keep_best_by in r]
            if scored:
                keep.add(max(scored)[1])
        deleted = [s for s in steps if s not in keep]
        for s in deleted:
            store.delete_checkpoint(s)
        return deleted

    def checkpoint(self, model: TrainableModel, step: int) -> Path:
        """The directory of checkpoint `step`, or a `ValueError` naming the steps there are."""
        store = self._reader(model)
        steps = store.steps()
        if step not in steps:
            raise UsageError(
                f"{model.project}/{model.name} has no checkpoint of step {step}; it has "
                f"{', '.join(map(str, steps)) or 'none'}"
            )
        return store.checkpoint_path(step)

    async def download_checkpoint(self, model: TrainableModel, step: int, dest: Path) -> Path:
        shutil.copytree(self.checkpoint(model, step), dest)
        return Path(dest)

    async def local_dir(self, model: TrainableModel) -> Path | None:
        return self._reader(model).dir
