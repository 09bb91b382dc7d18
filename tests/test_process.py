"""infergen/process.py: with glibc's thresholds raised, a large buffer freed and allocated
again is reused instead of being unmapped and faulted in afresh. glibc's own accounting
(mallinfo2) is the oracle for where the buffer lives; each case runs in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest

SCRIPT = """
import ctypes, json, resource, sys, torch
if sys.argv[1] == "configured":
    from infergen.process import configure_process, keep_large_allocations
    configure_process(1)
    assert keep_large_allocations()
class Info(ctypes.Structure):  # glibc's struct mallinfo2
    names = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
    _fields_ = [(name, ctypes.c_size_t) for name in names.split()]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
torch.empty(16 << 20).fill_(1.0)  # 64 MiB, once to warm up
out = {"mmapped_alive": [], "heap_after_free": [], "faults": []}
for _ in range(5):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t = torch.empty(16 << 20).fill_(1.0)
    out["faults"].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    out["mmapped_alive"].append(libc.mallinfo2().hblkhd)
    del t
    out["heap_after_free"].append(libc.mallinfo2().arena)
print(json.dumps(out))
"""

BUFFER = 64 << 20


def _allocations(mode: str) -> dict[str, list[int]]:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc is Linux's")
def test_large_buffers_are_reused_after_configure_process():
    """By default glibc serves the 64 MiB buffer with its own mmap (counted in hblkhd while it
    lives) and unmaps it on free, so every allocation faults its pages in afresh; configured,
    the buffer comes from the heap (hblkhd stays below its size) and the heap keeps it after
    free (arena stays at least its size). The page faults of each allocation are in the failure
    message, not asserted: the kernel, not glibc, decides those (a CI host once counted every
    page of the configured case as faulted afresh; here it counts none)."""
    default, configured = _allocations("default"), _allocations("configured")
    assert min(default["mmapped_alive"]) >= BUFFER, default
    assert max(configured["mmapped_alive"]) < BUFFER, configured
    assert min(configured["heap_after_free"]) >= BUFFER, configured


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
