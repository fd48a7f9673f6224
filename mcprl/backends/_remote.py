"""`RemoteBackend`: train on a GPU box from a laptop.

    # on the GPU machine
    MCPRL_API_KEY=secret mcprl serve --train --host 0.0.0.0 --port 8000 --path /data/runs
    # here
    backend = RemoteBackend("http://gpu-box:8000", api_key="secret")   # or $MCPRL_API_KEY
    await model.register(backend)

Rollouts, their MCP sessions and judging run here; the server runs inference (its OpenAI API at
`URL/v1`) and training, and keeps the run's checkpoints and records under its `--path`. A
training step uploads its groups as JSON, then follows the server's job until the checkpoint is
served. If the server stops answering (restarted, network down), calls are retried for
`retry_for` seconds; a step whose server restarted mid-way is sent again, and one the server
finished is not trained twice (see `mcprl.backends._api`).
"""

from __future__ import annotations

import io
import json
import logging
import os
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

from mcprl.backends._protocol import Inference, TrainResult
from mcprl.errors import BackendError, BackendRequestError, UsageError
from mcprl.model import TrainableModel
from mcprl.training import TrainConfig
from mcprl.types import TrajectoryGroup

__all__ = ["BackendError", "BackendRequestError", "RemoteBackend"]

logger = logging.getLogger(__name__)


class _JobLost(Exception):
    """The server no longer knows the training job (it restarted)."""


