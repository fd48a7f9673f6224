"""What every benchmark shares: the machine's peak matmul rate per dtype, and a checkout of
another revision of mcprl to compare against."""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def checkout(rev: str) -> Iterator[Path]:
    """A temporary git worktree of this repository at `rev` (run it with PYTHONPATH=<tree>)."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "rev"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(tree), rev],
            cwd=ROOT, check=True, capture_output=True,
        )  # fmt: skip
        try:
            yield tree
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT)


def sync(device: str) -> None:
    """Wait for the GPU's queued work, so a wall-clock timer measures it (a no-op on a CPU)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def peak_gflops(
    dtype: torch.dtype, n: int = 2048, seconds: float = 2.0, device: str = "cpu"
) -> float:
    """Sustained GFLOP/s of an n x n matrix product in `dtype` on `device` (on a GPU, 8192 x
    8192: a 2048 product is too small to reach its peak)."""
    cuda = device.startswith("cuda")
    n = max(n, 8192) if cuda else n
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    for _ in range(3):
        a @ b
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        count += 1
        if cuda and count % 10 == 0:
            torch.cuda.synchronize()
    if cuda:
        torch.cuda.synchronize()
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
    native = native_bf16()  # an emulated 2048^3 product takes ~15 s: measure a small one
    fp32 = peak_gflops(torch.float32, seconds=1.0)
    bf16 = peak_gflops(torch.bfloat16, n=2048 if native else 256, seconds=1.0)
    emulated = "" if native else " (emulated: no avx512_bf16/amx_bf16)"
    gpu = f"; GPU {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    return (
        f"{cpu}, {os.cpu_count()} cores; matmul peak fp32 {fp32:.0f}, bf16 {bf16:.1f}{emulated}"
        f" GFLOP/s{gpu}"
    )


def native_bf16() -> bool:
    """`mcprl.serving.native_bf16`; True under an older mcprl that lacks it (a benchmark of an
    older revision imports that one)."""
    try:
        from mcprl.serving import native_bf16 as native
    except ImportError:
        return True
    return native()


def default_dtypes() -> list[str]:
    """The dtypes worth measuring here: bfloat16 and float32 where bfloat16 is native (or on a
    GPU), else float32 alone (emulated bfloat16 runs ~100x slower; ask for it by name)."""
    if torch.cuda.is_available() or native_bf16():
        return ["bfloat16", "float32"]
    return ["float32"]
