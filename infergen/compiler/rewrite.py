"""Graph surgery shared by the passes: grouping nodes into one FUSED node, replacing nodes, and
restoring a valid execution order (a stable topological sort).

A group is fused only when it is convex — no path leaves it and comes back — which the sort
detects as a cycle; `fuse` then returns None and the graph is left as it was.
"""

from __future__ import annotations

from infergen.compiler.ir import Graph, Node, Op, Value


def toposort(graph: Graph) -> bool:
    """Orders graph.nodes so every node follows its inputs' producers, keeping the current
    order where it can. Returns False (and leaves the order) when the nodes form a cycle."""
    producer = {id(v): node for node in graph.nodes for v in node.outputs}
    position = {id(node): i for i, node in enumerate(graph.nodes)}
    waiting: dict[int, int] = {}
    readers: dict[int, list[Node]] = {}
    for node in graph.nodes:
        deps = {id(producer[id(v)]) for v in node.inputs if v is not None and id(v) in producer}
        deps.discard(id(node))
        waiting[id(node)] = len(deps)
        for dep in deps:
            readers.setdefault(dep, []).append(node)
    ready = sorted((n for n in graph.nodes if waiting[id(n)] == 0), key=lambda n: position[id(n)])
    ordered: list[Node] = []
    while ready:
        node = ready.pop(0)
        ordered.append(node)
        for reader in readers.get(id(node), ()):
            waiting[id(reader)] -= 1
            if waiting[id(reader)] == 0:
                ready.append(reader)
                ready.sort(key=lambda n: position[id(n)])
    if len(ordered) != len(graph.nodes):
        return False
    graph.nodes[:] = ordered
    return True


def used_outside(graph: Graph, group: list[Node]) -> list[Value]:
    """Values the group computes that a node outside it, or the graph's output, reads."""
    inside = {id(n) for n in group}
    needed = {id(v) for v in graph.outputs}
    for node in graph.nodes:
        if id(node) not in inside:
            needed.update(id(v) for v in node.inputs if v is not None)
    return [v for node in group for v in node.outputs if id(v) in needed]


def fuse(graph: Graph, group: list[Node], kernel: str) -> Node | None:
    """Replace `group` (nodes of `graph`, in order) by one FUSED node whose subgraph holds
    them; None (graph unchanged) when the group is not convex."""
    inside = {id(n) for n in group}
    computed = {id(v) for n in group for v in n.outputs}
    inputs: list[Value] = []
    for node in group:
        for v in node.inputs:
            if v is not None and id(v) not in computed and all(v is not u for u in inputs):
                inputs.append(v)
    outputs = used_outside(graph, group)
    sub = Graph(kernel, inputs, list(group), outputs)
    fused = Node(Op.FUSED, tuple(inputs), tuple(outputs), {"kernel": kernel, "graph": sub})
    before = list(graph.nodes)
    first = min(i for i, n in enumerate(graph.nodes) if id(n) in inside)
    rest = [n for n in graph.nodes if id(n) not in inside]
    graph.nodes[:] = rest[:first] + [fused] + rest[first:]
    if not toposort(graph):
        graph.nodes[:] = before
        return None
    return fused


def replace(graph: Graph, old: list[Node], new: list[Node]) -> None:
    """Put `new` where `old` was (old nodes' outputs must be recomputed by `new`, the same
    Value objects, or no longer read)."""
    gone = {id(n) for n in old}
    first = min(i for i, n in enumerate(graph.nodes) if id(n) in gone)
    rest = [n for n in graph.nodes if id(n) not in gone]
    graph.nodes[:] = rest[:first] + new + rest[first:]
    if not toposort(graph):
        raise AssertionError(f"replacing {[n.op.label for n in old]} made a cycle")
