"""What mcprl does where memory is short (mcprl._memory): glibc's allocator settings, set
in-process (the user's environment wins), and the engine's smaller batch."""

from __future__ import annotations

import ctypes.util
import json
import os
import subprocess
import sys

import pytest

from mcprl._memory import batch_kv_bytes, memory_is_short

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or ctypes.util.find_library("c") is None, reason="glibc only"
)

_PROBE = (
    "import json, sys; from mcprl._memory import bound_allocator; "
    "print(json.dumps(bound_allocator(float(sys.argv[1]))))"
)


def _made(available_gb: float = 4.0, **env: str) -> dict[str, int]:
    """What `bound_allocator` sets in a fresh process (mallopt is process-wide), with
    `available_gb` of memory free."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, str(available_gb)],
        env={**clean, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


def test_few_arenas_and_large_blocks_mapped_where_memory_is_short():
    assert _made(4.0) == {"MALLOC_ARENA_MAX": 2, "MALLOC_MMAP_THRESHOLD_": 4 << 20}


def test_glibc_defaults_kept_where_memory_is_plentiful():
    assert _made(20.0) == {}


def test_a_setting_in_the_environment_is_left_alone():
    assert _made(MALLOC_ARENA_MAX="8") == {"MALLOC_MMAP_THRESHOLD_": 4 << 20}
    assert _made(MALLOC_ARENA_MAX="8", MALLOC_MMAP_THRESHOLD_="131072") == {}


def test_the_engines_batch_holds_half_the_keys_and_values_where_memory_is_short():
    """`Engine(max_batch_kv_bytes="auto")`: 1 GiB on a CPU with memory to spare, 512 MiB where
    under 16 GiB is available (a default run's peak 3.98-4.12 -> 3.62-3.70 GB), no GPU bound."""
    assert batch_kv_bytes("cpu", available_gb=20.0) == 1 << 30
    assert batch_kv_bytes("cpu", available_gb=6.0) == 512 << 20
    assert batch_kv_bytes("cuda", available_gb=6.0) is None
    assert memory_is_short(6.0) and not memory_is_short(16.0)
