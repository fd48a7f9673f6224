"""The OpenAI-compatible HTTP server around the engine (vLLM's dialect).

    POST /v1/chat/completions     tools, tool_choice, response_format, logprobs, n, seed, stop
    GET  /v1/models               the base model and every loaded LoRA adapter
    POST /v1/load_lora_adapter    {"lora_name": ..., "lora_path": ...}
    POST /v1/unload_lora_adapter  {"lora_name": ...}
    GET  /health

Errors have OpenAI's shape (`{"error": {"message", "type", "param", "code"}}`): 400 for a bad
request, 401 for a missing or wrong API key, 403 for a request from a browser page or to a
host name this server is not, 404 for an unknown model, 413 for a body over `max_body_bytes`,
415 for a body that is not `application/json`. A bad request never stops the server, and no
reply or log line repeats more than a few hundred characters of what was sent.

Who may call (see README, "Security"):
- it binds 127.0.0.1 unless told otherwise, and an API key is required to bind anything else;
- with an API key, every endpoint but /health needs `Authorization: Bearer KEY` (compared in
  constant time);
- the `Host` header must name this server (its address, `localhost`, or a loopback address), so
  a web page cannot reach it through DNS rebinding; a request with a cross-site `Origin` or
  `Sec-Fetch-Site` header (a browser page elsewhere) is refused;
- adapters are loaded over HTTP only from `adapter_dirs` (none: loading is off).
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
import socket
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from mcprl.errors import UsageError
from mcprl.serving._api import ChatRequest, chat_response, error_body
from mcprl.serving._chat import PromptTokens, parse_tool_calls
from mcprl.serving._engine import Engine, SamplingParams
from mcprl.serving._grammar import GrammarError

__all__ = [
    "MAX_BODY_BYTES",
    "HTTPFailure",
    "ServerHandle",
    "adapter_request",
    "allowed_hosts",
    "build_app",
    "check_bind",
    "fail",
    "json_body",
    "start_server",
]

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 8 * 1024 * 1024  # a chat request for a model with a 128k context fits
MAX_N = 16  # completions per request: one request may not hold the whole engine
_ECHO_CHARS = 300
_LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}


class _HTTPError(Exception):
    def __init__(self, status: int, message: str, kind: str, param: str | None = None):
        super().__init__(message)
        self.status, self.kind, self.param = status, kind, param


def _fail(status: int, message: str, param: str | None = None) -> _HTTPError:
    kinds = {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        413: "invalid_request_error",
        415: "invalid_request_error",
    }
    return _HTTPError(status, message, kinds.get(status, "server_error"), param)


HTTPFailure = _HTTPError  # what a handler given to `build_app(routes=...)` raises
fail = _fail


def _ends_conversation(final_tools: Iterable[str]):
    """Whether a reply's text ends its conversation: it calls tools, each of them final (a
    request's `final_tools`). Such a reply is never continued by a next turn."""
    final = frozenset(final_tools)

    def ends(text: str) -> bool:
        _, calls = parse_tool_calls(text)
        return bool(calls) and all(c["function"]["name"] in final for c in calls)

    return ends


def clip(text: object, limit: int = _ECHO_CHARS) -> str:
    """`text` cut to `limit` characters, saying how much was left out."""
    text = str(text)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… [{len(text) - limit} more characters]"


def allowed_hosts(host: str) -> frozenset[str] | None:
    """The `Host` names a server bound to `host` answers to; None: any (a wildcard bind)."""
    host = host.strip("[]").lower()
    if host in ("0.0.0.0", "::", ""):
        return None
    return frozenset({host, *_LOOPBACK_NAMES})


