"""CPU threads follow the cores other processes leave free (mcprl.serving._threads)."""

from __future__ import annotations

import argparse

import pytest
import torch

from mcprl.cli._machine import set_threads
from mcprl.errors import UsageError
from mcprl.serving import _threads
from mcprl.serving._threads import CoreUse, ThreadGovernor, threads_left


@pytest.fixture(autouse=True)
def _restore_threads():
    before, fixed, most = torch.get_num_threads(), _threads._fixed, _threads._most
    _threads._fixed = _threads._most = None  # as a fresh process: earlier tests may have set them
    yield
    torch.set_num_threads(before)
    _threads._fixed, _threads._most = fixed, most


class _Use:
    """Scripted cores in use by others, window by window."""

    def __init__(self, cores: int, others: list[float]):
        self.cores = cores
        self._others = list(others)

    def others(self) -> float:
        return self._others.pop(0)


def _stat(path, ticks: dict[int, tuple[int, int]]) -> None:
    """A /proc/stat with (user, system) ticks per CPU; the rest idle."""
    lines = ["cpu  0 0 0 0 0 0 0 0 0 0"]
    lines += [f"cpu{n} {u} 0 {s} 1000 5 0 0 0 0 0" for n, (u, s) in ticks.items()]
    path.write_text("\n".join(lines) + "\nintr 1 2 3\n")


def test_a_busy_neighbour_takes_a_thread_at_once_and_gives_it_back_after_two_quiet_windows():
    governor = ThreadGovernor(most=2, every_s=0, use=_Use(2, [1.2, 0.1, 0.1, 0.4, 0.7]))
    governor.poll()
    assert (governor.threads, torch.get_num_threads()) == (1, 1)
    governor.poll()  # one quiet window is not enough: the neighbour may be between bursts
    assert governor.threads == 1
    governor.poll()
    assert (governor.threads, torch.get_num_threads()) == (2, 2)
    governor.poll()  # 0.4 of a core in use elsewhere: not worth a thread
    assert governor.threads == 2
    governor.poll()
    assert governor.threads == 1
    assert governor.changes == 3


def test_threads_left_never_fall_below_one_or_rise_above_the_ceiling():
    assert threads_left(0.0, 16, 8) == 8
    assert threads_left(3.4, 16, 16) == 13
    assert threads_left(5.0, 2, 2) == 1
    assert threads_left(0.49, 2, 2) == 2
    assert threads_left(0.6, 2, 2) == 1


def test_others_are_the_cpu_sets_busy_ticks_less_this_process(tmp_path, monkeypatch):
    clock = {"wall": 100.0, "own": 10.0}

    class Clock:
        @staticmethod
        def monotonic():
            return clock["wall"]

        @staticmethod
        def process_time():
            return clock["own"]

    monkeypatch.setattr(_threads, "time", Clock)
    stat = tmp_path / "stat"
    _stat(stat, {0: (100, 0), 1: (100, 0), 2: (0, 0)})
    use = CoreUse(stat)
    use.cpus = {0, 1}  # cpu2 lies outside this process's CPU set: never counted
    use._mark = use._read()
    # 2 s later: 300 ticks (3 s of CPU) on cpu0/cpu1, 1 s of it this process's; cpu2 ignored
    _stat(stat, {0: (250, 150), 1: (100, 0), 2: (900, 0)})
    clock.update(wall=102.0, own=11.0)
    assert use.others() == pytest.approx(1.0)
    assert CoreUse(tmp_path / "missing").others() is None


def test_a_fixed_count_turns_adaptation_off():
    assert ThreadGovernor.for_device("cuda") is None
    _threads.fix_threads(1)
    assert torch.get_num_threads() == 1
    assert ThreadGovernor.for_device("cpu") is None


def _args(**kw) -> argparse.Namespace:
    return argparse.Namespace(**{"threads": None, "device": "cpu", **kw})


def test_a_busy_machine_at_start_is_named_with_the_flag_that_fixes_the_count(monkeypatch, capsys):
    monkeypatch.delenv("MCPRL_THREADS", raising=False)
    torch.set_num_threads(2)
    monkeypatch.setattr("mcprl.serving.busy_at_start", lambda: (1.7, 2))
    set_threads(_args())
    out = capsys.readouterr().err
    assert "other processes use 1.7 of its 2 cores" in out
    assert "1 thread " in out and "--threads N" in out
    assert torch.get_num_threads() == 1
    assert _threads.adaptive_threads()  # it takes threads back later, up to the default
    governor = ThreadGovernor.for_device("cpu")
    assert governor is not None and (governor.threads, governor.most) == (1, 2)

    monkeypatch.setattr("mcprl.serving.busy_at_start", lambda: (0.1, 2))
    set_threads(_args())
    assert capsys.readouterr().err == ""


def test_threads_from_the_flag_or_environment_are_fixed_and_checked(monkeypatch):
    set_threads(_args(threads=1))
    assert torch.get_num_threads() == 1 and not _threads.adaptive_threads()
    with pytest.raises(UsageError, match="--threads 0: must be 1 or more"):
        set_threads(_args(threads=0))
    monkeypatch.setenv("MCPRL_THREADS", "two")
    with pytest.raises(UsageError, match="MCPRL_THREADS='two': must be a whole number"):
        set_threads(_args())


class _Busy:
    """Others use `others` cores in every window, of a `cores`-core CPU set."""

    def __init__(self, cores: int, others: float):
        self.cores, self.value = cores, others

    def others(self) -> float:
        return self.value


def test_settle_sets_the_count_at_once_up_as_well_as_down(monkeypatch):
    """A thread that starts a burst of work (a training step) takes the free cores now: `poll`
    would wait two quiet windows before it grows."""
    torch.set_num_threads(1)
    governor = ThreadGovernor(most=2, use=_Busy(2, 0.1))
    governor.threads = 1
    governor.settle(seconds=0)
    assert (governor.threads, torch.get_num_threads()) == (2, 2)
    governor.use = _Busy(2, 1.5)
    governor.settle(seconds=0)
    assert (governor.threads, torch.get_num_threads()) == (1, 1)


def test_a_later_governor_grows_back_to_the_processs_first_count_not_a_lowered_one(monkeypatch):
    monkeypatch.setattr(_threads, "CoreUse", lambda: _Busy(2, 0.0))
    torch.set_num_threads(2)
    assert ThreadGovernor.for_device("cpu").most == 2  # the engine's, at start
    torch.set_num_threads(1)  # the engine gave a thread up to a neighbour
    assert ThreadGovernor.for_device("cpu").most == 2  # the trainer's
