"""The errors mcprl raises, in one tree.

```
MCPRLError
```

Branches are added with the modules that raise them; dependencies' errors are converted where
they are caught, with `raise ... from exc`.
"""

from __future__ import annotations

__all__ = ["MCPRLError"]


class MCPRLError(Exception):
    """Base class of every error raised by mcprl."""
