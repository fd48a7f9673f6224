"""What a server offers, read once: tools (with input schemas), resources, prompts, instructions."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from mcprl.errors import MCPServerError
from mcprl.mcp._session import open_session
from mcprl.mcp._spec import ServerSpec

__all__ = [
    "PromptInfo",
    "ResourceInfo",
    "ServerInfo",
    "ToolInfo",
    "inspect_server",
    "openai_tools",
]


class ToolInfo(BaseModel):
    name: str
    description: str = ""
    input_schema: dict[str, Any]
    # MCP tool annotations as the server sent them (readOnlyHint, destructiveHint, ...)
    annotations: dict[str, Any] = Field(default_factory=dict)


class ResourceInfo(BaseModel):
    uri: str
    name: str = ""
    description: str = ""
    mime_type: str | None = None
    text: str | None = None  # read when `read_resources` is set and the resource is text


class PromptInfo(BaseModel):
    name: str
    description: str = ""
    arguments: list[str] = []


class ServerInfo(BaseModel):
    name: str
    instructions: str | None = None
    tools: list[ToolInfo]
    resources: list[ResourceInfo] = []
    prompts: list[PromptInfo] = []

    def tool(self, name: str) -> ToolInfo:
        for t in self.tools:
            if t.name == name:
                return t
        raise KeyError(name)


async def inspect_server(
    server: str | ServerSpec | Any,
    *,
    read_resources: bool = True,
    max_resource_chars: int = 4000,
    require_tools: bool = True,
    **session_options: Any,
) -> ServerInfo:
    """List a server's tools and resources (reading text resources, cut to a size)."""
    async with open_session(server, **session_options) as session:
        tools = [tool_info(t) for t in await session.list_tools()]
        if require_tools and not tools:
            raise MCPServerError(
                f"MCP server {session.spec.describe()} offers no tools, so there is nothing to "
                "train on; check that it registers tools (and that this is the right server)"
            )
        resources = []
        for r in await session.list_resources():
            info = ResourceInfo(
                uri=str(r.uri),
                name=r.name or "",
                description=r.description or "",
                mime_type=r.mime_type,
            )
            if read_resources and (r.mime_type or "text/").startswith(("text/", "application/j")):
                text = await session.read_resource(str(r.uri))
                info.text = text[:max_resource_chars]
            resources.append(info)
        prompts = [
            PromptInfo(
                name=p.name,
                description=p.description or "",
                arguments=[a.name for a in p.arguments or []],
            )
            for p in await session.list_prompts()
        ]
        return ServerInfo(
            name=session.server_name,
            instructions=session.instructions,
            tools=tools,
            resources=resources,
            prompts=prompts,
        )


def tool_info(tool: Any) -> ToolInfo:
    """An MCP SDK tool (as `MCPSession.list_tools` gives it) as mcprl's `ToolInfo`."""
    return ToolInfo(
        name=tool.name,
        description=tool.description or "",
        input_schema=dict(tool.input_schema or {"type": "object", "properties": {}}),
        annotations=tool_annotations(tool),
    )


def tool_annotations(tool: Any) -> dict[str, Any]:
    notes = getattr(tool, "annotations", None)
    if notes is None:
        return {}
    return notes.model_dump(by_alias=True, exclude_none=True, mode="json")


def openai_tools(tools: list[ToolInfo]) -> list[dict[str, Any]]:
    """MCP tools as OpenAI function tools."""
    return [
        {
            "type": "function",
            "function": {
                "name": t.name,
                "description": t.description,
                "parameters": t.input_schema,
            },
        }
        for t in tools
    ]
