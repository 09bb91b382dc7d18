"""The layer-program renderer: a whole decode step's decoder layers as one generated C function,
so no Python runs between kernels (the generated counterpart of the hand-written fused decode
driver, kernels/decode_layers_f32.c, whose GEMM and attention kernels it calls). The kernels
are not part of the program's source: it calls them in kernels/layer_kernels.c (declared by
layer_kernels.h), a shared library the program links against, compiled once per variant's
macros, so compiling a program compiles only its generated code.

Input: the layer graph after the "jit" pipeline. Fused groups that hold a GEMM or a KV store
are flattened back into their nodes; what is left is pointwise groups (rendered by
codegen_c.py, called as functions), GEMMs (`lk_gemm_any` on the layer's prepared weights in their
storage format), the KV store (rows copied to their slots), decode attention (the paged decode
kernel), mixture-of-experts feed-forwards (`lk_moe` on the layer's moe_args), mixers the module
runs (a callback into Python through the layer's mixer_args: the per-layer fallback; in decode
steps a mixer's native step, `lk_mixer_decode`: Mamba2's, gated DeltaNet's, MLA's), and
slices / views (pointer arithmetic). Activations live in one scratch arena, at
the offsets of the buffer plan (buffers.py: values whose live ranges do not overlap share
memory), T rows each.

    void <name>(const void *const *weights, const long *formats, float *const *caches,
                long n_layers, const step_args *const *steps, float *h, float *delta,
                float *arena, int threads, const prefill_args *const *prefills)

`weights[l * W + j]` is layer l's j-th weight input (a projection's prepared panels, a norm's
weight; NULL for a missing bias), `formats[l * G + g]` its g-th GEMM's panel format,
`caches[2 l]`, `caches[2 l + 1]` its K / V cache, `steps[l]` (and `prefills[l]`) its view of
the step: its cache group's slots, block tables and window, its RoPE table (one struct for
every layer of a uniform model; Gemma-3's sliding and full layers point at their group's);
h and delta are updated in place (the residual stream, the pending MLP output). Two phases,
two programs of one graph:
- "decode": one token per sequence, attention by the paged decode kernel over the step's
  decode block tables (fp32 or FP8 E4M3 caches); `p` is unused (NULL);
- "prefill": a step with prefills (a prompt, or a chunk after cached context; decode rows
  beside them join as one-query sequences), attention by the paged prefill kernel
  (paged_prefill_attention_f32.c) over `prefills[l]`, all the step's rows as one varlen batch
  (fp32 caches).
The runtime walks the graph for the other steps (sinks, input quantizers, ...).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from math import prod

from infergen.compiler.buffers import plan_buffers
from infergen.compiler.codegen_c import CodegenError, render_group
from infergen.compiler.codegen_gemm import (
    Epilogue,
    is_gemm_group,
    plan_epilogue,
    render_gemm_epilogue,
)
from infergen.compiler.ir import TOKENS, Graph, Node, Op, Sym, Value, attention_parts
from infergen.compiler.rewrite import toposort
from infergen.compiler.verify import verify
from infergen.ops import linear_bf16  # noqa: F401 (registers "bf16")
from infergen.ops.linear import LINEAR_BACKENDS

# the weight format code (a program's F[]) of bf16 panels, which a fused GEMM-with-tail runs
# on AMX tiles (kernels/gemm_epilogue_bf16.h)
BF16_FORMAT = LINEAR_BACKENDS.get("bf16").decode_format


def _epilogue(node: Node) -> Epilogue | None:
    """The fused GEMM of a GEMM-with-tail group (codegen_gemm.py), None for other nodes."""
    if not is_gemm_group(node):
        return None
    try:
        return plan_epilogue(node.attrs["graph"])
    except CodegenError:
        return None


def flatten(graph: Graph) -> Graph:
    """A copy with every fused group that is not a pointwise kernel or a GEMM with an
    epilogue replaced by its nodes."""
    flat = copy.deepcopy(graph)
    changed = True
    while changed:
        changed = False
        for index, node in enumerate(flat.nodes):
            kept = node.attrs.get("kernel") == "pointwise" or _epilogue(node) is not None
            if node.op is Op.FUSED and not kept:
                flat.nodes[index : index + 1] = node.attrs["graph"].nodes
                changed = True
                break
    toposort(flat)
    return verify(flat)


@dataclass(frozen=True)
class TRef:
    """A [T, ...] value in memory: row r at `ptr + r * row_stride`, the row's elements at
    `offset + Σ index_d · strides_d` (floats)."""

    ptr: str
    row_stride: str
    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]

    def contiguous_rows(self) -> bool:
        expected, step = [], 1
        for size in reversed(self.shape):
            expected.append(step)
            step *= size
        return tuple(reversed(expected)) == self.strides

    def row_elements(self) -> int:
        return prod(self.shape)

    def at(self) -> str:
        return f"({self.ptr} + {self.offset})" if self.offset else self.ptr


def _row(value: Value) -> tuple[int, ...]:
    if (
        value.rank < 1
        or value.shape[0] != TOKENS
        or any(isinstance(d, Sym) for d in value.shape[1:])
    ):
        raise CodegenError(f"%{value.name}: not a [T, ...] value")
    return tuple(value.shape[1:])


def _strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(prod(shape[d + 1 :]) for d in range(len(shape)))


@dataclass
class LayerProgram:
    source: str  # the whole C source to compile (render_layer_programs: every phase's)
    function: str
    weight_inputs: list[str]  # graph input names, in the order of `weights` per layer
    linears: list[str]  # the GEMMs' weight input names, in the order of `formats`
    arena_floats_per_token: int
    includes: list[str] = field(default_factory=list)  # what its definitions need
    definitions: str = ""  # its groups and its function
    # what each call site does, in the order of its timers (`<function>_timers`)
    sites: list[str] = field(default_factory=list)
    # whether it reads the KV cache itself (an ATTENTION or KV_STORE node; not: layers whose
    # mixers the module runs), so needs the caches, slots and the attention plan's tables
    attention: bool = True


PHASES = ("decode", "prefill")

# the prefill program's attention arguments (int32, as ops/paged_attention.PrefillBatch)
PREFILL_ARGS = """typedef struct {
    const int32_t *query_start, *query_lens, *seq_lens, *block_tables;
    long max_blocks, prefills;
} prefill_args;"""
# a MIXER node's weight input: the callback that runs layer `layer`'s mixer module on T rows
# of x into out (program.py: a ctypes callback into Python, the per-layer fallback)
MIXER_ARGS = """typedef struct {
    void (*call)(long layer, const float *x, float *out, long tokens);
    long layer;
    const void *native; /* the decode program's native form (lk_mixer_decode's) or NULL */
    long kind;          /* its kind (0: none) */
} mixer_args;"""


class _Renderer:
    def __init__(
        self,
        graph: Graph,
        name: str,
        heads: int,
        kv_heads: int,
        dim: int,
        scale: float,
        phase: str = "decode",
    ):
        if phase not in PHASES:
            raise ValueError(f"layer program phase {phase!r}, expected one of {PHASES}")
        self.graph, self.name, self.phase = graph, name, phase
        self.heads, self.kv_heads, self.dim, self.scale = heads, kv_heads, dim, scale
        self.refs: dict[int, TRef] = {}
        self.body: list[str] = []
        self.groups: list[str] = []
        self.copies = 0
        self.weight_inputs: list[str] = []
        self.linears: list[str] = []
        self.sites: list[str] = []
        plan = plan_buffers(graph)
        offsets, total = [], 0
        for size in plan.sizes:
            offsets.append(total)
            total += size
        self.buffer_of, self.offsets, self.arena = plan.buffer_of, offsets, total
        self.streams = _streams(graph)

    def emit(self, line: str) -> None:
        self.body.append("        " + line)

    def timed(self, label: str, lines: list[str]) -> None:
        """Emit a call site's lines inside its timer (seconds summed while the program's
        timing is on: `<function>_timers`)."""
        site = len(self.sites)
        self.sites.append(label)
        self.emit(f"{{ double t0_ = {self.name}_timing ? omp_get_wtime() : 0.0;")
        for line in lines:
            self.emit("  " + line)
        seconds = f"{self.name}_seconds[{site}]"
        self.emit(f"  if ({self.name}_timing) {seconds} += omp_get_wtime() - t0_; }}")

    def arena_ref(self, value: Value) -> TRef:
        """Where a node writes `value`: its buffer in the arena, or the step's h / delta for
        the layer's outputs that may be written there (`_streams`)."""
        shape = _row(value)
        if value.name in self.streams:
            return TRef(self.streams[value.name], str(prod(shape)), 0, shape, _strides(shape))
        offset = self.offsets[self.buffer_of[value.name]]
        return TRef(f"(arena + T * {offset})", str(prod(shape)), 0, shape, _strides(shape))

    def contiguous(self, ref: TRef) -> TRef:
        """`ref` itself when its rows are dense and back to back, else a copy in the arena."""
        if ref.contiguous_rows() and ref.row_stride == str(ref.row_elements()):
            return ref
        n = ref.row_elements()
        if not ref.contiguous_rows():
            raise CodegenError("a strided row where a kernel needs dense rows")
        self.copies += 1
        tmp = f"(arena + T * {self.arena})"
        self.arena += n
        self.emit(
            f"for (long t = 0; t < T; ++t) memcpy({tmp} + t * {n}, {ref.at()} + t * "
            f"{ref.row_stride}, sizeof(float) * {n});"
        )
        return TRef(tmp, str(n), 0, ref.shape, ref.strides)

    def bind_inputs(self) -> None:
        fixed = {"h": "h", "delta": "delta"}
        for value in self.graph.inputs:
            if value.name in fixed:
                shape = _row(value)
                self.refs[id(value)] = TRef(
                    fixed[value.name], str(prod(shape)), 0, shape, _strides(shape)
                )
            elif value.role == "weight" and value.name != "rope_table":
                self.weight_inputs.append(value.name)
        self.names = {v.name: v for v in self.graph.inputs}

    def weight(self, value: Value | None) -> str:
        if value is None:
            return "0"
        return f"((const float *)W[{self.weight_inputs.index(value.name)}])"

    def input_pointer(self, value: Value) -> tuple[str, str]:
        """(pointer, row stride) of a group input: a [T, ...] value, a weight, an index."""
        if value.name == "positions":
            return "s->positions", "0"
        if value.name == "rope_table":
            return "s->rope_cache", "0"
        if value.role == "weight":
            return self.weight(value), "0"
        ref = self.refs[id(value)]
        if not ref.contiguous_rows():
            ref = self.contiguous(ref)
        return ref.at(), ref.row_stride

    def render_node(self, node: Node) -> None:
        render = _RENDER.get(node.op)
        if render is None:
            raise CodegenError(f"no layer-program code for {node.op.label}")
        render(self, node)

    def _fused(self, node: Node) -> None:
        epilogue = _epilogue(node)
        if epilogue is not None:
            self._gemm_epilogue(node, epilogue)
            return
        name = f"{self.name}_g{len(self.groups)}"
        self.groups.append(render_group(node.attrs["graph"], name))
        ins = [self.input_pointer(v) for v in node.inputs]
        outs = [self.arena_ref(v) for v in node.outputs]
        k = len(self.groups)
        self.timed(
            f"pointwise -> {_site_name(node.outputs[-1])}",
            [
                f"const void *in{k}[] = {{{', '.join(p for p, _ in ins)}}};",
                f"long rs{k}[] = {{{', '.join(r for _, r in ins)}}};",
                f"void *out{k}[] = {{{', '.join(o.ptr for o in outs)}}};",
                f"{name}(in{k}, rs{k}, out{k}, T, threads);",
            ],
        )
        for value, ref in zip(node.outputs, outs, strict=True):
            self.refs[id(value)] = ref

    def _gemm_call(self, node: Node, src: TRef, dst: str) -> str:
        """gemm_any of a LINEAR node on `src` into `dst` (its weight's format: F[g])."""
        _, weight, bias = node.inputs
        n_out, n_in = weight.shape
        g = len(self.linears)
        self.linears.append(weight.name)
        return (
            f"lk_gemm_any(F[{g}], {self.weight(weight)}, {src.at()}, {self.weight(bias)}, "
            f"{dst}, T, {n_out}, {n_in}, threads);"
        )

    def _linear(self, node: Node) -> None:
        out = node.outputs[0]
        src = self.contiguous(self.refs[id(node.inputs[0])])
        dst = self.arena_ref(out)
        self.timed(_site_name(node.inputs[1]), [self._gemm_call(node, src, dst.ptr)])
        self.refs[id(out)] = dst

    def _gemm_epilogue(self, node: Node, epilogue: Epilogue) -> None:
        """A GEMM with its tail: fused (codegen_gemm.py) on fp32 panels (format 0) past
        GEMM_EPILOGUE_MIN_TOKENS tokens (layer_kernels.h, a program knob), and on bf16 panels
        (format 10) wherever gemm_bf16 would run on AMX tiles; in any other format, or below
        those sizes, the GEMM into a scratch product, then the tail as a pointwise kernel."""
        linear, out = epilogue.linear, node.outputs[0]
        x, weight, bias = linear.inputs
        src = self.contiguous(self.refs[id(x)])
        dst = self.arena_ref(out)
        k = len(self.groups)
        fused, tail = f"{self.name}_e{k}", f"{self.name}_g{k}"
        self.groups.append(render_gemm_epilogue(epilogue, fused))
        self.groups.append(render_group(epilogue.tail, tail))
        n_out, n_in = weight.shape
        product = f"(arena + T * {self.arena})"  # scratch past the buffer plan's
        self.arena += n_out
        g = len(self.linears)
        gemm = self._gemm_call(linear, src, product)
        args = (f"({self.weight(weight)}, {src.at()}, {self.weight(bias)}, {dst.ptr}, "
                f"{epilogue.out_columns}, T, {n_out}, {n_in}, threads)")  # fmt: skip
        self.timed(
            f"{_site_name(weight)} + tail",
            [
                f"if (F[{g}] == {BF16_FORMAT} && {fused}_bf16{args}) {{}}",
                f"else if (F[{g}] == 0 && T > GEMM_EPILOGUE_MIN_TOKENS) {fused}{args};",
                f"else {{ {gemm}",
                f"  const void *in{k}[] = {{{product}}}; long rs{k}[] = {{{n_out}}};",
                f"  void *out{k}[] = {{{dst.ptr}}};",
                f"  {tail}(in{k}, rs{k}, out{k}, T, threads); }}",
            ],
        )
        self.refs[id(out)] = dst

    def _slice(self, node: Node) -> None:
        src = self.refs[id(node.inputs[0])]
        dim = node.attrs["dim"] - 1
        shape = list(src.shape)
        shape[dim] = node.attrs["stop"] - node.attrs["start"]
        offset = src.offset + node.attrs["start"] * src.strides[dim]
        self.refs[id(node.outputs[0])] = TRef(
            src.ptr, src.row_stride, offset, tuple(shape), src.strides
        )

    def _view(self, node: Node) -> None:
        src = self.refs[id(node.inputs[0])]
        if not src.contiguous_rows():
            src = self.contiguous(src)
        shape = _row(node.outputs[0])
        self.refs[id(node.outputs[0])] = TRef(
            src.ptr, src.row_stride, src.offset, shape, _strides(shape)
        )

    def _kv_store(self, node: Node) -> None:
        k, v = (self.refs[id(x)] for x in node.inputs[:2])
        if not (k.contiguous_rows() and v.contiguous_rows()):
            raise CodegenError("K / V rows must be dense to store")
        store = _KV_STORES.get(node.attrs["format"])
        if store is None:
            raise CodegenError(f"KV format {node.attrs['format']}")
        rows = (f"{k.at()} + t * {k.row_stride}", f"{v.at()} + t * {v.row_stride}")
        lines = ["for (long t = 0; t < T; ++t) {", *store(self, node, rows, k.row_elements()), "}"]
        self.timed("kv_store", lines)
        for value in node.outputs:
            self.refs[id(value)] = TRef("kc", "0", 0, (), ())  # the cache, in place

    def _store_e4m3(self, node: Node, rows: tuple[str, str], n: int) -> list[str]:
        """FP8 codes of (x - shift) / scale per head."""
        k_scale, v_scale, k_shift = (self.weight(x) for x in node.inputs[5:8])
        stores = (("kc", rows[0], k_scale, k_shift), ("vc", rows[1], v_scale, "0"))
        return [
            f"    lk_store_e4m3({row}, (uint8_t *){cache} + s->slots[t] * {n}, "
            f"{scale}, {shift}, {self.kv_heads}, {self.dim});"
            for cache, row, scale, shift in stores
        ]

    def _store_f32(self, node: Node, rows: tuple[str, str], n: int) -> list[str]:
        return [
            f"    memcpy({cache} + s->slots[t] * {n}, {row}, sizeof(float) * {n});"
            for cache, row in (("kc", rows[0]), ("vc", rows[1]))
        ]

    def _attention(self, node: Node) -> None:
        if node.attrs["operands"] != "fp32":
            raise CodegenError("attention operands other than fp32")
        if self.phase == "prefill":
            self._prefill_attention(node)
            return
        q = self.contiguous(self.refs[id(node.inputs[0])])
        out = self.arena_ref(node.outputs[0])
        _, kv_scales, sinks = attention_parts(node.inputs, node.attrs)
        scales = "0, 0"  # FP8 codes: the per-head scales (the key shift cancels out)
        if node.attrs["kv_format"] != "f32":
            scales = ", ".join(self.weight(x) for x in kv_scales[:2])
        self.timed(
            "attention",
            [
                f"lk_decode_attention({q.at()}, kc, vc, {scales}, s->block_tables, "
                f"s->max_blocks, s->seq_lens, {out.ptr}, T, {self.heads}, "
                f"{self.kv_heads}, {self.dim}, s->block_size, {self.scale!r}f, s->window, "
                f"{self.weight(sinks)}, threads);"
            ],
        )
        self.refs[id(node.outputs[0])] = out

    def _prefill_attention(self, node: Node) -> None:
        """Every sequence's queries against its cached and new keys (stored before), read
        through the block tables in place: the paged prefill kernel."""
        if node.attrs["kv_format"] != "f32":
            raise CodegenError(f"prefill attention over a {node.attrs['kv_format']} KV cache")
        q = self.refs[id(node.inputs[0])]
        if not q.contiguous_rows():
            q = self.contiguous(q)
        out = self.arena_ref(node.outputs[0])
        sinks = attention_parts(node.inputs, node.attrs)[2]
        self.timed(
            "attention",
            [
                f"paged_prefill_attention_f32({q.at()}, {q.row_stride}, kc, vc, "
                "p->query_start, p->query_lens, p->seq_lens, p->block_tables, p->max_blocks, "
                f"p->prefills, {out.ptr}, {self.heads}, {self.kv_heads}, {self.dim}, "
                f"s->block_size, {self.scale!r}f, s->window, {self.weight(sinks)}, threads);"
            ],
        )
        self.refs[id(node.outputs[0])] = out

    def _moe(self, node: Node) -> None:
        """A mixture-of-experts feed-forward: lk_moe on the layer's moe_args (the MoE input's
        pointer in `weights`: compiler/program_moe.py builds it)."""
        x, module = node.inputs
        src = self.contiguous(self.refs[id(x)])
        out = self.arena_ref(node.outputs[0])
        slot = self.weight_inputs.index(module.name)
        self.timed(
            _site_name(module),
            [
                f"lk_moe((const moe_args *)W[{slot}], {src.at()}, {out.ptr}, T, "
                f"{src.row_elements()}, threads);"
            ],
        )
        self.refs[id(node.outputs[0])] = out

    def render(self) -> LayerProgram:
        self.bind_inputs()
        for node in self.graph.nodes:
            self.render_node(node)
        delta_out, h_out = self.graph.outputs[0], self.graph.outputs[1]
        tail = []
        for target, value in (("h", h_out), ("delta", delta_out)):
            if value.name in self.streams:
                continue  # (written there by its producer)
            ref = self.refs[id(value)]
            n = ref.row_elements()
            tail.append(
                f"for (long t = 0; t < T; ++t) memcpy({target} + t * {n}, "
                f"{ref.at()} + t * {ref.row_stride}, sizeof(float) * {n});"
            )
        if tail:  # (what its producer could not write in place)
            self.timed("copy out (h, delta)", tail)
        nw, ng = len(self.weight_inputs), len(self.linears)
        includes = ["#include <omp.h>", "#include <string.h>", '#include "layer_kernels.h"']
        sites = max(1, len(self.sites))
        definitions = "\n".join(
            [
                *self.groups,
                "/* seconds per call site since the last reset, summed over layers and calls",
                f" * (profiling: {self.name}_timers copies them out, then times on or off) */",
                f"static double {self.name}_seconds[{sites}];",
                f"static int {self.name}_timing = 0;",
                f"void {self.name}_timers(int enable, double *out) {{",
                f"    if (out) memcpy(out, {self.name}_seconds, sizeof {self.name}_seconds);",
                f"    memset({self.name}_seconds, 0, sizeof {self.name}_seconds);",
                f"    {self.name}_timing = enable;",
                "}",
                f"void {self.name}(const void *const *weights, const long *formats, "
                "float *const *caches, long n_layers, const step_args *const *steps, "
                "float *h, float *delta, float *arena, int threads, "
                "const prefill_args *const *prefills) {",
                "    long T = steps[0]->tokens;",
                "    for (long l = 0; l < n_layers; ++l) {",
                "        const step_args *s = steps[l];  /* the layer's view of the step */",
                "        const prefill_args *p = prefills ? prefills[l] : 0;",
                f"        const void *const *W = weights + l * {max(nw, 1)};",
                f"        const long *F = formats + l * {max(ng, 1)};",
                "        float *kc = caches[2 * l], *vc = caches[2 * l + 1];",
                "        (void)W; (void)F; (void)p;",
                *self.body,
                "    }",
                "}",
                "",
            ]
        )
        program = LayerProgram("", self.name, self.weight_inputs, self.linears, self.arena)
        program.includes, program.definitions = includes, definitions
        program.sites = list(self.sites)
        program.attention = any(n.op in (Op.ATTENTION, Op.KV_STORE) for n in self.graph.nodes)
        program.source = _translation_unit([program])
        return program

    def _mixer(self, node: Node) -> None:
        """A mixer the module runs (the per-layer fallback): the layer's mixer_args callback
        (program.py) on the normed rows, into the arena."""
        x, module, _, _ = node.inputs
        src = self.contiguous(self.refs[id(x)])
        out = self.arena_ref(node.outputs[0])
        slot = self.weight_inputs.index(module.name)
        args = f"const mixer_args *m_ = (const mixer_args *)W[{slot}];"
        callback = f"m_->call(m_->layer, {src.at()}, {out.ptr}, T);"
        # a mixer's native step where it has one and the step runs it (kind 0: the callback)
        native = f"lk_mixer_decode(m_->kind, m_->native, {src.at()}, {out.ptr}, T, threads)"
        callback = f"if (!{native}) {callback}"
        self.timed(f"mixer {node.attrs['mixer']}", [f"{{ {args} {callback} }}"])
        self.refs[id(node.outputs[0])] = out


