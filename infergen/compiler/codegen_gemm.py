"""GEMM epilogues: a GEMM group's pointwise tail compiled into the GEMM, run on each output
tile while it is in L1 (kernels/gemm_epilogue_f32.h) instead of over the whole product after
it — the product of a SwiGLU gate/up GEMM (T x 2I floats) is never written to memory.

A group qualifies (`plan_epilogue`) when it is a GEMM (LINEAR) whose output only feeds one
pointwise tail (a fused pointwise group, as `_fuse_inside_groups` leaves a `gemm_silu_mul`
group) that
- reads nothing but the product and writes one [T, n] output,
- is one elementwise chain over a single row shape (codegen_c.tile_row: no reductions), and
- is column-separable: every row size and column slice bound in it is a multiple of a unit
  that divides the GEMM's N into 1 or 2 parts, each a whole number of NR-column panels
  (parts = 2: SwiGLU pairs column n with column n + N/2).
Its tile form is the tail with that unit scaled to NR columns: rendered by codegen_c for a
row of parts x NR columns (serial, strided output rows), and called by the GEMM per panel and
token block. Anything else raises CodegenError with the reason (the runtime then runs the
GEMM and its tail one after the other).

The C source: the tail's function, then the template instantiated for it:

    void <name>(const float *Wp, const float *X, const float *bias, float *Y, long ldy,
                long M, long N, long K, int threads)
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from math import gcd

import torch

from infergen.compiler.codegen_c import CodegenError, render_group, tile_row
from infergen.compiler.ir import Graph, Node, Op, Value

NR = 24  # the fp32 packed panels' width (kernels/gemm_packed_f32.c NR, ops/linear.py PANEL)
MAX_PARTS = 2  # the template's EPI_PARTS: 1 or 2
TEMPLATE = "gemm_epilogue_f32.h"  # (in infergen/kernels/)
# the same on bf16 panels with AMX tiles: `<name>_bf16`, 0 where it does not run (no tiles)
TEMPLATE_BF16 = "gemm_epilogue_bf16.h"


@dataclass
class Epilogue:
    """A GEMM with its tail: what the fused kernel computes."""

    linear: Node  # the LINEAR node (inputs x, weight, bias)
    tail: Graph  # the tail at full width (reads the product, writes `output`)
    tile_tail: Graph  # the tail for one tile row: `parts` x NR columns in, NR out
    parts: int
    out_columns: int  # the output's row size (N / parts)
    x_input: int  # the group's inputs: the GEMM's x, its weight (the layer's Linear)
    weight_input: int

    @property
    def output(self) -> Value:
        return self.tail.outputs[0]

    def serves(self, linear) -> bool:
        """Whether a layer's Linear runs fused: fp32 panels of this GEMM's shape
        (ops/linear.py pack_panels) and no input quantizer; any other runs unfused."""
        n, k = self.linear.inputs[1].shape
        panels = linear.weight
        return (
            linear.act is None
            and panels.dtype == torch.float32
            and panels.dim() == 3
            and tuple(panels.shape) == (n // NR, k, NR)
        )

    def serves_any(self, statics: list[dict]) -> bool:
        """Whether some layer runs it fused; `statics`: each layer's bound inputs by name
        (runtime.CompiledLayers.static). None does: the fused GEMM is not worth building."""
        weight = self.linear.inputs[1].name
        return any(self.serves(env[weight]) for env in statics)

    def canonical(self) -> str:
        """What the generated kernel depends on (its JIT cache key)."""
        return f"parts={self.parts}\n{self.tile_tail.canonical()}"


def is_gemm_group(node: Node) -> bool:
    """A fused group holding a GEMM (what may have an epilogue form)."""
    return node.op is Op.FUSED and any(n.op is Op.LINEAR for n in node.attrs["graph"].nodes)


def _tail_of(group: Graph) -> tuple[Node, Node]:
    if len(group.nodes) != 2:
        raise CodegenError(f"{group.name}: {len(group.nodes)} nodes, expected a GEMM and a tail")
    linear, tail = group.nodes
    if linear.op is not Op.LINEAR:
        raise CodegenError(f"{group.name}: starts with {linear.op.label}, not a GEMM")
    if linear.attrs.get("act_fmt") is not None:
        raise CodegenError(f"{group.name}: the GEMM quantizes its input (an integer kernel)")
    if tail.op is not Op.FUSED or tail.attrs["kernel"] != "pointwise":
        raise CodegenError(f"{group.name}: the GEMM's tail is not one pointwise kernel")
    product = linear.outputs[0]
    if len(tail.inputs) != 1 or tail.inputs[0] is not product:
        raise CodegenError(f"{group.name}: the tail reads more than the GEMM's product")
    if len(tail.outputs) != 1 or any(v is product for v in group.outputs):
        raise CodegenError(f"{group.name}: the product is read outside the tail")
    return linear, tail


def _column_sizes(graph: Graph) -> list[int]:
    """The row sizes and column slice bounds of an elementwise [T, n] graph."""
    sizes = [v.shape[1] for v in graph.values()]
    for node in graph.nodes:
        if node.op is Op.SLICE:
            sizes += [node.attrs["start"], node.attrs["stop"]]
    return sizes


def _scaled(graph: Graph, unit: int) -> Graph:
    """A copy of `graph` with every multiple of `unit` columns scaled to NR per unit."""
    tile = copy.deepcopy(graph)
    for value in tile.values():
        value.shape = (value.shape[0], value.shape[1] // unit * NR)
    for node in tile.nodes:
        if node.op is Op.SLICE:
            node.attrs = dict(node.attrs)
            node.attrs["start"] = node.attrs["start"] // unit * NR
            node.attrs["stop"] = node.attrs["stop"] // unit * NR
    tile.name = f"{graph.name}_tile"
    return tile


def plan_epilogue(group: Graph, panel: int = NR) -> Epilogue:
    """The fused GEMM of a GEMM-with-tail group (see the module docstring); CodegenError
    naming why not. `panel`: the columns each part must be a whole number of (the C
    template's NR-column panels; 1 for the Triton rendering, whose tiles are masked)."""
    linear, tail_node = _tail_of(group)
    tail = tail_node.attrs["graph"]
    if tile_row(tail) is None:
        raise CodegenError(f"{group.name}: the tail is not one elementwise chain over its rows")
    n = linear.inputs[1].shape[0]
    unit = n
    for size in _column_sizes(tail):
        unit = gcd(unit, size)
    parts = n // unit
    if parts > MAX_PARTS or any(size % unit for size in _column_sizes(tail)):
        raise CodegenError(f"{group.name}: the tail mixes columns beyond {MAX_PARTS} parts")
    if unit % panel:
        raise CodegenError(
            f"{group.name}: {unit} columns per part, not a whole number of {panel}-column panels"
        )
    out_columns = tail.outputs[0].shape[1]
    if out_columns != unit:
        raise CodegenError(f"{group.name}: the tail writes {out_columns} columns, not {unit}")
    position = {id(v): i for i, v in enumerate(group.inputs)}
    x, weight = (position[id(v)] for v in linear.inputs[:2])
    return Epilogue(linear, tail, _scaled(tail, unit), parts, out_columns, x, weight)


def render_gemm_epilogue(epilogue: Epilogue, name: str) -> str:
    """C source of the fused GEMM `name` (the module docstring's signature)."""
    tail = render_group(epilogue.tile_tail, f"{name}_tail", "serial", strided_out=True)
    return "\n".join(
        [
            f"/* generated by infergen.compiler.codegen_gemm: {name} */",
            tail,
            f"#define EPI_NAME {name}",
            f"#define EPI_PARTS {epilogue.parts}",
            f"#define EPI_TAIL {name}_tail",
            f'#include "{TEMPLATE}"',
            f'#include "{TEMPLATE_BF16}"',
            "#undef EPI_NAME",
            "#undef EPI_PARTS",
            "#undef EPI_TAIL",
            "",
        ]
    )
