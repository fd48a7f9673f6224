"""A test MCP server like third-party task trackers: users and tasks as records (the tasks have
no ids a person would name), unread notifications, a writing tool, and two tools that are no
practice material: a debug call log that grows with every call, and an environment dump.

python tests/servers/tracker.py     # stdio
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "servers"))
from _compat import make_server, serve

server = make_server("tracker", instructions="A small team's tasks.")

_USERS = [
    {"username": "ana", "full_name": "Ana Silva", "team": "design", "open_tasks": 2},
    {"username": "ben", "full_name": "Ben Ode", "team": "backend", "open_tasks": 5},
    {"username": "chloe", "full_name": "Chloe Park", "team": "backend", "open_tasks": 1},
    {"username": "dev", "full_name": "Dev Rao", "team": "design", "open_tasks": 3},
]
_TASKS = [
    {"title": "Fix login page", "assignee": "ana", "status": "open", "estimate_hours": 3},
    {"title": "Write API docs", "assignee": "ben", "status": "done", "estimate_hours": 5},
    {"title": "Migrate database", "assignee": "ben", "status": "open", "estimate_hours": 13},
    {"title": "Plan offsite", "assignee": "chloe", "status": "blocked", "estimate_hours": 2},
]
_CALLS: list[dict] = []


def _log(tool: str, **args: object) -> None:
    _CALLS.append({"tool": tool, "args": args})


@server.tool()
def get_users() -> str:
    """List the team's users."""
    _log("get_users")
    return json.dumps({"users": _USERS})


@server.tool()
def get_tasks() -> str:
    """List every task with its assignee and status."""
    _log("get_tasks")
    return json.dumps({"tasks": _TASKS})


@server.tool()
def check_notifications(username: str) -> str:
    """Unread notifications for a user (a username from get_users)."""
    _log("check_notifications", username=username)
    user = next((u for u in _USERS if u["username"] == username), None)
    if user is None:
        return f"Error: no user {username!r}"
    unread = [t for t in _TASKS if t["assignee"] == username and t["status"] != "done"]
    return json.dumps({"user": username, "unread": len(unread)})


@server.tool()
def count_batch(requests: list[dict]) -> str:
    """Count a batch of requests (free-form objects, like unit-converter-mcp's `convert_batch`)."""
    _log("count_batch")
    return json.dumps({"total": len(requests)})


@server.tool()
def create_task(title: str, assignee: str) -> str:
    """Create a task."""
    _log("create_task", title=title)
    _TASKS.append({"title": title, "assignee": assignee, "status": "open", "estimate_hours": 1})
    return "created"


@server.tool()
def get_call_log() -> str:
    """Return this server's MCP calls, for debugging."""
    _log("get_call_log")
    return json.dumps(_CALLS)


@server.tool()
def get_settings() -> str:
    """The settings this tracker runs with."""
    return "\n".join(f"{k}={v}" for k, v in sorted(os.environ.items()))


if __name__ == "__main__":
    serve(server)
