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


def describe_machine() -> str:
    """One line: CPU model, cores, and the measured fp32 / bf16 matmul peaks."""
    import os
    import platform

    cpu = platform.processor() or "cpu"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    fp32, bf16 = peak_gflops(torch.float32, seconds=1.0), peak_gflops(torch.bfloat16, seconds=1.0)
    return f"{cpu}, {os.cpu_count()} cores; matmul peak fp32 {fp32:.0f}, bf16 {bf16:.0f} GFLOP/s"
