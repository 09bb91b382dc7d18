"""The generated layer programs at run time (codegen_layer.py): built once per engine through
the JIT cache, called with the layers' weight pointers, formats and caches bound once, and
the step's positions / slots / block tables per call — the decode program for decode steps,
the prefill program for steps with prefills (and decode rows beside them)."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from infergen import profiling
from infergen.compiler.buckets import bucket_of
from infergen.compiler.codegen_c import CodegenError
from infergen.compiler.codegen_gemm import TEMPLATE
from infergen.compiler.codegen_layer import FUNCTIONS, LayerProgram, render_layer_programs
from infergen.compiler.ir import Graph, Op
from infergen.compiler.jit_cache import Built, JitCache, NotBuilt
from infergen.compiler.program_deltanet import deltanet_args
from infergen.compiler.program_mla import mla_args, mla_bind, mla_fields
from infergen.compiler.program_moe import moe_args
from infergen.compiler.program_ssm import ssm_args
from infergen.compiler.program_variants import ProgramVariant
from infergen.compiler.tune import TuningRecord
from infergen.kernels.build import _source_bytes, library
from infergen.kvcache.kv_protocol import attention_part
from infergen.layers.linear import Linear
from infergen.layers.linear_attention import GatedDeltaNet
from infergen.layers.mla import MLAttention
from infergen.layers.moe import MoE
from infergen.layers.ssm import Mamba2Mixer
from infergen.models.fused_decode import StepArgs
from infergen.ops import rms_norm, rope
from infergen.ops.paged_attention import decode_cost
from infergen.ops.paged_prefill_native import VECTOR_FLOATS

_ARGTYPES = [
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_long,
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_int,
    ctypes.c_void_p,
]


class PrefillArgs(ctypes.Structure):  # codegen_layer.PREFILL_ARGS, field for field
    _fields_ = [
        *[(n, ctypes.c_void_p) for n in "query_start query_lens seq_lens block_tables".split()],
        ("max_blocks", ctypes.c_long),
        ("prefills", ctypes.c_long),
    ]


def model_program(model, graph: Graph, phase: str = "decode") -> LayerProgram:
    """The `phase` layer program of `model`'s "jit" layer graph, its source the one C source
    of every phase (codegen_layer.render_layer_programs); CodegenError when not renderable."""
    config = model.config
    programs, refused = render_layer_programs(
        graph,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
        _attention_scale(graph),
    )
    if phase not in programs:
        raise CodegenError(refused[phase])
    return programs[phase]


def _attention_scale(graph: Graph) -> float:
    """The softmax scale of the graph's ATTENTION node (0.0 without one: unused)."""
    for node in graph.nodes:
        if node.op is Op.ATTENTION:
            return node.attrs["scale"]
        if node.op is Op.FUSED:
            scale = _attention_scale(node.attrs["graph"])
            if scale:
                return scale
    return 0.0


def program_key(source: str, cache: JitCache) -> str:
    """The JIT cache key of a layer program's source (a variant's: its prelude first) and the
    kernel library it links against."""
    included = b"".join(_source_bytes(name) for name in (f"{LIBRARY}.c", TEMPLATE))
    kernels = hashlib.sha256(included).hexdigest()
    return cache.key(source, f"layer-program kernels={kernels}", kernel=PROGRAM_FLAGS)


def tuning_key(program: LayerProgram, cache: JitCache) -> str:
    """The program's key in tuning.json (its default variant's, marked as the tuning's)."""
    return cache.key(program_key(program.source, cache), "layer-program tuning")


DEFAULT = ProgramVariant()
# the kernels a program calls: the library it links against (one per variant's macros)
LIBRARY = "layer_kernels"
# a program is built with its library's flags (VNNI, BF16: its GEMM epilogues' micro-kernels)
PROGRAM_FLAGS = LIBRARY


