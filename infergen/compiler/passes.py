"""Passes as data: each pass is an ordered list of (pattern, rewrite) rules, applied until no
rule matches; `verify()` runs after every pass.

A rule's `match(node, graph)` looks at one node (the anchor) and returns what to rewrite —
usually the list of nodes to fuse — or None; its `rewrite(graph, match)` changes the graph
and returns whether it did (a fusion that would not be convex declines). Rules are tried in
order on nodes in execution order, so an earlier rule wins where two overlap: the pipeline
lists the specific fusions (GEMM + SiLU-mul, RoPE + KV store) before the generic one.

`PIPELINES` names the pass lists the runtime and `infergen compile` use.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from infergen.compiler.ir import Graph, Node, Op
from infergen.compiler.verify import verify
from infergen.registry import Registry

Match = Callable[[Node, Graph], Any]
Rewrite = Callable[[Graph, Any], bool]


@dataclass(frozen=True)
class Rule:
    name: str
    match: Match
    rewrite: Rewrite


@dataclass(frozen=True)
class Pass:
    name: str
    rules: tuple[Rule, ...]
    into_groups: bool = False  # also rewrite inside fused groups' subgraphs
    max_rounds: int = 1000  # a guard against rules that undo each other

    def __call__(self, graph: Graph, log: list[str] | None = None) -> Graph:
        for _ in range(self.max_rounds):
            if not self._apply_once(graph, log):
                break
        else:
            raise RuntimeError(f"pass {self.name} did not settle in {self.max_rounds} rounds")
        if self.into_groups:
            for node in graph.nodes:
                if node.op is Op.FUSED:
                    self(node.attrs["graph"], log)
        return verify(graph)

    def _apply_once(self, graph: Graph, log: list[str] | None) -> bool:
        for rule in self.rules:
            for node in list(graph.nodes):
                if not any(n is node for n in graph.nodes):
                    continue  # rewritten away by this round
                found = rule.match(node, graph)
                if found is not None and rule.rewrite(graph, found):
                    if log is not None:
                        log.append(
                            f"{self.name}/{rule.name} at {node.op.label}"
                            f"({', '.join(v.name for v in node.outputs)})"
                        )
                    return True
        return False


PASSES: Registry[Pass] = Registry("compiler pass")
PIPELINES: Registry[tuple[str, ...]] = Registry("compiler pipeline")


def run_pipeline(graph: Graph, name: str, log: list[str] | None = None) -> Graph:
    """Apply the pipeline's passes in order (verify after each)."""
    for pass_name in PIPELINES.get(name, where="pipeline"):
        graph = PASSES.get(pass_name)(graph, log)
    return graph
