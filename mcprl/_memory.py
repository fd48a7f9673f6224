"""Handing freed memory back to the operating system (glibc's allocator settings).

glibc keeps what a process frees, in per-thread arenas of 64 MB heaps, for the process to reuse.
A model on CPU frees gigabytes of activations and caches at a time, and the arenas hold on to
them: a git training process that had not yet trained held 8.6 GB, 6.5 GB of it in 103 such
heaps, while the same rollouts replayed in a process of their own peaked at 4.4 GB. Trimming
returns the free pages of every arena: the trainer trims after a step, the engine when idle and,
busy, every 2 s as rows finish (a catalog step's peak 10.1 -> 8.3 GB, a calculator step's 4.0
-> 3.5 GB, 30-90 ms a trim). Where memory is short, two settings also keep the memory from
piling up between trims (`bound_allocator`): few arenas, and blocks of 4 MB or more mapped on
their own, so that freeing one unmaps it (glibc otherwise raises that threshold to the largest
block freed, up to 32 MB, and keeps every such block after the first in an arena), and the
engine's running batch holds half the keys and values (`batch_kv_bytes`). No-ops without glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from typing import Any

__all__ = ["batch_kv_bytes", "bound_allocator", "memory_is_short", "return_freed_memory"]

_M_MMAP_THRESHOLD = -3  # mallopt's parameter numbers (malloc.h)
_M_ARENA_MAX = -8
ARENAS = 2
MMAP_THRESHOLD = 4 << 20  # bytes: at 1 MB rollouts were 30% slower
SHORT_GB = 16.0
BATCH_KV_BYTES = 1 << 30  # the engine's bound on its batch's keys and values on CPU
SHORT_BATCH_KV_BYTES = 512 << 20  # ... where memory is short


@functools.cache
def _libc() -> Any:
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name) if name else None


def return_freed_memory() -> None:
    """Return the process's freed heap memory to the OS (all arenas)."""
    trim = getattr(_libc(), "malloc_trim", None)  # glibc only
    if trim is not None:
        trim(0)


def _available_gb() -> float | None:
    """MemAvailable from /proc/meminfo, in GiB; None where there is none."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return None


@functools.cache
def _available_at_start_gb() -> float | None:
    return _available_gb()


def memory_is_short(available_gb: float | None = None) -> bool:
    """Whether under `SHORT_GB` GiB is available: `available_gb`, else MemAvailable as this
    process first read it, so the allocator and the engine decide alike (False where unknown)."""
    if available_gb is None:
        available_gb = _available_at_start_gb()
    return available_gb is not None and available_gb < SHORT_GB


def batch_kv_bytes(device_type: str, available_gb: float | None = None) -> int | None:
    """The engine's default bound on its running batch's keys and values, padding included
    (`Engine(max_batch_kv_bytes="auto")`): none off the CPU; on a CPU 1 GiB, or 512 MiB where
    memory is short (`memory_is_short`). The default calculator run alone (RESULTS.md, "A
    smaller batch where memory is short") peaked at 3.62-3.70 GB under 512 MiB against
    3.98-4.12 GB under 1 GiB, its rollouts 10-25% slower (two runs each): fewer rows decode at
    once. So a machine with memory to spare keeps the faster bound."""
    if device_type != "cpu":
        return None
    return SHORT_BATCH_KV_BYTES if memory_is_short(available_gb) else BATCH_KV_BYTES


@functools.cache
def bound_allocator(available_gb: float | None = None) -> dict[str, int]:
    """Where memory is short (`memory_is_short(available_gb)`), cap glibc's arenas at `ARENAS`
    and map blocks of `MMAP_THRESHOLD` bytes or more on their own, unless the environment sets
    `MALLOC_ARENA_MAX` or `MALLOC_MMAP_THRESHOLD_` (glibc reads those at start; they win).
    Measured on a catalog step (RESULTS.md): peak 10.3 -> 6.1-6.3 GB, rollouts 8-23%
    and evaluations 12-15% slower, so a machine with memory to spare keeps the faster default.
    Call it before the process starts its threads: glibc fixes its arena limit once it has
    8 arenas. Returns the settings it made, by environment variable name."""
    if not memory_is_short(available_gb):
        return {}  # before looking libc up: find_library runs ldconfig, at every CLI start
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:
        return {}
    made = {}
    for var, param, value in (
        ("MALLOC_ARENA_MAX", _M_ARENA_MAX, ARENAS),
        ("MALLOC_MMAP_THRESHOLD_", _M_MMAP_THRESHOLD, MMAP_THRESHOLD),
    ):
        if var not in os.environ and mallopt(param, value) == 1:
            made[var] = value
    return made
