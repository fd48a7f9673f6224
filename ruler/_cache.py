"""An on-disk cache of judge verdicts, in SQLite.

Keyed by a hash of everything that determines the judge's answer: model, endpoint, sampling
parameters, and the exact prompt (which holds the rubric and the serialized group). Only validated
verdicts are stored. Each operation opens its own connection with a busy timeout and WAL journal,
so threads and processes can share one file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import anyio.to_thread

__all__ = ["JudgeCache", "default_cache_path"]

_SCHEMA = "CREATE TABLE IF NOT EXISTS verdicts (key TEXT PRIMARY KEY, value TEXT, created REAL)"


def default_cache_path() -> Path:
    """`$RULER_CACHE_DIR`, else `$XDG_CACHE_HOME/ruler`, else `~/.cache/ruler`."""
    root = os.environ.get("RULER_CACHE_DIR")
    if root:
        base = Path(root)
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ruler"
    return base / "judge_cache.sqlite"


def cache_key(payload: dict[str, Any]) -> str:
    text = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


class JudgeCache:
    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path) if path is not None else default_cache_path()
        self._ready = False
        self._init_lock = threading.Lock()

    def _connect(self) -> sqlite3.Connection:
        if not self._ready:
            with self._init_lock:
                if not self._ready:
                    self._initialize()
        return sqlite3.connect(self.path, timeout=30.0)

    def _initialize(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=30.0)
        try:
            # WAL lets readers and a writer work at once. Switching needs a moment alone with
            # the file; if another process holds it, the busy timeout still keeps every
            # operation safe, only less concurrent.
            with contextlib.suppress(sqlite3.OperationalError):
                conn.execute("PRAGMA journal_mode=WAL")
            with conn:
                conn.execute(_SCHEMA)
        finally:
            conn.close()
        self._ready = True

    def get_blocking(self, key: str) -> dict[str, Any] | None:
        conn = self._connect()
        try:
            row = conn.execute("SELECT value FROM verdicts WHERE key = ?", (key,)).fetchone()
        finally:
            conn.close()
        return json.loads(row[0]) if row else None

    def put_blocking(self, key: str, value: dict[str, Any]) -> None:
        conn = self._connect()
        try:
            with conn:
                conn.execute(
                    "INSERT OR REPLACE INTO verdicts (key, value, created) VALUES (?, ?, ?)",
                    (key, json.dumps(value), time.time()),
                )
        finally:
            conn.close()

    async def get(self, key: str) -> dict[str, Any] | None:
        return await anyio.to_thread.run_sync(self.get_blocking, key)

    async def put(self, key: str, value: dict[str, Any]) -> None:
        await anyio.to_thread.run_sync(self.put_blocking, key, value)

    def __len__(self) -> int:
        conn = self._connect()
        try:
            return conn.execute("SELECT COUNT(*) FROM verdicts").fetchone()[0]
        finally:
            conn.close()
