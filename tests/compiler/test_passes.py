"""Every pass and pipeline keeps the graph's values: for every architecture, the rewritten
decoder-layer graph, run with the ops' references, equals the captured graph on real step
inputs (prefill, chunked prefill, mixed, decode) with random residual streams; each fusion
rule makes the kernel it names; the buffer plan never shares memory between live values."""

from __future__ import annotations

import copy

import pytest
import torch

from infergen import LLM
from infergen.compiler import pipelines  # noqa: F401  (registers the pipelines)
from infergen.compiler.buffers import plan_buffers
from infergen.compiler.decoder import capture_layer
from infergen.compiler.interpret import run
from infergen.compiler.ir import TOKENS, Graph, Node, Op, Value
from infergen.compiler.passes import PASSES, PIPELINES, run_pipeline
from infergen.compiler.rewrite import fuse
from infergen.compiler.verify import verify
from tests.compiler.layer_calls import record_layer_calls
from tests.hf_models import COMPILED_VARIANTS, build_hf_model

F32 = torch.float32


def _kernels(graph: Graph) -> list[str]:
    return sorted(n.attrs["kernel"] for n in graph.nodes if n.op is Op.FUSED)


def _launches(graph: Graph) -> int:
    """Nodes that run as a kernel (views and slices are free)."""
    return sum(n.op not in (Op.VIEW, Op.SLICE) for n in graph.nodes)


def _engine_case(name, tmp_path, **options):
    build_hf_model(name, tmp_path)
    llm = LLM(str(tmp_path), kv_cache_memory="4MiB", **options)
    model = llm.engine.runner.model
    model.fast_path = None
    captured = capture_layer(model, llm.engine.kv_cache, index=1)
    calls = record_layer_calls(llm, model.layers[1])
    return model, captured, calls


def _assert_same_values(original: Graph, rewritten: Graph, envs: list[dict]) -> None:
    for env in envs:
        expected = run(original, env)
        got = run(rewritten, env)
        for a, b in zip(got, expected, strict=True):
            scale = max(1.0, float(b.abs().max()))
            assert (a - b).abs().max() <= 1e-6 * scale


def _envs(model, captured, calls) -> list[dict]:
    envs = []
    generator = torch.Generator().manual_seed(3)
    for call in calls:
        args = {k: call[k] for k in ("h", "delta", "batch", "kv")}
        args["h"] = torch.randn(args["h"].shape, generator=generator)
        args["delta"] = torch.randn(args["delta"].shape, generator=generator)
        envs.append(captured.bind(model.layers[1], **args))
    return envs


@pytest.mark.parametrize("name", COMPILED_VARIANTS)
def test_pipelines_keep_the_values(name, tmp_path):
    model, captured, calls = _engine_case(name, tmp_path)
    envs = _envs(model, captured, calls)
    for pipeline in PIPELINES.names():
        graph = run_pipeline(copy.deepcopy(captured.graph), pipeline)
        assert _launches(graph) < _launches(captured.graph), pipeline
        _assert_same_values(captured.graph, graph, envs)
    for pass_name in PASSES.names():  # each pass alone
        graph = PASSES.get(pass_name)(copy.deepcopy(captured.graph))
        _assert_same_values(captured.graph, graph, envs)


def test_fusion_rules_make_their_kernels(tmp_path):
    _, captured, _ = _engine_case("llama_gqa", tmp_path / "a")
    fused = run_pipeline(copy.deepcopy(captured.graph), "fuse")
    assert _kernels(fused) == ["gemm_silu_mul", "rope_kv_store"]
    jit = run_pipeline(copy.deepcopy(captured.graph), "jit")
    assert _kernels(jit) == ["gemm_silu_mul", "pointwise", "pointwise", "rope_kv_store"]
    lowered = {n.op for n in jit.nodes} | {
        m.op for n in jit.nodes if n.op is Op.FUSED for m in n.attrs["graph"].nodes
    }
    assert not lowered & {Op.RMS_NORM, Op.ADD_RMS_NORM, Op.SILU_MUL, Op.ROPE}


