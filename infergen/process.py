"""Process-wide settings for fast CPU inference, applied once when an engine (or a benchmark)
starts: flush denormals, the thread count, and glibc's malloc kept from returning large
buffers to the OS.

Why malloc: glibc serves every allocation above its mmap threshold (at most 32 MiB by default)
with a fresh mmap and unmaps it on free, so a 64 MiB tensor allocated per call pays ~16k page
faults and the kernel's zeroing each time — measured here: allocating and filling a 4096x4096
fp32 tensor takes 24 ms, filling a preallocated one 3.9 ms. Raising the mmap and trim
thresholds keeps such buffers in the heap for reuse (what jemalloc / tcmalloc, which PyTorch's
CPU tuning guide recommends, do by default). Costs: up to TRIM_THRESHOLD bytes of freed memory
stay mapped to the process.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import torch

T = TypeVar("T")

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc <malloc.h>
MMAP_THRESHOLD = 1 << 30  # allocations below 1 GiB come from the heap ...
TRIM_THRESHOLD = 1 << 30  # ... and up to 1 GiB of freed heap stays mapped


def configure_process(num_threads: int | None = None) -> None:
    """Flush denormals (dequantized weights and small activations produce them; without
    flushing, a CPU forward runs several times slower), set torch's thread count, and keep
    large buffers in glibc's heap (module docstring)."""
    torch.set_flush_denormal(True)
    if num_threads:
        torch.set_num_threads(num_threads)
    keep_large_allocations()


@functools.cache
def keep_large_allocations() -> bool:
    """Raise glibc's mmap and trim thresholds; False where the C library is not glibc."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )


def in_transient_thread(fn: Callable[..., T], *args: Any) -> T:
    """fn(*args) in a thread that ends when it returns; its result, or its exception re-raised.

    For a process whose model work runs on one long-lived thread (the server's engine thread)
    while another (the main thread) only loads: OpenMP (libgomp) keeps a pool of worker threads
    per thread that starts parallel regions, and once all pools together hold more threads than
    there are CPUs, every pool stops spinning between regions and sleeps instead — each of the
    ~200 parallel regions of a decode step then pays a futex wake-up. Measured here (2 cores):
    one 576x960 projection at batch 1 took 30 µs with one pool and 115 µs with two, and a
    decode step 20 ms against 28 ms. A thread's pool goes away when the thread exits, so
    loading in a transient thread leaves the engine thread's pool alone.
    """
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=run, name="infergen-load")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]
