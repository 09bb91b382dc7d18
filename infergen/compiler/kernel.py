"""A compiled fused group at run time: tensors in, tensors out, through the generated C
function (codegen_c.py) built or found by the JIT cache (jit_cache.py)."""

from __future__ import annotations

import ctypes
import hashlib
from math import prod

import torch

from infergen import profiling
from infergen.compiler.codegen_c import render_group
from infergen.compiler.codegen_gemm import TEMPLATE, Epilogue, render_gemm_epilogue
from infergen.compiler.ir import TOKENS, Graph
from infergen.compiler.jit_cache import Built, JitCache
from infergen.compiler.regions import group_title
from infergen.kernels.build import _source_bytes, library

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


_GEMM_ARGTYPES = [ctypes.c_void_p] * 4 + [ctypes.c_long] * 4 + [ctypes.c_int]


class GemmEpilogueKernel:
    """A GEMM with its tail fused (codegen_gemm.py): `kernel(x, panels, bias)` → the tail's
    output, for fp32 packed panels (ops/linear.py pack_panels)."""

    def __init__(self, epilogue: Epilogue, built: Built):
        self.epilogue, self.built = epilogue, built
        self.fn = built.fn
        self.fn.restype = None
        self.fn.argtypes = _GEMM_ARGTYPES
        n, k = epilogue.linear.inputs[1].shape
        self.n, self.k = n, k
        title = f"gemm_epilogue({k}->{n}, {group_title(epilogue.tail)})"
        self.call = profiling.native(self.fn, title, profiling.JIT)

    def __call__(
        self, x: torch.Tensor, panels: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        x = x.contiguous()
        tokens = x.shape[0]
        columns = self.epilogue.out_columns
        out = torch.empty(tokens, columns, dtype=torch.float32)
        self.call(
            panels.data_ptr(),
            x.data_ptr(),
            bias.contiguous().data_ptr() if bias is not None else None,
            out.data_ptr(),
            columns,
            tokens,
            self.n,
            self.k,
            torch.get_num_threads(),
        )
        return out


# the shipped kernel whose micro-kernels a fused GEMM calls (a library it links against)
MICRO_KERNELS = "gemm_packed_f32"


def gemm_epilogue_key(epilogue: Epilogue, cache: JitCache) -> str:
    """The JIT cache key of `epilogue`'s fused GEMM (its tail, the template's sources and the
    micro-kernels' library it links against)."""
    sources = _source_bytes(TEMPLATE) + _source_bytes(f"{MICRO_KERNELS}.c")
    template = hashlib.sha256(sources).hexdigest()
    return cache.key(epilogue.canonical(), f"gemm-epilogue template={template}")


def compile_gemm_epilogue(epilogue: Epilogue, cache: JitCache) -> GemmEpilogueKernel:
    """Build (or find in the cache) the fused GEMM of `epilogue`."""
    key = gemm_epilogue_key(epilogue, cache)
    function = f"gemm_epilogue_{key}"
    built = cache.get(
        key,
        function,
        lambda: render_gemm_epilogue(epilogue, function),
        link=lambda: [library(MICRO_KERNELS)],
    )
    return GemmEpilogueKernel(epilogue, built)
