"""Generated C kernels (compiler/codegen_c.py via kernel.py / jit_cache.py) against the
reference interpreter: every primitive on odd sizes, every fused pointwise group the "jit"
pipeline makes for every architecture, over token counts 1 … 300 (one thread and the OpenMP
path) and with rows that are not contiguous in memory."""

from __future__ import annotations

import copy

import pytest
import torch

from infergen import LLM
from infergen.compiler import pipelines  # noqa: F401
from infergen.compiler.codegen_c import VARIANTS as VARIANT_ROWS
from infergen.compiler.codegen_c import CodegenError, render_group, tile_row, variants_for
from infergen.compiler.decoder import capture_layer
from infergen.compiler.interpret import run
from infergen.compiler.ir import TOKENS, Graph, Node, Op, Value
from infergen.compiler.jit_cache import JitCache
from infergen.compiler.kernel import compile_group
from infergen.compiler.passes import run_pipeline
from infergen.compiler.shapes import infer
from infergen.compiler.tune import random_inputs
from tests.hf_models import COMPILED_VARIANTS, build_hf_model

F32 = torch.float32
TOKEN_COUNTS = (1, 2, 7, 64, 300)


def assert_kernel_matches(graph: Graph, cache: JitCache, strided: bool = False) -> None:
    kernel = compile_group(graph, cache)
    for tokens in TOKEN_COUNTS:
        inputs = random_inputs(graph, tokens, seed=tokens)
        if strided:  # rows with a gap after them: a slice of a wider tensor
            inputs = [
                torch.cat([x, torch.randn(x.shape[0], 3)], dim=1)[:, : x.shape[1]]
                if v.shape[0] == TOKENS and x.dim() == 2 and v.dtype == F32
                else x
                for v, x in zip(graph.inputs, inputs, strict=True)
            ]
        got = kernel(*inputs)
        expected = run(graph, {v.name: x for v, x in zip(graph.inputs, inputs, strict=True)})
        for a, b in zip(got, expected, strict=True):
            assert a.shape == b.shape
            assert (a - b).abs().max() <= 2e-6 * max(1.0, float(b.abs().max())), tokens


def _graph(op: Op, shapes: list, attrs=None, dtypes=None) -> Graph:
    attrs = attrs or {}
    inputs = [
        Value(f"x{i}", s, (dtypes or {}).get(i, F32), "weight" if s[0] != TOKENS else "input")
        for i, s in enumerate(shapes)
    ]
    ((shape, dtype),) = infer(op, tuple(inputs), attrs)
    out = Value("y", shape, dtype)
    return Graph(op.label, inputs, [Node(op, tuple(inputs), (out,), attrs)], [out])


PRIMITIVES = [
    (Op.ADD, [(TOKENS, 3, 17), (TOKENS, 3, 17)], {}),
    (Op.SUB, [(TOKENS, 3, 17), (TOKENS, 1, 17)], {}),  # broadcast a middle dim
    (Op.MUL, [(TOKENS, 17), (17,)], {}),  # a weight over rows
    (Op.NEG, [(TOKENS, 5)], {}),
    (Op.SIGMOID, [(TOKENS, 1)], {}),
    (Op.ADD_SCALAR, [(TOKENS, 9)], {"value": 0.25}),
    (Op.MUL_SCALAR, [(TOKENS, 9)], {"value": -3.0}),
    (Op.SUM, [(TOKENS, 4, 13)], {}),
    (Op.MEAN, [(TOKENS, 13)], {}),
    (Op.SLICE, [(TOKENS, 6, 10)], {"dim": 2, "start": 3, "stop": 8}),
    (Op.SLICE, [(TOKENS, 6, 10)], {"dim": 1, "start": 1, "stop": 4}),
    (Op.VIEW, [(TOKENS, 12)], {"shape": (TOKENS, 3, 4)}),
    (Op.CONCAT, [(TOKENS, 2, 3), (TOKENS, 2, 5)], {"dim": 2}),
    (Op.GATHER_ROWS, [(100, 7), (TOKENS,)], {}),
]


@pytest.mark.parametrize("op, shapes, attrs", PRIMITIVES, ids=lambda p: str(p)[:40])
def test_primitive(op, shapes, attrs, tmp_path):
    dtypes = {1: torch.int64} if op is Op.GATHER_ROWS else None
    graph = _graph(op, shapes, attrs, dtypes)
    assert_kernel_matches(graph, JitCache(tmp_path))


