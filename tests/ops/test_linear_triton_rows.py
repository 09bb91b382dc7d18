"""The kernels="triton" rows of LINEAR_BACKENDS (ops/linear_triton_rows.py) and how a
projection takes them (ops/linear.backend_for, layers/linear.Linear).

Oracles: each "<format>:triton" row computes with the weight the CPU row of that format
computes with — `rows` equal bit for bit, products within fp32 rounding (GGUF blocks as
loaded too); W8A8 FP8 (an fp8_e4m3 weight with per-token FP8 inputs) equals the weight-only
product on fake-quantized inputs within fp32 rounding, through torch._scaled_mm where it runs
and through the weight-only kernel where it does not. Kernels run in Triton's interpreter
(TRITON_INTERPRET=1) or on a GPU (benchmarks/device_check.sh).
"""

from __future__ import annotations

import pytest
import torch

from infergen.formats.block_weight import BlockWeight
from infergen.layers.linear import Linear
from infergen.ops.linear import LINEAR_BACKENDS, PreparedTensors, backend_for
from infergen.ops.linear_triton import TRITON_FORMATS
from infergen.quant.activations import ACTIVATION_SCHEMES, ActivationQuant
from infergen.quant.schemes import apply_weight_scheme
from tests.triton_env import DEVICE, runnable

pytestmark = runnable
rows_module = pytest.importorskip("infergen.ops.linear_triton_rows")  # registers the rows
FORMATS = list(TRITON_FORMATS)
GGUF_FORMATS = ("q4_0", "q4_1", "q8_0")  # quantized by the gguf package
# W8A8 on a GPU: FP8 tensor cores keep fewer accumulator bits (tests/ops/test_linear_fp8.py)
W8A8_TOL = 1e-5 if DEVICE == "cpu" else 2e-3


def _weight(n: int, k: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) * 0.1
    w[1] = 0.0  # an all-zero channel
    return w


def _on_device(prepared: PreparedTensors) -> PreparedTensors:
    return PreparedTensors({name: t.to(DEVICE) for name, t in prepared.items()})


def test_rows_registered_and_picked_by_kernel_set():
    for fmt in FORMATS:
        row = backend_for(fmt, "triton")
        assert row is LINEAR_BACKENDS.get(f"{fmt}:triton") is not LINEAR_BACKENDS.get(fmt)
        assert row.decode_format is None  # never the fused CPU decode step
        assert backend_for(fmt, "native") is LINEAR_BACKENDS.get(fmt)
    assert backend_for("native", "torch") is LINEAR_BACKENDS.get("native")
    assert backend_for("native", "triton") is LINEAR_BACKENDS.get("native:triton")


