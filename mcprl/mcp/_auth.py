"""OAuth 2.1 for servers reached by URL, through the MCP SDK's client providers.

The SDK's `OAuthClientProvider` does the protocol: protected-resource and authorization-server
metadata discovery with the spec's fallbacks, dynamic client registration or a client ID
metadata document, PKCE, scopes and step-up on `insufficient_scope`, token refresh. mcprl adds
what a command-line tool needs around it:

- `TokenFile`: the SDK's `TokenStorage`, one JSON file per server under the user's config
  directory (`$MCPRL_CONFIG_DIR`, else `$XDG_CONFIG_HOME/mcprl`, else `~/.config/mcprl`), in
  `tokens/`, mode 0600. It keeps when the access token expires, so a later run refreshes a
  stale token before its first request instead of failing on it.
- `login(url)`: the interactive authorization-code flow (`mcprl login URL`). The browser opens
  the authorization page (or the URL is printed where there is none), and a loopback server on
  127.0.0.1 receives the redirect.
- `http_auth(spec)`: what a session sends. With `ServerSpec.oauth` (a client ID and secret,
  `--oauth-client-id` with the secret in `$MCPRL_OAUTH_CLIENT_SECRET`), the client-credentials
  grant for headless training runs (its tokens stay in memory, and a token that expires is
  replaced by a new one from the same grant); else the tokens a `login` stored for the URL,
  refreshed as they expire; else nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import time
import warnings
import webbrowser
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import anyio
import httpx2
from mcp.client.auth import OAuthClientProvider
from mcp.shared.auth import (
    AuthorizationCodeResult,
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthToken,
)
from pydantic import BaseModel, ConfigDict

from mcprl.errors import ServerSpecError

__all__ = [
    "SECRET_ENV",
    "OAuthClient",
    "TokenFile",
    "config_dir",
    "http_auth",
    "login",
    "login_command",
]

#: where `--oauth-client-id` takes its secret from (a flag would show in `ps` and shell history)
SECRET_ENV = "MCPRL_OAUTH_CLIENT_SECRET"


class OAuthClient(BaseModel):
    """A client registered with the server's authorization server (client credentials)."""

    model_config = ConfigDict(frozen=True)

    client_id: str
    client_secret: str | None = None
    scope: str | None = None
    issuer: str | None = None

    def __repr_args__(self) -> Any:
        for key, value in super().__repr_args__():
            yield key, ("***" if key == "client_secret" and value else value)


def config_dir() -> Path:
    """mcprl's directory under the user's config directory."""
    if os.environ.get("MCPRL_CONFIG_DIR"):
        return Path(os.environ["MCPRL_CONFIG_DIR"])
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "mcprl"


def login_command(url: str) -> str:
    return f"mcprl login {url}"


class TokenFile:
    """The SDK's `TokenStorage` in a file per server URL (module docstring), mode 0600."""

    def __init__(self, server_url: str, directory: Path | None = None) -> None:
        self.server_url = server_url
        host = re.sub(r"[^A-Za-z0-9.-]+", "_", urlparse(server_url).netloc)
        digest = hashlib.sha256(server_url.encode()).hexdigest()[:12]
        self.path = (directory or config_dir() / "tokens") / f"{host}-{digest}.json"

    def read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise ServerSpecError(
                f"the stored login for {self.server_url} ({self.path}) cannot be read: {exc}; "
                f"delete it and run `{login_command(self.server_url)}` again"
            ) from exc
        return data if isinstance(data, dict) else {}

    def _write(self, data: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({**data, "server_url": self.server_url}, f, indent=2)
        os.chmod(tmp, 0o600)  # an existing file keeps its mode through O_CREAT
        tmp.replace(self.path)

    @property
    def expires_at(self) -> float | None:
        return self.read().get("expires_at")

    async def get_tokens(self) -> OAuthToken | None:
        tokens = self.read().get("tokens")
        return OAuthToken.model_validate(tokens) if tokens else None

    async def set_tokens(self, tokens: OAuthToken) -> None:
        data = self.read()
        data["tokens"] = tokens.model_dump(mode="json", exclude_none=True)
        data["expires_at"] = time.time() + tokens.expires_in if tokens.expires_in else None
        self._write(data)

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        info = self.read().get("client_info")
        return OAuthClientInformationFull.model_validate(info) if info else None

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        data = self.read()
        data["client_info"] = client_info.model_dump(mode="json", exclude_none=True)
        self._write(data)


class _InMemory:
    """`TokenStorage` for this process only (client credentials: nothing to keep on disk)."""

    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client_info: OAuthClientInformationFull | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client_info

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client_info = client_info


class _StoredLogin(OAuthClientProvider):
    """The tokens of an earlier `mcprl login`: sent, and refreshed when they expire. Where the
    server wants a new login (no refresh token, or a refused one), the run stops and names the
    command that logs in again; it never opens a browser on its own."""

    def __init__(self, server_url: str, storage: TokenFile) -> None:
        metadata = OAuthClientMetadata(redirect_uris=None, grant_types=["refresh_token"])
        super().__init__(server_url, metadata, storage)
        self.storage = storage

    async def _perform_authorization(self) -> httpx2.Request:
        raise ServerSpecError(
            f"the login for {self.context.server_url} has expired and cannot be refreshed; log "
            f"in again: `{login_command(self.context.server_url)}`"
        )

    async def _initialize(self) -> None:
        await super()._initialize()
        expires_at = self.storage.expires_at
        if expires_at is not None:  # the SDK keeps the expiry in memory only
            self.context.token_expiry_time = expires_at


def http_auth(spec: Any) -> httpx2.Auth | None:
    """How a session with `spec` (a `ServerSpec` reached by URL) authorizes (module docstring)."""
    if spec.url is None:
        return None
    client = spec.oauth
    if client is not None:
        from mcp.client.auth.extensions.client_credentials import (
            ClientCredentialsOAuthProvider,
        )

        if not client.client_secret:
            raise ServerSpecError(
                f"the OAuth client {client.client_id!r} needs its secret: set ${SECRET_ENV}"
            )
        with warnings.catch_warnings():
            # omitting the issuer is deprecated in the SDK: the server's metadata names it
            warnings.simplefilter("ignore")
            return ClientCredentialsOAuthProvider(
                spec.url,
                _InMemory(),  # a new token each process: the secret is at hand
                client.client_id,
                client.client_secret,
                scope=client.scope,
                issuer=client.issuer,
            )
    storage = TokenFile(spec.url)
    if storage.read().get("tokens"):
        return _StoredLogin(spec.url, storage)
    return None


async def login(
    url: str,
    *,
    scope: str | None = None,
    open_browser: bool = True,
    port: int = 0,
    say: Callable[[str], None] = print,
    timeout: float = 300.0,
) -> TokenFile:
    """Log in to the server at `url` with the authorization-code flow (PKCE), and store the
    tokens (`TokenFile`). The user approves in a browser; the redirect comes back to a loopback
    server on 127.0.0.1 (`port`, 0 for any free one)."""
    from mcprl.mcp._session import open_session
    from mcprl.mcp._spec import ServerSpec

    spec = ServerSpec.parse(url)
    if spec.url is None:
        raise ServerSpecError(f"{spec.describe()} runs as a command: only servers at a URL log in")
    storage = TokenFile(spec.url)
    async with _Loopback(port) as loopback:
        metadata = OAuthClientMetadata(
            client_name="mcprl",
            redirect_uris=[loopback.redirect_uri],
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
            token_endpoint_auth_method="none",
            scope=scope,
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

        provider = OAuthClientProvider(spec.url, metadata, storage, redirect, callback)
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
