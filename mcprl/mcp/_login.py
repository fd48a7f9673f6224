"""`login(url)`: the interactive OAuth authorization-code flow (`mcprl login URL`).

The browser opens the authorization page (or the URL is printed where there is none), a
loopback server on 127.0.0.1 receives the redirect, and the SDK's `OAuthClientProvider`
registers the client, exchanges the code (PKCE) and hands the tokens to a `TokenFile`.
"""

from __future__ import annotations

import contextlib
import webbrowser
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs, urlparse

import anyio
import anyio.abc
from mcp.client.auth import OAuthClientProvider
from mcp.shared.auth import (
    AuthorizationCodeResult,
    OAuthClientInformationFull,
    OAuthClientMetadata,
)

from mcprl.errors import ServerSpecError
from mcprl.mcp._auth import TokenFile
from mcprl.mcp._session import open_session
from mcprl.mcp._spec import ServerSpec

__all__ = ["code_flow", "login"]


def code_flow(
    server_url: str,
    storage: Any,
    redirect_uri: str,
    on_redirect: Callable[[str], Awaitable[None]],
    on_callback: Callable[[], Awaitable[AuthorizationCodeResult]],
    *,
    scope: str | None = None,
    client_metadata_url: str | None = None,
) -> OAuthClientProvider:
    """The SDK's provider for mcprl as a public client of the authorization-code flow (PKCE):
    it registers itself (or names its client ID metadata document, `client_metadata_url`,
    where the server takes one), sends the user to `on_redirect`, and takes the code from
    `on_callback`. A client registered beforehand is the `client_info` `storage` holds."""
    metadata = OAuthClientMetadata(
        client_name="mcprl",
        redirect_uris=[redirect_uri],
        grant_types=["authorization_code", "refresh_token"],
        response_types=["code"],
        token_endpoint_auth_method="none",
        scope=scope,
    )
    return OAuthClientProvider(
        server_url,
        metadata,
        storage,
        on_redirect,
        on_callback,
        client_metadata_url=client_metadata_url,
    )


async def login(
    url: str,
    *,
    scope: str | None = None,
    open_browser: bool = True,
    port: int = 0,
    say: Callable[[str], None] = print,
    timeout: float = 300.0,
    client_id: str | None = None,
    client_secret: str | None = None,
    client_metadata_url: str | None = None,
) -> TokenFile:
    """Log in to the server at `url` with the authorization-code flow (PKCE), and store the
    tokens (`TokenFile`). The user approves in a browser; the redirect comes back to a loopback
    server on 127.0.0.1 (`port`, 0 for any free one). mcprl registers itself with the server's
    authorization server (dynamic client registration) unless given a client registered
    beforehand (`client_id`, with `client_secret` for a confidential one, and a fixed `port`
    matching its redirect URI), or a client ID metadata document (`client_metadata_url`, an
    HTTPS URL) that the server takes instead."""
    spec = ServerSpec.parse(url)
    if spec.url is None:
        raise ServerSpecError(f"{spec.describe()} runs as a command: only servers at a URL log in")
    storage = TokenFile(spec.url)
    async with _Loopback(port) as loopback:
        if client_id is not None:
            await storage.set_client_info(
                OAuthClientInformationFull(
                    client_id=client_id,
                    client_secret=client_secret,
                    redirect_uris=[loopback.redirect_uri],
                    grant_types=["authorization_code", "refresh_token"],
                    token_endpoint_auth_method="client_secret_basic" if client_secret else "none",
                )
            )

        async def redirect(authorization_url: str) -> None:
            opened = open_browser and _open(authorization_url)
            say(
                ("Opened your browser to log in. If it did not open, visit:\n  " if opened
                 else "Open this URL in a browser to log in:\n  ") + authorization_url
            )  # fmt: skip

        async def callback() -> AuthorizationCodeResult:
            with anyio.fail_after(timeout):
                return await loopback.result()

        provider = code_flow(
            spec.url,
            storage,
            loopback.redirect_uri,
            redirect,
            callback,
            scope=scope,
            client_metadata_url=client_metadata_url,
        )
        session_spec = spec.model_copy(update={"oauth": None})
        async with open_session(session_spec, auth=provider) as session:
            tools = await session.list_tools()
    say(f"Logged in to {spec.url} ({len(tools)} tools); tokens in {storage.path}")
    return storage


def _open(url: str) -> bool:
    with contextlib.suppress(Exception):
        return webbrowser.open(url)
    return False


class _Loopback:
    """A one-shot HTTP server on 127.0.0.1 that receives the authorization redirect."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._got: dict[str, str] = {}
        self._ready = anyio.Event()

    @property
    def redirect_uri(self) -> str:
        return f"http://127.0.0.1:{self.port}/callback"

    async def __aenter__(self) -> _Loopback:
        self._listener = await anyio.create_tcp_listener(
            local_host="127.0.0.1", local_port=self.port
        )
        self.port = self._listener.extra(anyio.abc.SocketAttribute.local_port)
        self._group = anyio.create_task_group()
        await self._group.__aenter__()
        self._group.start_soon(self._listener.serve, self._handle)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self._group.cancel_scope.cancel()
        await self._group.__aexit__(*exc)
        await self._listener.aclose()

    async def _handle(self, stream: Any) -> None:
        async with stream:
            request = b""
            with anyio.move_on_after(10):
                while b"\r\n\r\n" not in request and len(request) < 65536:
                    request += await stream.receive()
            line = request.split(b"\r\n", 1)[0].decode("latin-1")
            target = line.split(" ")[1] if line.count(" ") >= 2 else "/"
            query = {k: v[0] for k, v in parse_qs(urlparse(target).query).items()}
            if "code" in query or "error" in query:
                self._got = query
                self._ready.set()
                text = (
                    "mcprl: logged in; you can close this window."
                    if "code" in query
                    else (f"mcprl: the login failed: {query.get('error')}")
                )
            else:
                text = "mcprl: waiting for the authorization redirect."
            body = text.encode()
            await stream.send(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/plain; charset=utf-8\r\n"
                + f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
                + body
            )

    async def result(self) -> AuthorizationCodeResult:
        await self._ready.wait()
        if "code" not in self._got:
            error = self._got.get("error_description") or self._got.get("error")
            raise ServerSpecError(f"the authorization server refused the login: {error}")
        return AuthorizationCodeResult(
            code=self._got["code"], state=self._got.get("state"), iss=self._got.get("iss")
        )
