"""A stand-in for a vLLM server: mcprl's own server behind a shim that answers in vLLM's
dialect, for testing `VLLMBackend` without a GPU.

The shim forwards to a `LocalServer` and reshapes its chat replies as vLLM's: no per-choice
`prompt_token_ids` and no `mcprl` fields; `prompt_token_ids` (top level) and each choice's
`token_ids` only when the request sets `return_token_ids`; log-probabilities only as
`logprobs.content`, tokens spelled `token_id:N` under `return_tokens_as_token_ids`. It records
the adapter calls and the `/sleep` and `/wake_up` calls it receives.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route


class VLLMStandIn:
    def __init__(self, base_model: str, adapter_dirs: list[Path], api_key: str = "vllm-key"):
        from mcprl.serving import LocalServer

        self.api_key = api_key
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.inner = LocalServer(base_model, served_name=base_model, adapter_dirs=adapter_dirs)
        inner_headers = {"Authorization": f"Bearer {self.inner.api_key}"}

        def authorized(request: Request) -> bool:
            return request.headers.get("authorization") == f"Bearer {self.api_key}"

        async def forward(request: Request) -> Response:
            if not authorized(request):
                return JSONResponse({"error": "Unauthorized"}, status_code=401)
            path = request.url.path.removeprefix("/v1")
            body = await request.json() if request.method == "POST" else None
            if path.endswith("_lora_adapter"):
                self.calls.append((path.strip("/"), body))
            async with httpx.AsyncClient(timeout=600) as http:
                reply = await http.request(request.method, self.inner.base_url + path,
                                           json=body, headers=inner_headers)  # fmt: skip
            if path != "/chat/completions" or reply.status_code != 200:
                kind = reply.headers.get("content-type", "text/plain")
                return Response(reply.content, status_code=reply.status_code, media_type=kind)
            return JSONResponse(_as_vllm(reply.json(), body))

        async def sleep(request: Request) -> PlainTextResponse:
            self.calls.append((request.url.path.strip("/"), dict(request.query_params)))
            return PlainTextResponse("")

        async def health(request: Request) -> PlainTextResponse:
            return PlainTextResponse("")

        app = Starlette(routes=[
            Route("/v1/{rest:path}", forward, methods=["GET", "POST"]),
            Route("/sleep", sleep, methods=["POST"]),
            Route("/wake_up", sleep, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
        ])  # fmt: skip
        import uvicorn

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.02)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.inner.close()


def _as_vllm(reply: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    ids = bool(request.get("return_token_ids"))
    prompt = None
    for choice in reply["choices"]:
        prompt = choice.pop("prompt_token_ids", prompt)
        choice.pop("mcprl", None)
        if not ids:
            choice.pop("token_ids", None)
    reply.pop("prompt_token_ids", None)
    if ids:
        reply["prompt_token_ids"] = prompt
    return reply
