"""`verify(graph)`: the IR's invariants, checked after capture and between passes.

- every value is defined once (a graph input or one node's output) and has a unique name;
- every node reads only values defined before it (the node list is in execution order);
- weights and caches are graph inputs (a node never computes one, except a KV store's new
  cache), and an old cache is not read after the store that replaced it;
- each node's outputs have the shapes and dtypes its op's rule (shapes.py) derives from its
  inputs, and the op's output count;
- the graph's outputs are defined; fused groups are verified recursively.
"""

from __future__ import annotations

from infergen.compiler.ir import Graph, Op, OpKind
from infergen.compiler.shapes import ShapeError, infer


class VerifyError(ValueError):
    """A graph that breaks an IR invariant: the message names the node and the rule."""


def verify(graph: Graph) -> Graph:
    """Returns the graph when it is well formed; raises VerifyError naming what is not."""
    defined: set[int] = set()
    names: set[str] = set()
    replaced: dict[int, str] = {}  # id(cache) → the store that superseded it

    def define(value, where: str) -> None:
        if id(value) in defined:
            raise VerifyError(f"{graph.name}: %{value.name} defined twice ({where})")
        if value.name in names:
            raise VerifyError(f"{graph.name}: two values are named %{value.name} ({where})")
        defined.add(id(value))
        names.add(value.name)

    for value in graph.inputs:
        define(value, "input")
    for index, node in enumerate(graph.nodes):
        where = f"node {index}: {node.line()}"
        for value in node.inputs:
            if value is None:
                continue
            if id(value) not in defined:
                raise VerifyError(f"{graph.name}: {where} reads %{value.name} before it is defined")
            if id(value) in replaced:
                raise VerifyError(
                    f"{graph.name}: {where} reads cache %{value.name} after {replaced[id(value)]}"
                )
        if node.op.outputs >= 0 and len(node.outputs) != node.op.outputs:
            raise VerifyError(
                f"{graph.name}: {where} has {len(node.outputs)} outputs, "
                f"{node.op.label} makes {node.op.outputs}"
            )
        try:
            expected = infer(node.op, node.inputs, node.attrs)
        except ShapeError as error:
            raise VerifyError(f"{graph.name}: {where}: {error}") from None
        for value, (shape, dtype) in zip(node.outputs, expected, strict=True):
            if tuple(value.shape) != tuple(shape) or value.dtype != dtype:
                raise VerifyError(
                    f"{graph.name}: {where}: %{value.name} is {value.type_str()}, the rule "
                    f"gives shape {shape} dtype {dtype}"
                )
            if value.role in ("weight", "input", "opaque"):
                raise VerifyError(f"{graph.name}: {where} computes %{value.name}, a {value.role}")
            if value.role == "cache" and not _stores(node):
                raise VerifyError(f"{graph.name}: {where} computes cache %{value.name}")
            define(value, where)
        if _stores(node):
            for old in node.inputs:
                if old is not None and old.role == "cache":
                    replaced[id(old)] = f"node {index} replaced it"
        if node.op is Op.FUSED:
            try:
                verify(node.attrs["graph"])
            except VerifyError as error:
                raise VerifyError(f"{graph.name}: {where}: {error}") from None
    for value in graph.outputs:
        if id(value) not in defined:
            raise VerifyError(f"{graph.name}: output %{value.name} is never computed")
    return graph


def _stores(node) -> bool:
    """A KV store, or a fused group with one inside: the node writes caches."""
    if node.op.kind is OpKind.KV_STORE:
        return True
    return node.op is Op.FUSED and any(_stores(n) for n in node.attrs["graph"].nodes)
