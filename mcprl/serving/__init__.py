"""The policy behind an OpenAI-compatible endpoint, on CPU: engine, models, HTTP server.

from mcprl.serving import LocalServer
with LocalServer("smollm2-135m") as server:       # loads the model, serves on 127.0.0.1
    client = openai.OpenAI(base_url=server.base_url, api_key=server.api_key)

A `LocalServer` makes up a random API key unless given one: only code in this process, which
can read `server.api_key`, can use it.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from mcprl.serving._api import EXTENSIONS
from mcprl.serving._engine import Completion, Engine, SamplingParams
from mcprl.serving._kv import CPU_ATTENTION
from mcprl.serving._models import (
    DEFAULT_MODEL,
    LoadedModel,
    cache_dir,
    check_model,
    load_model,
    native_bf16,
    pick_device,
    pick_dtype,
    resolve_model,
    torch_dtype,
)
from mcprl.serving._prefix import common_prefix_length, expanded_cache, prefix_kv
from mcprl.serving._server import (
    ServerHandle,
    adapter_request,
    allowed_hosts,
    build_app,
    check_bind,
    fail,
    json_body,
    start_server,
)
from mcprl.serving._threads import (
    ThreadGovernor,
    adaptive_threads,
    busy_at_start,
    fix_threads,
    start_with,
    threads_left,
)

__all__ = [
    "CPU_ATTENTION",
    "DEFAULT_MODEL",
    "EXTENSIONS",
    "Completion",
    "Engine",
    "LoadedModel",
    "LocalServer",
    "SamplingParams",
    "ServerHandle",
    "ThreadGovernor",
    "adapter_request",
    "adaptive_threads",
    "allowed_hosts",
    "build_app",
    "busy_at_start",
    "cache_dir",
    "check_bind",
    "check_model",
    "common_prefix_length",
    "expanded_cache",
    "fail",
    "fix_threads",
    "json_body",
    "load_model",
    "native_bf16",
    "pick_device",
    "pick_dtype",
    "prefix_kv",
    "resolve_model",
    "start_server",
    "start_with",
    "threads_left",
    "torch_dtype",
]


class LocalServer:
    """Load a model, start the engine and serve it in this process; a context manager.

    `api_key`: the bearer token clients must send (default: a random one, `self.api_key`).
    `adapter_dirs`: where `/v1/load_lora_adapter` may load adapters from (default: nowhere).
    `device`: `auto` (a GPU where present), `cpu` or `cuda[:N]`.
    `max_batch_size`, `max_batch_kv_bytes`: how much the engine decodes at once (`Engine`).
    """

    extensions = EXTENSIONS  # the request fields of mcprl's own it reads (`Inference`)

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        *,
        dtype: str = "auto",
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
        max_batch_size: int = 32,
        max_batch_kv_bytes: int | str | None = "auto",
        served_name: str | None = None,
        adapter_dirs: Iterable[str | Path] = (),
        device: str | None = "auto",
        routes: Iterable[tuple[str, Any, list[str]]] = (),
    ) -> None:
        # "" requires no key (mcprl serve on loopback); None makes up a private one
        self.api_key = api_key if api_key is not None else secrets.token_urlsafe(32)
        self.loaded = load_model(model, dtype=dtype, device=device)
        self.engine = Engine(
            self.loaded, max_batch_size=max_batch_size, max_batch_kv_bytes=max_batch_kv_bytes
        )
        self.name = served_name or model
        self.handle = start_server(
            self.engine,
            self.name,
            host=host,
            port=port,
            api_key=self.api_key,
            adapter_dirs=adapter_dirs,
            routes=routes,
        )

    @property
    def base_url(self) -> str:
        return self.handle.base_url

    def allow_adapter_dir(self, path: str | Path) -> None:
        """Let the server load adapters from `path` too (see `ServerHandle.allow_adapter_dir`)."""
        self.handle.allow_adapter_dir(path)

    def paused(self) -> Any:
        """A context in which the engine decodes nothing (a training step holds the model)."""
        return self.engine.paused()

    def run_exclusive(self, fn: Any) -> Any:
        """`fn()` on the engine's thread while it decodes nothing (see `Engine.run_exclusive`)."""
        return self.engine.run_exclusive(fn)

    def close(self) -> None:
        self.handle.stop()
        self.engine.close()

    def __enter__(self) -> LocalServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
