"""What every benchmark reports about the machine: its peak matmul rate per dtype."""

from __future__ import annotations

import time

import torch


def peak_gflops(dtype: torch.dtype, n: int = 2048, seconds: float = 2.0) -> float:
    """Sustained GFLOP/s of an n x n matrix product in `dtype` on this machine."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    for _ in range(3):
        a @ b
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        count += 1
    return 2 * n**3 * count / (time.perf_counter() - start) / 1e9
