"""glibc's allocator settings (mcprl._memory): set in-process, and the user's environment wins."""

from __future__ import annotations

import ctypes.util
import json
import os
import subprocess
import sys

import pytest

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
