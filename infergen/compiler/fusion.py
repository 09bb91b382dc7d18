"""Fusion rules: which nodes become one kernel.

Specific patterns first (each names the kernel it makes):
- add_rms_norm:   ADD then RMS_NORM of the sum → one ADD_RMS_NORM (residual add + norm)
- norm_quantize:  (ADD_)RMS_NORM whose output only feeds an input quantizer
- gemm_silu_mul:  LINEAR whose output only feeds SILU_MUL (+ that output's quantizer): one
                  group. On fp32 panels it runs as one generated GEMM whose tail works on
                  each output tile in L1 (codegen_gemm.py); otherwise (another weight format,
                  a quantizer in the tail) the GEMM runs on the engine's backend and the
                  tail as one generated kernel over its whole output, after it
- gemm_gelu_mul:  the same with GELU_MUL (GeGLU: Gemma)
- rope_kv_store:  ROPE (and the slice that takes K out of a joint q/k rotation) feeding a KV
                  store: keys are rotated and written in one pass
Before them (its own pass, fuse_input_quantizers, first in the "jit" pipeline):
- input_quantizer: QUANTIZE_ACT whose output only feeds a LINEAR's input → that LINEAR, its
                  input quantizer an attribute: the backend quantizes the input itself (an
                  integer kernel, W8A8 / W4A8) or first, as the per-op path does
Then the generic rule: chains of pointwise ops, row reductions (over the last dimension) and
the layout ops between them, all over the token rows, become one loop kernel.
And dead-value elimination.
"""

from __future__ import annotations

from infergen.compiler.ir import TOKENS, Graph, Node, Op, OpKind, Value
from infergen.compiler.passes import PASSES, Pass, Rule
from infergen.compiler.rewrite import fuse, replace, used_outside


def _producer(graph: Graph, value: Value | None) -> Node | None:
    if value is None:
        return None
    for node in graph.nodes:
        if any(v is value for v in node.outputs):
            return node
    return None


def _readers(graph: Graph, value: Value) -> list[Node]:
    return [n for n in graph.nodes if any(v is value for v in n.inputs)]


def _only_reader(graph: Graph, value: Value) -> Node | None:
    """The single node reading `value` when nothing else (nor the graph output) does."""
    readers = _readers(graph, value)
    if len(readers) != 1 or any(v is value for v in graph.outputs):
        return None
    return readers[0]


def _fuse_rewrite(kernel: str):
    def rewrite(graph: Graph, group: list[Node]) -> bool:
        return fuse(graph, group, kernel) is not None

    return rewrite


# ---- add + rms_norm ---------------------------------------------------------------------


def _match_add_norm(node: Node, graph: Graph):
    if node.op is not Op.RMS_NORM:
        return None
    add = _producer(graph, node.inputs[0])
    if add is None or add.op is not Op.ADD:
        return None
    a, b = add.inputs
    if a.shape != b.shape or a.shape != add.outputs[0].shape:
        return None  # broadcasting adds are not a residual add
    return add, node


def _rewrite_add_norm(graph: Graph, match) -> bool:
    add, norm = match
    a, b = add.inputs
    fused = Node(
        Op.ADD_RMS_NORM, (a, b, norm.inputs[1]), (norm.outputs[0], add.outputs[0]), dict(norm.attrs)
    )
    replace(graph, [add, norm], [fused])
    return True


# ---- epilogue / prologue fusions --------------------------------------------------------

_NORMS = (Op.RMS_NORM, Op.ADD_RMS_NORM)


def _match_norm_quantize(node: Node, graph: Graph):
    if node.op not in _NORMS:
        return None
    reader = _only_reader(graph, node.outputs[0])
    return [node, reader] if reader is not None and reader.op is Op.QUANTIZE_ACT else None


def _match_gemm_gated(activation: Op):
    """LINEAR whose output only feeds the gated `activation` (+ that output's quantizer)."""

    def match(node: Node, graph: Graph):
        if node.op is not Op.LINEAR:
            return None
        act = _only_reader(graph, node.outputs[0])
        if act is None or act.op is not activation:
            return None
        group = [node, act]
        quant = _only_reader(graph, act.outputs[0])
        if quant is not None and quant.op is Op.QUANTIZE_ACT:
            group.append(quant)
        return group

    return match


def _match_rope_kv_store(node: Node, graph: Graph):
    if node.op is not Op.KV_STORE:
        return None
    source = _producer(graph, node.inputs[0])
    group = [node]
    if source is not None and source.op is Op.SLICE:  # K out of a joint q/k rotation
        group.insert(0, source)
        source = _producer(graph, source.inputs[0])
    if source is None or source.op is not Op.ROPE:
        return None
    return [source, *group]


def _match_input_quantizer(node: Node, graph: Graph):
    if node.op is not Op.QUANTIZE_ACT:
        return None
    linear = _only_reader(graph, node.outputs[0])
    if linear is None or linear.op is not Op.LINEAR or linear.inputs[0] is not node.outputs[0]:
        return None
    return node, linear


