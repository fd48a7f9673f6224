"""A test MCP server with three names and nothing else: every question about it is a count or
whether a name is there, and only three of those can be "yes".

python tests/servers/teams.py       # stdio
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "servers"))
from _compat import make_server, serve

server = make_server("teams", instructions="The league's teams.")


@server.tool()
def list_teams() -> str:
    """List the teams of the league."""
    return json.dumps(["Harbour Rovers", "Mill Lane United", "Old Town Athletic"])


if __name__ == "__main__":
    serve(server)
