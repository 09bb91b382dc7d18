"""C renderer: a fused group of pointwise / row-reduction / layout primitives → one C function
that makes a single pass over the token rows.

    void <name>(const void **in, const long *row_stride, void **out, long T, int threads)

`in[i]` is the group's i-th input: a [T, ...] tensor (its rows `row_stride[i]` elements apart,
each row contiguous), a weight without the T dimension (broadcast over the rows, contiguous),
or an int64 [T] index. `out[j]` is the j-th output, contiguous [T, ...]. Rows are split over
`threads` OpenMP threads when the step has enough of them to pay for the fork.

Inside a row every value lives in a small stack array (L1-resident) — or directly in the output
row when it is a group output — and each op is a loop over the value's row elements, written
so the C compiler vectorises the innermost one. Slices and views are not copied: a value is a
`Ref` (base array, offset, strides) and a view or slice only changes the Ref; a concat copies.

Static dimensions are constants in the source (the kernel is specialised for them); T is a
parameter. Numerics follow the references: fp32 throughout, a row sum accumulated in fp32
(in REDUCE_LANES partial sums, added up at the end).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import torch

from infergen.compiler.expressions import ELEMENTWISE, SCALAR_OPS, expression
from infergen.compiler.ir import TOKENS, Graph, Op, Sym, Value

# row elements below which a step runs on one thread (the fork costs ~µs)
PARALLEL_MIN_ELEMENTS = 1 << 14

# partial sums of a row reduction (a vector register of fp32 with AVX-512)
REDUCE_LANES = 16


@dataclass(frozen=True)
class Variant:
    """A way to render a group: the output elements of a step from which rows are split over
    threads (None: never), and the row tile — a row's ops run a tile of columns at a time, so
    a row's intermediates stay in L1 (0: whole rows; a group that is not one elementwise chain
    over a single row shape ignores it)."""

    parallel_min: int | None
    tile: int = 0


# kernel variants (what the tuner, tune.py, chooses between per token-count bucket)
VARIANTS: dict[str, Variant] = {
    "default": Variant(PARALLEL_MIN_ELEMENTS),
    "serial": Variant(None),
    "parallel": Variant(0),
    "tile256": Variant(PARALLEL_MIN_ELEMENTS, 256),
    "tile1024": Variant(PARALLEL_MIN_ELEMENTS, 1024),
}


class CodegenError(ValueError):
    """A group the C renderer has no code for (the runtime then runs it op by op)."""


@dataclass(frozen=True)
class Ref:
    """Where a value's elements are, within one row: base[offset + Σ index_d · strides_d]."""

    base: str
    offset: int
    shape: tuple[int, ...]  # per-row dims (a weight: all its dims)
    strides: tuple[int, ...]
    rowed: bool  # True: a [T, ...] value (one row of it); False: broadcast over rows

    def contiguous(self) -> bool:
        return self.strides == _contiguous(self.shape)


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def _row_shape(value: Value) -> tuple[tuple[int, ...], bool]:
    if value.rank >= 1 and value.shape[0] == TOKENS:
        rest = value.shape[1:]
        rowed = True
    else:
        rest, rowed = value.shape, False
    if any(isinstance(d, Sym) for d in rest):
        raise CodegenError(f"%{value.name}: dynamic dimension other than the leading T")
    return tuple(rest), rowed


def _float(value: float) -> str:
    return f"{float(value)!r}f"  # repr round-trips; "1e-05f" and "0.5f" are C floats


