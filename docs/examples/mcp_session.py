"""An MCP server's tools, and one call through a session.

python docs/examples/mcp_session.py [SERVER]     # default: example:calculator
"""

from __future__ import annotations

import asyncio
import sys

from mcprl.mcp import inspect_server, open_session


async def main(server: str) -> None:
    info = await inspect_server(server)  # tools (with their schemas), resources, prompts
    print(f"{info.name}: {', '.join(t.name for t in info.tools)}")
    async with open_session(server) as session:  # one session (one per attempt in training)
        result = await session.call_tool("multiply", {"a": 6, "b": 7}, timeout=10)
        print(result.text, result.is_error)  # 42 False


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "example:calculator"))
