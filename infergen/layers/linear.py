"""Linear layer: weight [out, in], optional bias; the product is an ops.linear backend.

The weight is stored in the backend's prepared form (`load`), which may not be [out, in]:
read it back with `rows`, never through `.weight` directly. A projection keeps the kernel set
it was built with (`kernels`): a quantized format runs that set's row of it where one exists
(ops/linear.backend_for: "int8:triton" under kernels="triton"), and its full-precision
fallback is that set's "native" row.
"""

from __future__ import annotations

import torch
from torch import nn

from infergen import profiling
from infergen.formats.block_weight import BlockWeight
from infergen.formats.quant_weight import QuantWeight
from infergen.layers.probe import probe_error
from infergen.ops import (
    linear_grouped,  # noqa: F401  (registers "q4_0" ... "int4_asym")
    linear_quantized,  # noqa: F401  (registers "int8", "fp8_e4m3")
)
from infergen.ops.linear import LINEAR_BACKENDS, PreparedTensors, backend_for, backend_name, cost
from infergen.ops.stored_weights import dense, fuse


class Linear(nn.Module):
    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool,
        dtype: torch.dtype,
        backend: str = "torch",
    ):
        super().__init__()
        self.in_features, self.out_features, self.dtype = in_features, out_features, dtype
        self.kernels = backend  # the kernel set: "native" | "torch" | "triton"
        self.backend = LINEAR_BACKENDS.get(backend, where="kernels", fallback="torch")
        self.register_buffer("weight", None)
        self.register_buffer("bias", None)
        self.has_bias = bias
        self.keep_blocks = True  # False: a weight scheme keeps this layer at full precision
        # the load-time check (layers/probe.py): the largest probe error a quantized weight may
        # show (None: no check), and (error, limit) when this layer fell back to full precision
        self.max_error: float | None = None
        self.probe_error: float | None = None  # measured at load when checked
        self.fallback: tuple[float, float] | None = None
        # the input quantizer of a weight + activation scheme (quant/activations.py), or None
        self.act: nn.Module | None = None

    def load(self, weight: torch.Tensor | BlockWeight, bias: torch.Tensor | None = None) -> None:
        """Take the checkpoint weight [out, in] (and bias [out]) in the engine dtype. GGUF
        blocks kept by the loader (the "gguf" weight scheme) are computed on as they are by
        their format's backend when this layer uses the native kernels (`keep_blocks`), else
        dequantized."""
        expected = (self.out_features, self.in_features)
        if tuple(weight.shape) != expected or (bias is not None) != self.has_bias:
            raise ValueError(
                f"Linear.load: weight {tuple(weight.shape)} bias {bias is not None}, "
                f"expected {expected} bias {self.has_bias}"
            )
        if isinstance(weight, (BlockWeight, QuantWeight)):  # stored quantized
            if self.keep_blocks and self.backend is backend_for("native", self.kernels):
                self.backend = backend_for(weight.fmt, self.kernels)
                self._store(self.backend.prepare(weight))
                self.bias = bias.to(self.dtype).contiguous() if bias is not None else None
                return
            weight = dense(weight)
        weight = weight.to(self.dtype).contiguous()
        self._store(self.backend.prepare(weight))
        if self.max_error is not None:
            error = self.probe_error = probe_error(self.backend, self.weight, weight)
            if error > self.max_error:  # far above the scheme's level: keep full precision
                self.fallback = (error, self.max_error)
                self.backend = backend_for("native", self.kernels)
                self._store(self.backend.prepare(weight))
        self.bias = bias.to(self.dtype).contiguous() if bias is not None else None

    def _store(self, prepared: torch.Tensor | PreparedTensors) -> None:
        """Hold a backend's prepared weight: a tensor as the buffer `weight`, several tensors
        (PreparedTensors) as the submodule `weight`."""
        self._modules.pop("weight", None)
        self._buffers.pop("weight", None)
        if isinstance(prepared, PreparedTensors):
            self.add_module("weight", prepared)
        else:
            self.register_buffer("weight", prepared)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [tokens, in] → [tokens, out]
        if profiling.enabled():
            with self.region(x):
                return self.product(x)
        return self.product(x)

    def region(self, x: torch.Tensor) -> torch.profiler.record_function:
        """The profiler's region of a product on x [tokens, in] (infergen/profiling.py): keyed
        by the shape and the weight's format (its backend row, and an input quantizer's
        format), costed with the weight as stored."""
        fmt = backend_name(self.backend)
        if self.act is not None:
            fmt += f" a={self.act.act.key[0]}"
        key = f"{self.in_features}->{self.out_features} {fmt}"
        return profiling.region("linear", key, self.cost(x.shape[0], x.element_size()))

    def cost(self, tokens: int, element_bytes: int) -> profiling.Cost:
        """The work of a product on `tokens` rows (ops/linear.py), the weight as stored."""
        stored = profiling.nbytes(self.weight, self.bias)
        return cost(tokens, self.in_features, self.out_features, stored, element_bytes)

    def product(self, x: torch.Tensor) -> torch.Tensor:
        """The product on fp32 x [tokens, in], the input quantizer (if any) applied as the
        backend does it — an integer kernel quantizing x itself, or x quantized first — with
        no profiler region of its own (the compiler's walker opens the node's)."""
        apply = self.backend.apply
        if self.act is not None:  # a W·A product of the backend's, or x quantized first
            apply = self.backend.quantized_inputs.get(self.act.act.key)
            if apply is None:
                apply, x = self.backend.apply, self.act(x)
        return apply(x, self.weight, self.bias, self.out_features)

    def dense_weight(self) -> torch.Tensor:
        """The weight [out, in] as the product uses it (dequantized when quantized)."""
        return self.rows(torch.arange(self.out_features))

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows `ids` of the weight [len(ids), in] (an embedding lookup for tied heads; a
        backend's rows may carry its padding past `in`)."""
        return self.backend.rows(self.weight, ids)[:, : self.in_features]

    @staticmethod
    def fused(weights: list[torch.Tensor | BlockWeight]) -> torch.Tensor | BlockWeight:
        """Concatenate projections that share an input (q/k/v, gate/up) along `out` (GGUF
        blocks of one type stay blocks)."""
        return fuse(weights)
