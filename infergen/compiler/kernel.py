"""A compiled fused group at run time: tensors in, tensors out, through the generated C
function (codegen_c.py) built or found by the JIT cache (jit_cache.py)."""

from __future__ import annotations

import ctypes
from math import prod

import torch

from infergen import profiling
from infergen.compiler.codegen_c import render_group
from infergen.compiler.ir import TOKENS, Graph
from infergen.compiler.jit_cache import Built, JitCache
from infergen.compiler.regions import group_title

_ARGTYPES = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long, ctypes.c_int]


def _rowed(shape) -> bool:
    return len(shape) >= 1 and shape[0] == TOKENS


class GroupKernel:
    """Runs one fused group's subgraph: `kernel(*inputs)` → list of output tensors."""

    def __init__(self, graph: Graph, built: Built):
        self.graph = graph
        self.built = built
        self.fn = built.fn
        self.fn.restype = None
        self.fn.argtypes = _ARGTYPES
        title = f"{graph.name}({group_title(graph)})"  # (its name when profiled)
        self.call = profiling.native(self.fn, title, profiling.JIT)
        self.rowed = [_rowed(v.shape) for v in graph.inputs]
        self.out_rows = [tuple(v.shape[1:]) for v in graph.outputs]
        n = len(graph.inputs)
        self._in = (ctypes.c_void_p * n)()
        self._strides = (ctypes.c_long * n)()
        self._out = (ctypes.c_void_p * len(graph.outputs))()

    def __call__(self, *inputs: torch.Tensor) -> list[torch.Tensor]:
        tokens = None
        keep = []  # contiguous copies must outlive the call
        for i, (x, rowed) in enumerate(zip(inputs, self.rowed, strict=True)):
            if rowed:
                tokens = x.shape[0] if tokens is None else tokens
                inner = x.stride()[1:]
                want = _contiguous_strides(x.shape[1:])
                if x.dim() > 1 and tuple(inner) != want:
                    x = x.contiguous()
                self._strides[i] = x.stride(0) if x.dim() > 1 else 1
            else:
                x = x.contiguous()
                self._strides[i] = 0
            keep.append(x)
            self._in[i] = x.data_ptr()
        if tokens is None:
            raise ValueError(f"{self.graph.name}: no input has the token rows")
        outputs = [torch.empty((tokens, *row), dtype=torch.float32) for row in self.out_rows]
        for j, out in enumerate(outputs):
            self._out[j] = out.data_ptr()
        self.call(self._in, self._strides, self._out, tokens, torch.get_num_threads())
        return outputs


def _contiguous_strides(shape) -> tuple[int, ...]:
    return tuple(prod(shape[d + 1 :]) for d in range(len(shape)))


def compile_group(graph: Graph, cache: JitCache, variant: str = "default") -> GroupKernel:
    """Build (or find in the cache) the C kernel of a fused group's subgraph, in a variant of
    codegen_c.VARIANTS."""
    key = cache.key(graph.canonical(), f"variant={variant}")
    function = f"group_{key}"
    built = cache.get(key, function, lambda: render_group(graph, function, variant))
    return GroupKernel(graph, built)
