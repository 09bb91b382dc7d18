"""A large zero-filled cache buffer whose pages the OS zeroes on first touch.

`torch.zeros` writes every byte at allocation: the default model's 1.07 GB KV pool took
1.37 s of an engine start (page faults and the memset), most of it for blocks a run may never
use. On the CPU the buffer is a calloc'd numpy array instead (glibc maps a large calloc to
fresh anonymous pages, which read as zeros and cost a fault only where first written) viewed
as the torch dtype; elsewhere, `torch.zeros`. The values are the same: zeros.
"""

from __future__ import annotations

import math

import numpy as np
import torch

LAZY_BYTES = 1 << 20  # below this, torch.zeros (small buffers: the heap, nothing to save)


def zeroed(shape: tuple[int, ...], dtype: torch.dtype, device=None) -> torch.Tensor:
    """A tensor of zeros of `shape` and `dtype` on `device` (see the module docstring)."""
    device = torch.device(device if device is not None else "cpu")
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if device.type != "cpu" or nbytes < LAZY_BYTES:
        return torch.zeros(shape, dtype=dtype, device=device)
    raw = np.zeros(nbytes, dtype=np.uint8)  # (calloc: pages zeroed on first touch)
    return torch.from_numpy(raw).view(dtype).view(shape)