@pytest.mark.parametrize("fmt", FORMATS)
def test_product_and_rows_equal_the_cpu_row(fmt):
    if fmt in GGUF_FORMATS:
        pytest.importorskip("gguf")
    n, k, tokens = 40, 64, 3
    w = _weight(n, k)
    cpu, gpu = LINEAR_BACKENDS.get(fmt), LINEAR_BACKENDS.get(f"{fmt}:triton")
    cpu_prepared, prepared = cpu.prepare(w), _on_device(gpu.prepare(w))
    ids = torch.tensor([0, 1, n - 1, 7])
    assert torch.equal(gpu.rows(prepared, ids.to(DEVICE)).cpu(), cpu.rows(cpu_prepared, ids))
    dense = cpu.rows(cpu_prepared, torch.arange(n))
    x = torch.randn(tokens, k, generator=torch.Generator().manual_seed(1))
    bias = torch.randn(n)
    got = gpu.apply(x.to(DEVICE), prepared, bias.to(DEVICE), n).cpu()
    want = x.double() @ dense.double().t() + bias.double()
    bound = (x.abs().double() @ dense.abs().double().t()) * k * 2**-23 + 1e-6
    assert ((got.double() - want).abs() <= bound).all()
    torch.testing.assert_close(got, cpu.apply(x, cpu_prepared, bias, n), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fmt", GGUF_FORMATS)
def test_gguf_blocks_as_loaded(fmt):
    gguf = pytest.importorskip("gguf")
    w = _weight(24, 64, seed=2)
    qtype = gguf.GGMLQuantizationType[fmt.upper()]
    blocks = BlockWeight(fmt.upper(), torch.from_numpy(gguf.quants.quantize(w.numpy(), qtype)),
                         tuple(w.shape))  # fmt: skip
    cpu, gpu = LINEAR_BACKENDS.get(fmt), LINEAR_BACKENDS.get(f"{fmt}:triton")
    ids = torch.arange(24)
    assert torch.equal(gpu.rows(gpu.prepare(blocks), ids), cpu.rows(cpu.prepare(blocks), ids))
    assert torch.equal(gpu.rows(gpu.prepare(blocks), ids), blocks.dequantize())
    other = "q8_0" if fmt != "q8_0" else "q4_0"
    with pytest.raises(TypeError, match="blocks"):
        LINEAR_BACKENDS.get(f"{other}:triton").prepare(blocks)


def _linear(fmt: str, w: torch.Tensor) -> Linear:
    lin = Linear(w.shape[1], w.shape[0], True, torch.float32, "triton")
    model = torch.nn.ModuleDict({"proj": lin})
    assert apply_weight_scheme(model, fmt) == ["proj"]
    bias = torch.randn(w.shape[0], generator=torch.Generator().manual_seed(5))
    lin.load(w.to(DEVICE), bias.to(DEVICE))
    return lin


def test_linear_holds_the_layout_and_falls_back_to_the_kernel_sets_dense_row():
    w = _weight(32, 64)
    lin = _linear("int8", w)
    assert lin.backend is LINEAR_BACKENDS.get("int8:triton")
    assert isinstance(lin.weight, PreparedTensors) and "weight" not in lin._buffers
    assert lin.weight.numel() == 32 * 64 + 32 * 4  # int8 codes + an fp32 scale per channel
    torch.testing.assert_close(lin.dense_weight().cpu(), LINEAR_BACKENDS.get("int8").rows(
        LINEAR_BACKENDS.get("int8").prepare(w), torch.arange(32)), rtol=0, atol=0)  # fmt: skip
    outlier = w.clone()
    outlier[0, 0] = 1e4  # per-tensor FP8 flushes the other channels: the load check rejects it
    lin = _linear("fp8_e4m3", outlier)
    assert lin.fallback is not None and lin.backend is LINEAR_BACKENDS.get("native:triton")
    assert isinstance(lin.weight, torch.Tensor) and "weight" not in lin._modules
    x = torch.randn(3, 64)
    got = lin(x.to(DEVICE)).cpu()
    torch.testing.assert_close(got, torch.nn.functional.linear(x, outlier, lin.bias.cpu()))


def _w8a8(monkeypatch, supported: bool, scheme: str = "fp8_e4m3"):
    """An fp8_e4m3:triton projection with FP8 inputs; returns it, x, the oracle, and the
    number of torch._scaled_mm calls so far (a list, updated)."""
    calls = []
    real = torch._scaled_mm
    monkeypatch.setattr(torch, "_scaled_mm", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    monkeypatch.setattr(rows_module, "supported", lambda device: supported)
    w = _weight(48, 64, seed=3)
    lin = _linear("fp8_e4m3", w)
    act = ActivationQuant(ACTIVATION_SCHEMES.get(scheme).act)
    if act.act.static:
        act.scale = torch.tensor([0.02], device=DEVICE)
    lin.act = act
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(4)) * 3
    dense = lin.dense_weight().cpu().double()
    want = act(x.to(DEVICE)).cpu().double() @ dense.t() + lin.bias.cpu().double()
    return lin, x, want, calls


@pytest.mark.parametrize("supported", [True, False])
def test_w8a8_fp8_through_scaled_mm_where_it_runs(monkeypatch, supported):
    lin, x, want, calls = _w8a8(monkeypatch, supported)
    got = lin(x.to(DEVICE)).cpu()
    assert len(calls) == (1 if supported else 0)
    tol = W8A8_TOL if supported else 1e-5
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)


def test_static_fp8_inputs_are_quantized_before_the_weight_only_kernel(monkeypatch):
    lin, x, want, calls = _w8a8(monkeypatch, True, scheme="fp8_e4m3_static")
    got = lin(x.to(DEVICE)).cpu()
    assert not calls  # no W·A product for a calibrated per-tensor scale: x̂ first
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
