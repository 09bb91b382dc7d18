"""`thread_times()`: the calling thread's seconds on a core and seconds waiting for one, so that
a tier read's wall time splits into its own work, its I/O waits and the time it waited for a
core (issue 23, item 2: what a background load can hide on the CPU, KVTiers.loads_inline).

Linux: /proc/thread-self/schedstat (time run and time runnable but queued, in ns), read through
one file descriptor per thread (opened on first use, closed when the thread ends: 1 µs a read).
Elsewhere, or where schedstat cannot be read: `time.thread_time()` and no queued time — a wait
for a core then counts as I/O, which makes background loads look more useful than they are.

In a virtual machine the hypervisor may also run another guest on this thread's core ("steal"):
the thread then neither runs nor waits in this kernel's queue, and that time would count as I/O
too (seen here: a thread spinning for 0.2 s ran 0.09 s of it). The queued time therefore
includes the machine's steal time averaged over its CPUs (/proc/stat's steal column; a thread
cannot be tied to one CPU's counter, it may move between reads).
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
PROC_STAT = "/proc/stat"
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01
STEAL_REFRESH_S = (
    0.002  # the counter moves in clock ticks (10 ms at 100 Hz): re-read at most this often
)


class _Steal:
    """The machine's steal seconds per CPU, re-read from /proc/stat (one descriptor per
    process; 13 µs a read) at most every STEAL_REFRESH_S."""

    def __init__(self) -> None:
        self.pid, self.fd, self.cpus = -1, -1, 1
        self.value, self.read_at = 0.0, -1.0

    def _open(self) -> None:
        self.pid = os.getpid()
        try:
            self.fd = os.open(PROC_STAT, os.O_RDONLY)
            text = os.pread(self.fd, 1 << 16, 0)
            self.cpus = max(1, sum(1 for line in text.split(b"\n")[1:] if line.startswith(b"cpu")))
        except OSError:
            self.fd = -1

    def per_cpu(self) -> float:
        now = time.monotonic()
        if now - self.read_at < STEAL_REFRESH_S and self.pid == os.getpid():
            return self.value
        if self.pid != os.getpid():
            self._open()
        if self.fd >= 0:
            try:  # "cpu  user nice system idle iowait irq softirq steal ..."
                fields = os.pread(self.fd, 128, 0).split(b"\n", 1)[0].split()
                self.value = int(fields[8]) * _TICK_S / self.cpus if len(fields) > 8 else 0.0
            except (OSError, ValueError):
                self.value = 0.0
        self.read_at = now
        return self.value


_steal = _Steal()


def steal_per_cpu() -> float:
    """Seconds the hypervisor has run other guests on this machine's CPUs since boot, averaged
    over the CPUs (0.0 without /proc/stat)."""
    return _steal.per_cpu()


def thread_times() -> tuple[float, float]:
    """(seconds this thread has run on a core, seconds it has waited runnable for one or had
    its core taken by the hypervisor — the machine's steal per CPU), cumulative: take
    differences."""
    stat = getattr(_local, "schedstat", None)
    if stat is None or stat.pid != os.getpid():
        stat = _local.schedstat = _Schedstat()
    times = stat.read()
    run, queued = times if times is not None else (time.thread_time(), 0.0)
    return run, queued + steal_per_cpu()
