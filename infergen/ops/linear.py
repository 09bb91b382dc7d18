"""Dense projection: y = x · Wᵀ + b.  x [tokens, in], W [out, in], b [out] or None.

Bytes moved: W dominates at small token counts (decode is memory-bound: out·in·4 bytes per
step in fp32); FLOPs 2·tokens·in·out.

A backend is a row of three functions (LINEAR_BACKENDS):
- `prepare(W)`: the checkpoint weight [out, in] → the form the backend reads (done once, at
  load time: a backend may re-lay the weight out for its kernel);
- `apply(x, prepared, bias, out_features)`: the product;
- `rows(prepared, ids)`: rows of W (the embedding lookup of a tied LM head reads the
  prepared weight, so the weight is stored once).
A row may also carry `quantized_inputs`: products that quantize their input themselves (W·A
kernels such as W8A8 FP8 through torch._scaled_mm), keyed by the activation format they take.

A kernel set may hold its own row of a format: `backend_for(name, kernels)` is the row
"<name>:<kernels>" where one is registered (the "int8:triton" ... rows of
ops/linear_triton_rows.py, registered only with kernels="triton"), else the row `name`.

"torch": W as is, F.linear (MKL). "native": fp32 W re-laid out into 24-column panels
(`pack_panels`) for kernels/gemm_packed_f32.c, an outer-product micro-kernel that serves every
token count: one token streams W at memory bandwidth; on an AVX2 EPYC 16 tokens ran at ~2x
MKL's speed, 512 tokens ~1.1x; on an AVX-512 Xeon (its 8-row micro-kernel) 16 tokens 1.7x,
128 tokens 1.1x, 512 tokens 0.84-0.96x over two runs (benchmarks/bench_linear.py, 2 cores).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from infergen.kernels.build import I, L, P, kernel
from infergen.profiling import Cost
from infergen.registry import Registry


class PreparedTensors(nn.Module):
    """A prepared weight of several tensors (a kernel's layout, e.g. ops/linear_triton's
    codes / scales / ...): each a buffer, so it moves with its projection; read like the dict
    it was made from (`prepared["codes"]`, `.get`, `.items`, `.values`)."""

    def __init__(self, tensors: Mapping[str, torch.Tensor]):
        super().__init__()
        for name, tensor in tensors.items():
            self.register_buffer(name, tensor)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._buffers[name]

    def __contains__(self, name: object) -> bool:
        return name in self._buffers

    def get(self, name: str, default=None):
        return self._buffers.get(name, default)

    def keys(self):
        return self._buffers.keys()

    def values(self):
        return self._buffers.values()

    def items(self):
        return self._buffers.items()

    def numel(self) -> int:
        """Bytes held (with element_size() 1: sizes read as of one tensor of bytes)."""
        return sum(t.numel() * t.element_size() for t in self._buffers.values())

    def element_size(self) -> int:
        return 1


ApplyFn = Callable[[torch.Tensor, object, torch.Tensor | None, int], torch.Tensor]


@dataclass(frozen=True)
class LinearBackend:
    prepare: Callable[[torch.Tensor], object]
    apply: ApplyFn  # apply(x [tokens, in], prepared, bias [out] | None, out) → [tokens, out]
    rows: Callable[[object, torch.Tensor], torch.Tensor]
    # kernels/decode_layers_f32.c's weight_format of the prepared panels (None: the fused
    # decode step cannot run this backend)
    decode_format: int | None = None
    # (activation format, granularity) → apply on the unquantized x, quantizing it as that
    # input quantizer would (ops/quantize_activation.py) inside the product; a projection
    # whose input quantizer is one of these calls it instead of quantizing x first
    quantized_inputs: Mapping[tuple[str, str], ApplyFn] = field(default_factory=dict)
    # (activation format, granularity) → decode_format of the fused decode step's kernel that
    # quantizes the input itself (the same product as the quantized_inputs entry)
    quantized_decode_formats: Mapping[tuple[str, str], int] = field(default_factory=dict)


LINEAR_BACKENDS: Registry[LinearBackend] = Registry("linear backend")


def backend_for(name: str, kernels: str) -> LinearBackend:
    """Row `name` as kernel set `kernels` runs it: "<name>:<kernels>" where that row is
    registered, else `name` itself."""
    return LINEAR_BACKENDS.get(f"{name}:{kernels}", where="kernels", fallback=name)


def backend_name(backend: LinearBackend) -> str:
    """The name a row is registered under (what a profile calls the weight format)."""
    return next((name for name, row in LINEAR_BACKENDS.items() if row is backend), "?")


def cost(
    tokens: int, in_features: int, out_features: int, weight_bytes: int, element_bytes: int
) -> Cost:
    """One product: 2·tokens·in·out FLOPs; bytes: the weight as stored (`weight_bytes`, bias
    included), x read and y written in the activations' element size."""
    flops = 2 * tokens * in_features * out_features
    return Cost(flops, weight_bytes + tokens * (in_features + out_features) * element_bytes)


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    y = x @ weight.t()
    return y + bias if bias is not None else y