def _streams(graph: Graph) -> dict[str, str]:
    """The layer's outputs (delta, h) that its producer may write straight into the step's
    `delta` / `h` — the buffers the program otherwise copies them to at the end of the layer
    ("copy out"): those produced after the last node that reads the input of that name, of
    its shape. Value name → "h" / "delta"."""
    inputs = {value.name: value for value in graph.inputs}
    producers, users = graph.producers(), graph.users()
    position = {id(node): i for i, node in enumerate(graph.nodes)}
    streams = {}
    for target, value in (("delta", graph.outputs[0]), ("h", graph.outputs[1])):
        source, producer = inputs.get(target), producers.get(id(value))
        if source is None or producer is None or value.shape != source.shape:
            continue
        readers = [position[id(node)] for node in users.get(id(source), [])]
        if max(readers, default=-1) < position[id(producer)]:
            streams[value.name] = target
    return streams


def _site_name(value: Value) -> str:
    """A call site's name from the value it reads or writes: a weight's module path
    ("attn.qkv"), an activation's name without its slice and version marks ("attn_norm")."""
    if value.role == "weight":
        return value.name.removesuffix(".weight")
    return re.sub(r"\.\d+", "", re.sub(r"\[[^\]]*\]", "", value.name))


def _translation_unit(programs: list[LayerProgram]) -> str:
    """One C source holding the programs' functions (their includes once)."""
    includes = list(dict.fromkeys(line for p in programs for line in p.includes))
    names = ", ".join(p.function for p in programs)
    return "\n".join(
        [
            f"/* generated by infergen.compiler.codegen_layer: {names} */",
            *includes,
            PREFILL_ARGS,
            MIXER_ARGS,
            *(p.definitions for p in programs),
        ]
    )


