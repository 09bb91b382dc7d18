"""Run an IR graph with each op's plain-torch reference: the oracle every pass and every
generated kernel is compared against.

`run(graph, env)` takes the runtime value of each graph input by name (tensors; a `Linear`
for a projection's weight, read back dense; the attention plan) and returns the outputs in
order. Nothing is updated in place: a KV store returns new caches.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from infergen.compiler.ir import Graph, Op, Sym, attention_parts, bind_shape
from infergen.kvcache.kv_format import KV_FORMATS, encode
from infergen.kvcache.paged_cache import KVLayer
from infergen.layers import moe
from infergen.layers.linear import Linear
from infergen.ops import gelu_mul, kv_store, linear, rms_norm, rope, silu_mul
from infergen.ops.attention_operands import ATTENTION_OPERANDS
from infergen.ops.attention_sinks import SinkCore
from infergen.ops.paged_attention import decode_attention, paged_attention

Executor = Callable[[list[Any], dict[str, Any], dict[str, int]], tuple[Any, ...]]
EXECUTORS: dict[Op, Executor] = {}


def executor(*ops: Op) -> Callable[[Executor], Executor]:
    def register(fn: Executor) -> Executor:
        for op in ops:
            EXECUTORS[op] = fn
        return fn

    return register


def bind_sizes(graph: Graph, env: dict[str, Any]) -> dict[str, int]:
    """The size of each dynamic dimension, read off the input tensors (which must agree)."""
    sizes: dict[str, int] = {}
    for value in graph.inputs:
        tensor = env[value.name]
        if not isinstance(tensor, torch.Tensor) or value.role == "weight":
            continue
        if tensor.dim() != value.rank:
            raise ValueError(f"input %{value.name}: rank {tensor.dim()}, graph {value.type_str()}")
        for dim, size in zip(value.shape, tensor.shape, strict=True):
            if isinstance(dim, Sym):
                if sizes.setdefault(str(dim), size) != size:
                    raise ValueError(
                        f"input %{value.name}: {dim} = {size}, elsewhere {sizes[str(dim)]}"
                    )
            elif dim != size:
                raise ValueError(
                    f"input %{value.name}: shape {tuple(tensor.shape)}, graph {value.type_str()}"
                )
    return sizes


def run(
    graph: Graph, env: dict[str, Any], run_node: Callable[..., tuple] | None = None
) -> list[Any]:
    """The graph's outputs for the input values `env` (name → runtime value). `run_node(node,
    args, sizes)` executes each node instead of the references (the engine's runtime)."""
    values = _execute(graph, env, run_node)
    return [values[id(v)] for v in graph.outputs]


def values_of(graph: Graph, env: dict[str, Any]) -> dict[str, Any]:
    """Every value of the graph by name (inputs and intermediates): for debugging a pass."""
    values = _execute(graph, env)
    return {v.name: values[id(v)] for v in graph.values()}


def _execute(
    graph: Graph, env: dict[str, Any], run_node: Callable[..., tuple] | None = None
) -> dict[int, Any]:
    missing = [v.name for v in graph.inputs if v.name not in env]
    if missing:
        raise ValueError(f"run {graph.name}: no values for inputs {missing}")
    sizes = bind_sizes(graph, env)
    values: dict[int, Any] = {id(v): env[v.name] for v in graph.inputs}
    for node in graph.nodes:
        args = [None if v is None else values[id(v)] for v in node.inputs]
        if run_node is not None:
            results = run_node(node, args, sizes)
        else:
            results = EXECUTORS[node.op](args, node.attrs, sizes)
        for value, result in zip(node.outputs, results, strict=True):
            values[id(value)] = result
    return values


def dense(weight: Any) -> torch.Tensor:
    return weight.dense_weight() if isinstance(weight, Linear) else weight


_BINARY = {Op.ADD: torch.add, Op.SUB: torch.sub, Op.MUL: torch.mul}
_UNARY = {Op.NEG: torch.neg, Op.SIGMOID: torch.sigmoid, Op.RSQRT: torch.rsqrt}


for _op, _fn in _BINARY.items():
    EXECUTORS[_op] = lambda args, attrs, sizes, fn=_fn: (fn(args[0], args[1]),)
for _op, _fn in _UNARY.items():
    EXECUTORS[_op] = lambda args, attrs, sizes, fn=_fn: (fn(args[0]),)


@executor(Op.ADD_SCALAR)
def _add_scalar(args, attrs, sizes):
    return (args[0] + attrs["value"],)


@executor(Op.MUL_SCALAR)
def _mul_scalar(args, attrs, sizes):
    return (args[0] * attrs["value"],)


@executor(Op.CAST)
def _cast(args, attrs, sizes):
    return (args[0].to(attrs["dtype"]),)


@executor(Op.SILU_MUL)
def _silu_mul(args, attrs, sizes):
    return (silu_mul.reference(args[0]),)


@executor(Op.GELU_MUL)
def _gelu_mul(args, attrs, sizes):
    return (gelu_mul.reference(args[0]),)


@executor(Op.ROPE)
def _rope(args, attrs, sizes):
    x, positions, table = args
    return (rope.reference(x, positions, table),)


@executor(Op.SUM)
def _sum(args, attrs, sizes):
    return (args[0].sum(-1, keepdim=True),)


@executor(Op.MEAN)
def _mean(args, attrs, sizes):
    return (args[0].mean(-1, keepdim=True),)


@executor(Op.RMS_NORM)
def _rms_norm(args, attrs, sizes):
    x, weight = args
    return (rms_norm.reference(x, weight, attrs["eps"]),)


@executor(Op.ADD_RMS_NORM)
def _add_rms_norm(args, attrs, sizes):
    h, delta, weight = args
    h = h + delta
    return rms_norm.reference(h, weight, attrs["eps"]), h


@executor(Op.LINEAR)
def _linear(args, attrs, sizes):
    x, weight, bias = args
    if attrs.get("quantizer") is not None:  # an input quantizer fused into the GEMM
        x = attrs["quantizer"](x)
    return (linear.reference(x, dense(weight).to(x.dtype), bias),)


def kv_layer(k_cache, v_cache, scales: list, kv_format: str) -> KVLayer | None:
    """The KVLayer the engine's ops take for a scaled cache format (None: unquantized)."""
    if not scales:
        return None
    k_scale, v_scale, k_shift = scales
    return KVLayer(k_cache, v_cache, k_scale, v_scale, KV_FORMATS.get(kv_format), k_shift)


@executor(Op.KV_STORE)
def _kv_store(args, attrs, sizes):
    k, v, k_cache, v_cache, slots, *scales = args
    k_cache, v_cache = k_cache.clone(), v_cache.clone()
    if scales:  # the format's codes of (x - shift) / scale
        fmt = KV_FORMATS.get(attrs["format"])
        k, v = encode(k, scales[0], fmt, scales[2]), encode(v, scales[1], fmt)
    kv_store.reference(k, v, k_cache, v_cache, slots)
    return k_cache, v_cache


@executor(Op.ATTENTION)
def _attention(args, attrs, sizes):
    (q, k, v, k_cache, v_cache, plan, slots), scales, sinks = attention_parts(args, attrs)
    core = attention_core(attrs, sinks)
    kv = kv_layer(k_cache, v_cache, scales, attrs.get("kv_format", "f32"))
    scale = attrs["scale"]
    decode = functools.partial(decode_attention, core=core)
    return (paged_attention(q, k, v, k_cache, v_cache, plan, scale, decode, kv, core, slots),)


def attention_core(attrs: dict[str, Any], sinks) -> Callable:
    """The attention core of an ATTENTION node: its operands' row, or the learned sinks'."""
    return ATTENTION_OPERANDS.get(attrs["operands"]) if sinks is None else SinkCore(sinks)


@executor(Op.MOE)
def _moe(args, attrs, sizes):
    x, module = args
    return (moe.reference(x, module),)


@executor(Op.MIXER)
def _mixer(args, attrs, sizes):
    x, module, step, cache = args  # (the module is its own reference: the per-op path's)
    return (module(x, step, cache),)


@executor(Op.QUANTIZE_ACT)
def _quantize_act(args, attrs, sizes):
    return (attrs["quantizer"](args[0]),)


@executor(Op.VIEW)
def _view(args, attrs, sizes):
    return (args[0].reshape(bind_shape(attrs["shape"], sizes)),)


@executor(Op.SLICE)
def _slice(args, attrs, sizes):
    return (args[0].narrow(attrs["dim"], attrs["start"], attrs["stop"] - attrs["start"]),)


@executor(Op.CONCAT)
def _concat(args, attrs, sizes):
    return (torch.cat(args, dim=attrs["dim"]),)


@executor(Op.GATHER_ROWS)
def _gather_rows(args, attrs, sizes):
    table, index = args
    return (table.index_select(0, index),)


@executor(Op.FUSED)
def _fused(args, attrs, sizes):
    sub: Graph = attrs["graph"]
    return tuple(run(sub, {v.name: a for v, a in zip(sub.inputs, args, strict=True)}))
