"""Public MCP servers nobody on the team wrote, installed from PyPI and npm, with small fixed data.

    python benchmarks/public_servers.py          # install (once) and list the server specs

`public_servers()` installs them (pinned versions, into `~/.cache/mcprl-bench`, or
`$MCPRL_BENCH_CACHE`) and returns `{name: server spec}` for `mcprl` commands. Servers built on
the 1.x MCP SDK get a virtual environment of their own, those on 2.x another, npm ones an npm
prefix. Their data is written fresh on each call: a two-table shop database for sqlite, a git
repository of eight commits by four authors at fixed dates, a folder of text files, and a
knowledge graph for the memory server, so every run asks the same servers the same things.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

CACHE = Path(os.environ.get("MCPRL_BENCH_CACHE", Path.home() / ".cache" / "mcprl-bench"))

PY_MCP2 = ["mcp>=2.3,<3", "mcp-server-time==2026.10.19", "mcp-server-git==2026.10.19"]
PY_MCP1 = [
    "mcp>=1.9,<2",
    "pydantic-settings",
    "mcp-server-calculator==0.2.1",
    "unit-converter-mcp==0.1.2",
    "gnomon-mcp==0.1.2",
    "mcp-server-sqlite==2025.4.25",
]
NPM = [
    "@modelcontextprotocol/server-everything@2026.8.31",
    "@modelcontextprotocol/server-memory@2026.8.31",
    "@modelcontextprotocol/server-filesystem@2026.8.31",
]


def _venv(name: str, requirements: list[str]) -> Path:
    env = CACHE / name
    stamp = env / "mcprl-requirements.txt"
    wanted = "\n".join(requirements)
    if stamp.exists() and stamp.read_text() == wanted:
        return env / "bin"
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(env)], check=True)
    subprocess.run(
        [str(env / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check",
         *requirements],
        check=True,
    )  # fmt: skip
    stamp.write_text(wanted)
    return env / "bin"


def _npm(requirements: list[str]) -> Path:
    prefix = CACHE / "npm"
    stamp = prefix / "mcprl-requirements.txt"
    wanted = "\n".join(requirements)
    if not (stamp.exists() and stamp.read_text() == wanted):
        prefix.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["npm", "install", "--silent", "--prefix", str(prefix), *requirements], check=True
        )
        stamp.write_text(wanted)
    return prefix / "node_modules" / ".bin"


def _shop(path: Path) -> Path:
    path.unlink(missing_ok=True)
    db = sqlite3.connect(path)
    db.executescript(
        """
        CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT, category TEXT, price REAL,
            stock INTEGER);
        INSERT INTO products VALUES (1, 'Desk lamp', 'lighting', 24.5, 12),
            (2, 'Office chair', 'furniture', 149.0, 4), (3, 'Bookshelf', 'furniture', 89.9, 7),
            (4, 'LED strip', 'lighting', 15.0, 30), (5, 'Standing desk', 'furniture', 399.0, 2),
            (6, 'Notebook', 'stationery', 3.5, 120), (7, 'Fountain pen', 'stationery', 45.0, 9);
        CREATE TABLE orders (id INTEGER PRIMARY KEY, product_id INTEGER, customer TEXT,
            quantity INTEGER, status TEXT);
        INSERT INTO orders VALUES (1, 2, 'Maria Lopez', 1, 'shipped'),
            (2, 6, 'Tom Becker', 10, 'pending'), (3, 4, 'Aiko Tanaka', 3, 'shipped'),
            (4, 1, 'Maria Lopez', 2, 'delivered'), (5, 7, 'Sam Okafor', 1, 'pending');
        """
    )
    db.commit()
    db.close()
    return path


COMMITS = [
    ("README.md", "# Recipes\n", "Start the recipe book", "Ana Silva", "2024-03-01T10:00:00"),
    ("soup.md", "Leek soup: leeks, potatoes, stock.\n", "Add leek soup", "Ben Ode",
     "2024-03-04T12:30:00"),
    ("bread.md", "Soda bread: flour, buttermilk, salt.\n", "Add soda bread", "Ana Silva",
     "2024-03-09T09:15:00"),
    ("curry.md", "Lentil curry: lentils, onion, cumin, coconut milk.\n", "Add lentil curry",
     "Chloe Park", "2024-03-12T18:40:00"),
    ("soup.md", "Leek soup: leeks, potatoes, stock, cream.\n", "Put cream in the leek soup",
     "Ben Ode", "2024-03-15T08:05:00"),
    ("salad.md", "Bean salad: beans, red onion, parsley, lemon.\n", "Add bean salad",
     "Dev Rana", "2024-03-20T13:20:00"),
    ("cake.md", "Carrot cake: carrots, flour, eggs, walnuts.\n", "Add carrot cake",
     "Chloe Park", "2024-03-26T16:45:00"),
    ("README.md", "# Recipes\nSoups, breads, mains, salads and cakes.\n",
     "List the sections in the README", "Ana Silva", "2024-04-02T11:00:00"),
]  # fmt: skip


def _repo(path: Path) -> Path:
    """A git repository of eight commits at fixed dates by four authors, and a second branch.

    Fixed names and dates give the same commit ids on every machine; a repository laid by an
    older version of this list is laid again.
    """
    stamp = path / ".git" / "mcprl-commits.json"
    if stamp.exists() and stamp.read_text() == json.dumps(COMMITS):
        return path
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    run = lambda *a, **env: subprocess.run(  # noqa: E731
        ["git", *a], cwd=path, check=True, capture_output=True, env={**os.environ, **env}
    )
    run("init", "-q", "-b", "main")
    for name, text, message, author, date in COMMITS:
        (path / name).write_text(text)
        run("add", name)
        email = author.split()[0].lower() + "@example.com"
        run(
            "commit", "-q", "-m", message, f"--author={author} <{email}>",
            GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date, GIT_COMMITTER_NAME=author,
            GIT_COMMITTER_EMAIL=email,
        )  # fmt: skip
    run("branch", "drafts")
    stamp.write_text(json.dumps(COMMITS))
    return path


def _folder(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    files = {
        "todo.txt": "buy milk\ncall the plumber\nbook train tickets\n",
        "notes/meeting.md": "# Team meeting\nAttendees: Ana, Ben, Chloe\nNext review: May 14\n",
        "notes/ideas.md": "- a reading list app\n- a recipe planner\n",
        "budget.csv": "item,amount\nrent,950\nfood,320\ntravel,110\n",
    }
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    return path


def _graph(path: Path) -> Path:
    entities = [
        ("Ana Silva", "person", ["works at Northwind", "speaks Portuguese", "likes hiking"]),
        ("Ben Ode", "person", ["works at Northwind", "plays the cello"]),
        ("Northwind", "organization", ["based in Lisbon", "founded in 2015"]),
        ("Project Atlas", "project", ["due in June", "budget of 40000 euros"]),
    ]
    relations = [
        ("Ana Silva", "Northwind", "works_at"),
        ("Ben Ode", "Northwind", "works_at"),
        ("Ana Silva", "Project Atlas", "leads"),
    ]
    lines = [
        json.dumps({"type": "entity", "name": n, "entityType": t, "observations": o})
        for n, t, o in entities
    ] + [
        json.dumps({"type": "relation", "from": a, "to": b, "relationType": r})
        for a, b, r in relations
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def _with_env(name: str, command: str, args: list[str], env: dict[str, str]) -> str:
    config = CACHE / "configs" / f"{name}.json"
    config.parent.mkdir(parents=True, exist_ok=True)
    entry = {"command": command, "args": args, "env": env}
    config.write_text(json.dumps({"mcpServers": {name: entry}}))
    return str(config)


def public_servers() -> dict[str, str]:
    """Install (once) and return `{name: server spec}`; the data is laid anew on each call."""
    py2 = _venv("py-mcp2", PY_MCP2)
    py1 = _venv("py-mcp1", PY_MCP1)
    npm = _npm(NPM)
    data = CACHE / "data"
    data.mkdir(parents=True, exist_ok=True)
    shop = _shop(data / "shop.db")
    repo = _repo(data / "recipes")
    folder = _folder(data / "folder")
    graph = _graph(data / "memory.jsonl")
    return {
        "time (mcp-server-time)": str(py2 / "mcp-server-time"),
        "calculator (mcp-server-calculator)": str(py1 / "mcp-server-calculator"),
        "units (unit-converter-mcp)": str(py1 / "unit-converter-mcp"),
        "dates and maths (gnomon-mcp)": str(py1 / "gnomon-mcp"),
        "sqlite shop (mcp-server-sqlite)": f"{py1 / 'mcp-server-sqlite'} --db-path {shop}",
        "git (mcp-server-git)": f"{py2 / 'mcp-server-git'} --repository {repo}",
        "everything (server-everything)": str(npm / "mcp-server-everything"),
        "memory graph (server-memory)": _with_env(
            "memory", str(npm / "mcp-server-memory"), [], {"MEMORY_FILE_PATH": str(graph)}
        ),
        "filesystem (server-filesystem)": f"{npm / 'mcp-server-filesystem'} {folder}",
    }


if __name__ == "__main__":
    for name, spec in public_servers().items():
        print(f"{name}: {spec}")
