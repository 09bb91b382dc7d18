"""Tensor parallelism's collectives (issue 26): the process group a sharded model's layers
talk over, and the two operations they need.

Megatron-style splitting: column-parallel projections (QKV, gate/up, the vocabulary rows of
the LM head) leave each rank a slice of the output features; row-parallel ones (o_proj,
down_proj) leave each rank a partial sum over its slice of the input features, completed by
one all-reduce. The group is torch.distributed's (gloo on the CPU, NCCL on CUDA), formed by
the caller (engine/workers.py, or torchrun's environment); this module only uses it.

A small all-reduce over gloo runs as an all-gather and a sum in rank order. Back to back
(as a decode step's 61 collectives run), gloo's all-reduce of a decode step's 2-18 KB took
1.2-1.6 ms here (AMD EPYC, 2 ranks over localhost, one thread each) against 0.5-0.6 ms for the
all-gather of the same tensor, and the default model's TP=2 decode ran 1.2x faster with the
gather (benchmarks/bench_tp.py, A/B twice). Started together (after a barrier), the two cost
the same up to 128 KB and the gather falls behind from 256 KB: SMALL_GATHER_BYTES. Every rank
adds the same parts in the same order, so the sums are bitwise equal across ranks.

`trace` (None: off) collects the seconds of every collective this rank waited in, in call
order; benchmarks compare the ranks' traces call by call, since the rank that arrives last at
a collective waits only for the transfer itself (engine/workers.py `Workers.waits`).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

SMALL_GATHER_BYTES = 1 << 18  # an all-gather moving at most this replaces gloo's all-reduce


@dataclass(eq=False)
class TPGroup:
    """This process's place in a tensor-parallel group: `rank` of `size`, over torch.distributed
    process group `group` (None: the default group)."""

    rank: int
    size: int
    group: Any = None
    # per collective: calls, bytes sent in and seconds spent waiting in them (benchmarks read
    # it: the communication share of a step)
    stats: dict[str, list[float]] = field(default_factory=dict)
    trace: list[float] | None = None  # a list: every collective's wait appended (call order)

    def count(self, name: str, nbytes: int, began: float) -> None:
        """One more `name` collective of `nbytes`, begun at perf_counter `began`."""
        waited = time.perf_counter() - began
        entry = self.stats.setdefault(name, [0, 0, 0.0])
        entry[0] += 1
        entry[1] += nbytes
        entry[2] += waited
        if self.trace is not None:
            self.trace.append(waited)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """x summed over the ranks, in place (every rank passes a tensor of the same shape)."""
        nbytes = x.numel() * x.element_size()
        began = time.perf_counter()
        if self.gathers(nbytes):
            parts = [torch.empty_like(x) for _ in range(self.size)]
            dist.all_gather(parts, x.contiguous(), group=self.group)
            torch.sum(torch.stack(parts), dim=0, out=x)
        else:
            dist.all_reduce(x, group=self.group)
        self.count("all_reduce", nbytes, began)
        return x

    def gathers(self, nbytes: int) -> bool:
        """Whether an all-reduce of `nbytes` runs as an all-gather and a sum (gloo, small)."""
        return nbytes * self.size <= SMALL_GATHER_BYTES and self.backend == "gloo"

    @functools.cached_property
    def backend(self) -> str:
        return str(dist.get_backend(self.group))

    def minimum(self, value: int) -> int:
        """The smallest of the ranks' `value`s (every rank calls it)."""
        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group)
        return int(t.item())

    def gather_columns(self, x: torch.Tensor, widths: list[int]) -> torch.Tensor:
        """[rows, sum(widths)]: each rank's x [rows, widths[rank]] side by side, rank order
        (widths may differ: padded to the widest for the collective, cut after)."""
        widest = max(widths)
        padded = x if x.shape[1] == widest else torch.nn.functional.pad(x, (0, widest - x.shape[1]))
        parts = [torch.empty_like(padded) for _ in range(self.size)]
        began = time.perf_counter()
        dist.all_gather(parts, padded.contiguous(), group=self.group)
        self.count("all_gather", padded.numel() * padded.element_size(), began)
        return torch.cat([p[:, :w] for p, w in zip(parts, widths, strict=True)], dim=1)