def test_norm_quantize_with_activation_quantization(tmp_path):
    model, captured, calls = _engine_case("llama_gqa", tmp_path, activations="int8")
    assert captured.graph.count()["quantize_act"] == 4
    fused = run_pipeline(copy.deepcopy(captured.graph), "fuse")
    assert _kernels(fused).count("norm_quantize") == 2
    assert "gemm_silu_mul" in _kernels(fused)  # down's quantizer joins the GEMM epilogue
    _assert_same_values(captured.graph, fused, _envs(model, captured, calls))


def test_input_quantizers_join_their_gemms(tmp_path):
    """The "jit" pipeline's first pass: each QUANTIZE_ACT feeding a GEMM becomes that GEMM's
    attribute (the backend's integer kernel quantizes the input itself); the values stay the
    reference's (the interpreter quantizes inside the LINEAR)."""
    model, captured, calls = _engine_case("llama_gqa", tmp_path, activations="int8")
    graph = PASSES.get("fuse_input_quantizers")(copy.deepcopy(captured.graph))
    assert "quantize_act" not in graph.count()
    linears = [n for n in graph.nodes if n.op is Op.LINEAR]
    assert [n.attrs.get("act_fmt") for n in linears] == ["int8"] * 4
    assert all(n.attrs["act_granularity"] == "token" for n in linears)
    envs = _envs(model, captured, calls)
    _assert_same_values(captured.graph, graph, envs)
    jit = run_pipeline(copy.deepcopy(captured.graph), "jit")
    assert "norm_quantize" not in _kernels(jit)  # the norms no longer end in a quantizer
    _assert_same_values(captured.graph, jit, envs)


def _v(name, shape, role="activation"):
    return Value(name, shape, F32, role)


def test_separate_add_and_norm_become_one_op():
    h, d, w = _v("h", (TOKENS, 8), "input"), _v("d", (TOKENS, 8), "input"), _v("w", (8,), "weight")
    s, y = _v("s", (TOKENS, 8)), _v("y", (TOKENS, 8))
    graph = Graph(
        "g",
        [h, d, w],
        [Node(Op.ADD, (h, d), (s,)), Node(Op.RMS_NORM, (s, w), (y,), {"eps": 1e-6})],
        [y, s],
    )
    original = copy.deepcopy(graph)
    PASSES.get("fuse_epilogues")(graph)
    assert [n.op for n in graph.nodes] == [Op.ADD_RMS_NORM]
    env = {"h": torch.randn(5, 8), "d": torch.randn(5, 8), "w": torch.rand(8)}
    _assert_same_values(original, graph, [env])


def test_a_group_that_is_not_convex_is_not_fused():
    """a → b, a → c(outside) → d reads b and c: fusing {a, b, d} would need c in the middle."""
    x = _v("x", (TOKENS, 4), "input")
    a, b, c, d = (_v(n, (TOKENS, 4)) for n in "abcd")
    nodes = [
        Node(Op.SIGMOID, (x,), (a,)),
        Node(Op.NEG, (a,), (b,)),
        Node(Op.RSQRT, (a,), (c,)),
        Node(Op.ADD, (b, c), (d,)),
    ]
    graph = Graph("g", [x], nodes, [d])
    before = list(graph.nodes)
    assert fuse(graph, [nodes[0], nodes[1], nodes[3]], "bad") is None
    assert graph.nodes == before
    assert fuse(graph, nodes, "all") is not None
    verify(graph)


def test_buffer_plan_never_shares_live_values(tmp_path):
    _, captured, _ = _engine_case("qwen3_qk_norm", tmp_path)
    for pipeline in (None, "jit"):
        graph = copy.deepcopy(captured.graph)
        if pipeline:
            graph = run_pipeline(graph, pipeline)
        plan = plan_buffers(graph)
        assert plan.total < plan.naive
        by_buffer: dict[int, list[tuple[int, int]]] = {}
        for name, (first, last) in plan.live.items():
            by_buffer.setdefault(plan.buffer_of[name], []).append((first, last))
        for ranges in by_buffer.values():
            ranges.sort()
            for (_, end), (start, _) in zip(ranges, ranges[1:], strict=False):
                assert end < start
        activations = [v for n in graph.nodes for v in n.outputs if v.role == "activation"]
        assert all(v.name in plan.buffer_of for v in activations)
