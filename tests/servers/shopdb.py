"""A test MCP server like third-party SQLite servers: a read-only SQL tool that takes any SELECT
(and returns rows as a Python-style list of dicts), a table listing and a table description, and
a tool that writes.

python tests/servers/shopdb.py      # stdio
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "servers"))
from _compat import ToolError, make_server, serve

server = make_server("shopdb", instructions="A small shop's database.")

ROWS = """
CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT, category TEXT, price REAL, stock INTEGER);
INSERT INTO products VALUES (1, 'Desk lamp', 'lighting', 24.5, 12),
    (2, 'Office chair', 'furniture', 149.0, 4), (3, 'Bookshelf', 'furniture', 89.9, 7),
    (4, 'LED strip', 'lighting', 15.0, 30), (5, 'Notebook', 'stationery', 3.5, 120);
CREATE TABLE orders (id INTEGER PRIMARY KEY, customer TEXT, quantity INTEGER, status TEXT);
INSERT INTO orders VALUES (1, 'Maria Lopez', 1, 'shipped'), (2, 'Tom Becker', 10, 'pending'),
    (3, 'Aiko Tanaka', 3, 'shipped');
"""
_DB = sqlite3.connect(":memory:", check_same_thread=False)
_DB.row_factory = sqlite3.Row
_DB.executescript(ROWS)


def _rows(sql: str) -> str:
    try:
        return str([dict(r) for r in _DB.execute(sql).fetchall()])
    except sqlite3.Error as exc:
        raise ToolError(f"Database error: {exc}") from None


@server.tool()
def read_query(query: str) -> str:
    """Execute a SELECT query on the SQLite database."""
    if not query.lstrip().upper().startswith("SELECT"):
        raise ToolError("Only SELECT queries are allowed for read_query")
    return _rows(query)


@server.tool()
def list_tables() -> str:
    """List all tables in the SQLite database."""
    return _rows("SELECT name FROM sqlite_master WHERE type = 'table'")


@server.tool()
def describe_table(table_name: str) -> str:
    """Get the schema information for a specific table."""
    if table_name not in ("products", "orders"):
        raise ToolError(f"Table {table_name!r} does not exist")
    return _rows(f"PRAGMA table_info({table_name})")


@server.tool()
def write_query(query: str) -> str:
    """Execute an INSERT, UPDATE, or DELETE query on the SQLite database."""
    _DB.execute(query)
    return "done"


if __name__ == "__main__":
    serve(server)
