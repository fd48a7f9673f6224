"""Server specs: how to reach an MCP server, parsed from what a user types.

- `http://…` or `https://…`: streamable HTTP; a URL whose path ends in `/sse`: SSE.
- `example:calculator`: one of the example servers shipped with mcprl, over stdio.
- `servers.json` or `servers.json#name`: an MCP client config file (`{"mcpServers": {…}}`);
  `${VAR}` (also `${env:VAR}`, and `${VAR:-default}`) in its strings is replaced by the
  environment variable, as other MCP clients do, so a token stays out of the file.
- anything else: a command line, run as a subprocess speaking MCP over stdio; leading
  `KEY=VALUE` words set the server's environment (`"ALLOWED_DIR=/tmp/x npx -y server"`).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field

from mcprl.errors import ServerSpecError

__all__ = [
    "EXAMPLE_SERVERS",
    "OAuthClient",
    "ServerSpec",
    "example_server_path",
    "load_mcp_config",
]

EXAMPLE_SERVERS = ("calculator", "notes", "catalog")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


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


class ServerSpec(BaseModel):
    """Where an MCP server is and how to talk to it."""

    model_config = ConfigDict(frozen=True)

    transport: Literal["stdio", "http", "sse"]
    name: str = Field(description="a short name for messages and logs")
    command: tuple[str, ...] = ()
    env: dict[str, str] | None = None
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] | None = None
    oauth: OAuthClient | None = Field(
        default=None, description="a client of the server's authorization server (OAuth)"
    )

    def __repr_args__(self) -> Any:
        # header and environment values are often secrets (tokens, API keys): never shown
        for key, value in super().__repr_args__():
            if key in ("headers", "env") and value:
                value = {k: "***" for k in value}
            yield key, value

    def with_oauth(self, client: OAuthClient | None) -> ServerSpec:
        """This spec authorizing as `client` (the client-credentials grant)."""
        if client is None:
            return self
        if self.transport == "stdio":
            raise ServerSpecError(
                f"OAuth is for a server reached by URL, and {self.describe()} runs as a command"
            )
        return self.model_copy(update={"oauth": client})

    def with_headers(self, headers: dict[str, str]) -> ServerSpec:
        """This spec with `headers` added to those it has (sent with every HTTP request)."""
        if not headers:
            return self
        if self.transport == "stdio":
            raise ServerSpecError(
                f"headers go to a server reached by URL, and {self.describe()} runs as a "
                "command; give it its token in its environment (`KEY=VALUE command`) instead"
            )
        return self.model_copy(update={"headers": {**(self.headers or {}), **headers}})

    @classmethod
    def parse(cls, spec: str | ServerSpec, *, env: dict[str, str] | None = None) -> ServerSpec:
        if isinstance(spec, ServerSpec):
            return spec
        text = spec.strip()
        if not text:
            raise ServerSpecError("empty server spec: give a URL, a command, or a config file")
        if text.startswith(("http://", "https://")):
            path = urlparse(text).path.rstrip("/")
            return cls(transport="sse" if path.endswith("/sse") else "http", name=text, url=text)
        if text.startswith("example:"):
            name = text.removeprefix("example:")
            path = example_server_path(name)
            # it runs on mcprl's own interpreter, so it imports from where mcprl imports (the
            # SDK starts a stdio server with a minimal environment, which drops PYTHONPATH)
            own = {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}
            env = {**own, **(env or {})} or None
            return cls(transport="stdio", name=name, command=(sys.executable, str(path)), env=env)
        file_part, _, entry = text.partition("#")
        if file_part.endswith(".json") and (Path(file_part).is_file() or entry):
            return load_mcp_config(file_part, entry or None)
        try:
            argv = tuple(shlex.split(text))
        except ValueError as exc:
            raise ServerSpecError(f"cannot parse the command {text!r}: {exc}") from exc
        # `KEY=VALUE … command args`, as in a shell: the server's environment (the SDK starts a
        # stdio server with a minimal environment, so variables of mcprl's own do not reach it)
        assigned: dict[str, str] = {}
        while argv and _ASSIGNMENT.match(argv[0]):
            key, _, value = argv[0].partition("=")
            assigned[key] = value
            argv = argv[1:]
        if not argv:
            raise ServerSpecError(
                f"{text!r} sets environment variables but names no command to run; "
                "write them before the command: 'KEY=VALUE command args'"
            )
        merged = {**(env or {}), **assigned} or None
        return cls(transport="stdio", name=Path(argv[0]).name, command=argv, env=merged)

    def describe(self) -> str:
        if self.transport == "stdio":
            return f"{self.name!r} (stdio: {shlex.join(self.command)})"
        return f"{self.name!r} ({self.transport}: {self.url})"


def example_server_path(name: str) -> Path:
    """The script of a bundled example server (`calculator`, `notes`, `catalog`)."""
    if name not in EXAMPLE_SERVERS:
        raise ServerSpecError(
            f"unknown example server {name!r}; choose one of {', '.join(EXAMPLE_SERVERS)}"
        )
    here = Path(__file__).resolve().parent.parent
    for root in (here / "_examples" / "servers", here.parent / "examples" / "servers"):
        if (root / f"{name}.py").is_file():
            return root / f"{name}.py"
    raise ServerSpecError(f"the example server {name!r} is not installed with this copy of mcprl")


def load_mcp_config(path: str | os.PathLike[str], name: str | None = None) -> ServerSpec:
    """A server from a config file in the `mcpServers` shape MCP clients use."""
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ServerSpecError(f"cannot read MCP config {p}: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise ServerSpecError(f"{p} is not valid JSON: {exc}") from exc
    servers = data.get("mcpServers") if isinstance(data, dict) else None
    if not isinstance(servers, dict) or not servers:
        raise ServerSpecError(f'{p} has no "mcpServers" object naming at least one server')
    if name is None:
        if len(servers) > 1:
            raise ServerSpecError(
                f"{p} defines {len(servers)} servers ({', '.join(servers)}); "
                f"choose one with {p}#NAME"
            )
        name = next(iter(servers))
    if name not in servers:
        raise ServerSpecError(f"{p} has no server {name!r}; it has: {', '.join(servers)}")
    return _from_config_entry(name, servers[name], p)


_VARIABLE = re.compile(r"\$\{(?:env:)?([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _expand(value: Any, name: str, source: Path) -> Any:
    """`value` (a config entry's string, list or object) with `${VAR}` replaced by the
    environment's value; an unset variable without a default is an error naming it."""
    if isinstance(value, str):

        def variable(match: re.Match[str]) -> str:
            found = os.environ.get(match.group(1))
            if found is not None:
                return found
            if match.group(2) is not None:
                return match.group(2)
            raise ServerSpecError(
                f"{source}: server {name!r} uses ${{{match.group(1)}}}, which is not set; "
                f"export {match.group(1)}=… or write ${{{match.group(1)}:-default}}"
            )

        return _VARIABLE.sub(variable, value)
    if isinstance(value, list):
        return [_expand(v, name, source) for v in value]
    if isinstance(value, dict):
        return {k: _expand(v, name, source) for k, v in value.items()}
    return value


def _from_config_entry(name: str, entry: Any, source: Path) -> ServerSpec:
    if not isinstance(entry, dict):
        raise ServerSpecError(f"{source}: server {name!r} must be an object")
    entry = _expand(entry, name, source)
    if "url" in entry:
        kind = str(entry.get("type") or entry.get("transport") or "").lower()
        url = str(entry["url"])
        if kind == "sse" or (not kind and urlparse(url).path.rstrip("/").endswith("/sse")):
            transport = "sse"
        else:
            transport = "http"
        return ServerSpec(transport=transport, name=name, url=url, headers=entry.get("headers"))
    if "command" in entry:
        args = entry.get("args") or []
        if not isinstance(args, list):
            raise ServerSpecError(f"{source}: server {name!r}: 'args' must be a list of strings")
        return ServerSpec(
            transport="stdio",
            name=name,
            command=(str(entry["command"]), *map(str, args)),
            env={str(k): str(v) for k, v in (entry.get("env") or {}).items()} or None,
            cwd=entry.get("cwd"),
        )
    raise ServerSpecError(f"{source}: server {name!r} needs either 'command' or 'url'")
