"""Run the example servers on either MCP SDK: 2.x (`MCPServer`) or 1.x (`FastMCP`).

Every example is a plain script: `python calculator.py` serves over stdio, `python calculator.py
--http 8001` serves streamable HTTP on 127.0.0.1:8001 at /mcp. The same file runs under an
interpreter with mcp 1.x installed, which is how mcprl's tests check it talks to both.
"""

from __future__ import annotations

import argparse
from typing import Any

try:  # mcp 2.x
    from mcp.server.mcpserver import Context, MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    MCP_MAJOR = 2
except ImportError:  # mcp 1.x
    from mcp.server.fastmcp import Context  # type: ignore[no-redef]
    from mcp.server.fastmcp import FastMCP as MCPServer  # type: ignore[no-redef]
    from mcp.server.fastmcp.exceptions import ToolError  # type: ignore[no-redef]

    MCP_MAJOR = 1

from mcp.types import ToolAnnotations

# What each tool does to the server's data, as MCP tool annotations: clients (mcprl's scenario
# generator among them) call only READS tools on a user's server unless told they may write.
READS = ToolAnnotations(readOnlyHint=True)
WRITES = ToolAnnotations(readOnlyHint=False, destructiveHint=False)
DELETES = ToolAnnotations(readOnlyHint=False, destructiveHint=True)

# Tools raise ToolError for mistakes the agent should read: the 2.x SDK shows the message of a
# ToolError to the client and hides the text of any other exception.
__all__ = [
    "DELETES",
    "MCP_MAJOR",
    "READS",
    "WRITES",
    "Context",
    "ToolError",
    "make_server",
    "serve",
    "session_key",
]


def make_server(name: str, instructions: str) -> Any:
    return MCPServer(name, instructions=instructions, log_level="WARNING")


def session_key(ctx: Any) -> str:
    """Which client session a request belongs to.

    Over streamable HTTP with a handshake, the `Mcp-Session-Id` header names the session. Over
    stdio the process serves exactly one client, so one key for the process is right.
    """
    try:
        request = ctx.request_context.request
        headers = getattr(request, "headers", None)
    except (AttributeError, ValueError):
        headers = None
    if headers is None:
        try:
            headers = ctx.headers
        except (AttributeError, ValueError):
            headers = None
    if headers:
        sid = headers.get("mcp-session-id")
        if sid:
            return sid
    return "process"


def serve(server: Any, argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=f"The {server.name} example MCP server.")
    parser.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP on PORT")
    parser.add_argument("--sse", type=int, metavar="PORT", help="serve (legacy) SSE on PORT")
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args(argv)
    if args.sse is not None:
        if MCP_MAJOR == 2:
            server.run("sse", host=args.host, port=args.sse)
        else:
            server.settings.host, server.settings.port = args.host, args.sse
            server.run("sse")
    elif args.http is None:
        server.run("stdio")
    elif MCP_MAJOR == 2:
        server.run("streamable-http", host=args.host, port=args.http)
    else:
        server.settings.host = args.host
        server.settings.port = args.http
        server.run("streamable-http")
