"""Backends: where a trainable model is served and trained.

`LocalBackend` runs the engine and the trainer in this process. A backend implements
`register(model)`, `endpoint(model)`, `step(model)`, `train(model, groups, config)`,
`list_checkpoints(model)`, `delete_checkpoints(model, ...)` and `close()`.
"""

from __future__ import annotations

from mcprl.backends._local import LocalBackend, TrainResult
from mcprl.backends._store import RunStore

__all__ = ["LocalBackend", "RunStore", "TrainResult"]