def recorded_variants(record: TuningRecord, key: str) -> dict[str, ProgramVariant]:
    """bucket → the variant tuning.json names for it (labels of unknown knobs or values — an
    older infergen's — are ignored: those buckets run the default)."""
    found = {}
    for bucket, label in record.labels(key).items():
        try:
            found[bucket] = ProgramVariant.parse(label)
        except ValueError:
            continue
    return found


class MixerArgs(ctypes.Structure):  # codegen_layer.MIXER_ARGS, field for field
    _fields_ = [
        ("call", ctypes.c_void_p),
        ("layer", ctypes.c_long),
        ("native", ctypes.c_void_p),
        ("kind", ctypes.c_long),
    ]


def _state_fields(view, batch) -> tuple[torch.Tensor, torch.Tensor]:
    """A recurrent mixer's step fields: each token row's state slot and fresh flag (decode:
    row t is sequence t; a prefill's rows are its sequence's, only the first one fresh)."""
    return row_states(batch.query_start_loc, batch.state_slots, batch.fresh)


def _state_bind(args, fields: tuple[torch.Tensor, torch.Tensor]) -> None:
    slots, fresh = fields
    args.slots, args.fresh = slots.data_ptr(), fresh.data_ptr()


def row_states(
    starts: list[int], slots: torch.Tensor, fresh: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token row of sequences whose rows are starts[i]:starts[i+1]: the sequence's state
    slot, and whether the row starts from zeros (its sequence is fresh and it is the first)."""
    if starts[-1] == len(starts) - 1:  # (a row per sequence: decode)
        return slots.contiguous(), fresh.contiguous()
    lengths = torch.tensor([b - a for a, b in zip(starts[:-1], starts[1:], strict=True)])
    first = torch.zeros(starts[-1], dtype=torch.bool)
    first[torch.tensor(starts[:-1])[lengths > 0]] = True
    rows_fresh = torch.repeat_interleave(fresh.to(torch.bool), lengths) & first
    return torch.repeat_interleave(slots, lengths).contiguous(), rows_fresh.contiguous()


@dataclass(frozen=True)
class NativeMixer:
    """A mixer with a native decode step (lk_mixer_decode's `kind`)."""

    kind: int
    build: Callable  # (module, its cache layer, where) → (C args, keep); CodegenError: none
    # (the layer's view, the batch) → the step's fields: tensors the same for every layer of
    # one view of the step (computed once a step, kept alive until the call returns)
    fields: Callable
    bind: Callable  # (C args, fields) → points one layer's step fields at them
    # (module, tokens, attention plan, element bytes) → the work of a step, as the module's
    # own op regions count it (what a profiled program call adds for it)
    cost: Callable
    # the most rows of a prefill step the native step runs (a sequence's rows one after
    # another, its state carried from one to the next; 0: none, the module is called back):
    # above it the module's chunked form (matrix products over chunks of tokens) is faster
    prefill_rows: int
    # and the longest context a row of such a step may have (0: any): MLA's rows each read
    # their context whole (as decode rows), the module's prefill reads it once per step
    prefill_context: int
    # the module's projections (Linear attributes; None where absent): the GEMMs its native
    # step runs as the module does (the startup budget's floor of its gain)
    projections: tuple[str, ...]


def _projections_cost(*names: str) -> Callable:
    """The work of a module's projections (those of `names` it has)."""

    def cost(module, tokens: int, plan, element: int) -> profiling.Cost:
        total = profiling.Cost()
        for linear in (getattr(module, name) for name in names):
            total += linear.cost(tokens, element) if linear is not None else profiling.Cost()
        return total

    return cost


_IN_OUT = ("in_proj", "out_proj")  # a recurrent mixer's projections
_MLA_PROJECTIONS = ("down", "q_up", "o")


def _mla_cost(module, tokens: int, plan, element: int) -> profiling.Cost:
    """A latent attention's step as its regions count it: its projections, norms, RoPE of
    the queries' and the key's rope dims, decode attention over the [latent | k_pe] rows."""
    total = _projections_cost(*_MLA_PROJECTIONS)(module, tokens, plan, element)
    if module.q_norm is not None:
        total += rms_norm.cost(tokens, module.mla.q_lora_rank, False, element)
    total += rms_norm.cost(tokens, module.latent, False, element)
    for heads in (module.num_heads, 1):
        total += rope.cost(tokens, heads, module.rope_dim, element)
    row = module.latent + module.rope_dim
    return total + decode_cost(module.num_heads, row, element, plan, 2 * row * element)


# the module's class → its native decode step
NATIVE_MIXERS: dict[type, NativeMixer] = {
    # (prefill rows: below where the native step stops beating the module on the prefills of
    # bench_architectures' rows, AMD EPYC Zen 4, 2 threads — Mamba2's step time 0.80x the
    # module's at 8 rows, 0.94-0.96x at 16, 1.08x at 32 (its state, read and written per row,
    # is larger than DeltaNet's); DeltaNet 0.62x at 8, 0.65x at 16, 0.84x at 256; MLA (each
    # row a one-query sequence of the absorbed decode attention) 0.77x at 8, 0.90x at 16,
    # 1.01x at 32, 1.12x at 64; 16 rows after 256 cached 1.14x: at most 32 positions)
    Mamba2Mixer: NativeMixer(
        1, ssm_args, _state_fields, _state_bind, _projections_cost(*_IN_OUT), 8, 0, _IN_OUT
    ),
    GatedDeltaNet: NativeMixer(
        2,
        deltanet_args,
        _state_fields,
        _state_bind,
        _projections_cost(*_IN_OUT),
        512,
        0,
        _IN_OUT,
    ),  # fmt: skip
    MLAttention: NativeMixer(
        3, mla_args, mla_fields, mla_bind, _mla_cost, 16, 32, _MLA_PROJECTIONS
    ),
}


def is_mixer(value) -> bool:
    """Whether a layer's bound input is a mixer module (a MIXER node's module input): a module
    other than a projection or an experts block."""
    return isinstance(value, nn.Module) and not isinstance(value, (Linear, MoE))


def native_row(module) -> tuple[NativeMixer, nn.Module] | None:
    """A mixer module's NATIVE_MIXERS row and the module it describes (a StateMixer's inner
    mixer), or None: it has no native decode step."""
    inner = getattr(module, "mixer", module)  # (layers/state_mixer.StateMixer wraps one)
    row = NATIVE_MIXERS.get(type(inner))
    return None if row is None else (row, inner)


def _native_cost(row: NativeMixer, module, element: int, tokens: int, plan) -> profiling.Cost:
    return row.cost(module, tokens, plan, element)


def native_mixer(module, cache_layer, where: str):
    """A mixer module's native decode form (its NativeMixer row, its C arguments, what to keep
    alive), or None: the program calls the module back."""
    found = native_row(module)
    if found is None:
        return None
    row, inner = found
    try:
        args, keep = row.build(inner, cache_layer, where)
    except CodegenError:
        return None
    return row, args, keep


# the callback a MIXER node calls: (layer, x, out, tokens)
MIXER_CALL = ctypes.CFUNCTYPE(None, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_long)


def _rows_at(address: int, tokens: int, width: int) -> torch.Tensor:
    """The fp32 rows [tokens, width] at `address` (the program's arena), without a copy."""
    floats = (ctypes.c_float * (tokens * width)).from_address(address)
    return torch.frombuffer(floats, dtype=torch.float32).view(tokens, width)


class ProgramUnavailable(Exception):
    """The layers hold something the layer program has no code for (the walker runs them)."""


class LayerProgramRunner:
    """The layer program of a model, in the variant the tuner chose per token bucket (in
    tuning.json; `tuned=False`: the default variant everywhere) — the default variant for the
    buckets it has not measured."""

    def __init__(
        self,
        model,
        kv_cache,
        graph: Graph,
        statics: list[dict],
        cache: JitCache,
        tuned: bool = True,
        phase: str = "decode",
        layers: list[int] | None = None,
    ):
        """`statics`: every layer's bound inputs (CompiledLayers.static); `layers`: the layers
        of `graph`'s kind that this program runs (None: all of them)."""
        try:
            program = model_program(model, graph, phase)
        except CodegenError as error:
            raise ProgramUnavailable(str(error)) from None
        self.phase = phase
        tuned = tuned and phase == "decode"  # (the tuner searches decode steps)
        if phase == "prefill" and program.attention and model.config.head_dim % VECTOR_FLOATS:
            raise ProgramUnavailable(
                f"head dim {model.config.head_dim}: the prefill kernel needs a multiple of "
                f"{VECTOR_FLOATS}"
            )
        self.program, self.cache = program, cache
        self.builds: list[Built] = []  # what building the variants took (compile report)
        self._calls: dict[ProgramVariant, object] = {}
        self._timers: list[object] = []  # each built variant's `<function>_timers`
        self._timed: dict[str, float] | None = None  # seconds per call site, while `timed`
        try:
            self.built = self.build(DEFAULT)
        except NotBuilt:
            raise ProgramUnavailable("not built within the startup budget") from None
        # bucket → the tuner's winner (program_tune.py), as tuning.json records it
        recorded = recorded_variants(TuningRecord(cache), tuning_key(program, cache))
        self.by_bucket: dict[str, ProgramVariant] = {}
        for bucket, variant in recorded.items() if tuned else ():
            try:
                self.build(variant)
            except NotBuilt:
                continue  # (evicted since: the default runs that bucket)
            self.by_bucket[bucket] = variant
        self.model, self.kv_cache = model, kv_cache
        self.layers = list(range(len(model.layers))) if layers is None else list(layers)
        # a MIXER node's module input → its cache input (bound per layer: CompiledLayers.static)
        self._mixer_caches = {n.inputs[1].name: n.inputs[3].name
                              for n in graph.nodes if n.op is Op.MIXER}  # fmt: skip
        # the layers' distinct views of a step (cache group, RoPE table), and each layer's
        mixers = [model.layers[i].attn for i in self.layers]
        layer_views = [(mixer.group, mixer.rope_index) for mixer in mixers]
        self.views = list(dict.fromkeys(layer_views))
        self.view_of = [self.views.index(view) for view in layer_views]
        self._bind(statics)

    def build(self, variant: ProgramVariant) -> Built:
        """Compile (or load) `variant`; its call is kept for `run`."""
        source = variant.prelude + self.program.source
        key = program_key(source, self.cache)

        def keyed() -> str:  # each phase's function named after the entry
            text = source
            for function in FUNCTIONS.values():
                text = text.replace(f"void {function}(", f"void {function}_{key}(")
            return text

        # one entry for every phase's function (named after the decode one's)
        built = self.cache.get(
            key,
            f"{FUNCTIONS['decode']}_{key}",
            keyed,
            PROGRAM_FLAGS,
            link=lambda: [library(LIBRARY, variant.library_defines)],
        )
        if variant not in self._calls:
            fn = built.fn
            library_ = ctypes.CDLL(str(built.path))  # (the entry's handle: its globals)
            if self.program.function != FUNCTIONS["decode"]:
                fn = getattr(library_, f"{self.program.function}_{key}")
            timers = getattr(library_, f"{self.program.function}_timers")
            timers.restype, timers.argtypes = None, [ctypes.c_int, ctypes.c_void_p]
            self._timers.append(timers)
            fn.restype = None
            fn.argtypes = _ARGTYPES
            self._calls[variant] = profiling.native(fn, self.program.function, profiling.JIT)
            self.builds.append(built)
        return built

    @contextlib.contextmanager
    def timed(self):
        """The program's call-site timers on while the block runs (every variant's): yields a
        dict that holds, after the block, seconds per call site summed over layers and calls
        ("attn.qkv", "attention", "pointwise -> attn_norm", ...; `LayerProgram.sites`). The
        timers are read after each of this program's calls (`run`), so programs whose code is
        one library — the same static timers — each count only their own calls."""
        seconds: dict[str, float] = {}
        for timers in self._timers:
            timers(1, None)
        self._timed = seconds
        try:
            yield seconds
        finally:
            self._read_timers(enable=0)
            self._timed = None

    def _read_timers(self, enable: int) -> None:
        """Add the variants' timers to the open `timed` dict, reset them, and leave them on
        (1) or off (0)."""
        out = (ctypes.c_double * max(1, len(self.program.sites)))()
        for timers in self._timers:
            timers(enable, out)
            for site, value in zip(self.program.sites, out, strict=False):
                self._timed[site] = self._timed.get(site, 0.0) + value

    def _bind(self, statics: list[dict]) -> None:
        """Per-layer weight pointers and GEMM formats, and the cache pointers (fixed)."""
        pointers, formats, caches = [], [], []
        self._keep = []
        # MIXER nodes call back into Python (the module on the layer's view of the step)
        self._mixer_call = MIXER_CALL(self._call_mixer)
        self._step, self._error = None, None
        # (position in self.layers, NativeMixer row, C args, module) of the native mixers: each
        # call sets the step's fields of those in its run of layers
        self._stepped: list = []
        self._mixers: list[tuple[nn.Module, object]] = []  # (module, its cache) per call site
        # layer → the work of its native mixer's step: (tokens, plan) → Cost
        self.native_costs: dict[int, Callable] = {}
        self._native_rows: dict[int, NativeMixer] = {}  # layer → its native mixer's row
        for index in self.layers:
            env = statics[index]
            for name in self.program.weight_inputs:
                value = env[name]
                if isinstance(value, MoE):  # its C arguments (program_moe.py)
                    try:
                        args, keep = moe_args(value, f"layer {index} {name}")
                    except CodegenError as error:
                        raise ProgramUnavailable(str(error)) from None
                    self._keep += [args, keep]
                    pointers.append(ctypes.addressof(args))
                    continue
                if is_mixer(value):
                    cache = env[self._mixer_caches[name]]
                    pointers.append(self._bind_mixer(value, cache, index, f"layer {index} {name}"))
                    continue
                if isinstance(value, Linear):
                    value = value.weight
                pointers.append(value.data_ptr() if value is not None else None)
            for name in self.program.linears:
                linear = env[name]
                fmt = linear.backend.decode_format
                if linear.act is not None:  # an integer kernel that quantizes x itself
                    fmt = linear.backend.quantized_decode_formats.get(linear.act.act.key)
                if fmt is None or linear.weight.dim() != 3:
                    raise ProgramUnavailable(f"layer {index} {name}: no packed-panel GEMM")
                formats.append(fmt)
            kv = attention_part(self.kv_cache.layer(index))
            if kv is None or not self.program.attention:
                caches += [None, None]  # (a mixer module reads its own cache layer)
                continue
            if kv.k.dtype not in (torch.float32, torch.float8_e4m3fn):
                raise ProgramUnavailable(f"a {kv.k.dtype} KV cache")
            caches += [kv.k.data_ptr(), kv.v.data_ptr()]
        self.weights = (ctypes.c_void_p * max(1, len(pointers)))(*pointers)
        self.formats = (ctypes.c_long * max(1, len(formats)))(*formats)
        self.caches = (ctypes.c_void_p * len(caches))(*caches)
        self.n_layers = len(self.layers)
        self._widths = (len(self.program.weight_inputs), len(self.program.linears))

    def _bind_mixer(self, module: nn.Module, cache, index: int, where: str) -> int:
        """A MIXER node's mixer_args for one layer (the callback's index of the module and its
        cache; the decode program's native form where the module has one): its address."""
        native = native_mixer(module, cache, where)
        if native is not None and self.phase == "prefill" and not native[0].prefill_rows:
            native = None
        self._mixers.append((module, cache))
        call = ctypes.cast(self._mixer_call, ctypes.c_void_p)
        args = MixerArgs(call, len(self._mixers) - 1, None, 0)
        self._keep.append(args)
        if native is not None:
            row, native_args, keep = native
            args.native, args.kind = ctypes.addressof(native_args), row.kind
            self._keep += [native_args, keep]
            self._stepped.append((self.layers.index(index), row, native_args, module, args))
            inner, element = getattr(module, "mixer", module), self.model.dtype.itemsize
            self.native_costs[index] = functools.partial(_native_cost, row, inner, element)
            self._native_rows[index] = row
        return ctypes.addressof(args)

    def native_runs(self, row: NativeMixer, batch) -> bool:
        """Whether mixer `row`'s native step runs this step (always in decode; in prefill,
        steps of at most its prefill_rows rows, none beyond its prefill_context, every
        sequence with some)."""
        if self.phase == "decode":
            return True
        if batch.num_tokens > row.prefill_rows:
            return False
        if row.prefill_context and int(batch.positions.max()) >= row.prefill_context:
            return False
        starts = batch.query_start_loc  # (recurrent models': a sequence without rows keeps
        # its state, or zeroes it when fresh — the module does that)
        return starts is None or all(b > a for a, b in zip(starts[:-1], starts[1:], strict=True))

    def native_costs_at(self, batch) -> dict[int, Callable]:
        """native_costs of the layers whose native steps run this step (the others' modules
        run: their own regions count their work)."""
        return {
            index: cost
            for index, cost in self.native_costs.items()
            if self.native_runs(self._native_rows[index], batch)
        }

    def run(
        self,
        h: torch.Tensor,
        batch,
        variant: ProgramVariant | None = None,
        delta: torch.Tensor | None = None,
        run: range | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The program's layers on a step of its phase, in `variant` (default: the one of the
        step's bucket): all of them, or the run `run` of positions in `self.layers` (a model
        whose layer kinds alternate runs each kind's program per run of its layers), from
        the pending `delta` (None: zeros, before the first layer)."""
        if variant is None:
            variant = self.by_bucket.get(bucket_of(h.shape[0]), DEFAULT)
        call = self._calls.get(variant)
        if call is None:
            self.build(variant)
            call = self._calls[variant]
        run = range(self.n_layers) if run is None else run
        tokens = h.shape[0]
        # each distinct layer view's arguments, and per layer a pointer to its view's
        args = [self._view_args(batch.view(*view), tokens) for view in self.views]
        views = [self.view_of[i] for i in run]
        steps = (ctypes.c_void_p * len(run))(*(ctypes.addressof(args[i][0]) for i in views))
        prefills = None
        if self.phase == "prefill" and self.program.attention:
            prefills = (ctypes.c_void_p * len(run))(*(ctypes.addressof(args[i][1]) for i in views))
        h = h.contiguous()
        delta = torch.zeros_like(h) if delta is None else delta.contiguous()
        arena = torch.empty(max(1, tokens * self.program.arena_floats_per_token))
        weights, formats = self._widths
        pointer = ctypes.sizeof(ctypes.c_void_p)
        self._step, self._error = batch, None
        runs: dict[int, bool] = {}  # mixer kind → whether its native step runs this step
        # (mixer kind, view) → the step's fields (alive until the call returns)
        fields: dict[tuple, tuple] = {}
        for position, row, native_args, module, mixer_args in self._stepped:
            if position not in run:
                continue
            if row.kind not in runs:
                runs[row.kind] = self.native_runs(row, batch)
            mixer_args.kind = row.kind if runs[row.kind] else 0  # (0: the module, called back)
            if runs[row.kind]:
                view = (module.group, module.rope_index)
                if (row.kind, view) not in fields:
                    fields[row.kind, view] = row.fields(batch.view(*view), batch)
                row.bind(native_args, fields[row.kind, view])
        call(
            ctypes.addressof(self.weights) + run.start * max(weights, 1) * pointer,
            ctypes.addressof(self.formats)
            + run.start * max(formats, 1) * ctypes.sizeof(ctypes.c_long),
            ctypes.addressof(self.caches) + run.start * 2 * pointer,
            len(run),
            steps,
            h.data_ptr(),
            delta.data_ptr(),
            arena.data_ptr(),
            variant.threads(torch.get_num_threads()),
            prefills,
        )
        self._step = None
        if self._timed is not None:  # (profiling: this call's timers, before another's)
            self._read_timers(enable=1)
        if self._error is not None:  # (raised inside a mixer's callback)
            raise self._error
        return h, delta

    def _call_mixer(self, site: int, x: int, out: int, tokens: int) -> None:
        """A MIXER node's callback: the mixer module of call site `site` (_bind_mixer) on its
        view of the step and its cache, the rows at `x` into the rows at `out`. An exception
        is kept and raised by `run` (a ctypes callback cannot raise through C); the rest of
        the program's output is unused."""
        if self._error is not None:
            return
        try:
            width = self.model.config.hidden_size
            module, cache = self._mixers[site]
            view = self._step.view(module.group, module.rope_index)
            result = module(_rows_at(x, tokens, width), view, cache)
            _rows_at(out, tokens, width).copy_(result)
        except BaseException as error:  # noqa: BLE001 - re-raised by run()
            self._error = error

    def _view_args(self, view, tokens: int) -> tuple[StepArgs, PrefillArgs | None]:
        """The step as the layers of one view see it (ForwardBatch.view: a cache group's
        slots, plan and window, a RoPE table): its step_args, and its prefill_args in the
        prefill phase."""
        config = self.model.config
        if not self.program.attention:  # (layers that read no KV cache through the program)
            return self._stateless_args(view, tokens), None
        plan = view.attn_plan
        tables = plan.decode_block_tables
        prefill = None
        if self.phase == "prefill":  # (decode rows of a mixed step: one-query sequences)
            rows = plan.all_rows_batch()
            prefill = PrefillArgs(
                rows.query_start.data_ptr(),
                rows.query_lens.data_ptr(),
                rows.seq_lens.data_ptr(),
                rows.block_tables.data_ptr(),
                rows.block_tables.shape[1],
                rows.block_tables.shape[0],
            )
        args = StepArgs(
            tokens,
            config.hidden_size,
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
            config.intermediate_size,
            self.kv_cache.block_size,
            tables.shape[1] if tables is not None else 0,
            plan.window,
            config.rms_norm_eps,
            0.0,
            view.rope.positions.data_ptr(),
            view.slot_mapping.data_ptr(),
            tables.data_ptr() if tables is not None else None,
            plan.decode_seq_lens.data_ptr() if tables is not None else None,
            view.rope.cache.data_ptr(),
        )
        return args, prefill

    def _stateless_args(self, view, tokens: int) -> StepArgs:
        """The step_args of layers without an ATTENTION node (the program reads the token
        count, sizes and the RoPE inputs; no slots, block tables or window)."""
        config = self.model.config
        rope = view.rope
        return StepArgs(
            tokens, config.hidden_size, config.num_attention_heads,
            config.num_key_value_heads, config.head_dim, config.intermediate_size,
            0, 0, 0, config.rms_norm_eps, 0.0,
            rope.positions.data_ptr() if rope is not None else None, None, None, None,
            rope.cache.data_ptr() if rope is not None else None,
        )  # fmt: skip

    def serves(self, batch) -> bool:
        """Whether a step (ForwardBatch) is one of the program's phase."""
        if not self.program.attention:  # (decode: one token per sequence)
            if batch.attn_plans:
                decode = batch.attn_plan.decode_only
            else:  # (no attention in the model: Mamba2)
                decode = batch.num_tokens == len(batch.query_start_loc) - 1
            return decode == (self.phase == "decode")
        plan = batch.attn_plan
        if self.phase == "decode":
            return plan.decode_only
        return (
            not plan.decode_only
            and bool(plan.prefills)
            and not plan.sinks
            and plan.block_tables is not None
        )
