"""mcprl: train open models to use any MCP server's tools with reinforcement learning.

The training toolkit. Its judge, RULER, lives in the standalone package `ruler`.
"""

from __future__ import annotations

from mcprl.errors import MCPRLError

__version__ = "0.1.0"

__all__ = ["MCPRLError", "__version__"]
