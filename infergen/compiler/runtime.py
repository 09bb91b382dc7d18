"""The compiled decoder layers inside the engine (EngineConfig.compile = "eager" | "jit").

At engine start the decoder layer is captured once (layers share the graph; each binds its
own weights) and, for "jit", run through the "jit" pipeline with every fused pointwise group
compiled by the code-generation target of the engine's kernel set (GROUP_TARGETS: "c", the C
renderer through the JIT cache, for the native and torch sets; "triton", the Triton renderer,
codegen_triton.py, for kernels="triton" — on a GPU, or on the CPU in Triton's interpreter).
A GEMM whose product only feeds a pointwise tail (the gate/up projection and its SwiGLU)
runs as one fused GEMM of the target (EpilogueTarget: C over fp32 panels, codegen_gemm.py;
Triton over a dense fp32 weight, codegen_triton_gemm.py) wherever the layer's weight is in
that layout. Other groups that hold a GEMM or a KV store run op by op, their pointwise tails
compiled as nested groups (also the fallback of a fused GEMM's layers in another layout). Each
step then walks the graph: generated kernels for fused groups, the engine's own
op backends of its kernel set for everything else (packed GEMMs or torch's, native or Triton
decode and prefill attention, KV store) — the "eager" mode walks the captured graph unfused,
op by op.

Bucketed dispatch (C target): a step's token count T picks a bucket (buckets.py); a fused
group holds the kernel variant the tuner (tune.py, tuning.json) found fastest for each bucket
it measured, and the default variant for the others. Decode steps of the C target run the
generated whole-layer program (program.py); the Triton target has neither (one variant per
group, decode steps walk the graph too).

The layers' residual stream comes back as a new tensor (`run` returns h and the pending
delta); the KV cache is written in place, as the per-op path does.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from infergen import profiling
from infergen.compiler import pipelines  # noqa: F401  (registers the pipelines)
from infergen.compiler.buckets import bucket_of
from infergen.compiler.codegen_c import CodegenError
from infergen.compiler.codegen_gemm import NR, Epilogue, is_gemm_group, plan_epilogue
from infergen.compiler.codegen_layer import PHASES
from infergen.compiler.codegen_triton import TritonGroupKernel
from infergen.compiler.codegen_triton_gemm import TritonGemmEpilogueKernel, serves_dense
from infergen.compiler.concurrent_builds import Outcome, run_builds
from infergen.compiler.decoder import attention_captured, capture_kinds, capture_layers
from infergen.compiler.interpret import EXECUTORS, attention_core, kv_layer, run
from infergen.compiler.ir import Graph, Node, Op, attention_parts
from infergen.compiler.jit_cache import JitCache, NotBuilt
from infergen.compiler.kernel import compile_gemm_epilogue, compile_group
from infergen.compiler.passes import PASSES, run_pipeline
from infergen.compiler.program import LayerProgramRunner, ProgramUnavailable
from infergen.compiler.regions import node_region
from infergen.compiler.tune import TuningRecord, group_key
from infergen.layers.attention import Attention
from infergen.layers.mlp import GatedMLP
from infergen.models.fast_paths import FAST_PATHS, FastPath
from infergen.models.fused_decode import FusedHead, StackCost
from infergen.ops.kv_store import kv_store
from infergen.ops.paged_attention import decode_with, paged_attention
from infergen.ops.rope import RopeInputs
from infergen.registry import Registry

COMPILE_MODES = ("off", "eager", "jit")
NOT_IN_BUDGET = "not built within the startup budget (compile_budget_s)"


@dataclass
class CompileReport:
    """What starting the compiled path cost and built."""

    capture_seconds: float = 0.0
    passes_seconds: float = 0.0
    # C compiler time summed over the kernels built (0 when every kernel came from the
    # cache); Triton: the first launches (where Triton compiles, or loads from its own cache)
    compile_seconds: float = 0.0
    # wall-clock seconds of building and loading them (builds run side by side: less than
    # compile_seconds where several were compiled): what the engine's start waited for them
    build_seconds: float = 0.0
    kernels_built: int = 0  # rendered now (C: compiled; Triton: source written)
    kernels_cached: int = 0  # found in the JIT cache
    target: str = "c"  # the GROUP_TARGETS row the fused groups were compiled by
    tuned_buckets: int = 0  # (group, bucket) pairs running the tuner's winner
    groups_op_by_op: list[str] = field(default_factory=list)
    # GEMM-with-tail groups whose GEMM and tail run one after the other (both still kernels),
    # and why: codegen_gemm.py has no fused form for them, or the startup budget left it out
    epilogues_unfused: list[str] = field(default_factory=list)

    @property
    def total_seconds(self) -> float:
        """The start's wall-clock seconds in the compiler: capture, passes, builds."""
        return self.capture_seconds + self.passes_seconds + self.build_seconds

    def count(self, built) -> None:
        """A kernel built now or found in the cache (jit_cache.Built)."""
        self.compile_seconds += built.seconds
        self.kernels_cached += built.cached
        self.kernels_built += not built.cached


