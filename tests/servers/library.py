"""A test MCP server whose values live in a resource: member ids appear only in the
`library://members` resource (JSON), and one tool takes them; a prompt says what users ask.

python tests/servers/library.py     # stdio
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "servers"))
from _compat import READS, ToolError, make_server, serve

server = make_server("library", instructions="A lending library's members.")

_MEMBERS = {
    "m-1042": {"name": "Iris Vale", "plan": "family", "books_on_loan": 3, "overdue": 1},
    "m-2207": {"name": "Tomas Berg", "plan": "student", "books_on_loan": 1, "overdue": 0},
    "m-3311": {"name": "Noor Haddad", "plan": "standard", "books_on_loan": 6, "overdue": 2},
}


@server.resource("library://members", mime_type="application/json")
def members() -> str:
    """Every member's id and name."""
    return json.dumps([{"id": k, "name": v["name"]} for k, v in _MEMBERS.items()])


@server.prompt()
def overdue_reminder(member_id: str) -> str:
    """Write a friendly reminder to a member about their overdue books."""
    return f"Remind member {member_id} about their overdue books."


@server.tool(annotations=READS)
def get_member(member_id: str) -> str:
    """A member's plan and loans, by member id."""
    if member_id not in _MEMBERS:
        raise ToolError(f"no member {member_id!r}")
    return json.dumps(_MEMBERS[member_id])


if __name__ == "__main__":
    serve(server)
