"""Dense projection: y = x · Wᵀ + b.  x [tokens, in], W [out, in], b [out] or None.

Bytes moved: W dominates at small token counts (decode is memory-bound: out·in·4 bytes per
step in fp32); FLOPs 2·tokens·in·out.

Backends (LINEAR_BACKENDS):
- "torch": F.linear (MKL sgemm/sgemv).
- "native": for one token (decode at batch 1) a C matrix-vector kernel
  (kernels/matvec_f32.c) that streams W at close to memory bandwidth — about 1.8× MKL's sgemv
  here; several tokens go to torch, where the product is compute-bound.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from infergen.kernels.build import I, L, P, kernel
from infergen.registry import Registry

LinearFn = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None"], torch.Tensor]
LINEAR_BACKENDS: Registry[LinearFn] = Registry("linear backend")


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    y = x @ weight.t()
    return y + bias if bias is not None else y


@LINEAR_BACKENDS.decorator("torch")
def linear_torch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x, weight, bias)


def _native_ok(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return (
        x.shape[0] == 1
        and x.dim() == 2
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and weight.is_contiguous()
        and x.device.type == "cpu"
    )


def _matvec() -> Callable[..., None] | None:
    return kernel("matvec_f32", P, P, P, P, L, L, I)


@LINEAR_BACKENDS.decorator("native")
def linear_native(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    matvec = _matvec()
    if matvec is None or not _native_ok(x, weight):
        return F.linear(x, weight, bias)
    x = x.contiguous()
    out = torch.empty(1, weight.shape[0], dtype=torch.float32)
    bias_ptr = bias.contiguous().data_ptr() if bias is not None else None
    matvec(
        weight.data_ptr(),
        x.data_ptr(),
        bias_ptr,
        out.data_ptr(),
        weight.shape[0],
        weight.shape[1],
        torch.get_num_threads(),
    )
    return out


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, backend: str = "torch"
) -> torch.Tensor:
    return LINEAR_BACKENDS.get(backend, where="kernels")(x, weight, bias)
