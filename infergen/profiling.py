"""Named regions for torch.profiler: the labels `infergen profile` (bench/profile.py) reads.

While a torch profiler records (`enabled()`), the engine opens a region around each native C
kernel call (kernels/build.py: "native::<function>") and around each op call of its layers,
its compiled layers and its fused decode step, named with what the call did:

    op:<op>[<key>] flops=<int> bytes=<int>

`op` the op ("linear", "rms_norm", "attention.decode", ...), `key` what rows group calls by
(the shapes that do not change from step to step: "576->1728 int8"), `flops` and `bytes` this
call's work from the shapes it ran on (each op's `cost` in ops/: FLOPs counted as in its
docstring, bytes the tensors read and written once — a weight as stored). The label travels
with the event, so the same numbers are in the Chrome / Perfetto trace. Without a profiler
`enabled()` is one C call and no region is opened.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import torch

NATIVE = "native::"  # a shipped C kernel's region: NATIVE + its function name
JIT = "jit::"  # a generated kernel's region (compiler/): JIT + what it is
OP = "op:"  # an op call's region (the grammar above)
_LABEL = re.compile(
    r"op:(?P<op>[^\[]+)\[(?P<key>[^\]]*)\] flops=(?P<flops>\d+) bytes=(?P<bytes>\d+)"
)


@dataclass(frozen=True)
class Cost:
    """The work of one op call: floating-point (or integer multiply-add) operations, bytes
    read + written."""

    flops: int = 0
    bytes: int = 0

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.flops + other.flops, self.bytes + other.bytes)

    def __sub__(self, other: Cost) -> Cost:
        return Cost(self.flops - other.flops, self.bytes - other.bytes)

    def __mul__(self, factor: int) -> Cost:
        return Cost(self.flops * factor, self.bytes * factor)


@dataclass(frozen=True)
class OpLabel:
    op: str
    key: str
    cost: Cost


def enabled() -> bool:
    """Whether a torch profiler is recording. False while torch.compile traces the caller (the
    check would break its graph; a compiled graph is profiled as torch's own kernels)."""
    return not torch.compiler.is_compiling() and torch.autograd._profiler_enabled()


def native(fn: Callable[..., object], name: str, prefix: str = NATIVE) -> Callable[..., object]:
    """A C function `fn` (ctypes) as the engine calls it: straight through, or, while a
    profiler records, inside the region `prefix` + `name` (C kernels are invisible to the
    profiler otherwise). The check costs well under a tenth of a ctypes call."""
    label = prefix + name
    recording = torch.autograd._profiler_enabled
    record = torch.profiler.record_function

    def call(*args):
        if recording():
            with record(label):
                return fn(*args)
        return fn(*args)

    call.__name__ = call.__qualname__ = name
    return call


def region(op: str, key: str, cost: Cost) -> torch.profiler.record_function:
    """The region of one op call (use as `with region(...):` while `enabled()`); brackets in
    `key` become parentheses."""
    key = key.replace("[", "(").replace("]", ")")
    label = f"{OP}{op}[{key}] flops={int(cost.flops)} bytes={int(cost.bytes)}"
    return torch.profiler.record_function(label)


def parse(name: str) -> OpLabel | None:
    """An op region's label back (None: not one)."""
    if not name.startswith(OP):
        return None
    found = _LABEL.fullmatch(name)
    if found is None:
        return None
    cost = Cost(int(found["flops"]), int(found["bytes"]))
    return OpLabel(found["op"], found["key"], cost)


def nbytes(*tensors: torch.Tensor | None) -> int:
    """Bytes of tensors as stored (None counts 0)."""
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)