def _torch_apply(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out_features: int
) -> torch.Tensor:
    return F.linear(x, weight, bias)


def _index_rows(weight: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return weight.index_select(0, ids)


LINEAR_BACKENDS.register("torch", LinearBackend(lambda w: w, _torch_apply, _index_rows))


# Output columns per panel: three AVX2 vectors, the width of the micro-kernel.
PANEL = 24


def pack_panels(weight: torch.Tensor) -> torch.Tensor:
    """W [out, in] → panels [ceil(out/24), in, 24] with panels[p, k, j] = W[24p + j, k];
    the last panel is padded with zero rows."""
    out_features, in_features = weight.shape
    padded = -(-out_features // PANEL) * PANEL
    w = weight
    if padded != out_features:
        w = torch.zeros(padded, in_features, dtype=weight.dtype)
        w[:out_features] = weight
    return w.view(padded // PANEL, PANEL, in_features).transpose(1, 2).contiguous()


def _gemm_packed() -> Callable[..., None] | None:
    return kernel("gemm_packed_f32", P, P, P, P, L, L, L, I)


def _native_prepare(weight: torch.Tensor) -> torch.Tensor:
    if weight.dtype != torch.float32 or _gemm_packed() is None:
        return weight  # torch path (apply and rows see a 2-d weight)
    return pack_panels(weight)


def _native_apply(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, out_features: int
) -> torch.Tensor:
    if weight.dim() == 2:
        return F.linear(x, weight, bias)
    if x.dtype != torch.float32:
        raise TypeError(f"native linear expects float32 activations, got {x.dtype}")
    return run_packed(_gemm_packed(), x, weight, bias, out_features)


def run_packed(
    fn: Callable[..., None],
    x: torch.Tensor,
    prepared: torch.Tensor,
    bias: torch.Tensor | None,
    out_features: int,
) -> torch.Tensor:
    """Call a packed-panel GEMM kernel fn(Wp, X, bias, Y, M, N, K, threads) on fp32 x."""
    x = x.contiguous()
    tokens, in_features = x.shape
    out = torch.empty(tokens, out_features, dtype=torch.float32)
    fn(
        prepared.data_ptr(),
        x.data_ptr(),
        bias.contiguous().data_ptr() if bias is not None else None,
        out.data_ptr(),
        tokens,
        out_features,
        in_features,
        torch.get_num_threads(),
    )
    return out


def _native_rows(weight: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    if weight.dim() == 2:
        return weight.index_select(0, ids)
    return weight[ids // PANEL, :, ids % PANEL]  # [len(ids), in]


LINEAR_BACKENDS.register(
    "native", LinearBackend(_native_prepare, _native_apply, _native_rows, decode_format=0)
)
