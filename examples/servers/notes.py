"""Notes: a small note store with per-session state (create, list, search, update, delete).

Each client session gets its own empty notebook: over stdio the process is the session; over
streamable HTTP the `Mcp-Session-Id` names it. Nothing is written to disk.

    python examples/servers/notes.py            # stdio
    python examples/servers/notes.py --http 8002
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from _compat import DELETES, READS, WRITES, Context, ToolError, make_server, serve, session_key

server = make_server(
    "notes",
    instructions="A private notebook for this session. Notes have an id, a title, a body and tags.",
)

_NOTEBOOKS: dict[str, dict[str, Any]] = {}


def _book(ctx: Context) -> dict[str, Any]:
    return _NOTEBOOKS.setdefault(session_key(ctx), {"next": 1, "notes": {}})


def _get(ctx: Context, note_id: int) -> dict[str, Any]:
    note = _book(ctx)["notes"].get(note_id)
    if note is None:
        raise ToolError(f"no note with id {note_id}; list_notes shows the ids that exist")
    return note


def _summary(note: dict[str, Any]) -> dict[str, Any]:
    return {"id": note["id"], "title": note["title"], "tags": note["tags"]}


@server.tool(annotations=WRITES)
def create_note(title: str, body: str, ctx: Context, tags: list[str] | None = None) -> dict:
    """Create a note and return it with its new id."""
    if not title.strip():
        raise ToolError("title must not be empty")
    book = _book(ctx)
    note = {
        "id": book["next"],
        "title": title.strip(),
        "body": body,
        "tags": sorted({t.strip().lower() for t in tags or [] if t.strip()}),
    }
    book["notes"][note["id"]] = note
    book["next"] += 1
    return note


@server.tool(annotations=READS)
def list_notes(ctx: Context, tag: str | None = None) -> dict:
    """List notes (id, title, tags), oldest first, optionally only those with a tag."""
    notes = list(_book(ctx)["notes"].values())
    if tag:
        notes = [n for n in notes if tag.strip().lower() in n["tags"]]
    return {"count": len(notes), "notes": [_summary(n) for n in notes]}


@server.tool(annotations=READS)
def search_notes(query: str, ctx: Context) -> dict:
    """Find notes whose title or body contains every word of the query (case-insensitive)."""
    words = query.lower().split()
    if not words:
        raise ToolError("query must contain at least one word")
    hits = [
        n
        for n in _book(ctx)["notes"].values()
        if all(w in f"{n['title']} {n['body']}".lower() for w in words)
    ]
    return {"count": len(hits), "notes": [_summary(n) for n in hits]}


@server.tool(annotations=READS)
def get_note(note_id: int, ctx: Context) -> dict:
    """Return one note with its body."""
    return _get(ctx, note_id)


@server.tool(annotations=WRITES)
def update_note(
    note_id: int,
    ctx: Context,
    title: str | None = None,
    body: str | None = None,
    tags: list[str] | None = None,
) -> dict:
    """Change a note's title, body or tags (only the fields given) and return it."""
    note = _get(ctx, note_id)
    if title is not None:
        if not title.strip():
            raise ToolError("title must not be empty")
        note["title"] = title.strip()
    if body is not None:
        note["body"] = body
    if tags is not None:
        note["tags"] = sorted({t.strip().lower() for t in tags if t.strip()})
    return note


@server.tool(annotations=DELETES)
def delete_note(note_id: int, ctx: Context) -> dict:
    """Delete a note. Returns the id deleted and how many notes remain."""
    _get(ctx, note_id)
    notes = _book(ctx)["notes"]
    del notes[note_id]
    return {"deleted": note_id, "remaining": len(notes)}


if __name__ == "__main__":
    serve(server)
