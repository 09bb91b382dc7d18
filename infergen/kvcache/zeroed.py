"""A large zero-filled cache buffer whose pages the OS zeroes on first touch — in the
background, ahead of the engine's writes.

`torch.zeros` writes every byte at allocation: the default model's 1.07 GB KV pool took
1.37 s of an engine start (page faults and the memset), most of it for blocks a run may never
use. On the CPU the buffer is a calloc'd numpy array instead (glibc maps a large calloc to
fresh anonymous pages, which read as zeros and cost a fault only where first written) viewed
as the torch dtype; elsewhere, `torch.zeros`. The values are the same: zeros.

Left to the first writes, those faults land on the requests: a 512-token prompt's KV (~24 MB
on the default model) met fresh pages until the whole pool had been written once — 37-58 ms
of a 200-240 ms bf16 prefill under `infergen profile` on a Xeon (2026-12-07). So a daemon
thread at the lowest scheduling priority faults the pool in ahead of use, 64 MB a call, by
Linux's madvise(MADV_POPULATE_WRITE) (5.14+; the kernel zeroes the pages without the thread
writing them, and a page already written is left as it is). Where the call is refused the
pages fault in on first touch, as before.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import mmap
import os
import threading

import numpy as np
import torch

LAZY_BYTES = 1 << 20  # below this, torch.zeros (small buffers: the heap, nothing to save)
MADV_POPULATE_WRITE = 23  # <linux/mman.h>
POPULATE_CHUNK = 64 << 20  # bytes a madvise call (the thread stops at the first refusal)


def zeroed(
    shape: tuple[int, ...], dtype: torch.dtype, device=None, populate: bool = True
) -> torch.Tensor:
    """A tensor of zeros of `shape` and `dtype` on `device` (see the module docstring);
    `populate`: a large CPU buffer's pages faulted in by a background thread."""
    device = torch.device(device if device is not None else "cpu")
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if device.type != "cpu" or nbytes < LAZY_BYTES:
        return torch.zeros(shape, dtype=dtype, device=device)
    raw = np.zeros(nbytes, dtype=np.uint8)  # (calloc: pages zeroed on first touch)
    tensor = torch.from_numpy(raw).view(dtype).view(shape)
    if populate:
        populate_in_background(tensor)
    return tensor


def populate_in_background(tensor: torch.Tensor) -> threading.Thread | None:
    """Fault a CPU tensor's pages in from a low-priority daemon thread (it holds the tensor
    until done); None where madvise is not available here."""
    madvise = _madvise()
    if madvise is None:
        return None
    thread = threading.Thread(target=_populate, args=(madvise, tensor), daemon=True,
                              name="infergen-kv-populate")  # fmt: skip
    thread.start()
    return thread


def _madvise():
    if not hasattr(os, "setpriority") or os.uname().sysname != "Linux":
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    fn = libc.madvise
    fn.argtypes, fn.restype = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int), ctypes.c_int
    return fn


def _populate(madvise, tensor: torch.Tensor) -> None:
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # (this thread only)
    except OSError:
        pass
    page = mmap.PAGESIZE
    first = tensor.data_ptr()
    start = -(-first // page) * page  # whole pages inside the buffer
    end = (first + tensor.numel() * tensor.element_size()) // page * page
    for at in range(start, end, POPULATE_CHUNK):  # (ctypes releases the GIL during each call)
        if madvise(at, min(POPULATE_CHUNK, end - at), MADV_POPULATE_WRITE) != 0:
            return  # (an older kernel: EINVAL; first touch faults them in instead)