class _Renderer:
    def __init__(self, graph: Graph, name: str, variant: Variant, strided_out: bool = False):
        self.graph, self.name, self.parallel_min = graph, name, variant.parallel_min
        self.strided_out = strided_out
        # the row tile (0: none): the columns [c0, c1) of the one row shape `tile_row`
        self.tile_row = tile_row(graph)
        self.tile = variant.tile if self.tile_row and variant.tile < self.tile_row[0] else 0
        self.refs: dict[int, Ref] = {}
        self.lines: list[str] = []
        self.locals: list[str] = []
        self.counter = 0
        self.index_inputs: dict[int, str] = {}

    def fresh(self, stem: str) -> str:
        self.counter += 1
        return f"{stem}{self.counter}"

    # ---- element access ----------------------------------------------------------------
    def element(self, ref: Ref, out_shape: tuple[int, ...], idx: list[str]) -> str:
        """C expression of `ref`'s element at the output row index `idx` (right-aligned
        numpy broadcasting: size-1 dims read index 0, missing leading dims are absent)."""
        terms = [str(ref.offset)] if ref.offset else []
        lead = len(out_shape) - len(ref.shape)
        if lead < 0:
            raise CodegenError(f"{ref.base}: rank above its consumer's")
        for d, (size, stride) in enumerate(zip(ref.shape, ref.strides, strict=True)):
            if size == 1:
                continue
            var = idx[lead + d]
            terms.append(var if stride == 1 else f"{var} * {stride}")
        return f"{ref.base}[{' + '.join(terms) or '0'}]"

    def loops(self, shape: tuple[int, ...], body: callable) -> None:
        """Nested loops over `shape` with index names i0, i1, ...; `body(idx)` → statements."""
        idx = [f"i{d}" for d in range(len(shape))]
        indent = "    "
        if self.tile and tuple(shape) == self.tile_row:  # (a tiled group: its tile's columns)
            self.lines.append(f"{indent * 2}for (long i0 = c0; i0 < c1; ++i0)")
            for statement in body(idx):
                self.lines.append(indent * 3 + statement)
            return
        for d, size in enumerate(shape):
            self.lines.append(
                f"{indent * (d + 2)}for (long {idx[d]} = 0; {idx[d]} < {size}; ++{idx[d]})"
            )
        pad = indent * (len(shape) + 2)
        for statement in body(idx):
            self.lines.append(pad + statement)

    def destination(self, value: Value, shape: tuple[int, ...]) -> Ref:
        """A contiguous place for `value`'s row: its output row, or a new stack array."""
        for j, out in enumerate(self.graph.outputs):
            if out is value:
                return Ref(f"o{j}", 0, shape, _contiguous(shape), True)
        name = self.fresh("v")
        self.locals.append(f"        float {name}[{max(1, prod(shape))}];")
        return Ref(name, 0, shape, _contiguous(shape), True)

    # ---- ops ---------------------------------------------------------------------------
    def render_sigmoid(self, node) -> None:
        """1 / (1 + e^-x) with e^x from the kernels' vectorised exp (common.h exp_array): a
        loop calling expf does not vectorise."""
        (x,), out = node.inputs, node.outputs[0]
        shape, _ = _row_shape(out)
        src, dst = self.refs[id(x)], self.destination(out, shape)
        tmp = Ref(self.fresh("e"), 0, shape, _contiguous(shape), True)
        self.locals.append(f"        float {tmp.base}[{max(1, prod(shape))}];")
        self.loops(
            shape,
            lambda idx: [f"{self.element(tmp, shape, idx)} = -({self.element(src, shape, idx)});"],
        )
        if self.tile:
            self.lines.append(f"        exp_array({tmp.base} + c0, {tmp.base} + c0, c1 - c0);")
        else:
            self.lines.append(f"        exp_array({tmp.base}, {tmp.base}, {prod(shape)});")
        self.loops(
            shape,
            lambda idx: [
                f"{self.element(dst, shape, idx)} = 1.0f / (1.0f + "
                f"{self.element(tmp, shape, idx)});"
            ],
        )
        self.refs[id(out)] = dst

    def render_node(self, node) -> None:
        op, out = node.op, node.outputs[0]
        if op is Op.SIGMOID:
            self.render_sigmoid(node)
        elif op in ELEMENTWISE:
            shape, _ = _row_shape(out)
            dst = self.destination(out, shape)
            srcs = [self.refs[id(v)] for v in node.inputs]
            scalar = _float(node.attrs["value"]) if op in SCALAR_OPS else None

            def body(idx):
                args = [self.element(r, shape, idx) for r in srcs]
                return [f"{self.element(dst, shape, idx)} = {expression(op, 'c', args, scalar)};"]

            self.loops(shape, body)
            self.refs[id(out)] = dst
        elif op in (Op.SUM, Op.MEAN):
            self.render_reduce(node)
        elif op is Op.SLICE:
            src = self.refs[id(node.inputs[0])]
            dim = node.attrs["dim"] - (1 if src.rowed else 0)
            shape = list(src.shape)
            shape[dim] = node.attrs["stop"] - node.attrs["start"]
            offset = src.offset + node.attrs["start"] * src.strides[dim]
            self.refs[id(out)] = Ref(src.base, offset, tuple(shape), src.strides, src.rowed)
        elif op is Op.VIEW:
            self.render_view(node)
        elif op is Op.CONCAT:
            self.render_concat(node)
        elif op is Op.GATHER_ROWS:
            self.render_gather(node)
        else:
            raise CodegenError(f"no C code for {op.label}")

    def render_reduce(self, node) -> None:
        (x,), out = node.inputs, node.outputs[0]
        src = self.refs[id(x)]
        shape, _ = _row_shape(out)
        dst = self.destination(out, shape)
        outer, n = shape[:-1], src.shape[-1]
        divide = f" / {_float(n)}" if node.op is Op.MEAN else ""  # torch: the sum over n

        def body(idx):
            # REDUCE_LANES partial sums (one vector add a step, where a single running sum is
            # a chain of n dependent adds), then added up, then the tail
            acc, lanes = self.fresh("acc"), self.fresh("lanes")
            read = self.element(src, (*outer, n), [*idx, "r"])
            lane_read = self.element(src, (*outer, n), [*idx, "(r + l)"])
            return [
                "{",
                f"    float {lanes}[{REDUCE_LANES}] = {{0.0f}}, {acc} = 0.0f;",
                "    long r = 0;",
                f"    for (; r + {REDUCE_LANES} <= {n}; r += {REDUCE_LANES})",
                f"        for (int l = 0; l < {REDUCE_LANES}; ++l) {lanes}[l] += {lane_read};",
                f"    for (int l = 0; l < {REDUCE_LANES}; ++l) {acc} += {lanes}[l];",
                f"    for (; r < {n}; ++r) {acc} += {read};",
                f"    {self.element(dst, shape, [*idx, '0'])} = {acc}{divide};",
                "}",
            ]

        self.loops(outer, body)
        self.refs[id(out)] = dst

    def render_view(self, node) -> None:
        (x,), out = node.inputs, node.outputs[0]
        src = self.refs[id(x)]
        shape, rowed = _row_shape(out)
        if not (src.rowed and rowed):
            raise CodegenError("a view must keep the token rows")
        if not src.contiguous():  # e.g. a slice of the middle dimension: copy it first
            tmp = Ref(self.fresh("v"), 0, src.shape, _contiguous(src.shape), True)
            self.locals.append(f"        float {tmp.base}[{max(1, prod(src.shape))}];")
            self.loops(
                src.shape,
                lambda idx: [
                    f"{self.element(tmp, src.shape, idx)} = {self.element(src, src.shape, idx)};"
                ],
            )
            src = tmp
        self.refs[id(out)] = Ref(src.base, src.offset, shape, _contiguous(shape), True)
        if any(o is out for o in self.graph.outputs):
            self.copy_out(out)

    def render_concat(self, node) -> None:
        out = node.outputs[0]
        shape, _ = _row_shape(out)
        dst = self.destination(out, shape)
        dim = node.attrs["dim"] - 1
        start = 0
        for value in node.inputs:
            src = self.refs[id(value)]
            part = src.shape
            target = Ref(dst.base, dst.offset + start * dst.strides[dim], part, dst.strides, True)
            self.loops(
                part,
                lambda idx, s=src, t=target, p=part: [
                    f"{self.element(t, p, idx)} = {self.element(s, p, idx)};"
                ],
            )
            start += part[dim]
        self.refs[id(out)] = dst

    def render_gather(self, node) -> None:
        table, index = node.inputs
        out = node.outputs[0]
        shape, _ = _row_shape(out)
        dst = self.destination(out, shape)
        src = self.refs[id(table)]
        if src.rowed or not src.contiguous():
            raise CodegenError("gather_rows needs a contiguous table without the token rows")
        row, pos = prod(src.shape[1:]), self.index_inputs[id(index)]
        inner = Ref("", 0, shape, _contiguous(shape), True)

        def body(idx):
            flat = self.element(inner, shape, idx)[1:-1]  # "i0 * 8 + i1" style, no base
            return [f"{self.element(dst, shape, idx)} = {src.base}[{pos}[t] * {row} + {flat}];"]

        self.loops(shape, body)
        self.refs[id(out)] = dst

    def copy_out(self, value: Value) -> None:
        """A group output whose Ref is not its output row (a view of a local): copy it."""
        src = self.refs[id(value)]
        j = next(j for j, o in enumerate(self.graph.outputs) if o is value)
        dst = Ref(f"o{j}", 0, src.shape, _contiguous(src.shape), True)
        if src.base == dst.base:
            return
        self.loops(
            src.shape,
            lambda idx: [
                f"{self.element(dst, src.shape, idx)} = {self.element(src, src.shape, idx)};"
            ],
        )
        self.refs[id(value)] = dst

    def _pragma(self, work: int) -> str:
        if self.parallel_min is None:
            return "    /* serial variant: one thread */"
        return (
            f"    #pragma omp parallel for num_threads(threads) schedule(static) "
            f"if (T * {work} >= {self.parallel_min})"
        )

    # ---- the function ------------------------------------------------------------------
    def render(self) -> str:
        head: list[str] = []
        for i, value in enumerate(self.graph.inputs):
            if value.dtype == torch.int64 and value.rank == 1 and value.shape[0] == TOKENS:
                head.append(f"    const long *p{i} = (const long *)in[{i}];")
                self.index_inputs[id(value)] = f"p{i}"
                continue
            if value.dtype != torch.float32:
                raise CodegenError(f"input %{value.name}: {value.dtype}, the renderer does fp32")
            shape, rowed = _row_shape(value)
            if rowed:
                row = f"(const float *)in[{i}] + t * row_stride[{i}]"
                self.lines.append(f"        const float *x{i} = {row};")
            else:
                head.append(f"    const float *x{i} = (const float *)in[{i}];")
            self.refs[id(value)] = Ref(f"x{i}", 0, shape, _contiguous(shape), rowed)
        for j, value in enumerate(self.graph.outputs):
            shape, rowed = _row_shape(value)
            if not rowed or value.dtype != torch.float32:
                raise CodegenError(f"output %{value.name} is not fp32 [T, ...]")
            step = f"out_stride[{j}]" if self.strided_out else str(prod(shape))
            self.lines.append(f"        float *o{j} = (float *)out[{j}] + t * {step};")
        if self.tile:
            n, tile = self.tile_row[0], self.tile
            self.lines.append(f"        for (long c0 = 0; c0 < {n}; c0 += {tile}) {{")
            self.lines.append(f"        long c1 = c0 + {tile} < {n} ? c0 + {tile} : {n};")
        for node in self.graph.nodes:
            self.render_node(node)
        for value in self.graph.outputs:
            self.copy_out(value)
        if self.tile:
            self.lines.append("        }")
        work = sum(prod(_row_shape(v)[0]) for v in self.graph.outputs)
        return "\n".join(
            [
                f"/* generated by infergen.compiler.codegen_c from group {self.graph.name} */",
                "#include <math.h>",
                '#include "common.h"',  # exp_array
                "",
                f"void {self.name}(const void **in, const long *row_stride, void **out, "
                + ("const long *out_stride, " if self.strided_out else "")
                + "long T, int threads) {",
                *head,
                self._pragma(work),
                "    for (long t = 0; t < T; ++t) {",
                *self.locals,
                *self.lines,
                "    }",
                "}",
                "",
            ]
        )


