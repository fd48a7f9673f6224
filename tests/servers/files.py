"""A test MCP server like third-party filesystem servers: it needs an environment variable to
start (SANDBOX_DIR), and it has unannotated tools that write and delete. Every call is appended
to SANDBOX_DIR/calls.log, so a test can tell which tools were called.

SANDBOX_DIR=/tmp/x python tests/servers/files.py
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "servers"))
from _compat import ToolError, make_server, serve

if not os.environ.get("SANDBOX_DIR"):
    sys.exit("SANDBOX_DIR is required: the folder this server may read and write")
ROOT = Path(os.environ["SANDBOX_DIR"]).resolve()

server = make_server("files", instructions="Read and write text files in one folder.")


def _log(tool: str, **arguments: str) -> None:
    with (ROOT / "calls.log").open("a", encoding="utf-8") as f:
        f.write(json.dumps({"tool": tool, **arguments}) + "\n")


def _path(name: str) -> Path:
    path = (ROOT / name).resolve()
    if ROOT not in path.parents or path.name == "calls.log":
        raise ToolError(f"{name!r} is outside the folder")
    return path


@server.tool()
def list_files() -> str:
    """List the files in the folder."""
    _log("list_files")
    names = sorted(p.name for p in ROOT.iterdir() if p.is_file() and p.name != "calls.log")
    return json.dumps({"files": [{"name": n} for n in names], "count": len(names)})


@server.tool()
def read_file(name: str) -> str:
    """Read a text file (a name from list_files)."""
    _log("read_file", name=name)
    path = _path(name)
    if not path.is_file():
        raise ToolError(f"no file named {name!r}")
    return path.read_text(encoding="utf-8")


@server.tool()
def write_file(name: str, content: str) -> str:
    """Write a text file, replacing what it held."""
    _log("write_file", name=name)
    _path(name).write_text(content, encoding="utf-8")
    return f"wrote {len(content)} characters to {name}"


@server.tool()
def delete_file(name: str) -> str:
    """Delete a file."""
    _log("delete_file", name=name)
    path = _path(name)
    if not path.is_file():
        raise ToolError(f"no file named {name!r}")
    path.unlink()
    return f"deleted {name}"


if __name__ == "__main__":
    serve(server)