def _host_name(value: str) -> str:
    """`example.com` from `example.com:8000`, `::1` from `[::1]:8000`."""
    return (urlsplit(f"//{value}").hostname or "").lower()


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _fail(413, f"the request body is {declared} bytes; this server takes at most {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _fail(413, f"the request body is over {limit} bytes, the most this server takes")
        chunks.append(chunk)
    return b"".join(chunks)


async def json_body(request: Request, limit: int = MAX_BODY_BYTES) -> dict[str, Any]:
    """The request's JSON object body, or an `HTTPFailure` saying what is wrong with it."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/json":
        raise _fail(
            415, f"send the body as Content-Type: application/json (got {clip(kind, 60)!r})"
        )
    try:
        body = json.loads(await _read_body(request, limit))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _fail(400, f"the request body is not valid JSON: {clip(exc, 120)}") from exc
    if not isinstance(body, dict):
        raise _fail(400, f"the request body must be a JSON object, not {type(body).__name__}")
    return body


def _validation_message(exc: ValidationError) -> tuple[str, str]:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    return f"{where}: {first['msg']}" if where else first["msg"], where


def build_app(
    engine: Engine,
    served_name: str,
    api_key: str | None = None,
    *,
    hosts: Iterable[str] | None = frozenset(_LOOPBACK_NAMES),
    adapter_dirs: Iterable[str | Path] = (),
    max_body_bytes: int = MAX_BODY_BYTES,
    max_n: int = MAX_N,
    routes: Iterable[tuple[str, Any, list[str]]] = (),
) -> Starlette:
    """The app; `hosts` are the `Host` names it answers to (None: any), see `allowed_hosts`.

    `routes` (path, async handler, methods) are served beside the OpenAI API under the same
    checks (host, origin, API key); a handler may raise `HTTPFailure` for an error reply."""
    hosts = frozenset(h.lower() for h in hosts) if hosts is not None else None
    roots = [Path(d).expanduser().resolve() for d in adapter_dirs]
    key = api_key.encode() if api_key else None
    max_n = min(max_n, engine.max_batch_size)
    prompts = PromptTokens(engine.tokenizer)  # multi-turn prompts keep the sampled tokens

    async def body_of(request: Request) -> dict[str, Any]:
        return await json_body(request, max_body_bytes)

    def adapter_allowed(path: str) -> bool:
        real = Path(path).expanduser().resolve()
        return any(real.is_relative_to(root) for root in roots)

    def model_ids() -> list[str]:
        return [served_name, *engine.adapters]

    def adapter_for(name: str) -> str | None:
        if name == served_name:
            return None
        if name in engine.adapters:
            return name
        raise _fail(404, f"model {name!r} not found; available: {', '.join(model_ids())}", "model")

    async def chat(request: Request) -> JSONResponse:
        body = await body_of(request)
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
            prompt = prompts.render(messages, offered)
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
        if req.n > max_n:
            raise _fail(400, f"n may be at most {max_n} on this server", "n")
        fmt = req.response_format.model_dump() if req.response_format else None
        try:
            grammar = engine.grammars.compile(offered, req.choice, fmt)
        except GrammarError as exc:
            raise _fail(400, str(exc), "tools" if offered else "response_format") from exc
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            min_p=req.min_p,
            stop=req.stops,
            seed=req.seed,
            n=req.n,
            top_logprobs=req.top_logprobs or 0,
            ignore_eos=req.ignore_eos,
        )
        ends = _ends_conversation(req.final_tools) if req.final_tools else None
        completions = await engine.generate(
            prompt, params, adapter=adapter, grammar=grammar, ends_conversation=ends
        )
        for c in completions:
            if ends is None or not ends(c.text):
                prompts.remember(prompt, c.token_ids)
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
        body = await body_of(request)
        name, path = body.get("lora_name"), body.get("lora_path")
        if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
            raise _fail(400, "give 'lora_name' and 'lora_path' as non-empty strings")
        if name == served_name or name in engine.adapters:
            raise _fail(
                400, f"an adapter or model named {clip(name)!r} is already loaded", "lora_name"
            )
        if not roots:
            raise _fail(
                403,
                "this server loads no adapters over HTTP; start it with --allow-adapter-dir DIR "
                "to allow the adapters under DIR",
                "lora_path",
            )
        if not adapter_allowed(path):
            raise _fail(
                403,
                f"{clip(path)} is not under a directory this server loads adapters from "
                "(--allow-adapter-dir)",
                "lora_path",
            )
        if not (Path(path) / "adapter_config.json").is_file():
            raise _fail(
                400, f"{clip(path)} is not a peft adapter directory (no adapter_config.json)"
            )
        try:
            await asyncio.to_thread(engine.load_adapter, name, path)
        except Exception as exc:
            raise _fail(400, f"could not load the adapter: {clip(exc)}", "lora_path") from exc
        return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

    async def unload_lora(request: Request) -> PlainTextResponse:
        body = await body_of(request)
        name = body.get("lora_name")
        if not isinstance(name, str) or not name:
            raise _fail(400, "give 'lora_name' as a non-empty string", "lora_name")
        if name not in engine.adapters:
            raise _fail(404, f"no adapter named {clip(name)!r} is loaded", "lora_name")
        await asyncio.to_thread(engine.unload_adapter, name)
        return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")

    async def health(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    def refusal(request: Request) -> _HTTPError | None:
        """Why this request may not be served (module docstring), or None."""
        if hosts is not None and _host_name(request.headers.get("host", "")) not in hosts:
            return _fail(403, "the Host header does not name this server")
        origin = request.headers.get("origin")
        if (
            origin is not None
            and urlsplit(origin).netloc.lower() != request.headers.get("host", "").lower()
        ):
            return _fail(403, "cross-origin requests from browser pages are not served")
        if request.headers.get("sec-fetch-site", "none") not in ("none", "same-origin"):
            return _fail(403, "cross-site requests from browser pages are not served")
        if key is not None:
            given = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, b"Bearer " + key):
                return _fail(
                    401,
                    "invalid or missing API key: send the key this server was started with "
                    "(its MCPRL_API_KEY or --api-key) as 'Authorization: Bearer KEY'",
                )
        return None

    def reply(exc: _HTTPError) -> JSONResponse:
        body = error_body(clip(exc, 2000), exc.kind, exc.status, exc.param)
        return JSONResponse(body, status_code=exc.status)

    def guarded(handler):
        async def endpoint(request: Request):
            refused = refusal(request)
            if refused is not None:
                return reply(refused)
            try:
                return await handler(request)
            except _HTTPError as exc:
                return reply(exc)
            except Exception as exc:
                logger.error("request to %s failed: %s", request.url.path, clip(exc))
                logger.debug("the failure", exc_info=True)
                return reply(_fail(500, f"internal error: {clip(exc)}"))

        return endpoint

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", guarded(chat), methods=["POST"]),
            Route("/v1/models", guarded(models), methods=["GET"]),
            Route("/v1/load_lora_adapter", guarded(load_lora), methods=["POST"]),
            Route("/v1/unload_lora_adapter", guarded(unload_lora), methods=["POST"]),
            Route("/health", health, methods=["GET"]),
            *(Route(path, guarded(handler), methods=methods) for path, handler, methods in routes),
        ]
    )
    app.state.adapter_roots = roots  # live: `ServerHandle.allow_adapter_dir` adds to it
    return app


def check_bind(host: str, api_key: str | None) -> None:
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback and not api_key:
        raise UsageError(
            f"binding {host} exposes the model beyond this machine; set an API key "
            "(--api-key) to do that, or bind 127.0.0.1"
        )


class ServerHandle:
    """A server running in a background thread; `stop()` shuts it down."""

    def __init__(self, server: Any, thread: threading.Thread, host: str, port: int, app: Any):
        self._server, self._thread, self._app = server, thread, app
        self.host, self.port = host, port

    def allow_adapter_dir(self, path: str | Path) -> None:
        """Let `/v1/load_lora_adapter` load from `path` (resolved, so a run directory that is a
        symlink to elsewhere is allowed where it really lies) from now on."""
        roots = self._app.state.adapter_roots
        real = Path(path).expanduser().resolve()
        if real not in roots:
            roots.append(real)

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
    adapter_dirs: Iterable[str | Path] = (),
    routes: Iterable[tuple[str, Any, list[str]]] = (),
) -> ServerHandle:
    """Serve in-process, in a thread (for the local backend and tests)."""
    import uvicorn

    check_bind(host, api_key)
    if port == 0:
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
    app = build_app(
        engine,
        served_name,
        api_key,
        hosts=allowed_hosts(host),
        adapter_dirs=adapter_dirs,
        routes=routes,
    )
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="mcprl-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the server did not start on {host}:{port}")
        time.sleep(0.02)
    return ServerHandle(server, thread, host, port, app)


def adapter_request(base_url: str, api_key: str, what: str, body: dict[str, str]) -> None:
    """POST `body` to `{base_url}/{what}_lora_adapter` (`load` or `unload`): the calls a vLLM
    server takes too. Raises `RuntimeError` with the server's reason if it refuses."""
    import httpx

    reply = httpx.post(
        f"{base_url}/{what}_lora_adapter",
        json=body,
        headers={"Authorization": f"Bearer {api_key}"},
        timeout=600,
    )
    if reply.status_code != 200:
        raise RuntimeError(f"the server refused to {what} {body}: {clip(reply.text, 500)}")
