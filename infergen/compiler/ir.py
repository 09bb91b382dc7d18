"""The compiler's IR: a small dataflow graph of tensor ops.

A `Graph` is a list of `Node`s in execution order over SSA `Value`s. Each value has a shape of
`Dim`s — an int for a dimension fixed by the model config (hidden size, heads), or a `Sym` for
one that changes per step (`T` tokens in the batch) — a dtype, and, for weights and caches,
the format its elements are stored in. Mutation does not exist in the IR: an op that updates
a buffer in place in the engine (the residual add of RMSNorm, the KV-cache store) returns a
new value, and later readers use that one.

Ops are an enum grouped by kind (`OpKind`): the passes match on ops and kinds, the renderers
(C, Triton) on the kind first. Coarse ops (RMS_NORM, ROPE, SILU_MUL, GELU_MUL) are what capture
sees in the model code; passes may lower them to the pointwise / reduction primitives they are
made of.

`Graph.dump()` is the readable text form, one node per line:

    %x, %h.1 = add_rms_norm(%h, %delta, %attn_norm) eps=1e-05   # f32[T,64], f32[T,64]
"""

from __future__ import annotations

import enum
import itertools
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from math import prod
from typing import Any

import torch


class Sym(str):
    """A dynamic dimension, by name (e.g. "T": tokens in the step)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Sym({str(self)!r})"


Dim = int | Sym
Shape = tuple[Dim, ...]

TOKENS = Sym("T")


class OpKind(enum.Enum):
    POINTWISE = "pointwise"  # elementwise over broadcast inputs
    REDUCTION = "reduction"  # over the last dimension (row reductions, norms)
    MATMUL = "matmul"  # x · Wᵀ (+ b), W in its storage format
    ATTENTION = "attention"  # paged attention over the KV cache
    KV_STORE = "kv_store"  # writes K / V into cache slots
    QUANTIZE = "quantize"  # values ↔ codes of a format
    LAYOUT = "layout"  # views, slices, concatenation, row gathers: no arithmetic
    CUSTOM = "custom"  # fused groups and anything a renderer treats as a black box


class Op(enum.Enum):
    """(name, kind, number of outputs)."""

    # pointwise primitives
    ADD = ("add", OpKind.POINTWISE, 1)
    SUB = ("sub", OpKind.POINTWISE, 1)
    MUL = ("mul", OpKind.POINTWISE, 1)
    NEG = ("neg", OpKind.POINTWISE, 1)
    SIGMOID = ("sigmoid", OpKind.POINTWISE, 1)
    RSQRT = ("rsqrt", OpKind.POINTWISE, 1)
    ADD_SCALAR = ("add_scalar", OpKind.POINTWISE, 1)  # attrs: value
    MUL_SCALAR = ("mul_scalar", OpKind.POINTWISE, 1)  # attrs: value
    CAST = ("cast", OpKind.POINTWISE, 1)  # attrs: dtype
    # coarse pointwise ops the model calls
    SILU_MUL = ("silu_mul", OpKind.POINTWISE, 1)  # silu(x[..., :n]) · x[..., n:]
    GELU_MUL = ("gelu_mul", OpKind.POINTWISE, 1)  # gelu_tanh(x[..., :n]) · x[..., n:]
    ROPE = ("rope", OpKind.POINTWISE, 1)  # (x, positions, cos_sin table)
    # reductions over the last dimension (keepdim)
    SUM = ("sum", OpKind.REDUCTION, 1)
    MEAN = ("mean", OpKind.REDUCTION, 1)
    RMS_NORM = ("rms_norm", OpKind.REDUCTION, 1)  # (x, weight) attrs: eps
    ADD_RMS_NORM = ("add_rms_norm", OpKind.REDUCTION, 2)  # (h, delta, weight) → (y, h + delta)
    # matmul
    LINEAR = ("linear", OpKind.MATMUL, 1)  # (x, weight[, bias]) attrs: format
    # attention and cache
    KV_STORE = ("kv_store", OpKind.KV_STORE, 2)  # (k, v, k_cache, v_cache, slots) → caches
    # (q, k, v, k_cache, v_cache, plan, slots[, k_scale, v_scale, k_shift][, sinks])
    ATTENTION = ("attention", OpKind.ATTENTION, 1)
    # quantization
    QUANTIZE_ACT = ("quantize_act", OpKind.QUANTIZE, 1)  # attrs: fmt, granularity, quantizer
    # layout
    VIEW = ("view", OpKind.LAYOUT, 1)  # attrs: shape
    SLICE = ("slice", OpKind.LAYOUT, 1)  # attrs: dim, start, stop
    CONCAT = ("concat", OpKind.LAYOUT, 1)  # attrs: dim
    GATHER_ROWS = ("gather_rows", OpKind.LAYOUT, 1)  # (table, index): table[index]
    # a mixture-of-experts feed-forward (x, the layer's MoE module): run by the module itself
    MOE = ("moe", OpKind.CUSTOM, 1)
    # a token mixer capture keeps whole (x, the layer's mixer module, the layer's view of the
    # step, its cache layer): a recurrent state mixer, latent attention, attention with parts
    # capture has no ops for — the module runs itself (the per-layer fallback). attrs: mixer
    MIXER = ("mixer", OpKind.CUSTOM, 1)
    # fused groups (passes build them; attrs: graph, the group's own subgraph)
    FUSED = ("fused", OpKind.CUSTOM, -1)

    def __init__(self, label: str, kind: OpKind, outputs: int):
        self.label, self.kind, self.outputs = label, kind, outputs


# attributes that hold runtime objects (a fused group's subgraph, an input quantizer with its
# calibrated scale): not printed, not part of what a kernel is specialised on
RUNTIME_ATTRS = ("graph", "quantizer")

# what a value is: the activations flow; weights and the cos/sin table are constants of the
# model; caches are state that outlives the step; "opaque" values (the attention plan) are
# runtime objects the graph passes through without looking inside
ROLES = ("activation", "input", "weight", "cache", "opaque")


@dataclass(eq=False)
class Value:
    name: str
    shape: Shape
    dtype: torch.dtype | None  # None for opaque values
    role: str = "activation"
    format: str | None = None  # weights / caches: the storage format ("int8", "fp8_e4m3", ...)

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"value {self.name}: role {self.role!r}, expected one of {ROLES}")

    @property
    def rank(self) -> int:
        return len(self.shape)

    def type_str(self) -> str:
        if self.dtype is None:
            return self.role
        dims = ",".join(str(d) for d in self.shape)
        fmt = f":{self.format}" if self.format else ""
        return f"{dtype_name(self.dtype)}[{dims}]{fmt}"

    def __repr__(self) -> str:
        return f"%{self.name}: {self.type_str()}"


@dataclass(eq=False)
class Node:
    op: Op
    inputs: tuple[Value | None, ...]  # None: an optional input left out (a missing bias)
    outputs: tuple[Value, ...]
    attrs: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        outs = ", ".join(f"%{v.name}" for v in self.outputs)
        ins = ", ".join("None" if v is None else f"%{v.name}" for v in self.inputs)
        attrs = "".join(
            f" {k}={_attr_str(v)}" for k, v in self.attrs.items() if k not in RUNTIME_ATTRS
        )
        types = ", ".join(v.type_str() for v in self.outputs)
        return f"{outs} = {self.op.label}({ins}){attrs}   # {types}"


@dataclass(eq=False)
class Graph:
    name: str
    inputs: list[Value]
    nodes: list[Node]
    outputs: list[Value]

    def values(self) -> Iterator[Value]:
        yield from self.inputs
        for node in self.nodes:
            yield from node.outputs

    def producers(self) -> dict[int, Node]:
        """id(value) → the node that computes it (inputs have none)."""
        return {id(v): node for node in self.nodes for v in node.outputs}

    def users(self) -> dict[int, list[Node]]:
        """id(value) → the nodes that read it, in order."""
        found: dict[int, list[Node]] = {}
        for node in self.nodes:
            for v in node.inputs:
                if v is not None:
                    found.setdefault(id(v), []).append(node)
        return found

    def count(self) -> Counter[str]:
        return Counter(node.op.label for node in self.nodes)

    def dump(self) -> str:
        header = ", ".join(repr(v) for v in self.inputs)
        lines = [f"graph {self.name}({header}):"]
        for node in self.nodes:
            lines.append("  " + node.line())
            sub = node.attrs.get("graph")
            if isinstance(sub, Graph):
                lines.extend("    " + line for line in sub.dump().splitlines())
        lines.append("  return " + ", ".join(f"%{v.name}" for v in self.outputs))
        return "\n".join(lines)

    def canonical(self) -> str:
        """The dump with values renamed v0, v1, ... in order of definition and the graph
        unnamed: equal for graphs that compute the same thing (the JIT cache key)."""
        saved = [(v, v.name) for v in _all_values(self)]
        try:
            for i, (value, _) in enumerate(saved):
                value.name = f"v{i}"
            name, self.name = self.name, "g"
            try:
                return self.dump()
            finally:
                self.name = name
        finally:
            for value, name in saved:
                value.name = name


def _all_values(graph: Graph) -> list[Value]:
    seen: dict[int, Value] = {}
    for value in graph.values():
        seen.setdefault(id(value), value)
    for node in graph.nodes:
        if node.op is Op.FUSED:
            for value in _all_values(node.attrs["graph"]):
                seen.setdefault(id(value), value)
    return list(seen.values())


class Namer:
    """Unique value names: the preferred name, then name.1, name.2, ..."""

    def __init__(self, taken: set[str] | None = None):
        self.taken = set(taken or ())

    def __call__(self, name: str) -> str:
        name = name or "v"
        if name not in self.taken:
            self.taken.add(name)
            return name
        for i in itertools.count(1):
            candidate = f"{name}.{i}"
            if candidate not in self.taken:
                self.taken.add(candidate)
                return candidate
        raise AssertionError("unreachable")


_DTYPE_NAMES = {
    torch.float32: "f32",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.float64: "f64",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.bool: "bool",
    torch.float8_e4m3fn: "f8e4m3",
}


def attention_parts(inputs: tuple, attrs: dict[str, Any]) -> tuple[tuple, tuple, Any]:
    """An ATTENTION node's inputs (or their runtime values) in three parts: (q, k, v, k_cache,
    v_cache, plan, slots); a scaled KV format's (k_scale, v_scale, k_shift), or (); and the
    learned sink logits [heads] (attrs "sinks": GPT-OSS), or None."""
    rest = tuple(inputs[7:])
    if attrs.get("sinks"):
        return tuple(inputs[:7]), rest[:-1], rest[-1]
    return tuple(inputs[:7]), rest, None


def dtype_name(dtype: torch.dtype) -> str:
    return _DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


def _attr_str(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, tuple):
        return "(" + ",".join(str(v) for v in value) + ")"
    return str(value)


def numel(shape: Shape) -> tuple[Counter[str], int]:
    """The element count as (symbols with multiplicity, static factor)."""
    symbols = Counter(str(d) for d in shape if isinstance(d, Sym))
    return symbols, prod(d for d in shape if not isinstance(d, Sym))


def resolve_view(source: Shape, target: tuple[Dim, ...]) -> Shape:
    """The target shape of a view with at most one -1 resolved; ValueError when the element
    counts cannot match (symbolic factors must appear on both sides)."""
    src_syms, src_static = numel(source)
    unknown = [i for i, d in enumerate(target) if not isinstance(d, Sym) and d == -1]
    if len(unknown) > 1:
        raise ValueError(f"view to {target}: more than one -1")
    known = tuple(d for d in target if isinstance(d, Sym) or d != -1)
    dst_syms, dst_static = numel(known)
    if src_syms != dst_syms:
        raise ValueError(f"view {source} → {target}: dynamic dimensions differ")
    if unknown:
        if dst_static == 0 or src_static % dst_static:
            raise ValueError(f"view {source} → {target}: {src_static} elements do not divide")
        out = list(target)
        out[unknown[0]] = src_static // dst_static
        return tuple(out)
    if src_static != dst_static:
        raise ValueError(f"view {source} → {target}: element counts differ")
    return tuple(target)


def bind_shape(shape: Shape, sizes: dict[str, int]) -> tuple[int, ...]:
    """A concrete shape: each Sym replaced by its size."""
    return tuple(sizes[str(d)] if isinstance(d, Sym) else d for d in shape)
