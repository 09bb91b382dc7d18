"""`HostCopies`: how blocks cross between the pool's device and the host tier (issue 23,
item 1), one HOST_COPIES row per device type; one object per cache, shared by its host tier
(`to_host`) and its KVTiers (`to_device`).

CPU (`CpuCopies`): a host copy is a clone; `to_device` hands the host tensor on as it is
(PagedKVCache.write_block copies it into the pool).

CUDA (`CudaCopies`): host copies live in pinned (page-locked) memory, so both directions are
DMA transfers that do not block the host, issued on one side stream; events order them
against the compute stream (the stream current at the call, which runs the steps):

- `to_host(src)`: the side stream waits for the compute stream (src's contents are final),
  copies into a new pinned tensor and records an event; the compute stream waits on that
  event, so nothing it runs later — the next step writing into the evicted block, or reusing
  src's memory — starts before the copy has read src. The pinned tensor is complete only
  when that event is: host code reads it after `settle()` (the host tier spilling it to disk).
- `to_device(data)`: a new device tensor is filled on the side stream (after every earlier
  `to_host` copy there: one stream runs in order, so a block saved then loaded reads complete
  bytes) and an event is recorded; the compute stream waits on it, so the step that reads the
  loaded block starts after its copy, and nothing else on the compute stream waits for the
  side stream. `record_stream` keeps the tensor's memory from reuse until the compute stream is
  done with it.

The allocator caches pinned memory in powers of two: a block of B bytes may pin up to 2B (the
host tier's budget counts B).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from infergen.registry import Registry


class HostCopies(Protocol):
    def to_host(self, src: torch.Tensor) -> torch.Tensor:
        """A host copy of `src` (any device) that the caller keeps."""
        ...

    def settle(self) -> None:
        """Wait until every host copy made so far is complete (before host code reads one)."""
        ...

    def to_device(self, data: torch.Tensor) -> torch.Tensor:
        """`data` (a host tensor) where the pool lives, ready for the compute stream."""
        ...


class CpuCopies:
    def to_host(self, src: torch.Tensor) -> torch.Tensor:
        return src.detach().to("cpu", copy=True)

    def settle(self) -> None:
        return None

    def to_device(self, data: torch.Tensor) -> torch.Tensor:
        return data


class CudaCopies:
    def __init__(self, device: torch.device):
        self.device = device
        self.side = torch.cuda.Stream(device=device)  # the copies' stream
        self._last_to_host: torch.cuda.Event | None = None

    def to_host(self, src: torch.Tensor) -> torch.Tensor:
        compute = torch.cuda.current_stream(self.device)
        host = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
        self.side.wait_stream(compute)  # src is written on the compute stream
        with torch.cuda.stream(self.side):
            host.copy_(src, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.side)
        compute.wait_event(done)  # nothing overwrites src before it is copied
        if src.device.type == "cuda":
            src.record_stream(self.side)
        self._last_to_host = done
        return host

    def settle(self) -> None:
        if self._last_to_host is not None:
            self._last_to_host.synchronize()  # one stream: every earlier copy is done too

    def to_device(self, data: torch.Tensor) -> torch.Tensor:
        compute = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self.side):
            moved = torch.empty(data.shape, dtype=data.dtype, device=self.device)
            moved.copy_(data, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.side)
        compute.wait_event(done)  # the step reading the loaded block runs after the copy
        moved.record_stream(compute)
        return moved


CPU_COPIES = CpuCopies()  # stateless: one for every CPU cache
HOST_COPIES: Registry[Callable[[torch.device], HostCopies]] = Registry("KV tier copy path")
HOST_COPIES.register("cpu", lambda device: CPU_COPIES)
HOST_COPIES.register("cuda", CudaCopies)


def host_copies(device: torch.device | str) -> HostCopies:
    """The copy path for a pool on `device` (a new side stream for a CUDA device)."""
    device = torch.device(device)
    return HOST_COPIES.get(device.type, where="device")(device)
