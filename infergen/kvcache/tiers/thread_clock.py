"""`thread_times()`: the calling thread's seconds on a core and seconds waiting for one, so that
a tier read's wall time splits into its own work, its I/O waits and the time it waited for a
core (issue 23, item 2: what a background load can hide on the CPU, KVTiers.loads_inline).

Linux: /proc/thread-self/schedstat (time run and time runnable but queued, in ns), read through
one file descriptor per thread (opened on first use, closed when the thread ends: 1 µs a read).
Elsewhere, or where schedstat cannot be read: `time.thread_time()` and no queued time — a wait
for a core then counts as I/O, which makes background loads look more useful than they are.
"""

from __future__ import annotations

import os
import threading
import time

SCHEDSTAT = "/proc/thread-self/schedstat"


class _Schedstat:
    """This thread's schedstat file (closed when the thread's locals are dropped)."""

    def __init__(self) -> None:
        self.pid = os.getpid()  # (a forked child opens its own: this one names the parent's)
        try:
            self.fd = os.open(SCHEDSTAT, os.O_RDONLY)
        except OSError:
            self.fd = -1

    def read(self) -> tuple[float, float] | None:
        if self.fd < 0:
            return None
        try:
            run, queued = os.pread(self.fd, 64, 0).split()[:2]
            return int(run) / 1e9, int(queued) / 1e9
        except (OSError, ValueError):
            return None

    def __del__(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)


_local = threading.local()


def thread_times() -> tuple[float, float]:
    """(seconds this thread has run on a core, seconds it has waited runnable for one), both
    since the thread started: take differences."""
    stat = getattr(_local, "schedstat", None)
    if stat is None or stat.pid != os.getpid():
        stat = _local.schedstat = _Schedstat()
    times = stat.read()
    return times if times is not None else (time.thread_time(), 0.0)