def tile_row(graph: Graph) -> tuple[int] | None:
    """The one row shape (n,) of a group every node of which is elementwise (or a sigmoid, or
    a slice of the last dimension) with an output row of that shape — what a row tile can cut
    into columns; None for any other group (reductions, views, concatenations, gathers)."""
    shapes = set()
    for node in graph.nodes:
        tileable = (
            node.op in ELEMENTWISE
            or node.op is Op.SIGMOID
            or (node.op is Op.SLICE and node.attrs["dim"] == node.inputs[0].rank - 1)
        )
        out = node.outputs[0]
        if not tileable or out.rank != 2 or out.shape[0] != TOKENS:
            return None
        shapes.add(tuple(out.shape[1:]))
    return shapes.pop() if len(shapes) == 1 and not isinstance(next(iter(shapes))[0], Sym) else None


def variants_for(graph: Graph) -> list[str]:
    """The VARIANTS that render this group differently: a row tile only where tile_row cuts
    its rows into more than one tile."""
    row = tile_row(graph)
    return [
        name
        for name, variant in VARIANTS.items()
        if not variant.tile or (row is not None and variant.tile < row[0])
    ]


def render_group(
    graph: Graph, name: str, variant: str = "default", strided_out: bool = False
) -> str:
    """C source of one fused group's subgraph, function `name`. Raises CodegenError for a
    group outside what the renderer does (not fp32, dynamic inner dims, matmul, ...).
    `strided_out`: the function takes `const long *out_stride` after `out` (output j's rows
    `out_stride[j]` floats apart; a GEMM epilogue writes its tile into a wider matrix)."""
    if variant not in VARIANTS:
        raise CodegenError(f"unknown kernel variant {variant!r}, expected one of {list(VARIANTS)}")
    return _Renderer(graph, name, VARIANTS[variant], strided_out).render()
