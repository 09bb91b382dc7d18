"""GEMMs with their pointwise tail fused (compiler/codegen_gemm.py, kernels/gemm_epilogue_f32.h)
against plain torch (x·Wᵀ + b, then the tail) for every kernel ISA this machine builds plus the
generic one; bitwise against the unfused GEMM + tail kernel; the groups it refuses and why; and
in the engine (graph walker and layer program, fp32 and int8 panels) against the per-op path;
the Triton rendering against torch (in the interpreter on the CPU, compiled on a GPU)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from infergen import LLM
from infergen.compiler import runtime
from infergen.compiler.codegen_c import CodegenError
from infergen.compiler.codegen_gemm import NR, plan_epilogue
from infergen.compiler.codegen_triton_gemm import TritonGemmEpilogueKernel
from infergen.compiler.ir import TOKENS, Graph, Node, Op, Value
from infergen.compiler.jit_cache import JitCache
from infergen.compiler.kernel import compile_gemm_epilogue, compile_group
from infergen.compiler.passes import PASSES
from infergen.compiler.startup import plan_startup
from infergen.kernels.build import _cpu_flags
from infergen.ops.linear import LINEAR_BACKENDS, pack_panels
from tests.hf_models import build_hf_model
from tests.triton_env import DEVICE, runnable

F32 = torch.float32
TOKEN_COUNTS = (1, 3, 5, 8, 9, 17, 64, 130)
# the kernel builds this machine runs (INFERGEN_KERNEL_ISA, kernels/build.py): generic always
ISAS = ["generic"] + (["avx2"] if {"avx2", "fma", "f16c"} <= _cpu_flags() else [])
ISAS += ["native"] if "avx512f" in _cpu_flags() else []


def _group(n: int, k: int, tail: str) -> Graph:
    """A GEMM-with-tail group as the "jit" pipeline leaves it: LINEAR, then its tail fused.
    tail "swiglu": silu(y[:, :n/2]) · y[:, n/2:]; "silu": y · sigmoid(y)."""
    x = Value("x", (TOKENS, k), F32, "input")
    w = Value("w", (n, k), F32, "weight")
    b = Value("b", (n,), F32, "weight")
    y = Value("y", (TOKENS, n), F32)
    nodes = [Node(Op.LINEAR, (x, w, b), (y,), {"format": "f32"})]
    if tail == "swiglu":
        out = Value("act", (TOKENS, n // 2), F32)
        nodes.append(Node(Op.SILU_MUL, (y,), (out,), {}))
    else:
        s = Value("s", (TOKENS, n), F32)
        out = Value("act", (TOKENS, n), F32)
        nodes += [Node(Op.SIGMOID, (y,), (s,), {}), Node(Op.MUL, (y, s), (out,), {})]
    graph = Graph("gemm_tail", [x, w, b], nodes, [out])
    PASSES.get("lower")(graph)
    PASSES.get("fuse_pointwise")(graph)
    tail_nodes = [n for n in graph.nodes if n.op is not Op.LINEAR]
    assert len(tail_nodes) == 1 and tail_nodes[0].op is Op.FUSED
    return graph


def _oracle(x, w, b, tail: str) -> torch.Tensor:
    y = F.linear(x, w, b)
    if tail == "swiglu":
        half = y.shape[1] // 2
        return F.silu(y[:, :half]) * y[:, half:]
    return F.silu(y)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("tail, n, k", [("swiglu", 4 * NR, 40), ("silu", 3 * NR, 33)])
def test_fused_gemm_equals_torch(isa, tail, n, k, tmp_path, monkeypatch):
    if isa == "native":
        monkeypatch.delenv("INFERGEN_KERNEL_ISA", raising=False)
    else:
        monkeypatch.setenv("INFERGEN_KERNEL_ISA", isa)
    epilogue = plan_epilogue(_group(n, k, tail))
    assert epilogue.parts == (2 if tail == "swiglu" else 1)
    kernel = compile_gemm_epilogue(epilogue, JitCache(tmp_path))
    torch.manual_seed(0)
    w, b = torch.randn(n, k), torch.randn(n)
    panels = pack_panels(w)
    layer = SimpleNamespace(weight=panels, act=None)
    assert epilogue.serves(layer)
    assert not epilogue.serves(SimpleNamespace(weight=panels[:-1], act=None))
    assert not epilogue.serves(SimpleNamespace(weight=panels, act=object()))
    for tokens in TOKEN_COUNTS:
        x = torch.randn(tokens, k)
        for bias in (None, b):
            got = kernel(x, panels, bias)
            expected = _oracle(x, w, bias, tail)
            assert got.shape == expected.shape
            assert (got - expected).abs().max() <= 1e-5 * expected.abs().max(), tokens


@pytest.mark.parametrize("tail, n", [("swiglu", 6 * NR), ("silu", 3 * NR)])
def test_fused_gemm_is_bitwise_the_unfused_gemm_and_tail(tail, n, tmp_path):
    """The same FMAs in the same order sum the same products: the fused result is the unfused
    one (with AVX-512 past 8 tokens: panels two at a time, an odd last one alone)."""
    k = 70
    graph = _group(n, k, tail)
    epilogue = plan_epilogue(graph)
    fused = compile_gemm_epilogue(epilogue, JitCache(tmp_path))
    unfused_tail = compile_group(graph.nodes[1].attrs["graph"], JitCache(tmp_path))
    apply = LINEAR_BACKENDS.get("native").apply
    torch.manual_seed(1)
    w, b = torch.randn(n, k), torch.randn(n)
    panels = pack_panels(w)
    for tokens in (1, 5, 7, 9, 13, 16, 70):  # (5: blocks of 3 + 2; 9: 3 + 3 + 3)
        x = torch.randn(tokens, k)
        (unfused,) = unfused_tail(apply(x, panels, b, n))
        assert torch.equal(fused(x, panels, b), unfused), tokens


@pytest.mark.parametrize("tail, n", [("swiglu", 6 * NR), ("silu", 3 * NR)])
def test_the_bf16_tile_epilogue_is_bitwise_gemm_bf16_and_the_tail(tail, n, tmp_path):
    """kernels/gemm_epilogue_bf16.h, built as a layer program builds it (the bf16 kernels'
    flags: AMX-BF16 where the CPU has it): where gemm_bf16 runs on tiles, the same tile
    products on the same tiled tokens, then the bias and the tail — bitwise gemm_bf16's product
    through the unfused tail; elsewhere it declines (0) and the program runs those two."""
    import ctypes

    from infergen.compiler.codegen_gemm import render_gemm_epilogue
    from infergen.compiler.kernel import MICRO_KERNELS
    from infergen.kernels.build import I, L, kernel, library
    from infergen.ops import linear_bf16

    k = 70
    graph = _group(n, k, tail)
    epilogue = plan_epilogue(graph)
    cache = JitCache(tmp_path)
    name = f"bf16_epilogue_{tail}"
    built = cache.get(f"test-{name}", f"{name}_bf16", lambda: render_gemm_epilogue(epilogue, name),
                      kernel=linear_bf16.SOURCE, link=lambda: [library(MICRO_KERNELS)])  # fmt: skip
    fused = built.fn
    fused.restype = ctypes.c_int
    unfused_tail = compile_group(graph.nodes[1].attrs["graph"], cache)
    tiles = kernel("gemm_bf16_tiles", L, source=linear_bf16.SOURCE, restype=I)
    bf16 = LINEAR_BACKENDS.get("bf16")
    torch.manual_seed(2)
    w, b = torch.randn(n, k), torch.randn(n)
    panels = bf16.prepare(w)
    columns = epilogue.out_columns
    for tokens in (1, 4, 5, 16, 17, 33, 70):
        x = torch.randn(tokens, k)
        for bias in (None, b):
            out = torch.full((tokens, columns), float("nan"))
            ran = fused(ctypes.c_void_p(panels.data_ptr()), ctypes.c_void_p(x.data_ptr()),
                        ctypes.c_void_p(bias.data_ptr() if bias is not None else None),
                        ctypes.c_void_p(out.data_ptr()), ctypes.c_long(columns),
                        ctypes.c_long(tokens), ctypes.c_long(n), ctypes.c_long(k),
                        ctypes.c_int(2))  # fmt: skip
            assert bool(ran) == bool(tiles(tokens)), tokens
            if ran:
                (unfused,) = unfused_tail(bf16.apply(x, panels, bias, n))
                assert torch.equal(out, unfused), (tokens, bias is not None)


@pytest.mark.parametrize(
    "n, tail, why",
    [
        (4 * NR + 12, "swiglu", "not a whole number of 24-column panels"),
        (4 * NR, "norm", "not one elementwise chain"),
    ],
)
def test_groups_without_an_epilogue_are_refused_with_the_reason(n, tail, why):
    if tail == "norm":  # y · Σ y: a row reduction needs the whole row
        x = Value("x", (TOKENS, 8), F32, "input")
        w = Value("w", (n, 8), F32, "weight")
        y, s = Value("y", (TOKENS, n), F32), Value("s", (TOKENS, 1), F32)
        out = Value("out", (TOKENS, n), F32)
        nodes = [
            Node(Op.LINEAR, (x, w, None), (y,), {"format": "f32"}),
            Node(Op.SUM, (y,), (s,), {}),
            Node(Op.MUL, (y, s), (out,), {}),
        ]
        graph = Graph("gemm_norm", [x, w], nodes, [out])
        PASSES.get("fuse_pointwise")(graph)
    else:
        graph = _group(n, 16, tail)
    with pytest.raises(CodegenError, match=why):
        plan_epilogue(graph)


@pytest.fixture
def private_jit_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(runtime, "JitCache", lambda: JitCache(tmp_path / "jit"))


@pytest.mark.parametrize("weights", [None, "int8"])
def test_engine_runs_the_fused_gemm_and_equals_the_per_op_path(
    weights, tmp_path, private_jit_cache
):
    """An MLP whose width is a whole number of panels: the walker runs the fused GEMM on fp32
    panels and the layer programs (decode, prefill) call it; int8 panels take the unfused
    branch of both. Logits equal the per-op path's."""
    build_hf_model("llama_gqa", tmp_path / "model", intermediate_size=6 * NR)
    options = dict(kv_cache_memory="4MiB", weights=weights)
    reference = LLM(str(tmp_path / "model"), **options)
    compiled = LLM(str(tmp_path / "model"), compile="jit", **options)
    layers = compiled.engine.runner.model.fast_path_for(compiled.engine.kv_cache)
    for program in (layers.program, layers.prefill_program):
        assert program is not None and "gemm_epilogue_f32.h" in program.program.source
    calls = {"n": 0}
    if weights is not None:  # no layer has fp32 panels: the walker's kernel is not built
        assert layers.gemm_epilogues == {}
        assert any("fp32 panels" in why for why in layers.report.epilogues_unfused)
    else:
        assert len(layers.gemm_epilogues) == 1, layers.report.epilogues_unfused
        kernel = next(iter(layers.gemm_epilogues.values()))
        call = kernel.call

        def counting(*args):
            calls["n"] += 1
            return call(*args)

        kernel.call = counting
    tokens = list(range(5, 45))
    prefill_program = layers.prefill_program
    for walker in (True, False):  # prefill steps walked, then through the prefill program
        layers.prefill_program = None if walker else prefill_program
        for chunk in (40, 6, 1):
            expected = reference.engine.prompt_logits(tokens, chunk=chunk)
            got = compiled.engine.prompt_logits(tokens, chunk=chunk)
            assert (got - expected).abs().max() <= 1e-4 * expected.abs().max(), chunk
        if walker:
            assert (calls["n"] > 0) == (weights is None)


