"""CPU threads sized to the cores that other processes leave free.

torch runs CPU operations in an OpenMP team that, by default, has one thread per core and
spins between parallel regions rather than sleeping. Alone on a machine that is the fastest
choice. Beside another busy process it is the slowest by far: the spinning threads take turns
with the other process's threads, and each parallel region waits for a thread that is off the
CPU. Measured on this project's 2-core machine (generate, 16 rows, SmolLM2-135M, bf16):

    one process, 2 threads                              116 ms a token
    two processes, 2 threads each                      1342-2514 ms (11-22x slower)
    two processes, OMP_WAIT_POLICY=PASSIVE             222 ms   (but alone: 135, 16% slower)
    two processes, 1 thread each                       210 ms   (alone: 211)

So the engine measures, every few seconds between decoding steps, how many cores other
processes used (from /proc/stat, less this process's own CPU time), and sets torch's thread
count to the cores left: one process alone keeps every core, two share them. It drops a
thread as soon as one window shows the need (contention costs 10x) and takes it back after two
quiet windows. The trainer does the same between micro-batches, from a count measured afresh
at each step's start (`settle`): with two threads beside another run's rollouts a step ran at
0.16x its speed alone, sized to the free cores at 0.60x, with the rollouts at 0.57x and 0.65x
(`benchmarks/sharing.py --training`). Thread counts do not change the engine's numbers: on
this machine's CPU, logits and greedy tokens are identical with 1 or 2 threads (a training
step's weights differ by float summation order: at most 3.3e-6).

`fix_threads(n)` (the CLI's `--threads`, `$MCPRL_THREADS`) sets a count and turns this off.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

__all__ = [
    "CoreUse",
    "ThreadGovernor",
    "adaptive_threads",
    "busy_at_start",
    "fix_threads",
    "start_with",
    "threads_left",
]

logger = logging.getLogger(__name__)

BUSY = 0.5  # cores that others must use before a thread is given up
_fixed: int | None = None
_most: int | None = None  # the count to grow back to, where a busy start began with fewer


def fix_threads(count: int) -> None:
    """Use `count` CPU threads for the rest of the process, whatever else the machine runs."""
    import torch

    global _fixed
    _fixed = count
    torch.set_num_threads(count)


def start_with(count: int) -> None:
    """Begin with `count` threads (a busy machine at start); engines grow back to torch's
    default count as cores free up."""
    import torch

    global _most
    _most = _most or torch.get_num_threads()
    torch.set_num_threads(count)


def adaptive_threads() -> bool:
    """Whether engines size their threads to the free cores (no count was fixed)."""
    return _fixed is None


class CoreUse:
    """The cores of this process's CPU set that other processes used, window by window.

    Linux only (`/proc/stat`); elsewhere `others()` is None. The kernel's per-CPU tick counts
    (user, nice, system, irq, softirq) less this process's CPU time, over wall time.
    """

    def __init__(self, stat: Path = Path("/proc/stat")):
        self.stat = stat
        self.cpus = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set()
        self._hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._mark = self._read()

    @property
    def cores(self) -> int:
        return len(self.cpus) or (os.cpu_count() or 1)

    def _read(self) -> tuple[float, float, float] | None:
        try:
            lines = self.stat.read_text().splitlines()
        except OSError:
            return None
        busy = 0
        for line in lines:
            name, *fields = line.split()
            cpu = name[3:]
            if not (name.startswith("cpu") and cpu.isdigit()) or int(cpu) not in self.cpus:
                continue
            user, nice, system, _idle, _iowait, irq, softirq = (int(f) for f in fields[:7])
            busy += user + nice + system + irq + softirq
        return time.monotonic(), busy / self._hz, time.process_time()

    def others(self) -> float | None:
        """Cores used by other processes since the last call (or since this object was made)."""
        now = self._read()
        if now is None or self._mark is None or not self.cpus:
            return None
        (t0, busy0, own0), (t1, busy1, own1) = self._mark, now
        self._mark = now
        if t1 - t0 <= 0:
            return None
        return max(0.0, ((busy1 - busy0) - (own1 - own0)) / (t1 - t0))


class ThreadGovernor:
    """Keeps torch's thread count at the cores others leave free, up to `most`.

    Call `poll()` from the thread that runs the model (torch's count is per calling thread); it
    does nothing until `every_s` has passed since the last window.
    """

    def __init__(self, most: int, every_s: float = 2.0, use: CoreUse | None = None):
        self.most = max(1, most)
        self.every_s = every_s
        self.use = use or CoreUse()
        self.threads = self.most
        self.changes = 0
        self._last = time.monotonic()
        self._wanted: int | None = None

    @classmethod
    def for_device(cls, device_type: str) -> ThreadGovernor | None:
        """A governor for a model on `device_type`, or None: only CPU models, only where no
        count was fixed, only where /proc/stat can be read."""
        global _most
        if device_type != "cpu" or not adaptive_threads():
            return None
        import torch

        # the count to grow back to is the process's first: a later governor (the trainer's,
        # after the engine's gave threads up) would otherwise take a lowered count for its most
        _most = _most or torch.get_num_threads()
        governor = cls(_most)
        governor.threads = torch.get_num_threads()
        return governor if governor.use.others() is not None else None

    def settle(self, seconds: float = 0.25) -> None:
        """Measure the cores others use over `seconds` now, and set the calling thread's count
        to what they leave free, up or down. For a thread that starts a burst of work (a
        training step): its count is its own, and it should not wait two windows to grow."""
        import torch

        self.use.others()  # a window from now
        time.sleep(seconds)
        others = self.use.others()
        self._last, self._wanted = time.monotonic(), None
        if others is None:
            return
        want = self.want(others)
        if want != self.threads:
            self._set(want, others)
        else:
            torch.set_num_threads(want)  # this thread's own count may differ from the last set

    def want(self, others: float) -> int:
        return threads_left(others, self.use.cores, self.most)

    def poll(self) -> None:
        now = time.monotonic()
        if now - self._last < self.every_s:
            return
        self._last = now
        others = self.use.others()
        if others is None:
            return
        want = self.want(others)
        if want == self.threads:
            self._wanted = None
            return
        # give a thread up at once; take one back only after two windows agree
        if want < self.threads or self._wanted == want:
            self._set(want, others)
        else:
            self._wanted = want

    def _set(self, threads: int, others: float) -> None:
        import torch

        logger.info(
            "other processes use %.1f of %d cores: %d CPU threads (was %d)",
            others, self.use.cores, threads, self.threads,
        )  # fmt: skip
        torch.set_num_threads(threads)
        self.threads = threads
        self._wanted = None
        self.changes += 1


def threads_left(others: float, cores: int, most: int) -> int:
    """Threads for the cores that `others` (cores in use by other processes) leave free: one
    is given up once others use more than `BUSY` of it; never fewer than 1 or more than `most`."""
    return max(1, min(most, int(cores - others + (1 - BUSY))))


def busy_at_start(seconds: float = 0.5) -> tuple[float, int] | None:
    """(cores other processes use, cores of this CPU set), measured over `seconds`; None where
    that cannot be read."""
    use = CoreUse()
    time.sleep(seconds)
    others = use.others()
    return None if others is None else (others, use.cores)
