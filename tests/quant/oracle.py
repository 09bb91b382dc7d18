"""The oracle every quantized linear backend answers to: its product equals the fp32 "native"
kernel on the dequantized weight bit for bit (the kernel uses exactly those values and
accumulates as the fp32 kernel does), and a float64 matmul within float rounding."""

from __future__ import annotations

import torch

from infergen.ops.linear import LINEAR_BACKENDS


def assert_equals_dequantized(name: str, w, dequantized, x, bias) -> None:
    backend, native = LINEAR_BACKENDS.get(name), LINEAR_BACKENDS.get("native")
    out_features = dequantized.shape[0]
    ours = backend.apply(x, backend.prepare(w), bias, out_features)
    assert torch.equal(ours, native.apply(x, native.prepare(dequantized), bias, out_features))
    expected = x.double() @ dequantized.double().t() + (bias.double() if bias is not None else 0)
    torch.testing.assert_close(ours.double(), expected, rtol=1e-5, atol=1e-4)
