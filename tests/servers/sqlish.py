"""A test MCP server like third-party SQL servers: a free-text query tool that reports failures
as ordinary text ("Database error: Parser Error: ..."), and a table-name argument whose values
come only from another tool's results.

python tests/servers/sqlish.py      # stdio
"""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "servers"))
from _compat import make_server, serve

server = make_server("sqlish", instructions="A small read-only fruit and vegetable database.")

_DB = sqlite3.connect(":memory:", check_same_thread=False)
_DB.executescript(
    """
    CREATE TABLE fruit (name TEXT, colour TEXT, price REAL);
    INSERT INTO fruit VALUES ('apple', 'red', 0.5), ('banana', 'yellow', 0.25),
        ('cherry', 'red', 3.0), ('kiwi', 'green', 0.75);
    CREATE TABLE vegetables (name TEXT, price REAL);
    INSERT INTO vegetables VALUES ('carrot', 0.2), ('leek', 0.9), ('pea', 1.5);
    """
)


@server.tool()
def list_tables() -> str:
    """List the tables in the database."""
    rows = _DB.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
    return json.dumps({"tables": [{"name": r[0]} for r in rows]})


@server.tool()
def count_rows(table: str) -> str:
    """Count the rows of a table (a name from list_tables)."""
    if not table.isidentifier():
        return f"Database error: Parser Error: syntax error at or near {table!r}"
    try:
        (count,) = _DB.execute(f"SELECT COUNT(*) FROM {table}").fetchone()
    except sqlite3.Error as exc:
        return f"Database error: Catalog Error: {exc}"
    return json.dumps({"table": table, "count": count})


@server.tool()
def query(sql: str) -> str:
    """Run a SQL query and return the rows as JSON."""
    try:
        rows = _DB.execute(sql).fetchall()
    except sqlite3.Error as exc:
        return f"Database error: Parser Error: {exc}"
    return json.dumps(rows)


if __name__ == "__main__":
    serve(server)
