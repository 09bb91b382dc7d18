"""How much CPU other processes used while a measurement ran (this machine is shared and noisy).

    with OtherCpu() as other:
        run()
    other.cores   # average number of cores busy with *other* processes (incl. VM steal)

Busy time of the whole machine (/proc/stat: user+nice+system+irq+softirq+steal) minus this
process's own CPU time (and its waited-for children), divided by the wall time. With 2 threads
on 2 cores, anything above ~0.2 means the measurement competed for cores: thread-pool barriers
(OpenMP in torch and llama.cpp) then stall for whole scheduler slices and timings can be
several times slower. Reads only /proc; returns None where /proc/stat is absent.
"""

from __future__ import annotations

import os
import time


def _busy_seconds() -> float | None:
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    # cpu user nice system idle iowait irq softirq steal ...
    values = [int(v) for v in fields[1:9]]
    busy = values[0] + values[1] + values[2] + values[5] + values[6] + values[7]
    return busy / os.sysconf("SC_CLK_TCK")


def _own_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class OtherCpu:
    def __enter__(self) -> OtherCpu:
        self.cores: float | None = None
        self._busy, self._own, self._wall = _busy_seconds(), _own_seconds(), time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        busy, wall = _busy_seconds(), time.perf_counter() - self._wall
        if busy is None or self._busy is None or wall <= 0:
            return
        other = (busy - self._busy) - (_own_seconds() - self._own)
        self.cores = round(max(0.0, other) / wall, 2)
