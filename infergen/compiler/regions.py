"""The profiler's regions of the compiled layers (infergen/profiling.py): one per graph node the
runtime runs while a torch profiler records, named and costed as the per-op path's are.

Engine ops take the region of their op (ops/*.py `region`; a projection its Linear's; attention
opens its own inside ops/paged_attention.py). A fused group compiled to a generated kernel is
"jit.<kernel>", keyed by what it computes (`group_title`: its outputs' names); its bytes are
its inputs and outputs, its FLOPs one per output element of each pointwise or reduction node
inside it (a coarse op its own op's count: SiLU-mul 5, RoPE 3, RMSNorm 4, with the residual add
5). Layout nodes, and groups run op by op (whose nodes have their own regions), get none.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from math import prod
from typing import Any

import torch

from infergen import profiling
from infergen.compiler.ir import Graph, Node, Op, OpKind, bind_shape
from infergen.ops import gelu_mul, kv_store, rms_norm, rope, silu_mul
from infergen.profiling import Cost

# FLOPs per output element of the coarse ops (their ops/*.py `cost`); other pointwise and
# reduction nodes count one
_FLOPS_PER_ELEMENT = {
    Op.SILU_MUL: 5,
    Op.GELU_MUL: 10,
    Op.ROPE: 3,
    Op.RMS_NORM: 4,
    Op.ADD_RMS_NORM: 5,
}


def node_region(node: Node, args: list, sizes: dict[str, int], compiled: bool):
    """The region of one node run by the runtime (None: it gets none). `compiled`: a fused
    group that runs as a generated kernel."""
    if node.op is Op.FUSED:
        if not compiled:
            return None
        return group_region(node.attrs["graph"], node.attrs.get("kernel", "group"), args, sizes)
    make = _ENGINE_REGIONS.get(node.op)
    return None if make is None else make(args)


def group_region(
    graph: Graph, kernel: str, args: list, sizes: dict[str, int]
) -> AbstractContextManager:
    flops = 0
    for inner in graph.nodes:
        if inner.op.kind in (OpKind.POINTWISE, OpKind.REDUCTION):
            elements = prod(bind_shape(inner.outputs[0].shape, sizes))
            flops += _FLOPS_PER_ELEMENT.get(inner.op, 1) * elements
    read = profiling.nbytes(*(a for a in args if isinstance(a, torch.Tensor)))
    written = sum(
        prod(bind_shape(v.shape, sizes)) * (v.dtype.itemsize if v.dtype else 0)
        for v in graph.outputs
    )
    return profiling.region(f"jit.{kernel}", group_title(graph), Cost(flops, read + written))


def group_title(graph: Graph) -> str:
    """A fused group by what it computes: its outputs' names ("h.1,attn_norm": the residual
    stream and the attention's normed input), as capture named them from the model code."""
    return ",".join(v.name for v in graph.outputs)


def _linear(args: list[Any]):
    x, linear = args[0], args[1]
    return linear.region(x)


_ENGINE_REGIONS = {
    Op.LINEAR: _linear,
    Op.ROPE: lambda args: rope.region(args[0]),
    Op.SILU_MUL: lambda args: silu_mul.region(args[0]),
    Op.GELU_MUL: lambda args: gelu_mul.region(args[0]),
    Op.ADD_RMS_NORM: lambda args: rms_norm.region(args[0], args[1]),
    Op.RMS_NORM: lambda args: rms_norm.region(args[0], None),
    Op.KV_STORE: lambda args: kv_store.region(*args[:4]),
}
