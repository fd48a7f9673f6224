"""A session with one MCP server: open it, list what it offers, call its tools.

    async with open_session("example:calculator") as session:
        tools = await session.list_tools()
        result = await session.call_tool("add", {"a": 1, "b": 2}, timeout=10)
        result.text, result.is_error

Start-up failures (bad command, a server that exits, hangs, or prints junk on stdout) raise
`MCPServerStartError` naming the server, the cause and the end of its stderr. A server that dies
during a session raises `MCPConnectionError` from the call; open a new session to go on. Tool
failures are not exceptions: they come back as `ToolResult(is_error=True)` for the agent to read.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, Literal

import anyio
import httpx2
from mcp import Client, MCPError, StdioServerParameters
from mcp import types as mcp_types
from mcp.client.auth import OAuthFlowError, OAuthRegistrationError, OAuthTokenError
from mcp.client.stdio import stdio_client

from mcprl.errors import MCPConnectionError, MCPRLError, MCPServerError, MCPServerStartError
from mcprl.mcp._auth import http_auth, login_command
from mcprl.mcp._elicit import ElicitationPolicy, Elicitations
from mcprl.mcp._results import ResultsAs, ToolResult, tool_result
from mcprl.mcp._sampling import Sampler
from mcprl.mcp._spec import ServerSpec

__all__ = ["MCPSession", "open_session"]

logger = logging.getLogger(__name__)

_CONNECTION_CLOSED = -32000
_REQUEST_TIMEOUT = -32001
_STDERR_TAIL = 2000
_LOST = (
    anyio.ClosedResourceError,
    anyio.BrokenResourceError,
    anyio.EndOfStream,
    httpx2.TransportError,
    ConnectionError,
)

#: How sessions negotiate. "legacy" (the initialize handshake) is the default: every SDK
#: generation speaks it (1.x servers, and 2.x servers), and over HTTP it gives each session an
#: `Mcp-Session-Id`, which servers with per-session state rely on. "auto" probes the 2026
#: protocol first and falls back to the handshake.
ConnectMode = Literal["legacy", "auto"]


class MCPSession:
    """An open session. Create it with `open_session`."""

    def __init__(
        self,
        spec: ServerSpec,
        client: Client,
        stderr: Any,
        call_timeout: float,
        elicitations: Elicitations | None = None,
    ) -> None:
        self.spec = spec
        self._client = client
        self.elicitations = elicitations or Elicitations()
        self._stderr = stderr
        self.call_timeout = call_timeout
        self.max_result_chars = 20_000

    @property
    def server_name(self) -> str:
        info = self._client.server_info
        return info.name if info is not None and info.name else self.spec.name

    @property
    def instructions(self) -> str | None:
        return self._client.instructions

    def stderr_tail(self) -> str:
        return _tail(self._stderr)

    async def list_tools(self) -> list[mcp_types.Tool]:
        """Every tool the server offers, following pagination."""
        return await self._paginate(self._client.list_tools, "tools")

    async def list_resources(self) -> list[mcp_types.Resource]:
        """Every resource the server lists (none when it has no resources capability)."""
        caps = self._client.server_capabilities
        if caps is not None and caps.resources is None:
            return []
        return await self._paginate(self._client.list_resources, "resources")

    async def list_prompts(self) -> list[mcp_types.Prompt]:
        """Every prompt the server lists (none when it has no prompts capability)."""
        caps = self._client.server_capabilities
        if caps is not None and caps.prompts is None:
            return []
        return await self._paginate(self._client.list_prompts, "prompts")

    async def read_resource(self, uri: str) -> str:
        """A resource's text parts joined; binary parts become a placeholder."""
        result = await self._request(lambda: self._client.read_resource(uri), f"reading {uri}")
        parts = []
        for item in result.contents:
            text = getattr(item, "text", None)
            if text is not None:
                parts.append(text)
            else:
                size = len(getattr(item, "blob", "") or "") * 3 // 4
                parts.append(f"[binary resource: {item.mime_type or 'unknown type'}, {size} bytes]")
        return "\n".join(parts)

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        timeout: float | None = None,
        results_as: ResultsAs = "text",
    ) -> ToolResult:
        """Call a tool. Errors the agent should see come back as `ToolResult(is_error=True)`.

        `results_as`: see `tool_result`."""
        limit = timeout if timeout is not None else self.call_timeout
        asked = len(self.elicitations.seen)
        try:
            result = await self._client.call_tool(name, arguments or {}, read_timeout_seconds=limit)
        except MCPError as exc:
            if exc.code == _CONNECTION_CLOSED:
                raise self._lost(f"calling tool {name!r}", exc) from exc
            if exc.code == _REQUEST_TIMEOUT:
                return ToolResult(f"Error: tool {name!r} timed out after {limit:g}s", True)
            return ToolResult(f"Error: {exc.message}", True)
        except _LOST as exc:
            raise self._lost(f"calling tool {name!r}", exc) from exc
        out = tool_result(result, self.max_result_chars, results_as)
        out.elicitations = self.elicitations.seen[asked:]  # what the server asked meanwhile
        return out

    async def _paginate(self, method: Any, field: str) -> list[Any]:
        items: list[Any] = []
        cursor: str | None = None
        for _ in range(1000):  # a server whose cursor never ends cannot hang us
            page = await self._request(lambda c=cursor: method(cursor=c), f"listing {field}")
            items.extend(getattr(page, field))
            cursor = page.next_cursor
            if not cursor:
                return items
        raise MCPServerError(f"{self.spec.describe()} kept paginating {field} past 1000 pages")

    async def _request(self, call: Any, what: str) -> Any:
        try:
            return await call()
        except MCPError as exc:
            if exc.code == _CONNECTION_CLOSED:
                raise self._lost(what, exc) from exc
            message = f"{self.spec.describe()} failed while {what}: {exc.message}"
            raise MCPServerError(message) from exc
        except _LOST as exc:
            raise self._lost(what, exc) from exc

    def _lost(self, what: str, exc: BaseException) -> MCPConnectionError:
        return MCPConnectionError(
            f"lost the connection to MCP server {self.spec.describe()} while {what}: "
            f"{_reason(exc)}",
            server=self.spec.name,
            stderr_tail=self.stderr_tail(),
        )