class CompiledLayers:
    def __init__(self, model, kv_cache, mode: str, jit_cache: JitCache | None = None):
        if mode not in ("eager", "jit"):
            raise ValueError(f"compile mode {mode!r}: expected 'eager' or 'jit'")
        self.model, self.kv_cache, self.mode = model, kv_cache, mode
        kernels = getattr(model, "kernels", "native")  # the set its layers were built with
        target = kernels if kernels in GROUP_TARGETS else "c"
        self.target = GROUP_TARGETS.get(target, where="kernels")
        self.report = CompileReport(target=target)
        # seconds per node kind / fused group, summed over calls (None: not profiling)
        self.profile: dict[str, float] | None = None
        started = time.perf_counter()
        # the layers' distinct graphs (decoder.py: one per kind of layer) and each layer's
        self.kinds = capture_kinds(model, kv_cache)
        self.kind_of = [0] * len(model.layers)
        for k, kind in enumerate(self.kinds):
            for index in kind.layers:
                self.kind_of[index] = k
            if kind.module_mixer is not None:  # (the per-layer fallback, named)
                self.report.groups_op_by_op.append(
                    f"{kind.describe()}: the {kind.module_mixer} runs as its module"
                )
        self.report.capture_seconds = time.perf_counter() - started
        started = time.perf_counter()
        self.graphs = [copy.deepcopy(kind.captured.graph) for kind in self.kinds]
        if mode == "jit":
            self.graphs = [_jit(graph) for graph in self.graphs]
        self.report.passes_seconds = time.perf_counter() - started
        # per kind, the graph inputs bound from the layer's view of each step
        self.step_inputs = [
            [v.name for v in graph.inputs if v.name in STEP_INPUTS] for graph in self.graphs
        ]
        # the step's head in one C call after the layer programs (FusedHead: the final norm,
        # the LM head, a greedy batch's argmax); None: Transformer.head runs it
        head = FusedHead(model) if mode == "jit" else None
        self.head = head if head is not None and head.available else None
        self.kernels: dict[int, dict[str, Any]] = {}  # id(FUSED node) → bucket → kernel
        # id(FUSED GEMM-with-tail node) → its fused GEMM (codegen_gemm.py; fp32 panels)
        self.gemm_epilogues: dict[int, Any] = {}  # (EpilogueTarget.build's kernels)
        jit_cache = jit_cache or JitCache()
        # the engine's startup budget chose what to build (compiler/startup.py): load only
        if getattr(model, "jit_cached_only", False):
            jit_cache = jit_cache.loading_only()
        # weights bound once per layer; the step's inputs are bound per call, from the
        # layer's view of the step (ForwardBatch.view: its cache group, its RoPE table)
        self.static = [self._static_env(i) for i in range(len(model.layers))]
        self.views = [(layer.attn.group, layer.attn.rope_index) for layer in model.layers]
        self.ops = _engine_ops(model)
        # decode steps, and steps with prefills: the layers of each kind as one generated C
        # function per phase (program.py), called per run of consecutive layers of the kind
        self.runs = _runs(self.kind_of)
        self.programs: dict[str, list] = {phase: [None] * len(self.graphs) for phase in PHASES}
        # (a profiled program call's work: a mixer the module runs counts its own)
        attends = [attention_captured(model, index) for index in range(len(model.layers))]
        self.stack_cost = StackCost(model, kv_cache, attends.__getitem__)
        if mode == "jit":
            self._compile_all(jit_cache)

    @property
    def program(self):
        """The decode program of the first kind of layer (of every layer, for most models)."""
        return self.programs["decode"][0]

    @program.setter
    def program(self, runner) -> None:
        self.programs["decode"][0] = runner

    @property
    def prefill_program(self):
        return self.programs["prefill"][0]

    @prefill_program.setter
    def prefill_program(self, runner) -> None:
        self.programs["prefill"][0] = runner

    @contextlib.contextmanager
    def timed(self, phase: str):
        """Every kind's `phase` program's call-site timers on while the block runs: yields a
        dict of seconds per call site, filled when the block ends; with several kinds of
        layer, per kind and call site ("layers 0-2, 4-6 (linear_attention ...): attn.qkv")."""
        seconds: dict[str, float] = {}
        programs = [(k, p) for k, p in enumerate(self.programs[phase]) if p is not None]
        with contextlib.ExitStack() as stack:
            found = [(k, stack.enter_context(p.timed())) for k, p in programs]
            yield seconds
        for k, sites in found:
            kind = f"{self.kinds[k].describe()}: " if len(self.kinds) > 1 else ""
            for site, value in sites.items():
                seconds[kind + site] = seconds.get(kind + site, 0.0) + value

    def _compile_all(self, jit_cache: JitCache) -> None:
        """Every kernel of the jit mode — per kind of layer its fused GEMMs and pointwise
        groups, then the layer programs per phase and kind — built side by side
        (concurrent_builds.py, where the target allows), then taken in that order."""
        started = time.perf_counter()
        device = self.model.rope_cache.device
        jobs: list[tuple[Callable[[], Any], Callable[[Outcome], None]]] = []
        for graph in self.graphs:
            jobs += self._kernel_jobs(graph, jit_cache, device)
        # the first phase's programs, the longest compiles, start first (the other phases'
        # share their JIT cache entries: started at once, they would only wait for them)
        programs = range(len(jobs), len(jobs) + len(self.graphs))
        if self.target.layer_program:
            for phase in self.programs:
                for k, graph in enumerate(self.graphs):
                    jobs.append((functools.partial(self._new_program, graph, jit_cache, phase, k),
                                 functools.partial(self._take_program, phase, k)))  # fmt: skip
        outcomes = run_builds([build for build, _ in jobs], self.target.parallel_builds, programs)
        for (_, take), outcome in zip(jobs, outcomes, strict=True):
            take(outcome)
        if not self.target.layer_program:
            self.report.groups_op_by_op.append(
                f"layer program: C only (target {self.report.target!r})"
            )
        self.report.build_seconds = time.perf_counter() - started

    def _new_program(self, graph: Graph, jit_cache: JitCache, phase: str, kind: int):
        return LayerProgramRunner(self.model, self.kv_cache, graph, self.static, jit_cache,
                                  phase=phase, layers=self.kinds[kind].layers)  # fmt: skip

    def _take_program(self, phase: str, kind: int, outcome: Outcome) -> None:
        try:
            program = outcome.get()
        except ProgramUnavailable as why:
            label = "layer program" if phase == "decode" else f"{phase} layer program"
            if len(self.kinds) > 1:
                label += f" of {self.kinds[kind].describe()}"
            self.report.groups_op_by_op.append(f"{label}: {why}")
            return
        for built in program.builds:
            self.report.count(built)
        self.report.tuned_buckets += len(program.by_bucket)
        self.programs[phase][kind] = program

    def _static_env(self, index: int) -> dict[str, Any]:
        """The inputs fixed for layer `index`: its weights, its KV cache (and scales)."""
        layer, kv = self.model.layers[index], self.kv_cache.layer(index)
        env = {}
        for name, source in self.kinds[self.kind_of[index]].captured.sources.items():
            if source.origin in ("module", "kv"):
                env[name] = source.fetch(layer, {"kv": kv})
        env["rope_table"] = self.model.rope_tables[layer.attn.rope_index]
        return env

    def _kernel_jobs(self, graph: Graph, jit_cache: JitCache, device) -> list[tuple]:
        """(build, take) of each kernel of `graph`: its GEMM-with-tail groups as fused GEMMs
        (the target's rendering; those it refuses, or the budget left out, run their GEMM and
        then their tail), then its pointwise groups."""
        jobs = []
        if self.target.gemm_epilogue is not None:
            for node in filter(is_gemm_group, graph.nodes):
                sub = node.attrs["graph"]
                jobs.append((functools.partial(self._build_epilogue, sub, jit_cache, device),
                             functools.partial(self._take_epilogue, node)))  # fmt: skip
        for node in pointwise_groups(graph):
            sub = node.attrs["graph"]
            jobs.append((functools.partial(self.target.build, sub, jit_cache, "default", device),
                         functools.partial(self._take_group, node, jit_cache, device)))  # fmt: skip
        return jobs

    def _build_epilogue(self, sub: Graph, jit_cache: JitCache, device):
        target = self.target.gemm_epilogue
        epilogue = plan_epilogue(sub, target.panel)
        weight = epilogue.linear.inputs[1].name
        if not any(target.serves(epilogue, env[weight]) for env in self.static):
            raise CodegenError(f"no layer's weight is {target.layout}")  # (not built)
        return target.build(epilogue, jit_cache, device)

    def _take_epilogue(self, node: Node, outcome: Outcome) -> None:
        kernel = _built_or_why(outcome.get, node.attrs["graph"], self.report.epilogues_unfused)
        if kernel is not None:
            self.gemm_epilogues[id(node)] = kernel
            self.report.count(kernel.built)

    def _take_group(self, node: Node, jit_cache: JitCache, device, outcome: Outcome) -> None:
        """A pointwise group's default kernel, and the tuner's winners per bucket (built
        here, one after the other: a tuned cache holds them already)."""
        sub = node.attrs["graph"]
        kernel = _built_or_why(outcome.get, sub, self.report.groups_op_by_op)
        if kernel is None:
            return
        variants = {"default": kernel}
        winners = {}
        if self.target.tuned:
            winners = TuningRecord(jit_cache).winners(group_key(sub, jit_cache))
        for bucket, variant in winners.items():
            try:
                variants[bucket] = (
                    kernel
                    if variant == "default"
                    else self.target.build(sub, jit_cache, variant, device)
                )
            except NotBuilt:
                continue  # (a winner evicted since: the default runs that bucket)
        self.kernels[id(node)] = variants
        for built in {id(k): k.built for k in variants.values()}.values():
            self.report.count(built)
        self.report.tuned_buckets += len(winners)

    # ---- per step ------------------------------------------------------------------------
    def run(self, h: torch.Tensor, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """All decoder layers of the step: returns (residual stream h, pending delta)."""
        return self._run(h, batch, self._serving(batch) if self.profile is None else None)

    def _run(self, h: torch.Tensor, batch, programs: list | None):
        """`run` with the step's programs per kind (`_serving`; None: walk every layer)."""
        delta = torch.zeros_like(h)
        if programs is None:  # the graph walker, layer by layer
            for index in range(len(self.model.layers)):
                h, delta = self.run_layer(index, h, delta, batch)
            return h, delta
        for kind, layers in self.runs:  # each run of one kind's layers: its program (or walked)
            program = programs[kind]
            if program is None:
                for position in layers:
                    index = self.kinds[kind].layers[position]
                    h, delta = self.run_layer(index, h, delta, batch)
            elif profiling.enabled():
                with self._program_region(program, kind, layers, h.shape[0], batch):
                    h, delta = program.run(h, batch, delta=delta, run=layers)
            else:
                h, delta = program.run(h, batch, delta=delta, run=layers)
        return h, delta

    def run_logits(self, batch) -> torch.Tensor | None:
        """The logits of a step whose rows are all sampled (Transformer._forward asks), when
        layer programs run its layers: the embedding, they, then the head in one C call
        (FusedHead); None for walked steps, without a C head, and while profiling
        (Transformer runs the embedding and the head)."""
        if self.head is None or self.profile is not None or profiling.enabled():
            return None
        programs = self._serving(batch)
        if programs is None:
            return None
        h, delta = self._run(self.model.embed_rows(batch.input_ids), batch, programs)
        return self.head(h, delta, batch)

    def _serving(self, batch) -> list | None:
        """Per kind, the program of the step's phase (None for a kind without one); None when
        no kind has one (the step is walked)."""
        for programs in self.programs.values():
            serving = [p if p is not None and p.serves(batch) else None for p in programs]
            if any(serving):
                return serving
        return None

    def _program_region(self, program, kind: int, run: range, tokens: int, batch):
        """The profiler's region of a program call on a run of one kind's layers."""
        layers = [self.kinds[kind].layers[position] for position in run]
        plan = batch.attn_plans[0] if batch.attn_plans else None
        work = self.stack_cost(tokens, plan, layers, program.native_costs_at(batch))
        title = f"{len(layers)} layers, jit {program.phase} program"
        return profiling.region(f"{program.phase}_layers", title, work)

    def run_layer(self, index: int, h: torch.Tensor, delta: torch.Tensor, batch):
        """Decoder layer `index`: returns (h + delta + its attention output, its MLP output)."""
        env = dict(self.static[index])
        view = batch.view(*self.views[index])  # the layer's cache group and RoPE table
        kind = self.kind_of[index]
        env.update(h=h, delta=delta)
        env.update((name, STEP_INPUTS[name](view)) for name in self.step_inputs[kind])
        bucket = bucket_of(h.shape[0])
        run_node = lambda n, a, s: self._timed(n, a, s, bucket)  # noqa: E731
        delta, h, *_ = run(self.graphs[kind], env, run_node)
        return h, delta

    def _timed(self, node: Node, args: list, sizes: dict[str, int], bucket: str) -> tuple:
        if self.profile is None:
            return self._node(node, args, sizes, bucket)
        started = time.perf_counter()
        result = self._node(node, args, sizes, bucket)
        label = node.attrs.get("kernel", node.op.label)
        self.profile[label] = self.profile.get(label, 0.0) + time.perf_counter() - started
        return result

    def _node(self, node: Node, args: list, sizes: dict[str, int], bucket: str) -> tuple:
        if profiling.enabled():  # the node's region (compiler/regions.py)
            region = node_region(node, args, sizes, id(node) in self.kernels)
            if region is not None:
                with region:
                    return self._run_node(node, args, sizes, bucket)
        return self._run_node(node, args, sizes, bucket)

    def _run_node(self, node: Node, args: list, sizes: dict[str, int], bucket: str) -> tuple:
        if node.op is Op.FUSED:
            fused_gemm = self.gemm_epilogues.get(id(node))
            if fused_gemm is not None:
                out = _run_gemm_epilogue(self.target.gemm_epilogue, fused_gemm, args)
                if out is not None:
                    return out
            variants = self.kernels.get(id(node))
            if variants is not None:
                return tuple((variants.get(bucket) or variants["default"])(*args))
            sub = node.attrs["graph"]
            env = {v.name: a for v, a in zip(sub.inputs, args, strict=True)}
            return tuple(run(sub, env, lambda n, a, s: self._node(n, a, s, bucket)))
        engine_op = ENGINE_OPS.get(node.op.label) if node.op.label in ENGINE_OPS else None
        if engine_op is not None:
            return engine_op(self.ops, args, node.attrs)
        return EXECUTORS[node.op](args, node.attrs, sizes)


# a graph input bound per step → its value in the layer's view of the step (ForwardBatch.view)
STEP_INPUTS: dict[str, Callable[[Any], Any]] = {
    "slots": lambda view: view.slot_mapping,
    "plan": lambda view: view.attn_plan,
    "positions": lambda view: view.rope.positions,
    "batch_whole": lambda view: view,  # (a MIXER node's: the module takes the view whole)
}


def _runs(kind_of: list[int]) -> list[tuple[int, range]]:
    """The runs of consecutive layers of one kind: (kind, positions of its layers in the
    kind's list). [0, 0, 1, 0] → [(0, range(0, 2)), (1, range(0, 1)), (0, range(2, 3))]."""
    runs: list[tuple[int, range]] = []
    seen = [0] * (max(kind_of, default=-1) + 1)
    for kind in kind_of:
        if runs and runs[-1][0] == kind:
            runs[-1] = (kind, range(runs[-1][1].start, runs[-1][1].stop + 1))
        else:
            runs.append((kind, range(seen[kind], seen[kind] + 1)))
        seen[kind] += 1
    return runs


def _built_or_why(build: Callable[[], Any], sub: Graph, why: list[str]) -> Any | None:
    """`build()`'s kernel, or None with the reason appended to `why` (no code for the group,
    or left out by the startup budget)."""
    try:
        return build()
    except CodegenError as error:
        why.append(f"{sub.name}: {error}")
    except NotBuilt:
        why.append(f"{sub.name}: {NOT_IN_BUDGET}")
    return None


def _run_gemm_epilogue(target: EpilogueTarget, kernel: Any, args: list) -> tuple | None:
    """The fused GEMM on the group's inputs, or None where the layer's weight is not in the
    layout its target's kernel reads (`target.serves`): then the group's GEMM and tail run
    one after the other."""
    epilogue = kernel.epilogue
    linear = args[epilogue.weight_input]
    if not target.serves(epilogue, linear):
        return None
    return (kernel(args[epilogue.x_input], linear.weight, linear.bias),)


def pointwise_groups(graph: Graph) -> list[Node]:
    """The fused pointwise groups (what codegen_c renders), nested ones included."""
    found = []
    for node in graph.nodes:
        if node.op is Op.FUSED:
            if node.attrs["kernel"] == "pointwise":
                found.append(node)
            else:
                found.extend(pointwise_groups(node.attrs["graph"]))
    return found


def jit_graph(model, kv_cache) -> Graph:
    """The decoder layer after the "jit" pipeline, pointwise tails inside groups fused (layers
    of one kind: capture_layers)."""
    return _jit(capture_layers(model, kv_cache).graph)


def jit_kinds(model, kv_cache) -> list[tuple[Graph, list[int]]]:
    """Per kind of decoder layer (decoder.capture_kinds), its graph after the "jit" pipeline
    and the indices of its layers."""
    return [(_jit(kind.captured.graph), kind.layers) for kind in capture_kinds(model, kv_cache)]


def _jit(graph: Graph) -> Graph:
    graph = run_pipeline(graph, "jit")
    _fuse_inside_groups(graph)
    return graph


def _fuse_inside_groups(graph: Graph) -> None:
    """Fuse the pointwise tails inside groups that also hold a GEMM or a KV store (so the
    group's elementwise part still becomes one generated kernel)."""
    for node in graph.nodes:
        if node.op is Op.FUSED and node.attrs["kernel"] != "pointwise":
            PASSES.get("fuse_pointwise")(node.attrs["graph"])


def _engine_ops(model) -> _EngineOps:
    """The op backends of the model's layers: of its first captured attention, its first
    gated MLP (a model may have neither: Mamba2)."""
    attentions = (getattr(layer.attn, "attention", layer.attn) for layer in model.layers)
    attn = next((a for a in attentions if isinstance(a, Attention)), None)  # (Falcon-H1's too)
    act = next((layer.mlp.act for layer in model.layers if isinstance(layer.mlp, GatedMLP)), None)
    return _EngineOps(
        getattr(attn, "decode_row", None),
        getattr(attn, "rope", None),
        act,  # (an MoE layer runs its own: the MOE node's module)
        model.layers[0].attn_norm.fn,
        getattr(attn, "prefill", None),
    )


@dataclass(frozen=True)
class _EngineOps:
    """The op backends the model's layers use (rows of its kernel set: native C, Triton or
    torch)."""

    decode: Any  # the decode row (bound per node to its attention core: decode_with)
    rope: Any
    gated_act: Any  # the MLP's gated activation (SiLU-mul or GELU-mul)
    rms_norm: Any
    prefill: Any


@dataclass(frozen=True)
class EpilogueTarget:
    """How a code-generation target fuses a GEMM-with-tail group (codegen_gemm.py's
    Epilogue): the weight layout its kernel reads and the kernel."""

    panel: int  # the columns each part of the product must be a whole number of
    serves: Callable[[Epilogue, Any], bool]  # whether a layer's Linear runs the kernel
    layout: str  # what `serves` asks of a weight (the compile report's reason)
    # (epilogue, JIT cache, device) → kernel: `kernel(x, weight, bias)`, `epilogue`, `built`;
    # CodegenError when the target has no code for it
    build: Callable[[Epilogue, JitCache, torch.device], Any]


@dataclass(frozen=True)
class GroupTarget:
    """A code-generation target of the fused pointwise groups."""

    # (group, JIT cache, variant, device) → kernel: `kernel(*inputs)` → outputs, and `built`
    # (jit_cache.Built: seconds, cached); CodegenError when the target has no code for it
    build: Callable[[Graph, JitCache, str, torch.device], Any]
    tuned: bool  # the tuner's per-bucket variants apply (tune.py measures C variants)
    gemm_epilogue: EpilogueTarget | None  # GEMM-with-tail groups run as one fused GEMM
    layer_program: bool  # decode steps may run the generated whole-layer C program
    # its kernels build side by side at engine start (concurrent_builds.py: C compiler
    # processes); False: one after the other
    parallel_builds: bool


# the engine's kernel set → the target its fused groups compile to (a set without a row: "c")
GROUP_TARGETS: Registry[GroupTarget] = Registry("codegen target")
GROUP_TARGETS.register(
    "c", GroupTarget(lambda g, cache, variant, device: compile_group(g, cache, variant),
                     tuned=True, layer_program=True, parallel_builds=True,
                     gemm_epilogue=EpilogueTarget(
                         NR, Epilogue.serves, "fp32 panels",
                         lambda epilogue, cache, device: compile_gemm_epilogue(epilogue, cache)))
)  # fmt: skip
GROUP_TARGETS.register(
    "triton", GroupTarget(lambda g, cache, variant, device: TritonGroupKernel(g, cache, device),
                          tuned=False, layer_program=False, parallel_builds=False,
                          gemm_epilogue=EpilogueTarget(1, serves_dense, "a dense fp32 [N, K]",
                                                       TritonGemmEpilogueKernel))
)  # fmt: skip


# the engine's implementation of the ops the graph leaves whole (the rest: interpret.py)
ENGINE_OPS: Registry = Registry("engine op")


@ENGINE_OPS.decorator("linear")
def _linear(ops, args, attrs):
    x, linear, _ = args
    if attrs.get("quantizer") is not None:  # its input quantizer fused in: as the per-op path
        return (linear.product(x.contiguous()),)
    return (linear.backend.apply(x.contiguous(), linear.weight, linear.bias, linear.out_features),)


@ENGINE_OPS.decorator("kv_store")
def _kv_store(ops, args, attrs):
    k, v, k_cache, v_cache, slots, *scales = args
    kv_store(k, v, k_cache, v_cache, slots, kv_layer(k_cache, v_cache, scales, attrs["format"]))
    return k_cache, v_cache  # written in place: the old cache is never read again (verify)


@ENGINE_OPS.decorator("attention")
def _attention(ops, args, attrs):
    (q, k, v, k_cache, v_cache, plan, slots), scales, sinks = attention_parts(args, attrs)
    core = attention_core(attrs, sinks)
    kv = kv_layer(k_cache, v_cache, list(scales), attrs["kv_format"])
    decode = decode_with(ops.decode, core)
    out = paged_attention(
        q, k, v, k_cache, v_cache, plan, attrs["scale"], decode, kv, core, slots, ops.prefill
    )
    return (out,)


@ENGINE_OPS.decorator("mixer")
def _mixer(ops, args, attrs):
    x, module, step, cache = args  # (the per-layer fallback: the module runs itself)
    return (module(x.contiguous(), step, cache),)


@ENGINE_OPS.decorator("moe")
def _moe(ops, args, attrs):
    x, module = args
    return (module(x.contiguous()),)


@ENGINE_OPS.decorator("rope")
def _rope(ops, args, attrs):
    x, positions, table = args
    return (ops.rope(x, RopeInputs(positions, table)),)


@ENGINE_OPS.decorator("silu_mul")
def _gated_act(ops, args, attrs):
    return (ops.gated_act(args[0]),)


ENGINE_OPS.register("gelu_mul", _gated_act)


@ENGINE_OPS.decorator("add_rms_norm")
def _add_rms_norm(ops, args, attrs):
    h, delta, weight = args
    y = ops.rms_norm(h, delta, weight, attrs["eps"])  # h += delta in place: h is the new h
    return y, h


@ENGINE_OPS.decorator("rms_norm")
def _rms_norm(ops, args, attrs):
    x, weight = args
    return (ops.rms_norm(x, None, weight, attrs["eps"]),)


@ENGINE_OPS.decorator("view")
def _view(ops, args, attrs):
    x = args[0]
    shape = [x.shape[0] if not isinstance(d, int) else d for d in attrs["shape"]]
    return (x.reshape(shape),)


# the layer features (Transformer.layer_features) the compiler runs beyond the Llama-shaped
# layer: Gemma-3's (each layer binds its cache group's slots and attention plan and its RoPE
# table; sandwich norms are RMS_NORM nodes; GeGLU is GELU_MUL), GPT-OSS's (learned sinks: an
# ATTENTION input; mixture-of-experts feed-forwards: MOE nodes the module runs, lk_moe in the
# layer programs), Qwen3-Next's (a gated attention output: SIGMOID, MUL; partial rotary
# dimensions: ROPE and CONCAT), and as the per-layer fallback (decoder.py: MIXER nodes the
# module runs, or the layer programs call back or run natively) recurrent state mixers and
# latent attention
CAPTURED_FEATURES = frozenset(
    {"cache_groups", "rope_tables", "gelu_mlp", "sandwich_norms", "attention_sinks", "moe",
     "recurrent", "mla", "output_gate", "partial_rotary"}
)  # fmt: skip


def _compiled(mode: str) -> FastPath:
    return FastPath(
        build=lambda model, kv_cache: CompiledLayers(model, kv_cache, mode),
        description=f"the captured decoder layer, compile={mode!r}",
        features=CAPTURED_FEATURES,
    )


for _mode in ("eager", "jit"):
    FAST_PATHS.register(_mode, _compiled(_mode))
