"""Shape and dtype rules of the IR ops: `infer(op, inputs, attrs)` → [(shape, dtype)] per
output. Capture creates values with these rules and `verify()` re-derives every node's
outputs with them, so a pass that rewires a node wrongly is caught between passes.

Dimensions are ints or `Sym`s; broadcasting is numpy's (equal, or 1), with a symbolic
dimension matching only itself or 1.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from infergen.compiler.ir import (
    Dim,
    Graph,
    Op,
    Shape,
    Sym,
    Value,
    attention_parts,
    resolve_view,
)

Result = list[tuple[Shape, torch.dtype | None]]
Rule = Callable[[tuple[Value | None, ...], dict[str, Any]], Result]
SHAPE_RULES: dict[Op, Rule] = {}


class ShapeError(ValueError):
    """An op applied to inputs whose shapes / dtypes it does not accept."""


def rule(*ops: Op) -> Callable[[Rule], Rule]:
    def register(fn: Rule) -> Rule:
        for op in ops:
            SHAPE_RULES[op] = fn
        return fn

    return register


def infer(op: Op, inputs: tuple[Value | None, ...], attrs: dict[str, Any]) -> Result:
    try:
        return SHAPE_RULES[op](inputs, attrs)
    except ShapeError as error:
        args = ", ".join("None" if v is None else repr(v) for v in inputs)
        raise ShapeError(f"{op.label}({args}): {error}") from None


def _need(condition: bool, message: str) -> None:
    if not condition:
        raise ShapeError(message)


def broadcast(a: Shape, b: Shape) -> Shape:
    out: list[Dim] = []
    for i in range(max(len(a), len(b))):
        da = a[len(a) - 1 - i] if i < len(a) else 1
        db = b[len(b) - 1 - i] if i < len(b) else 1
        _need(da == db or da == 1 or db == 1, f"shapes {a} and {b} do not broadcast")
        out.append(db if da == 1 else da)
    return tuple(reversed(out))


@rule(Op.ADD, Op.SUB, Op.MUL)
def _binary(inputs, attrs) -> Result:
    a, b = inputs
    _need(a.dtype == b.dtype, f"dtypes {a.dtype} and {b.dtype} differ")
    return [(broadcast(a.shape, b.shape), a.dtype)]


@rule(Op.NEG, Op.SIGMOID, Op.RSQRT, Op.ADD_SCALAR, Op.MUL_SCALAR, Op.QUANTIZE_ACT)
def _unary(inputs, attrs) -> Result:
    (x,) = inputs
    return [(x.shape, x.dtype)]


@rule(Op.CAST)
def _cast(inputs, attrs) -> Result:
    return [(inputs[0].shape, attrs["dtype"])]


@rule(Op.SILU_MUL, Op.GELU_MUL)
def _gated_act(inputs, attrs) -> Result:
    (x,) = inputs
    last = x.shape[-1]
    _need(isinstance(last, int) and not isinstance(last, Sym) and last % 2 == 0, "odd last dim")
    return [((*x.shape[:-1], last // 2), x.dtype)]


@rule(Op.ROPE)
def _rope(inputs, attrs) -> Result:
    x, positions, table = inputs
    _need(x.rank == 3, "x must be [tokens, heads, head_dim]")
    _need(positions.shape == x.shape[:1], f"positions {positions.shape} for {x.shape[0]} tokens")
    _need(table.shape[-1] == x.shape[-1], f"table {table.shape} for head_dim {x.shape[-1]}")
    return [(x.shape, x.dtype)]


@rule(Op.SUM, Op.MEAN)
def _row_reduce(inputs, attrs) -> Result:
    (x,) = inputs
    return [((*x.shape[:-1], 1), x.dtype)]


def _norm_weight(x: Value, weight: Value) -> None:
    _need(weight.shape == x.shape[-1:], f"weight {weight.shape} for rows of {x.shape[-1]}")


@rule(Op.RMS_NORM)
def _rms_norm(inputs, attrs) -> Result:
    x, weight = inputs
    _norm_weight(x, weight)
    return [(x.shape, x.dtype)]


@rule(Op.ADD_RMS_NORM)
def _add_rms_norm(inputs, attrs) -> Result:
    h, delta, weight = inputs
    _need(delta.shape == h.shape and delta.dtype == h.dtype, f"delta {delta!r} for {h!r}")
    _norm_weight(h, weight)
    return [(h.shape, h.dtype), (h.shape, h.dtype)]


@rule(Op.LINEAR)
def _linear(inputs, attrs) -> Result:
    x, weight, bias = inputs
    out_features, in_features = weight.shape
    _need(
        x.shape[-1] == in_features,
        f"x rows of {x.shape[-1]}, weight [{out_features}, {in_features}]",
    )
    _need(bias is None or bias.shape == (out_features,), f"bias {bias!r}")
    return [((*x.shape[:-1], out_features), x.dtype)]


@rule(Op.MOE)
def _moe(inputs, attrs) -> Result:
    x, module = inputs
    _need(x.rank == 2, f"x {x.shape}: expected [tokens, hidden]")
    return [(x.shape, x.dtype)]


@rule(Op.MIXER)
def _mixer(inputs, attrs) -> Result:
    x, module, step, cache = inputs
    _need(x.rank == 2, f"x {x.shape}: expected [tokens, hidden]")
    return [(x.shape, x.dtype)]


@rule(Op.KV_STORE)
def _kv_store(inputs, attrs) -> Result:
    k, v, k_cache, v_cache, slots, *scales = inputs
    _scales(k_cache, scales)
    _need(k.shape == v.shape and k.rank == 3, f"k {k.shape}, v {v.shape}")
    _need(k_cache.shape[2:] == k.shape[1:], f"cache {k_cache.shape} for k {k.shape}")
    _need(slots.shape == k.shape[:1], f"slots {slots.shape} for {k.shape[0]} tokens")
    return [(k_cache.shape, k_cache.dtype), (v_cache.shape, v_cache.dtype)]


@rule(Op.ATTENTION)
def _attention(inputs, attrs) -> Result:
    (q, k, v, k_cache, v_cache, plan, slots), scales, sinks = attention_parts(inputs, attrs)
    _scales(k_cache, list(scales))
    _need(sinks is None or sinks.shape == (q.shape[1],), f"sinks {sinks!r} for {q.shape[1]} heads")
    _need(q.rank == 3 and k.shape[1:] == k_cache.shape[2:], f"q {q.shape}, cache {k_cache.shape}")
    _need(q.shape[1] % k.shape[1] == 0, f"{q.shape[1]} heads over {k.shape[1]} KV heads")
    return [(q.shape, q.dtype)]


def _scales(cache: Value, scales: list[Value]) -> None:
    """A scaled KV format comes with its K / V scales [kv_heads] and key shift [kv_heads, d]."""
    if cache.format is None:
        _need(not scales, "scales for an unquantized cache")
        return
    _need(len(scales) == 3, f"a {cache.format} cache needs k_scale, v_scale, k_shift")
    heads, dim = cache.shape[2], cache.shape[3]
    k_scale, v_scale, k_shift = scales
    _need(k_scale.shape == v_scale.shape == (heads,), f"scales {k_scale!r}, {v_scale!r}")
    _need(k_shift.shape == (heads, dim), f"key shift {k_shift!r}")


@rule(Op.VIEW)
def _view(inputs, attrs) -> Result:
    (x,) = inputs
    try:
        return [(resolve_view(x.shape, attrs["shape"]), x.dtype)]
    except ValueError as error:
        raise ShapeError(str(error)) from None


@rule(Op.SLICE)
def _slice(inputs, attrs) -> Result:
    (x,) = inputs
    dim, start, stop = attrs["dim"], attrs["start"], attrs["stop"]
    size = x.shape[dim]
    _need(not isinstance(size, Sym), f"slice of dynamic dimension {size}")
    _need(0 <= start < stop <= size, f"slice {start}:{stop} of {size}")
    shape = list(x.shape)
    shape[dim] = stop - start
    return [(tuple(shape), x.dtype)]


@rule(Op.CONCAT)
def _concat(inputs, attrs) -> Result:
    dim = attrs["dim"]
    first = inputs[0]
    rest = [s for i, s in enumerate(first.shape) if i != dim % first.rank]
    total = 0
    for x in inputs:
        _need(x.dtype == first.dtype, "dtypes differ")
        _need([s for i, s in enumerate(x.shape) if i != dim % x.rank] == rest, "shapes differ")
        size = x.shape[dim]
        _need(not isinstance(size, Sym), "concat along a dynamic dimension")
        total += size
    shape = list(first.shape)
    shape[dim] = total
    return [(tuple(shape), first.dtype)]


@rule(Op.GATHER_ROWS)
def _gather_rows(inputs, attrs) -> Result:
    table, index = inputs
    _need(index.rank == 1, f"index {index.shape}")
    return [((index.shape[0], *table.shape[1:]), table.dtype)]


@rule(Op.FUSED)
def _fused(inputs, attrs) -> Result:
    sub: Graph = attrs["graph"]
    _need(len(sub.inputs) == len(inputs), "fused group inputs differ from its graph's")
    for outer, inner in zip(inputs, sub.inputs, strict=True):
        _need(outer.shape == inner.shape and outer.dtype == inner.dtype, f"{outer!r} ≠ {inner!r}")
    return [(v.shape, v.dtype) for v in sub.outputs]