@asynccontextmanager
async def open_session(
    server: str | ServerSpec | Any,
    *,
    startup_timeout: float = 30.0,
    call_timeout: float = 60.0,
    max_result_chars: int = 20_000,
    mode: ConnectMode = "legacy",
    auth: httpx2.Auth | None = None,
    elicitation: ElicitationPolicy | Elicitations = "decline",
    sampling: Sampler | None = None,
) -> AsyncIterator[MCPSession]:
    """Open a session with a server: a spec string, a `ServerSpec`, or (in-process) a server
    object such as an `MCPServer`. A server reached by URL is authorized by `auth` where given,
    else as `mcprl.mcp._auth.http_auth` decides (OAuth client credentials, or a stored login).
    `elicitation`: how the server's questions to the user are answered (`mcprl.mcp._elicit`);
    `sampling`: the model that answers its requests for completions (else they are refused).
    """
    elicitations = (
        elicitation if isinstance(elicitation, Elicitations) else Elicitations(elicitation)
    )
    refused: list[int] = []
    if isinstance(server, (str, ServerSpec)):
        spec = ServerSpec.parse(server)
        target: Any = _target(spec, refused, auth)
    else:  # an in-process server object
        spec = ServerSpec(transport="stdio", name=getattr(server, "name", "in-process"))
        target = server
    junk: list[str] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, Exception):
            junk.append(_junk_text(message))
        await anyio.lowlevel.checkpoint()

    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as stderr:
        if isinstance(target, StdioServerParameters):
            # Capture the server's stderr so failures can show its end.
            target = stdio_client(target, errlog=stderr)
        # The read timeout bounds the handshake: a server that never answers fails start-up.
        client = Client(
            target,
            mode=mode,
            message_handler=on_message,
            elicitation_callback=elicitations,
            sampling_callback=sampling,
            cache=None,
            read_timeout_seconds=startup_timeout,
        )
        try:
            async with contextlib.AsyncExitStack() as stack:
                try:
                    await stack.enter_async_context(client)
                except Exception as exc:
                    raise _start_error(spec, exc, stderr, junk, startup_timeout, refused) from exc
                session = MCPSession(spec, client, stderr, call_timeout, elicitations)
                session.max_result_chars = max_result_chars
                yield session
        except BaseExceptionGroup as group:
            raise _unwrap(group) from None


def _target(spec: ServerSpec, refused: list[int], auth: httpx2.Auth | None = None) -> Any:
    """What the SDK's client connects to; `refused` collects the HTTP statuses (401, 403) of
    requests the server turned away for want of credentials, which the SDK does not report."""
    if spec.transport == "stdio":
        return StdioServerParameters(
            command=spec.command[0], args=list(spec.command[1:]), env=spec.env, cwd=spec.cwd
        )
    auth = auth if auth is not None else http_auth(spec)
    if spec.transport == "sse":
        from mcp.client.sse import sse_client

        return sse_client(spec.url, headers=spec.headers, auth=auth)
    from mcp.client.streamable_http import streamable_http_client

    async def note_refusal(response: httpx2.Response) -> None:
        if response.status_code in (401, 403):
            refused.append(response.status_code)

    # the MCP SDK's own timeouts (a response stream may stay open for minutes)
    client = httpx2.AsyncClient(
        headers=spec.headers,
        timeout=httpx2.Timeout(30.0, read=300.0),
        event_hooks={"response": [note_refusal]},
        auth=auth,
    )
    return streamable_http_client(spec.url, http_client=client)


