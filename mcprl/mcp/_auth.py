"""OAuth 2.1 for servers reached by URL, through the MCP SDK's client providers.

The SDK's `OAuthClientProvider` does the protocol: protected-resource and authorization-server
metadata discovery with the spec's fallbacks, dynamic client registration or a client ID
metadata document, PKCE, scopes and step-up on `insufficient_scope`, token refresh. mcprl adds
what a command-line tool needs around it:

- `TokenFile`: the SDK's `TokenStorage`, one JSON file per server under the user's config
  directory (`$MCPRL_CONFIG_DIR`, else `$XDG_CONFIG_HOME/mcprl`, else `~/.config/mcprl`), in
  `tokens/`, mode 0600. It keeps when the access token expires, so a later run refreshes a
  stale token before its first request instead of failing on it.
- `login(url)` (in `_login`): the interactive authorization-code flow (`mcprl login URL`).
- `http_auth(spec)`: what a session sends. With `ServerSpec.oauth` (a client ID and secret,
  `--oauth-client-id` with the secret in `$MCPRL_OAUTH_CLIENT_SECRET`), the client-credentials
  grant for headless training runs (its token stays in memory, shared by the process's
  sessions, and one that expires is replaced by a new one from the same grant); else the
  tokens a `login` stored for the URL, refreshed as they expire; else nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx2
from mcp.client.auth import OAuthClientProvider
from mcp.shared.auth import (
    OAuthClientInformationFull,
    OAuthClientMetadata,
    OAuthToken,
)

from mcprl.errors import ServerSpecError

__all__ = ["SECRET_ENV", "MemoryTokens", "TokenFile", "config_dir", "http_auth", "login_command"]

#: where `--oauth-client-id` takes its secret from (a flag would show in `ps` and shell history)
SECRET_ENV = "MCPRL_OAUTH_CLIENT_SECRET"


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


class MemoryTokens:
    """`TokenStorage` for this process only (client credentials: nothing to keep on disk)."""

    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client_info: OAuthClientInformationFull | None = None
        self.expires_at: float | None = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens
        self.expires_at = time.time() + tokens.expires_in if tokens.expires_in else None

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


_CLIENT_TOKENS: dict[tuple[str, str, str, str | None, str | None], MemoryTokens] = {}


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

        class Provider(ClientCredentialsOAuthProvider):
            async def _initialize(self) -> None:
                await super()._initialize()
                self.context.token_expiry_time = storage.expires_at

        # the sessions of this process share the client's token (one per attempt would cost a
        # refused request and a token request each); none is kept on disk: the secret is at hand
        secret = hashlib.sha256(client.client_secret.encode()).hexdigest()
        key = (spec.url, client.client_id, secret, client.scope, client.issuer)
        storage = _CLIENT_TOKENS.setdefault(key, MemoryTokens())
        with warnings.catch_warnings():
            # omitting the issuer is deprecated in the SDK: the server's metadata names it
            warnings.simplefilter("ignore")
            return Provider(
                spec.url,
                storage,
                client.client_id,
                client.client_secret,
                scope=client.scope,
                issuer=client.issuer,
            )
    storage = TokenFile(spec.url)
    if storage.read().get("tokens"):
        return _StoredLogin(spec.url, storage)
    return None