def render_layer_program(
    graph: Graph,
    name: str,
    heads: int,
    kv_heads: int,
    dim: int,
    scale: float,
    phase: str = "decode",
) -> LayerProgram:
    """The C layer program of a "jit" layer graph for `phase` (see the module docstring);
    CodegenError when the graph holds something it has no code for."""
    flat = flatten(graph)
    return _Renderer(flat, name, heads, kv_heads, dim, scale, phase).render()


# the op → its renderer; a KV store's format → the C that stores one token's K and V
_RENDER = {
    Op.FUSED: _Renderer._fused,
    Op.LINEAR: _Renderer._linear,
    Op.SLICE: _Renderer._slice,
    Op.VIEW: _Renderer._view,
    Op.KV_STORE: _Renderer._kv_store,
    Op.ATTENTION: _Renderer._attention,
    Op.MOE: _Renderer._moe,
    Op.MIXER: _Renderer._mixer,
}
_KV_STORES = {"fp8_e4m3": _Renderer._store_e4m3, "f32": _Renderer._store_f32}


# the phases' function names (one translation unit holds both)
FUNCTIONS = {"decode": "layer_program", "prefill": "prefill_program"}


def render_layer_programs(
    graph: Graph, heads: int, kv_heads: int, dim: int, scale: float
) -> tuple[dict[str, LayerProgram], dict[str, str]]:
    """Every phase's program of a "jit" layer graph, all in one C source (each program's
    `source`): one compile and one JIT cache entry for both.
    Returns (phase → program, phase → why not for the phases it has no code for);
    CodegenError when the decode program has none."""
    programs, refused = {}, {}
    for phase, function in FUNCTIONS.items():
        try:
            programs[phase] = render_layer_program(
                graph, function, heads, kv_heads, dim, scale, phase
            )
        except CodegenError as error:
            if phase == "decode":
                raise
            refused[phase] = str(error)
    source = _translation_unit(list(programs.values()))
    for program in programs.values():
        program.source = source
    return programs, refused
