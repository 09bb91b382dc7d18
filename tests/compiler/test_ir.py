"""The IR (compiler/ir.py, shapes.py) and its verifier (verify.py): shape rules, views with
symbolic dimensions, and a verifier that rejects each broken invariant with a message naming
the node."""

from __future__ import annotations

import pytest
import torch

from infergen.compiler.ir import TOKENS, Graph, Node, Op, OpKind, Sym, Value, resolve_view
from infergen.compiler.shapes import ShapeError, broadcast, infer
from infergen.compiler.verify import VerifyError, verify

F32 = torch.float32


def _v(name, shape, role="activation", dtype=F32):
    return Value(name, shape, dtype, role)


def _norm_linear_graph():
    x = _v("x", (TOKENS, 8), "input")
    w = _v("w", (8,), "weight")
    lin = _v("lin", (6, 8), "weight")
    y = _v("y", (TOKENS, 8))
    z = _v("z", (TOKENS, 6))
    nodes = [
        Node(Op.RMS_NORM, (x, w), (y,), {"eps": 1e-5}),
        Node(Op.LINEAR, (y, lin, None), (z,), {"format": "f32"}),
    ]
    return Graph("g", [x, w, lin], nodes, [z])


def test_every_op_has_a_kind_and_a_shape_rule():
    from infergen.compiler.interpret import EXECUTORS
    from infergen.compiler.shapes import SHAPE_RULES

    for op in Op:
        assert isinstance(op.kind, OpKind)
        assert op in SHAPE_RULES, op
        assert op in EXECUTORS, op


def test_views_resolve_symbolic_and_static_dimensions():
    assert resolve_view((TOKENS, 144), (TOKENS, -1, 24)) == (TOKENS, 6, 24)
    assert resolve_view((TOKENS, 4, 24), (TOKENS, 96)) == (TOKENS, 96)
    with pytest.raises(ValueError, match="dynamic dimensions differ"):
        resolve_view((TOKENS, 4), (Sym("R"), 4))
    with pytest.raises(ValueError, match="do not divide"):
        resolve_view((TOKENS, 10), (TOKENS, -1, 3))
    with pytest.raises(ValueError, match="element counts differ"):
        resolve_view((TOKENS, 10), (TOKENS, 2, 4))


def test_broadcast_and_rules():
    assert broadcast((TOKENS, 1, 8), (4, 1)) == (TOKENS, 4, 8)
    with pytest.raises(ShapeError):
        broadcast((TOKENS, 8), (Sym("R"), 8))
    x = _v("x", (TOKENS, 10))
    assert infer(Op.SILU_MUL, (x,), {}) == [((TOKENS, 5), F32)]
    assert infer(Op.SLICE, (x,), {"dim": 1, "start": 2, "stop": 7}) == [((TOKENS, 5), F32)]
    with pytest.raises(ShapeError, match="slice 2:12 of 10"):
        infer(Op.SLICE, (x,), {"dim": 1, "start": 2, "stop": 12})
    with pytest.raises(ShapeError, match="weight"):
        infer(Op.LINEAR, (x, _v("w", (3, 9), "weight"), None), {})


def test_verify_accepts_a_good_graph_and_dumps_it():
    graph = verify(_norm_linear_graph())
    text = graph.dump()
    assert "rms_norm(%x, %w) eps=1e-05" in text and "f32[T,6]" in text


def test_verify_rejects_use_before_definition():
    graph = _norm_linear_graph()
    graph.nodes.reverse()
    with pytest.raises(VerifyError, match="reads %y before it is defined"):
        verify(graph)


def test_verify_rejects_a_wrong_output_shape():
    graph = _norm_linear_graph()
    graph.nodes[1].outputs[0].shape = (TOKENS, 7)
    with pytest.raises(VerifyError, match="the rule gives shape"):
        verify(graph)


def test_verify_rejects_duplicate_names_and_missing_outputs():
    graph = _norm_linear_graph()
    graph.nodes[1].outputs[0].name = "y"
    with pytest.raises(VerifyError, match="two values are named %y"):
        verify(graph)
    graph = _norm_linear_graph()
    graph.outputs.append(_v("ghost", (TOKENS, 6)))
    with pytest.raises(VerifyError, match="output %ghost is never computed"):
        verify(graph)


def test_verify_rejects_reading_a_cache_after_its_store():
    k = _v("k", (TOKENS, 2, 4), "input")
    kc = _v("kc", (Sym("B"), 16, 2, 4), "cache")
    vc = _v("vc", (Sym("B"), 16, 2, 4), "cache")
    slots = _v("slots", (TOKENS,), "input", torch.int64)
    new_k, new_v = _v("kc2", kc.shape, "cache"), _v("vc2", vc.shape, "cache")
    stale = _v("stale", kc.shape, "cache")
    store = Node(Op.KV_STORE, (k, k, kc, vc, slots), (new_k, new_v))
    graph = Graph("g", [k, kc, vc, slots], [store], [new_k, new_v])
    verify(graph)
    graph.nodes.append(
        Node(Op.KV_STORE, (k, k, kc, new_v, slots), (stale, _v("s2", kc.shape, "cache")))
    )
    with pytest.raises(VerifyError, match="reads cache %kc after node 0"):
        verify(graph)
