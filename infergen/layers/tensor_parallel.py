"""Tensor parallelism's collectives (issue 26): the process group a sharded model's layers
talk over, and the two operations they need.

Megatron-style splitting: column-parallel projections (QKV, gate/up, the vocabulary rows of
the LM head) leave each rank a slice of the output features; row-parallel ones (o_proj,
down_proj) leave each rank a partial sum over its slice of the input features, completed by
one all-reduce. The group is torch.distributed's (gloo on the CPU, NCCL on CUDA), formed by
the caller (engine/workers.py, or torchrun's environment); this module only uses it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TPGroup:
    """This process's place in a tensor-parallel group: `rank` of `size`, over torch.distributed
    process group `group` (None: the default group)."""

    rank: int
    size: int
    group: Any = None
    # per collective: calls, bytes sent in and seconds spent waiting in them (benchmarks read
    # it: the communication share of a step)
    stats: dict[str, list[float]] = field(default_factory=dict, compare=False)

    def count(self, name: str, nbytes: int, began: float) -> None:
        """One more `name` collective of `nbytes`, begun at perf_counter `began`."""
        entry = self.stats.setdefault(name, [0, 0, 0.0])
        entry[0] += 1
        entry[1] += nbytes
        entry[2] += time.perf_counter() - began

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """x summed over the ranks, in place (every rank passes a tensor of the same shape)."""
        began = time.perf_counter()
        dist.all_reduce(x, group=self.group)
        self.count("all_reduce", x.numel() * x.element_size(), began)
        return x

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
