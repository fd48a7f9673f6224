"""The OpenAI-compatible HTTP server around the engine (vLLM's dialect).

    POST /v1/chat/completions     tools, tool_choice, response_format, logprobs, n, seed, stop
    GET  /v1/models               the base model and every loaded LoRA adapter
    POST /v1/load_lora_adapter    {"lora_name": ..., "lora_path": ...}
    POST /v1/unload_lora_adapter  {"lora_name": ...}
    GET  /health

Errors have OpenAI's shape (`{"error": {"message", "type", "param", "code"}}`): 400 for a bad
request, 401 for a missing or wrong API key, 404 for an unknown model. A bad request never
stops the server. It binds 127.0.0.1 unless told otherwise, and an API key is required to bind
anything else.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import socket
import threading
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from mcprl.serving._api import ChatRequest, chat_response, error_body
from mcprl.serving._chat import render_prompt
from mcprl.serving._engine import Engine, SamplingParams
from mcprl.serving._grammar import GrammarError

__all__ = ["ServerHandle", "build_app", "check_bind", "start_server"]

logger = logging.getLogger(__name__)


class _HTTPError(Exception):
    def __init__(self, status: int, message: str, kind: str, param: str | None = None):
        super().__init__(message)
        self.status, self.kind, self.param = status, kind, param


def _fail(status: int, message: str, param: str | None = None) -> _HTTPError:
    kinds = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error"}
    return _HTTPError(status, message, kinds.get(status, "server_error"), param)


async def _json(request: Request) -> Any:
    try:
        return json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _fail(400, f"the request body is not valid JSON: {exc}") from exc


def _validation_message(exc: ValidationError) -> tuple[str, str]:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    return f"{where}: {first['msg']}" if where else first["msg"], where


def build_app(engine: Engine, served_name: str, api_key: str | None = None) -> Starlette:
    def model_ids() -> list[str]:
        return [served_name, *engine.adapters]

    def adapter_for(name: str) -> str | None:
        if name == served_name:
            return None
        if name in engine.adapters:
            return name
        raise _fail(404, f"model {name!r} not found; available: {', '.join(model_ids())}", "model")

    async def chat(request: Request) -> JSONResponse:
        body = await _json(request)
        try:
            req = ChatRequest.model_validate(body)
        except ValidationError as exc:
            message, where = _validation_message(exc)
            raise _fail(400, message, where or None) from exc
        adapter = adapter_for(req.model)
        messages = [m.plain() for m in req.messages]
        tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
        offered = tools if req.choice != "none" else None
        try:
            prompt = render_prompt(engine.tokenizer, messages, offered)
        except Exception as exc:  # a template that cannot render these messages
            raise _fail(400, f"cannot format the messages with the chat template: {exc}") from exc
        room = engine.max_context - len(prompt)
        max_tokens = req.max_completion_tokens or req.max_tokens or min(1024, room)
        if room < 1 or max_tokens > room:
            raise _fail(
                400,
                f"the prompt has {len(prompt)} tokens and max_tokens is {max_tokens}, but the "
                f"model's context is {engine.max_context} tokens",
                "max_tokens",
            )
        if req.n > engine.max_batch_size:
            raise _fail(400, f"n may be at most {engine.max_batch_size}", "n")
        fmt = req.response_format.model_dump() if req.response_format else None
        try:
            grammar = engine.grammars.compile(offered, req.choice, fmt)
        except GrammarError as exc:
            raise _fail(400, str(exc), "tools" if offered else "response_format") from exc
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            stop=req.stops,
            seed=req.seed,
            n=req.n,
            top_logprobs=req.top_logprobs or 0,
            ignore_eos=req.ignore_eos,
        )
        completions = await engine.generate(prompt, params, adapter=adapter, grammar=grammar)
        return JSONResponse(chat_response(req, prompt, completions, engine.tokenizer))

    async def models(request: Request) -> JSONResponse:
        now = int(time.time())
        data = [
            {
                "id": name,
                "object": "model",
                "created": now,
                "owned_by": "mcprl",
                "root": served_name,
                "parent": None if name == served_name else served_name,
            }
            for name in model_ids()
        ]
        return JSONResponse({"object": "list", "data": data})

    async def load_lora(request: Request) -> PlainTextResponse:
        body = await _json(request)
        name, path = body.get("lora_name"), body.get("lora_path")
        if not isinstance(name, str) or not name or not isinstance(path, str):
            raise _fail(400, "give 'lora_name' and 'lora_path' as strings")
        if name == served_name or name in engine.adapters:
            raise _fail(400, f"an adapter or model named {name!r} is already loaded", "lora_name")
        if not (Path(path) / "adapter_config.json").is_file():
            raise _fail(400, f"{path} is not a peft adapter directory (no adapter_config.json)")
        try:
            await asyncio.to_thread(engine.load_adapter, name, path)
        except Exception as exc:
            raise _fail(400, f"could not load the adapter: {exc}", "lora_path") from exc
        return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

    async def unload_lora(request: Request) -> PlainTextResponse:
        body = await _json(request)
        name = body.get("lora_name")
        if name not in engine.adapters:
            raise _fail(404, f"no adapter named {name!r} is loaded", "lora_name")
        await asyncio.to_thread(engine.unload_adapter, name)
        return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")

    async def health(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    def guarded(handler):
        async def endpoint(request: Request):
            if api_key is not None and request.headers.get("authorization") != f"Bearer {api_key}":
                return JSONResponse(
                    error_body("invalid or missing API key", "authentication_error", 401),
                    status_code=401,
                )
            try:
                return await handler(request)
            except _HTTPError as exc:
                return JSONResponse(
                    error_body(str(exc), exc.kind, exc.status, exc.param), status_code=exc.status
                )
            except Exception as exc:
                logger.exception("request failed")
                return JSONResponse(
                    error_body(f"internal error: {exc}", "server_error", 500), status_code=500
                )

        return endpoint

    return Starlette(
        routes=[
            Route("/v1/chat/completions", guarded(chat), methods=["POST"]),
            Route("/v1/models", guarded(models), methods=["GET"]),
            Route("/v1/load_lora_adapter", guarded(load_lora), methods=["POST"]),
            Route("/v1/unload_lora_adapter", guarded(unload_lora), methods=["POST"]),
            Route("/health", health, methods=["GET"]),
        ]
    )


def check_bind(host: str, api_key: str | None) -> None:
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback and not api_key:
        raise ValueError(
            f"binding {host} exposes the model beyond this machine; set an API key "
            "(--api-key) to do that, or bind 127.0.0.1"
        )


class ServerHandle:
    """A server running in a background thread; `stop()` shuts it down."""

    def __init__(self, server: Any, thread: threading.Thread, host: str, port: int):
        self._server, self._thread = server, thread
        self.host, self.port = host, port

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_server(
    engine: Engine,
    served_name: str,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    api_key: str | None = None,
) -> ServerHandle:
    """Serve in-process, in a thread (for the local backend and tests)."""
    import uvicorn

    check_bind(host, api_key)
    if port == 0:
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
    app = build_app(engine, served_name, api_key)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="mcprl-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the server did not start on {host}:{port}")
        time.sleep(0.02)
    return ServerHandle(server, thread, host, port)
