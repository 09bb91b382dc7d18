"""infergen/process.py: with glibc's thresholds raised, a large buffer freed and allocated
again is reused instead of being unmapped and faulted in afresh (the kernel's own minor-fault
counter is the oracle; each case runs in a fresh interpreter)."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

SCRIPT = """
import resource, sys, torch
if sys.argv[1] == "configured":
    from infergen.process import configure_process, keep_large_allocations
    configure_process(1)
    assert keep_large_allocations()
torch.empty(16 << 20).fill_(1.0)  # 64 MiB, once to warm up
faults = []
for _ in range(5):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.empty(16 << 20).fill_(1.0)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(sorted(faults)[2])  # the median allocation
"""


def _faults_per_allocation(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True
    )
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc is Linux's")
def test_large_buffers_are_reused_after_configure_process():
    pages = (64 << 20) // 4096
    assert _faults_per_allocation("default") > pages // 2  # fresh mmap pages every time
    assert _faults_per_allocation("configured") < pages // 20


POOL_SCRIPT = """
import os, sys, time, torch
from infergen.process import in_transient_thread
torch.set_num_threads(2)
def threads():
    time.sleep(0.3)
    return len(os.listdir("/proc/self/task"))
def work():
    torch.randn(1500, 1500) @ torch.randn(1500, 1500)  # an OpenMP parallel region
before = threads()
work() if sys.argv[1] == "main" else in_transient_thread(work)
print(threads() - before)
"""


@pytest.mark.parametrize("where,extra", [("main", 1), ("transient", 0)])
def test_openmp_pool_of_a_transient_thread_goes_away(where, extra):
    """The kernel's task list is the oracle: parallel work on the main thread leaves an OpenMP
    worker behind for good; in a transient thread, the worker leaves with it."""
    out = subprocess.run(
        [sys.executable, "-c", POOL_SCRIPT, where], capture_output=True, text=True, check=True
    )
    assert int(out.stdout.split()[-1]) == extra, out.stdout + out.stderr


def test_in_transient_thread_returns_and_raises():
    from infergen.process import in_transient_thread

    main = threading.get_ident()
    assert in_transient_thread(lambda a, b: (a + b, threading.get_ident() != main), 2, 3) == (
        5,
        True,
    )
    with pytest.raises(ValueError, match="bad"):
        in_transient_thread(lambda: (_ for _ in ()).throw(ValueError("bad")))
