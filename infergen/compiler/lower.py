"""Lowering: the coarse ops capture sees (RMS_NORM, ADD_RMS_NORM, SILU_MUL, GELU_MUL, ROPE)
rewritten into the pointwise, row-reduction and layout primitives they are made of, in the order of
the ops' references (ops/*.py), so the lowered graph computes the same values:

    rms_norm(x, w)      = (x · rsqrt(mean(x · x) + eps)) · w
    add_rms_norm(h, d)  = rms_norm(h + d), and h + d
    silu_mul(x)         = (g · sigmoid(g)) · u          g, u = x[..., :n], x[..., n:]
    gelu_mul(x)         = (g · sigmoid(c·g·(1 + 0.044715·g·g))) · u     c = 2·√(2/π)
                          (gelu_tanh: 0.5·(1 + tanh(z)) = sigmoid(2z), one exponential)
    rope(x, p, table)   = concat(x1·cos − x2·sin, x2·cos + x1·sin)   cos, sin = table[p] halves

A renderer then needs only the primitives; the generic fusion puts them back together into
one loop kernel per chain. Runs inside fused groups too (after the specific fusions).
"""

from __future__ import annotations

import math

import torch

from infergen.compiler.ir import TOKENS, Graph, Namer, Node, Op, Value
from infergen.compiler.passes import PASSES, Pass, Rule
from infergen.compiler.rewrite import replace
from infergen.compiler.shapes import infer


class _Builder:
    """Emits primitive nodes with fresh names; `out=` reuses the replaced node's value."""

    def __init__(self, graph: Graph, stem: str):
        self.namer = Namer({v.name for v in _all_values(graph)})
        self.stem = stem
        self.nodes: list[Node] = []

    def __call__(self, op: Op, *inputs: Value, out: Value | None = None, **attrs) -> Value:
        ((shape, dtype),) = infer(op, inputs, attrs)
        value = out or Value(self.namer(f"{self.stem}.{op.label}"), shape, dtype)
        self.nodes.append(Node(op, inputs, (value,), attrs))
        return value


def _all_values(graph: Graph):
    yield from graph.values()
    for node in graph.nodes:
        if node.op is Op.FUSED:
            yield from _all_values(node.attrs["graph"])


def _lowerable(node: Node) -> bool:
    return node.op in _LOWERINGS and all(
        v is None or v.dtype in (torch.float32, torch.int64) for v in node.inputs
    )


def _rms(b: _Builder, x: Value, weight: Value, eps: float, out: Value) -> None:
    mean = b(Op.MEAN, b(Op.MUL, x, x))
    inv = b(Op.RSQRT, b(Op.ADD_SCALAR, mean, value=eps))
    b(Op.MUL, b(Op.MUL, x, inv), weight, out=out)


def _lower_rms_norm(b: _Builder, node: Node) -> None:
    x, weight = node.inputs
    _rms(b, x, weight, node.attrs["eps"], node.outputs[0])


def _lower_add_rms_norm(b: _Builder, node: Node) -> None:
    h, delta, weight = node.inputs
    y, total = node.outputs
    b(Op.ADD, h, delta, out=total)
    _rms(b, total, weight, node.attrs["eps"], y)


def _gate_up(b: _Builder, node: Node) -> tuple[Value, Value]:
    """The halves of a gated activation's input: gate x[..., :n], up x[..., n:]."""
    (x,) = node.inputs
    last, n = x.rank - 1, x.shape[-1] // 2
    return (
        b(Op.SLICE, x, dim=last, start=0, stop=n),
        b(Op.SLICE, x, dim=last, start=n, stop=2 * n),
    )


def _lower_silu_mul(b: _Builder, node: Node) -> None:
    gate, up = _gate_up(b, node)
    b(Op.MUL, b(Op.MUL, gate, b(Op.SIGMOID, gate)), up, out=node.outputs[0])


GELU_TANH_SCALE = 2 * math.sqrt(2 / math.pi)  # sigmoid(2z) = 0.5·(1 + tanh(z))


def _lower_gelu_mul(b: _Builder, node: Node) -> None:
    gate, up = _gate_up(b, node)
    cubic = b(Op.ADD_SCALAR, b(Op.MUL_SCALAR, b(Op.MUL, gate, gate), value=0.044715), value=1.0)
    inner = b(Op.MUL_SCALAR, b(Op.MUL, gate, cubic), value=GELU_TANH_SCALE)
    b(Op.MUL, b(Op.MUL, gate, b(Op.SIGMOID, inner)), up, out=node.outputs[0])


def _lower_rope(b: _Builder, node: Node) -> None:
    x, positions, table = node.inputs
    dim = x.shape[-1]
    half = dim // 2
    rows = b(Op.VIEW, b(Op.GATHER_ROWS, table, positions), shape=(TOKENS, 1, dim))
    cos = b(Op.SLICE, rows, dim=2, start=0, stop=half)
    sin = b(Op.SLICE, rows, dim=2, start=half, stop=dim)
    x1 = b(Op.SLICE, x, dim=2, start=0, stop=half)
    x2 = b(Op.SLICE, x, dim=2, start=half, stop=dim)
    first = b(Op.SUB, b(Op.MUL, x1, cos), b(Op.MUL, x2, sin))
    second = b(Op.ADD, b(Op.MUL, x2, cos), b(Op.MUL, x1, sin))
    b(Op.CONCAT, first, second, dim=2, out=node.outputs[0])


_LOWERINGS = {
    Op.RMS_NORM: _lower_rms_norm,
    Op.ADD_RMS_NORM: _lower_add_rms_norm,
    Op.SILU_MUL: _lower_silu_mul,
    Op.GELU_MUL: _lower_gelu_mul,
    Op.ROPE: _lower_rope,
}


def _match(node: Node, graph: Graph):
    return node if _lowerable(node) else None


def _rewrite(graph: Graph, node: Node) -> bool:
    builder = _Builder(graph, node.outputs[0].name)
    _LOWERINGS[node.op](builder, node)
    replace(graph, [node], builder.nodes)
    return True


PASSES.register("lower", Pass("lower", (Rule("lower", _match, _rewrite),), into_groups=True))
