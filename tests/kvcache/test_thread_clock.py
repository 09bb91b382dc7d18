"""`thread_times()` (kvcache/tiers/thread_clock.py) against the kernel's own per-thread CPU
clock (`time.thread_time`) and the wall clock: a thread that spins runs for its wall time, a
thread that sleeps (as a read blocked on a disk does) neither runs nor queues meanwhile."""

from __future__ import annotations

import os
import threading
import time

import pytest

from infergen.kvcache.tiers.thread_clock import STEAL_REFRESH_S, steal_per_cpu, thread_times

TICK = 0.01  # the steal counter's resolution (a clock tick at 100 Hz)


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _measure(work) -> tuple[float, float, float, float, float]:
    """(wall, run, queued, thread_time, steal) deltas of `work()` on a thread of its own; steal:
    the machine's steal per CPU, which `queued` includes (the thread's own CPU may have lost
    more, up to the other CPUs' share too)."""
    found: list[tuple[float, ...]] = []

    def run() -> None:
        time.sleep(STEAL_REFRESH_S)  # (the steal counter re-read at both ends)
        wall, (ran, queued), cpu = time.perf_counter(), thread_times(), time.thread_time()
        steal = steal_per_cpu()
        work()
        ran_end, queued_end = thread_times()
        found.append((time.perf_counter() - wall, ran_end - ran, queued_end - queued,
                      time.thread_time() - cpu, steal_per_cpu() - steal))  # fmt: skip

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return found[0]


def test_a_spinning_thread_runs_its_wall_time():
    """Spinning never blocks: its wall time is run, queued or taken by the hypervisor (here a
    spinning thread once ran 0.09 s of 0.2: the rest was steal, which queued now counts)."""
    wall, ran, queued, cpu, steal = _measure(lambda: _spin(0.2))
    other_steal = steal * ((os.cpu_count() or 1) - 1)  # (what other CPUs lost: maybe ours)
    assert abs(ran - cpu) < 0.02  # the kernel's CPU clock for this thread
    assert queued >= 0 and ran + queued <= wall + 0.02 + other_steal + TICK
    assert ran + queued + other_steal >= 0.9 * wall - TICK


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="reads Linux's /proc/stat")
def test_steal_is_proc_stats_steal_column_per_cpu():
    """An independent parse of /proc/stat: the steal column (in clock ticks) over the CPUs."""
    lines = open("/proc/stat").read().splitlines()
    cpus = sum(1 for line in lines[1:] if line.startswith("cpu"))
    want = int(lines[0].split()[8]) / os.sysconf("SC_CLK_TCK") / cpus
    time.sleep(STEAL_REFRESH_S)  # (a fresh read, not the cached value)
    got = steal_per_cpu()
    assert want <= got <= want + 0.5  # (the counter only grows; 0.5 s of slack for the host)


def test_a_sleeping_thread_neither_runs_nor_queues():
    wall, ran, queued, _, steal = _measure(lambda: time.sleep(0.2))
    assert wall >= 0.2 and ran < 0.02 and queued - steal < 0.05
    assert wall - ran - (queued - steal) >= 0.15  # what KVTiers counts as I/O waits, steal aside


def test_a_forked_child_reads_its_own_thread():
    """After a fork the child's times are its own (not the parent thread's, whose descriptor
    it inherited): a child that has barely run reports far less run time than the parent."""
    import os

    _spin(0.3)
    parent_ran, _ = thread_times()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its run time and leave at once
        ran, _ = thread_times()
        os.write(write, repr(ran).encode())
        os._exit(0)
    os.close(write)
    child_ran = float(os.read(read, 64))
    os.close(read)
    os.waitpid(pid, 0)
    assert parent_ran >= 0.05 and child_ran < parent_ran / 2  # (run time: less if contended)
