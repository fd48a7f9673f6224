"""`FakeBackend`: the one test double of `mcprl.backends.Backend`.

It keeps runs on disk exactly as `LocalBackend` does (it inherits the same `StoredRuns`
methods), serves a given endpoint (a scripted policy, or none), and trains nothing: each
`train` records the groups it was given and advances the step, checkpointing a marker file.

`scripted_config` is the `RunConfig` of a run whose policy is a scripted endpoint.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mcprl.backends import Inference, StoredRuns, TrainResult
from mcprl.backends._store import RunStore
from mcprl.curriculum import is_informative
from mcprl.train import RunConfig


def scripted_config(**settings: Any) -> RunConfig:
    """A run for a scripted policy: reference reward, no evaluations, no report, and no worked
    example (a scripted policy reads every turn of the conversation, and an example's turns
    would come first). `settings` are `RunConfig`'s fields, over those."""
    config = RunConfig(
        **{"eval_every": 0, "reward": "reference", "write_report": False, **settings}
    )
    config.rollout.examples = 0
    return config


class FakeBackend(StoredRuns):
    def __init__(self, path: Path, base_url: str = "http://127.0.0.1:9/v1") -> None:
        self.path = Path(path)
        self.base_url = base_url
        self.registered: list[str] = []
        self.trained: list[list] = []
        self.configs: list = []  # the TrainConfig of each train() call
        self.rows: list[dict] = []  # the `metrics` each train call was given
        self._steps: dict[tuple[str, str], int] = {}

    async def check_model(self, base_model: str) -> None:
        from mcprl.serving import check_model

        check_model(base_model)

    async def register(self, model) -> int:
        self.registered.append(model.name)
        store = RunStore(self.path, model.project, model.name)
        if store.read_model_info() is None:
            store.write_model_info({"base_model": model.base_model})
        if store.latest_step() is None:
            store.write_checkpoint(0, self._save, {})
        step = store.latest_step()
        self._steps[(model.project, model.name)] = step
        return step

    async def inference(self, model) -> Inference:
        return Inference(base_url=self.base_url, api_key="fake", base_name=model.base_model)

    async def base_inference(self, base_model: str) -> Inference:
        return Inference(base_url=self.base_url, api_key="fake", base_name=base_model)

    async def serve_checkpoint(self, model, step: int) -> str:
        self.checkpoint(model, step)  # names the steps there are when it is missing
        return f"{model.name}@{step}"

    async def get_step(self, model) -> int:
        return self._current_step(model)

    async def train(self, model, groups, config=None, *, metrics=None, on_progress=None):
        step = self._current_step(model) + 1
        store = RunStore(self.path, model.project, model.name)
        store.write_trajectories("train", step, groups)
        self.trained.append(groups)
        self.configs.append(config)
        self.rows.append(metrics or {})
        by = config.informative if config is not None else "reward"
        skipped = not any(is_informative(g, by) for g in groups)
        result = {"reward_mean": 0.0, "skipped_update": float(skipped)}
        if on_progress is not None:
            on_progress(1, 1)
        store.write_checkpoint(step, self._save, {"metrics": result})
        self._steps[(model.project, model.name)] = step
        store.append_history({"step": step, **{f"train/{k}": v for k, v in result.items()},
                              **(metrics or {})})  # fmt: skip
        return TrainResult(step=step, metrics=result)

    def close(self) -> None:
        pass

    def _current_step(self, model) -> int:
        key = (model.project, model.name)
        if key not in self._steps:
            raise RuntimeError(f"model {model.name!r} is not registered with this backend")
        return self._steps[key]

    @staticmethod
    def _save(folder: Path) -> None:
        (folder / "adapter_config.json").write_text(json.dumps({"fake": True}))
