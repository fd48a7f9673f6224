"""`VLLMBackend`: vLLM serves the rollouts, peft trains the LoRA (on CUDA where present).

    backend = VLLMBackend(".mcprl")                                   # starts `vllm serve`
    backend = VLLMBackend(".mcprl", vllm_url="http://gpu:8000/v1")   # or attaches to one

It is a `LocalBackend` whose inference server is vLLM: checkpoints, history and resuming are
the same; each new checkpoint is loaded into vLLM by path through `/v1/load_lora_adapter` (so
an attached server must read the backend's `path` at the same absolute path) and served as
`name@step`. A started server runs `vllm serve BASE --enable-lora --max-lora-rank R` with
runtime adapter loading allowed (`VLLM_ALLOW_RUNTIME_LORA_UPDATING=1`). Where inference and
training share one GPU, `sleep_mode=True` puts vLLM to sleep while a step trains (its
`/sleep` and `/wake_up` endpoints: a started server gets `--enable-sleep-mode` and
`VLLM_SERVER_DEV_MODE=1`); otherwise vLLM keeps `gpu_memory_utilization` of the GPU and the
trainer uses the rest. Rollouts ask vLLM for token ids and log-probabilities in its own request
fields, and `mcprl.tokens` reads its replies.

Training is peft's (`mcprl.training.LoraTrainer`), or Unsloth's (`UnslothTrainer`) with
`trainer="unsloth"`, or with `auto` (the default) where Unsloth is installed and the device is a
GPU; `auto` falls back to peft, with a warning, for a model Unsloth cannot load.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx

from mcprl.backends._local import LocalBackend
from mcprl.errors import UsageError

__all__ = ["VLLMBackend", "VLLMServer"]

logger = logging.getLogger(__name__)


class VLLMServer:
    """A vLLM OpenAI-compatible server: attached by `url`, or started as a subprocess."""

    def __init__(
        self,
        base_model: str,
        *,
        url: str | None = None,
        api_key: str | None = None,
        sleep_mode: bool = False,
        max_lora_rank: int = 16,
        gpu_memory_utilization: float = 0.5,
        extra_args: Sequence[str] = (),
        startup_timeout: float = 900.0,
    ) -> None:
        self.api_key = api_key or os.environ.get("VLLM_API_KEY") or "EMPTY"
        self.sleep_mode = sleep_mode
        self.proc: subprocess.Popen | None = None
        if url is not None:
            url = url.rstrip("/")
            self.base_url = url if url.endswith("/v1") else f"{url}/v1"
            self._wait(startup_timeout, attached=True)
            return
        if shutil.which("vllm") is None:
            raise UsageError(
                "vLLM is not installed here (no `vllm` command): install it on the GPU machine "
                "(pip install vllm), or attach to a running server with `vllm_url=URL`"
            )
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        command = ["vllm", "serve", base_model, "--enable-lora", "--max-lora-rank",
                   str(max_lora_rank), "--host", "127.0.0.1", "--port", str(port),
                   "--gpu-memory-utilization", str(gpu_memory_utilization),
                   "--api-key", self.api_key, *extra_args]  # fmt: skip
        env = {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}
        if sleep_mode:
            command.append("--enable-sleep-mode")
            env["VLLM_SERVER_DEV_MODE"] = "1"
        logger.info("starting %s", " ".join(command))
        self.proc = subprocess.Popen(command, env=env)
        self.base_url = f"http://127.0.0.1:{port}/v1"
        self._wait(startup_timeout, attached=False)

    @property
    def root(self) -> str:
        return self.base_url.removesuffix("/v1")

    def _wait(self, timeout: float, *, attached: bool) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"`vllm serve` exited with code {self.proc.returncode}")
            try:
                if httpx.get(f"{self.root}/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                if attached:
                    raise UsageError(
                        f"no vLLM server answers at {self.root} (GET /health failed); start it "
                        "with `vllm serve MODEL --enable-lora` and "
                        "VLLM_ALLOW_RUNTIME_LORA_UPDATING=1, or check `vllm_url`"
                    ) from None
            time.sleep(1.0)
        self.close()
        raise RuntimeError(f"vLLM did not answer at {self.root} within {timeout:.0f} s")

    def served_models(self) -> list[str]:
        reply = httpx.get(
            f"{self.base_url}/models", headers={"Authorization": f"Bearer {self.api_key}"}
        )
        reply.raise_for_status()
        return [m["id"] for m in reply.json()["data"]]

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """vLLM asleep (its GPU memory freed) while a step trains, with `sleep_mode`."""
        if not self.sleep_mode:
            yield
            return
        headers = {"Authorization": f"Bearer {self.api_key}"}
        httpx.post(f"{self.root}/sleep", params={"level": 1}, headers=headers, timeout=600)
        try:
            yield
        finally:
            httpx.post(f"{self.root}/wake_up", headers=headers, timeout=600)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc = None


class VLLMBackend(LocalBackend):
    def __init__(
        self,
        path: str | Path = ".mcprl",
        *,
        vllm_url: str | None = None,
        api_key: str | None = None,
        sleep_mode: bool = False,
        vllm_args: Sequence[str] = (),
        gpu_memory_utilization: float = 0.5,
        train_dtype: str = "auto",
        device: str | None = "auto",
        train_with: str = "auto",
        trainer: Any = None,
    ) -> None:
        """`vllm_url`: a running vLLM server to attach to (default: start one); `api_key`: its
        key (default $VLLM_API_KEY); `sleep_mode`: sleep vLLM while training (one shared
        GPU); `vllm_args`: more `vllm serve` arguments; `train_with`: `auto`, `peft` or
        `unsloth` (see `mcprl.training.pick_trainer`); `trainer`: a trainer factory instead."""
        options = dict(
            url=vllm_url,
            api_key=api_key,
            sleep_mode=sleep_mode,
            extra_args=vllm_args,
            gpu_memory_utilization=gpu_memory_utilization,
        )

        def start(base_model: str, routes: Sequence[Any]) -> VLLMServer:
            if routes:
                raise UsageError("mcprl serve --train serves with mcprl's engine, not vLLM")
            return VLLMServer(base_model, **options)

        super().__init__(
            path, train_dtype=train_dtype, device=device, trainer=trainer, inference=start
        )
        self.vllm_url, self.vllm_api_key = vllm_url, api_key
        self.trainer_name = "custom"
        if trainer is None:
            from mcprl.training import trainer_factory

            self.trainer_name, self._make_trainer = trainer_factory(
                train_with, self.device, self.train_dtype, separate_inference=True
            )

    async def check_model(self, base_model: str) -> None:
        if self.vllm_url is None:
            return  # `vllm serve` itself says whether it can load the model
        server = VLLMServer(base_model, url=self.vllm_url, api_key=self.vllm_api_key)
        served = server.served_models()
        if base_model not in served:
            raise UsageError(
                f"the vLLM server at {self.vllm_url} serves {', '.join(served)}, not "
                f"{base_model!r}: set `base_model` to its name"
            )