def test_rsqrt_on_positive_values(tmp_path):
    x = Value("x", (TOKENS, 6), F32, "input")
    square, y = Value("s", (TOKENS, 6), F32), Value("y", (TOKENS, 6), F32)
    nodes = [Node(Op.MUL, (x, x), (square,)), Node(Op.RSQRT, (square,), (y,))]
    assert_kernel_matches(Graph("g", [x], nodes, [y]), JitCache(tmp_path))


def _jit_groups(name, tmp_path) -> list[Graph]:
    build_hf_model(name, tmp_path / "model")
    engine = LLM(str(tmp_path / "model"), kv_cache_memory="4MiB").engine
    graph = run_pipeline(capture_layer(engine.runner.model, engine.kv_cache).graph, "jit")
    return [n.attrs["graph"] for n in graph.nodes if n.op is Op.FUSED]


@pytest.mark.parametrize("name", COMPILED_VARIANTS)
def test_every_pointwise_group_of_every_architecture(name, tmp_path):
    cache = JitCache(tmp_path / "jit")
    rendered = 0
    for group in _jit_groups(name, tmp_path):
        if group.name != "pointwise":
            with pytest.raises(CodegenError):  # GEMM / KV store inside: runs op by op
                render_group(group, "f")
            continue
        assert_kernel_matches(group, cache)
        assert_kernel_matches(group, cache, strided=True)
        rendered += 1
    assert rendered >= 2  # the two residual add + norms at least


def test_rendering_is_deterministic_and_names_do_not_matter(tmp_path):
    graph = _graph(Op.ADD, [(TOKENS, 8), (TOKENS, 8)])
    other = copy.deepcopy(graph)
    for v in other.values():
        v.name = "renamed_" + v.name
    cache = JitCache(tmp_path)
    first = compile_group(graph, cache)
    assert not first.built.cached and first.built.seconds > 0
    assert JitCache(tmp_path).key(other.canonical(), "variant=default") == first.built.key
    again = compile_group(other, JitCache(tmp_path))  # a fresh process's view: from disk
    assert again.built.cached and again.built.key == first.built.key


def test_row_tiles_compute_the_same_bits(tmp_path):
    """A SiLU-mul chain with a broadcast weight over 1500 columns (tail tiles of 220 after
    five of 256, of 476 after one of 1024): every variant equals the interpreter and the
    default variant bit for bit (each element's arithmetic is the same; only the order over
    columns changes)."""
    x = Value("x", (TOKENS, 3000), F32, "input")
    w = Value("w", (1500,), F32, "weight")
    gate, up = Value("gate", (TOKENS, 1500), F32), Value("up", (TOKENS, 1500), F32)
    sig, act = Value("sig", (TOKENS, 1500), F32), Value("act", (TOKENS, 1500), F32)
    prod_, out = Value("prod", (TOKENS, 1500), F32), Value("out", (TOKENS, 1500), F32)
    nodes = [
        Node(Op.SLICE, (x,), (gate,), {"dim": 1, "start": 0, "stop": 1500}),
        Node(Op.SLICE, (x,), (up,), {"dim": 1, "start": 1500, "stop": 3000}),
        Node(Op.SIGMOID, (gate,), (sig,)),
        Node(Op.MUL, (gate, sig), (act,)),
        Node(Op.MUL, (act, up), (prod_,)),
        Node(Op.MUL, (prod_, w), (out,)),
    ]
    graph = Graph("silu_mul_w", [x, w], nodes, [out])
    assert tile_row(graph) == (1500,)
    assert set(variants_for(graph)) == set(VARIANT_ROWS)  # every tile cuts 1500 columns
    assert "c0 += 256" in render_group(graph, "f", "tile256")
    cache = JitCache(tmp_path)
    for tokens in (1, 7, 300):
        inputs = random_inputs(graph, tokens, seed=tokens)
        expected = run(graph, {v.name: a for v, a in zip(graph.inputs, inputs, strict=True)})
        default = compile_group(graph, cache)(*inputs)[0]
        assert (default - expected[0]).abs().max() <= 2e-6 * float(expected[0].abs().max())
        for variant in VARIANT_ROWS:
            assert torch.equal(compile_group(graph, cache, variant)(*inputs)[0], default)
    with_norm = _graph(Op.MEAN, [(TOKENS, 600)])  # a reduction: rows stay whole
    assert tile_row(with_norm) is None and "tile256" not in variants_for(with_norm)