class RemoteBackend:
    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        *,
        timeout: float = 600.0,
        retry_for: float = 600.0,
        poll_every: float = 0.5,
    ) -> None:
        """`url`: the server's address (`http://host:port`); `api_key`: its key (default:
        $MCPRL_API_KEY); `retry_for`: how long to keep trying a server that does not answer."""
        url = url.rstrip("/")
        self.url = url.removesuffix("/v1")
        if not self.url.startswith(("http://", "https://")):
            raise UsageError(f"`backend={url!r}`: give the server's URL, e.g. http://gpu-box:8000")
        self.api_key = api_key or os.environ.get("MCPRL_API_KEY") or "EMPTY"
        self.timeout, self.retry_for, self.poll_every = timeout, retry_for, poll_every
        self._base_names: dict[tuple[str, str], str] = {}
        self.bytes_sent = 0  # uploaded request bodies, for benchmarks

    # -- Backend -------------------------------------------------------------------------------

    async def check_model(self, base_model: str) -> None:
        await self._call("check", {"base_model": base_model})

    async def register(self, model: TrainableModel) -> int:
        reply = await self._call("register", {"model": _model(model)})
        self._base_names[(model.project, model.name)] = reply["base_name"]
        return int(reply["step"])

    async def claim(self, model: TrainableModel) -> None:
        """Nothing to hold here: the serving process writes the run, and holds it from its
        first write on (a second server on the same folder fails then)."""
        return None

    async def inference(self, model: TrainableModel) -> Inference:
        base_name = self._base_names.get((model.project, model.name))
        if base_name is None:
            raise RuntimeError(f"model {model.name!r} is not registered with this backend")
        return Inference(
            base_url=f"{self.url}/v1", api_key=self.api_key, base_name=base_name,
            extensions=list(_extensions()),
        )  # fmt: skip

    async def base_inference(self, base_model: str) -> Inference:
        reply = await self._call("base", {"base_model": base_model})
        return Inference(
            base_url=f"{self.url}/v1", api_key=self.api_key, base_name=reply["name"],
            extensions=list(_extensions()),
        )  # fmt: skip

    async def serve_checkpoint(self, model: TrainableModel, step: int) -> str:
        return (await self._call("serve", {"model": _model(model), "step": step}))["name"]

    async def get_step(self, model: TrainableModel) -> int:
        return int((await self._call("step", {"model": _model(model)}))["step"])

    async def train(
        self,
        model: TrainableModel,
        groups: list[TrajectoryGroup],
        config: TrainConfig | None = None,
        *,
        metrics: dict[str, float] | None = None,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> TrainResult:
        """Upload `groups` and wait for the step; like `LocalBackend.train`, a started step is
        seen through even if the caller is cancelled."""
        with anyio.CancelScope(shield=True):
            step = await self.get_step(model)
            body = {
                "model": _model(model),
                "step": step,
                "groups": [g.model_dump(mode="json") for g in groups],
                "config": (config or TrainConfig()).model_dump(mode="json"),
                "metrics": metrics or {},
            }
            deadline = time.monotonic() + self.retry_for
            while True:
                reply = await self._call("train", body)
                try:
                    return await self._follow(reply, on_progress)
                except _JobLost:
                    if time.monotonic() > deadline:
                        raise BackendError(
                            f"the backend at {self.url} lost training step {step + 1} again and "
                            f"again for {self.retry_for:.0f} s"
                        ) from None
                    logger.warning("the backend restarted during the step: sending it again")

    async def log(
        self,
        model: TrainableModel,
        metrics: dict[str, float],
        split: str = "val",
        groups: list[TrajectoryGroup] | None = None,
    ) -> None:
        body: dict[str, Any] = {"model": _model(model), "metrics": metrics, "split": split}
        if groups is not None:
            body["groups"] = [g.model_dump(mode="json") for g in groups]
        await self._call("log", body)

    async def history(self, model: TrainableModel) -> list[dict[str, Any]]:
        return (await self._call("history", {"model": _model(model)}))["rows"]

    async def trajectories(
        self, model: TrainableModel, split: str
    ) -> dict[int, list[TrajectoryGroup]]:
        reply = await self._call("trajectories", {"model": _model(model), "split": split})
        return {
            int(k): [TrajectoryGroup.model_validate(g) for g in v]
            for k, v in reply["steps"].items()
        }

    async def read_file(self, model: TrainableModel, name: str) -> str | None:
        return (await self._call("files/read", {"model": _model(model), "file": name}))["text"]

    async def write_file(self, model: TrainableModel, name: str, text: str) -> None:
        await self._call("files/write", {"model": _model(model), "file": name, "text": text})

    async def list_checkpoints(self, model: TrainableModel) -> list[int]:
        return (await self._call("checkpoints", {"model": _model(model)}))["steps"]

    async def delete_checkpoints(
        self, model: TrainableModel, keep_last: int = 1, keep_best_by: str | None = "val/reward"
    ) -> list[int]:
        body = {"model": _model(model), "keep_last": keep_last, "keep_best_by": keep_best_by}
        return (await self._call("checkpoints/delete", body))["deleted"]

    async def download_checkpoint(self, model: TrainableModel, step: int, dest: Path) -> Path:
        body = {"model": _model(model), "step": step}
        data = await self._call("checkpoints/download", body, raw=True)
        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=False)
        with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
            tar.extractall(dest, filter="data")  # refuses links and paths out of dest
        return dest

    async def local_dir(self, model: TrainableModel) -> Path | None:
        return None

    def close(self) -> None:
        return None

    def __enter__(self) -> RemoteBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- HTTP ----------------------------------------------------------------------------------

    async def _follow(
        self, reply: dict[str, Any], on_progress: Callable[[int, int], None] | None
    ) -> TrainResult:
        job = reply.get("job")
        while reply["state"] == "running":
            if on_progress is not None and reply.get("total"):
                on_progress(reply["done"], reply["total"])
            await anyio.sleep(self.poll_every)
            try:
                reply = await self._call(f"jobs/{job}", None)
            except BackendError as exc:
                if exc.status == 404:
                    raise _JobLost from exc
                raise
        if reply["state"] == "failed":
            raise BackendError(f"the backend at {self.url} failed to train: {reply['error']}")
        if on_progress is not None and reply.get("total"):
            on_progress(reply["done"], reply["total"])
        return TrainResult.model_validate(reply["result"])

    async def _call(self, route: str, body: dict[str, Any] | None, *, raw: bool = False) -> Any:
        """POST `body` (GET when None) to /backend/`route`; retry while the server is away."""
        import httpx

        url = f"{self.url}/backend/{route}"
        headers = {"Authorization": f"Bearer {self.api_key}"}
        content = None
        if body is not None:
            content = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        deadline, wait, warned = time.monotonic() + self.retry_for, 0.5, False
        while True:
            try:
                async with httpx.AsyncClient(timeout=self.timeout) as http:
                    if content is None:
                        response = await http.get(url, headers=headers)
                    else:
                        response = await http.post(url, content=content, headers=headers)
                break
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError,
                    httpx.ReadError) as exc:  # fmt: skip
                if time.monotonic() > deadline:
                    raise BackendError(
                        f"the backend at {self.url} did not answer for {self.retry_for:.0f} s "
                        f"({type(exc).__name__}); is `mcprl serve --train` running there?"
                    ) from exc
                if not warned:
                    logger.warning("the backend at %s does not answer; retrying", self.url)
                    warned = True
                await anyio.sleep(wait)
                wait = min(wait * 2, 5.0)
        if content is not None:
            self.bytes_sent += len(content)
        if response.status_code == 401:
            raise BackendError(
                f"the backend at {self.url} refused the API key (401): set MCPRL_API_KEY (or "
                "`api_key`) to the key its `mcprl serve --train` was started with",
                401,
            )
        if response.status_code >= 400:
            kind = BackendRequestError if response.status_code < 500 else BackendError
            raise kind(f"the backend at {self.url}: {_message(response)}", response.status_code)
        return response.content if raw else response.json()


def _model(model: TrainableModel) -> dict[str, Any]:
    return model.model_dump(mode="json", include={"name", "project", "base_model", "config"})


def _message(response: Any) -> str:
    try:
        return str(response.json()["error"]["message"])
    except Exception:
        return f"HTTP {response.status_code}: {response.text[:300]}"


def _extensions() -> tuple[str, ...]:
    """What `mcprl serve` reads beyond the OpenAI API (an older one ignores them)."""
    from mcprl.serving import EXTENSIONS

    return EXTENSIONS
