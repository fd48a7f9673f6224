"""Talking to MCP servers: specs, sessions, tool results as text.

`open_session(spec)` opens one session; `inspect_server(spec)` lists tools and resources once.
"""

from __future__ import annotations

from mcprl.mcp._auth import SECRET_ENV, MemoryTokens, TokenFile, config_dir
from mcprl.mcp._elicit import ElicitationPolicy, Elicitations
from mcprl.mcp._elicit import describe as describe_elicitation
from mcprl.mcp._inspect import (
    PromptInfo,
    ResourceInfo,
    ServerInfo,
    ToolInfo,
    inspect_server,
    openai_tools,
    tool_annotations,
    tool_info,
)
from mcprl.mcp._login import code_flow, login
from mcprl.mcp._results import ResultsAs, ToolResult
from mcprl.mcp._safety import looks_like_error, name_words, tool_access, writing_tools
from mcprl.mcp._sampling import Sampler
from mcprl.mcp._session import MCPSession, open_session
from mcprl.mcp._spec import (
    EXAMPLE_SERVERS,
    OAuthClient,
    ServerSpec,
    example_server_path,
    load_mcp_config,
)

__all__ = [
    "EXAMPLE_SERVERS",
    "SECRET_ENV",
    "ElicitationPolicy",
    "Elicitations",
    "MCPSession",
    "MemoryTokens",
    "OAuthClient",
    "PromptInfo",
    "ResourceInfo",
    "ResultsAs",
    "Sampler",
    "ServerInfo",
    "ServerSpec",
    "TokenFile",
    "ToolInfo",
    "ToolResult",
    "code_flow",
    "config_dir",
    "describe_elicitation",
    "example_server_path",
    "inspect_server",
    "load_mcp_config",
    "login",
    "looks_like_error",
    "name_words",
    "open_session",
    "openai_tools",
    "tool_access",
    "tool_annotations",
    "tool_info",
    "writing_tools",
]