def _junk_text(exc: Exception) -> str:
    """The offending stdout line, from the parse error the SDK hands over."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        with contextlib.suppress(Exception):
            line = errors()[0].get("input")
            if isinstance(line, str):
                return repr(line[:200])
    return (str(exc).splitlines() or [repr(exc)])[0][:200]


def _tail(stderr: Any) -> str:
    if stderr is None:
        return ""
    try:
        stderr.flush()
        stderr.seek(0, 2)
        size = stderr.tell()
        stderr.seek(max(0, size - _STDERR_TAIL * 4))
        return stderr.read()[-_STDERR_TAIL:].strip()
    except (OSError, ValueError):
        return ""


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]


def _unwrap(group: BaseExceptionGroup) -> BaseException:
    """The one meaningful error inside task-group wrapping, preferring mcprl's own."""
    leaves = _leaves(group)
    for leaf in leaves:
        if isinstance(leaf, (MCPConnectionError, MCPServerError)):
            return leaf
    return leaves[0] if len(leaves) == 1 else group


def _reason(exc: BaseException) -> str:
    leaf = _leaves(exc)[0]
    if isinstance(leaf, MCPError):
        return leaf.message
    text = str(leaf)
    return f"{type(leaf).__name__}: {text}" if text else type(leaf).__name__


_HTTP_REASONS = {
    "Bad Request": 400,
    "Unauthorized": 401,
    "Forbidden": 403,
    "Not Found": 404,
    "Method Not Allowed": 405,
    "Not Acceptable": 406,
    "Internal Server Error": 500,
    "Bad Gateway": 502,
    "Service Unavailable": 503,
}


def _start_error(
    spec: ServerSpec,
    exc: BaseException,
    stderr: Any,
    junk: list[str],
    timeout: float,
    refused: Sequence[int] = (),
) -> MCPServerStartError:
    leaf = _leaves(exc)[0]
    where = f"MCP server {spec.describe()}"
    if isinstance(leaf, (OAuthFlowError, OAuthTokenError, OAuthRegistrationError)):
        cause = (
            f"its OAuth authorization failed: {leaf}. Check `oauth_client_id`, its secret and "
            f"`oauth_scope`, or log in: `{login_command(spec.url)}`"
        )
    elif isinstance(leaf, MCPRLError):
        cause = str(leaf)
    elif refused:
        status = refused[-1]
        said = "Unauthorized" if status == 401 else "Forbidden"
        given = "the credentials sent" if spec.headers else "a request without credentials"
        cause = (
            f"it refused {given} (HTTP {status} {said}) at {spec.url}; log in "
            f"(`{login_command(spec.url)}`), give an OAuth client (`oauth_client_id`, its "
            "secret in $MCPRL_OAUTH_CLIENT_SECRET), or send its token as a header "
            "(`headers`, e.g. 'Authorization: Bearer TOKEN'; in an MCP config file's "
            '"headers", ${VAR} keeps the secret in the environment)'
        )
    elif junk:
        cause = (
            f"it wrote text that is not MCP JSON-RPC to stdout ({junk[0]}); over stdio, stdout "
            "carries protocol messages only, so the server must log to stderr"
        )
    elif isinstance(leaf, TimeoutError) or (
        isinstance(leaf, MCPError) and leaf.code == _REQUEST_TIMEOUT
    ):
        cause = f"it did not complete the MCP handshake within {timeout:g}s (is it an MCP server?)"
    elif isinstance(leaf, FileNotFoundError) and spec.transport == "stdio":
        cause = f"the command {spec.command[0]!r} was not found"
    elif isinstance(leaf, PermissionError) and spec.transport == "stdio":
        cause = f"the command {spec.command[0]!r} is not executable"
    elif isinstance(leaf, MCPError) and leaf.code == _CONNECTION_CLOSED:
        cause = "it exited (or closed its output) during start-up"
    elif isinstance(leaf, httpx2.ConnectError):
        cause = f"nothing is listening at {spec.url} ({leaf})"
    elif isinstance(leaf, httpx2.HTTPStatusError):
        cause = f"it answered HTTP {leaf.response.status_code} at {spec.url}"
    elif spec.transport != "stdio" and isinstance(leaf, MCPError) and leaf.message in _HTTP_REASONS:
        # the SDK turns an HTTP error status into an MCP error carrying only the reason phrase
        cause = f"{spec.url} answered HTTP {_HTTP_REASONS[leaf.message]} ({leaf.message})"
        if leaf.message == "Not Found":
            cause += (
                ": no MCP endpoint at this path; streamable HTTP servers usually serve /mcp, "
                "SSE servers /sse"
            )
    else:
        cause = _reason(leaf)
    return MCPServerStartError(
        f"could not start {where}: {cause}", server=spec.name, stderr_tail=_tail(stderr)
    )
