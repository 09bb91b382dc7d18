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

import torch

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
