"""Buffer reuse: which activation values can share memory.

A value is live from the node that computes it to the last node that reads it (values the
graph returns live to the end). Values whose live ranges do not overlap may share a buffer;
`plan_buffers` assigns them greedily (largest first, first buffer that is free for the whole
range and big enough), the rule of most arena allocators. Sizes are in elements of a token
row times T — every activation here is [T, ...] — so one plan serves every batch size.

Layout ops (views, slices) alias their input: they share its buffer and extend its life.
Inputs, weights and caches are not planned (they are owned outside the step).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from infergen.compiler.ir import Graph, OpKind, Sym, Value


@dataclass
class BufferPlan:
    buffer_of: dict[str, int]  # value name → buffer index
    sizes: list[int]  # per buffer: elements per token
    live: dict[str, tuple[int, int]]  # value name → (first node, last node) it is live at
    naive: int  # elements per token if every value had its own buffer

    @property
    def total(self) -> int:
        return sum(self.sizes)


def _row_elements(value: Value) -> int:
    """Elements per token row (dynamic dims other than T count as 1: not planned here)."""
    return prod(d for d in value.shape if not isinstance(d, Sym))


def plan_buffers(graph: Graph) -> BufferPlan:
    root: dict[int, Value] = {}  # id(value) → the value whose buffer it views
    live: dict[int, list[int]] = {}
    planned: list[Value] = []
    end = len(graph.nodes)
    for index, node in enumerate(graph.nodes):
        for v in node.inputs:
            if v is not None and id(v) in root:
                live[id(root[id(v)])][1] = index
        aliasing = node.op.kind is OpKind.LAYOUT and node.op.label in ("view", "slice")
        for v in node.outputs:
            if v.role != "activation":
                continue
            source = node.inputs[0] if aliasing else None
            if source is not None and id(source) in root:
                root[id(v)] = root[id(source)]
            else:
                root[id(v)] = v
                live[id(v)] = [index, index]
                planned.append(v)
    for v in graph.outputs:
        if id(v) in root:
            live[id(root[id(v)])][1] = end
    buffers: list[tuple[int, list[tuple[int, int]]]] = []  # (size, busy ranges)
    buffer_of: dict[str, int] = {}
    for v in sorted(planned, key=lambda v: -_row_elements(v)):
        first, last = live[id(v)]
        size = _row_elements(v)
        free = [
            i
            for i, (capacity, busy) in enumerate(buffers)
            if capacity >= size and all(last < a or first > b for a, b in busy)
        ]
        if free:
            buffers[free[0]][1].append((first, last))
        else:
            buffers.append((size, [(first, last)]))
        buffer_of[v.name] = free[0] if free else len(buffers) - 1
    for v in graph.values():
        if id(v) in root and root[id(v)] is not v:
            buffer_of[v.name] = buffer_of[root[id(v)].name]
    return BufferPlan(
        buffer_of,
        [size for size, _ in buffers],
        {v.name: tuple(live[id(v)]) for v in planned},
        sum(_row_elements(v) for v in planned),
    )
