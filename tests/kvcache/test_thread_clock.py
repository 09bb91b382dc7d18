"""`thread_times()` (kvcache/tiers/thread_clock.py) against the kernel's own per-thread CPU
clock (`time.thread_time`) and the wall clock: a thread that spins runs for its wall time, a
thread that sleeps (as a read blocked on a disk does) neither runs nor queues meanwhile."""

from __future__ import annotations

import threading
import time

from infergen.kvcache.tiers.thread_clock import thread_times


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _measure(work) -> tuple[float, float, float, float]:
    """(wall, run, queued, thread_time) deltas of `work()` on a thread of its own."""
    found: list[tuple[float, float, float, float]] = []

    def run() -> None:
        wall, (ran, queued), cpu = time.perf_counter(), thread_times(), time.thread_time()
        work()
        ran_end, queued_end = thread_times()
        found.append((time.perf_counter() - wall, ran_end - ran, queued_end - queued,
                      time.thread_time() - cpu))  # fmt: skip

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return found[0]


def test_a_spinning_thread_runs_its_wall_time():
    wall, ran, queued, cpu = _measure(lambda: _spin(0.2))
    assert abs(ran - cpu) < 0.02  # the kernel's CPU clock for this thread
    assert queued >= 0 and ran + queued <= wall + 0.02
    assert ran + queued >= 0.9 * wall  # spinning: never blocked


def test_a_sleeping_thread_neither_runs_nor_queues():
    wall, ran, queued, _ = _measure(lambda: time.sleep(0.2))
    assert wall >= 0.2 and ran < 0.02 and queued < 0.05
    assert wall - ran - queued >= 0.15  # what KVTiers counts as I/O waits


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
