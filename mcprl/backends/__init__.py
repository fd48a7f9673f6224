"""Backends: where a trainable model is served and trained, behind one protocol (`Backend`).

- `LocalBackend`: the engine and the trainer in this process (CPU, or plain torch on CUDA).
- `RemoteBackend(url, api_key)`: a client for `mcprl serve --train` on another machine; the
  rollouts (and their MCP sessions) stay here, inference and training run there.
- `VLLMBackend`: vLLM serves (started here, or attached by URL), peft trains on CUDA.

The training loop, `mcprl eval` and `mcprl report` use only the `Backend` methods.
"""

from __future__ import annotations

from mcprl.backends._api import backend_routes
from mcprl.backends._local import LocalBackend
from mcprl.backends._protocol import (
    RUN_FILES,
    Backend,
    Inference,
    InferenceServer,
    Trainer,
    TrainResult,
    export_run,
)
from mcprl.backends._records import StoredRuns
from mcprl.backends._remote import BackendError, RemoteBackend
from mcprl.backends._store import RunStore
from mcprl.backends._vllm import VLLMBackend, VLLMServer

__all__ = [
    "RUN_FILES",
    "Backend",
    "BackendError",
    "Inference",
    "InferenceServer",
    "LocalBackend",
    "RemoteBackend",
    "RunStore",
    "StoredRuns",
    "TrainResult",
    "Trainer",
    "VLLMBackend",
    "VLLMServer",
    "backend_routes",
    "export_run",
]
