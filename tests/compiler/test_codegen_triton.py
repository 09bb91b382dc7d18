"""Generated Triton kernels (compiler/codegen_triton.py) against the reference interpreter:
the primitives and every fused pointwise group of every architecture, on odd token counts.
In the Triton interpreter on the CPU (TRITON_INTERPRET=1, tests/conftest.py), or on a GPU with
TRITON_INTERPRET=0 (benchmarks/device_check.sh)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from infergen.compiler.codegen_c import CodegenError
from infergen.compiler.interpret import run
from infergen.compiler.jit_cache import JitCache
from infergen.compiler.tune import random_inputs
from tests.compiler.test_codegen_c import PRIMITIVES, _graph, _jit_groups
from tests.hf_models import COMPILED_VARIANTS
from tests.triton_env import DEVICE, runnable

pytestmark = runnable
TOKEN_COUNTS = (1, 3, 7)


def assert_triton_matches(graph, cache) -> None:
    from infergen.compiler.codegen_triton import TritonGroupKernel

    kernel = TritonGroupKernel(graph, cache)
    for tokens in TOKEN_COUNTS:
        inputs = random_inputs(graph, tokens, seed=tokens)
        expected = run(graph, {v.name: x for v, x in zip(graph.inputs, inputs, strict=True)})
        got = kernel(*[x.to(DEVICE) for x in inputs])
        for a, b in zip(got, expected, strict=True):
            assert a.shape == b.shape
            assert (a.cpu() - b).abs().max() <= 2e-6 * max(1.0, float(b.abs().max())), tokens


@pytest.mark.parametrize("op, shapes, attrs", PRIMITIVES, ids=lambda p: str(p)[:40])
def test_primitive(op, shapes, attrs, tmp_path):
    from infergen.compiler.ir import Op

    dtypes = {1: torch.int64} if op is Op.GATHER_ROWS else None
    assert_triton_matches(_graph(op, shapes, attrs, dtypes), JitCache(tmp_path))


@pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None, reason="builds models with transformers"
)
@pytest.mark.parametrize("name", COMPILED_VARIANTS)
def test_every_pointwise_group_of_every_architecture(name, tmp_path):
    cache = JitCache(tmp_path / "jit")
    rendered = 0
    for group in _jit_groups(name, tmp_path):
        if group.name != "pointwise":
            continue
        assert_triton_matches(group, cache)
        rendered += 1
    assert rendered >= 2


def test_a_slice_of_a_concat_is_refused(tmp_path):
    from infergen.compiler.codegen_triton import render_group_triton
    from infergen.compiler.ir import TOKENS, Graph, Node, Op, Value

    f32 = torch.float32
    x = Value("x", (TOKENS, 4), f32, "input")
    y, z = Value("y", (TOKENS, 8), f32), Value("z", (TOKENS, 2), f32)
    nodes = [
        Node(Op.CONCAT, (x, x), (y,), {"dim": 1}),
        Node(Op.SLICE, (y,), (z,), {"dim": 1, "start": 3, "stop": 5}),
    ]
    with pytest.raises(CodegenError, match="concat"):
        render_group_triton(Graph("g", [x], nodes, [z]), "f")