def _rewrite_input_quantizer(graph: Graph, match) -> bool:
    quantize, linear = match
    attrs = dict(linear.attrs)
    attrs.update(act_fmt=quantize.attrs["fmt"], act_granularity=quantize.attrs["granularity"],
                 quantizer=quantize.attrs["quantizer"])  # fmt: skip
    fused = Node(Op.LINEAR, (quantize.inputs[0], *linear.inputs[1:]), linear.outputs, attrs)
    replace(graph, [quantize, linear], [fused])
    return True


# ---- generic pointwise / row-reduction fusion -------------------------------------------

_COMPUTE = (OpKind.POINTWISE, OpKind.REDUCTION, OpKind.QUANTIZE)


def _row_wise(node: Node) -> bool:
    """Computes over the token rows: every output is [T, ...] (a loop over rows can run it)."""
    return all(v.rank >= 1 and v.shape[0] == TOKENS for v in node.outputs)


def _fusible(node: Node) -> bool:
    return (node.op.kind in _COMPUTE or node.op.kind is OpKind.LAYOUT) and _row_wise(node)


def _match_pointwise(node: Node, graph: Graph):
    """From a compute node, the chain of fusible nodes reading what the group computes."""
    if node.op.kind not in _COMPUTE or not _row_wise(node):
        return None
    group = [node]
    computed = {id(v) for v in node.outputs}
    start = next(i for i, n in enumerate(graph.nodes) if n is node)
    for other in graph.nodes[start + 1 :]:
        reads_group = any(v is not None and id(v) in computed for v in other.inputs)
        if reads_group and _fusible(other):
            group.append(other)
            computed.update(id(v) for v in other.outputs)
    # views and slices at the end only re-view a result for someone outside: leave them out
    while group and group[-1].op in (Op.VIEW, Op.SLICE):
        group.pop()
    _pull_producers(graph, group)
    position = {id(n): i for i, n in enumerate(graph.nodes)}
    group.sort(key=lambda n: position[id(n)])
    computes = [n for n in group if n.op.kind in _COMPUTE or n.op is Op.CONCAT]
    return group if len(computes) >= 2 else None


def _pull_producers(graph: Graph, group: list[Node]) -> None:
    """Add the fusible nodes that compute the group's inputs for the group alone (e.g. the
    cos / sin rows a lowered RoPE gathers), until none is left."""
    changed = True
    while changed:
        changed = False
        members = {id(n) for n in group}
        for node in group:
            for value in node.inputs:
                source = _producer(graph, value)
                if source is None or id(source) in members or not _fusible(source):
                    continue
                readers = [r for v in source.outputs for r in _readers(graph, v)]
                outputs = any(v is o for v in source.outputs for o in graph.outputs)
                if not outputs and all(id(r) in members for r in readers):
                    group.append(source)
                    changed = True
                    break
            if changed:
                break


def _rewrite_pointwise(graph: Graph, group: list[Node]) -> bool:
    # a group that is not convex (something outside reads a middle value and feeds a later
    # member) is shrunk from the end until it is
    while len([n for n in group if n.op.kind in _COMPUTE or n.op is Op.CONCAT]) >= 2:
        if fuse(graph, group, "pointwise") is not None:
            return True
        group = group[:-1]
    return False


# ---- dead values --------------------------------------------------------------------------


def _match_dead(node: Node, graph: Graph):
    if node.op is Op.KV_STORE:  # its effect is the cache it writes
        return None
    return node if not used_outside(graph, [node]) else None


def _remove(graph: Graph, node: Node) -> bool:
    graph.nodes.remove(node)
    return True


ADD_RMS_NORM_RULE = Rule("add_rms_norm", _match_add_norm, _rewrite_add_norm)
EPILOGUE_RULES = (
    ADD_RMS_NORM_RULE,
    Rule("norm_quantize", _match_norm_quantize, _fuse_rewrite("norm_quantize")),
    Rule("gemm_silu_mul", _match_gemm_gated(Op.SILU_MUL), _fuse_rewrite("gemm_silu_mul")),
    Rule("gemm_gelu_mul", _match_gemm_gated(Op.GELU_MUL), _fuse_rewrite("gemm_gelu_mul")),
    Rule("rope_kv_store", _match_rope_kv_store, _fuse_rewrite("rope_kv_store")),
)
PASSES.register("fuse_epilogues", Pass("fuse_epilogues", EPILOGUE_RULES))
PASSES.register(
    "fuse_input_quantizers",
    Pass(
        "fuse_input_quantizers",
        (Rule("input_quantizer", _match_input_quantizer, _rewrite_input_quantizer),),
    ),
)
PASSES.register(
    "fuse_pointwise",
    Pass("fuse_pointwise", (Rule("pointwise", _match_pointwise, _rewrite_pointwise),)),
)
PASSES.register("dead_values", Pass("dead_values", (Rule("dead", _match_dead, _remove),)))