@runnable
@pytest.mark.parametrize("tail, n, k", [("swiglu", 4 * NR, 40), ("silu", 3 * NR, 33)])
def test_triton_fused_gemm_equals_torch(tail, n, k, tmp_path):
    """The Triton rendering of the same epilogues (codegen_triton_gemm.py): the tail applied
    to the register tiles of every part, one store."""
    kernel = TritonGemmEpilogueKernel(plan_epilogue(_group(n, k, tail)), JitCache(tmp_path))
    torch.manual_seed(0)
    w, b = torch.randn(n, k, device=DEVICE), torch.randn(n, device=DEVICE)
    for tokens in (1, 17, 40):
        x = torch.randn(tokens, k, device=DEVICE)
        for bias in (None, b):
            got = kernel(x, w, bias)
            expected = _oracle(x, w, bias, tail)
            assert got.shape == expected.shape
            assert (got - expected).abs().max() <= 1e-5 * expected.abs().max(), tokens
    assert TritonGemmEpilogueKernel(kernel.epilogue, JitCache(tmp_path)).built.cached


def test_startup_plan_skips_a_fused_gemm_no_layer_can_run(tmp_path):
    """int8 panels everywhere: the plan does not compile the walker's fused GEMM, and says
    why; with fp32 panels it is built (a budget that fits the groups and it, not the layer
    program)."""
    build_hf_model("llama_gqa", tmp_path / "model", intermediate_size=6 * NR)
    for weights, budget, status in (
        (None, 4.0, "built"),
        ("int8", 0.0, "no layer has fp32 panels"),
    ):
        llm = LLM(str(tmp_path / "model"), kv_cache_memory="4MiB", weights=weights)
        model, kv_cache = llm.engine.runner.model, llm.engine.kv_cache
        cache = JitCache(tmp_path / f"jit-{weights}")
        items = plan_startup(model, kv_cache, {"1": 1.0}, budget, cache)
        (item,) = [i for i in items if i.group.startswith("GEMM epilogue")]
        assert item.status == status
