"""All decoder layers of a decode step in one native call (kernels/decode_layers_f32.c); for a
step whose rows are all sampled, the whole step: the embedding rows, the layers, the final norm,
the LM head and a greedy batch's argmax (`FusedDecode.run_logits`, decode_step_f32).

A decode step of a 30-layer model makes ~300 small calls from Python (norms, projections,
RoPE, KV store, attention, activation), each with its tensor allocations and module dispatch:
at batch 1 that overhead was a third of the step. The C driver calls the same kernels in the
same order, so its result is bit-identical to the per-op path (tests/models/
test_fused_decode.py); the per-op path stays the reference and runs every step this one does
not cover (prefill, the torch kernels, QK-norm, non-fp32).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import torch

from infergen import profiling
from infergen.kernels.build import I, L, P, kernel
from infergen.kvcache.kv_protocol import attention_part
from infergen.kvcache.paged_cache import PagedKVCache
from infergen.layers.forward_batch import ForwardBatch
from infergen.layers.mlp import GATED_COSTS
from infergen.layers.moe import MoE
from infergen.models.fast_paths import FAST_PATHS, FastPath
from infergen.ops import kv_store, rms_norm, rope, silu_mul
from infergen.ops.linear_quantized import SCALE_ROWS, outside_rows
from infergen.ops.paged_attention import (
    DECODE_BACKENDS,
    AttentionPlan,
    decode_cost,
    prefill_cost,
)
from infergen.ops.rms_norm import RMS_NORM_BACKENDS
from infergen.ops.rope import ROPE_BACKENDS
from infergen.ops.silu_mul import SILU_MUL_BACKENDS

SOURCE = "decode_layers_f32"
# cache element types the driver stores and reads: fp32 values, FP8 E4M3 codes (kv_format.py)
_CACHE_DTYPES = (torch.float32, torch.float8_e4m3fn)
_LAYER_FIELDS = (
    "attn_norm qkv_w qkv_b o_w o_b mlp_norm gate_up_w gate_up_b down_w down_b k_cache v_cache"
)


class LayerWeights(ctypes.Structure):
    _fields_ = [
        *[(name, ctypes.c_void_p) for name in _LAYER_FIELDS.split()],
        ("formats", ctypes.c_long * 4),  # qkv, o, gate_up, down: LinearBackend.decode_format
        *[(name, ctypes.c_void_p) for name in ("k_scale", "v_scale", "k_shift")],  # FP8 KV
    ]


class EmbedWeights(ctypes.Structure):  # the C embed_weights: a step's embedding rows
    _fields_ = [("weight", ctypes.c_void_p), ("kind", ctypes.c_long), ("rows", ctypes.c_long)]


# a tied head's panels by their weight_format (LinearBackend.decode_format) → the C embedding
# kind: fp32 panels, int8 / FP8 E4M3 codes (+ each panel's scale rows)
_EMBED_KINDS = {0: 1, 1: 2, 2: 3}


class HeadWeights(ctypes.Structure):  # the C head_weights: the final norm and the LM head
    _fields_ = [
        *[(name, ctypes.c_void_p) for name in ("norm_w", "weight", "bias")],
        *[(name, ctypes.c_long) for name in ("format", "vocab")],
        ("eps", ctypes.c_float),
    ]


_STEP_LONGS = "tokens hidden heads kv_heads dim inter block_size max_blocks window"


class StepArgs(ctypes.Structure):  # the C step_args, field for field
    _fields_ = [
        *[(name, ctypes.c_long) for name in _STEP_LONGS.split()],
        ("eps", ctypes.c_float),
        ("scale", ctypes.c_float),
        *[(name, ctypes.c_void_p) for name in "positions slots block_tables seq_lens".split()],
        ("rope_cache", ctypes.c_void_p),
    ]


def _ptr(t: torch.Tensor | None) -> int | None:
    return t.data_ptr() if t is not None else None


def _decode_format(linear) -> int | None:
    """The panels' weight_format in the driver (LinearBackend.decode_format); a quantized
    input runs where the backend's kernel quantizes it itself (W8A8 / W4A8 integer products:
    quantized_decode_formats), other input quantizers take the per-op path (None)."""
    if linear.act is None:
        return linear.backend.decode_format
    return linear.backend.quantized_decode_formats.get(linear.act.act.key)


def embed_weights(model) -> EmbedWeights | None:
    """The step's embedding as the driver reads it, or None where Transformer.embed_rows does
    the lookup: a scaled embedding, a vocabulary split over ranks, a tied head in another
    format, a row width other than hidden_size (panels padded past it)."""
    if model.shard is not None or model.embed_scale is not None:
        return None
    hidden = model.config.hidden_size
    if model.embed is not None:  # its own fp32 [vocab, hidden] rows
        weight = model.embed
        if (
            weight.dtype != torch.float32
            or weight.dim() != 2
            or weight.shape[1] != hidden
            or not weight.is_contiguous()
        ):
            return None
        return EmbedWeights(_ptr(weight), 0, weight.shape[0])
    head = model.lm_head
    kind = _EMBED_KINDS.get(head.backend.decode_format)
    weight = head.weight
    if kind is None or weight is None or weight.dim() != 3 or not weight.is_contiguous():
        return None
    width = weight.shape[1] - (SCALE_ROWS if kind > 1 else 0)  # (codes: + the scale rows)
    if width != hidden:
        return None
    return EmbedWeights(_ptr(weight), kind, weight.shape[0] * weight.shape[2])


def head_weights(model) -> HeadWeights | None:
    """The final norm's and the LM head's pointers, or None where the C head does not run them
    (then Transformer.head does): a non-native norm, a head not in packed panels, a logits
    multiplier or a vocabulary split over ranks."""
    head = model.lm_head
    if (
        model.norm.fn is not RMS_NORM_BACKENDS.get("native")
        or head.weight is None
        or head.weight.dim() != 3
        or model.config.logits_multiplier != 1.0
        or model.shard is not None
    ):
        return None
    fmt = _decode_format(head)
    if fmt is None:
        return None
    return HeadWeights(_ptr(model.norm.weight), _ptr(head.weight), _ptr(head.bias), fmt,
                       head.out_features, model.norm.eps)  # fmt: skip


class FusedHead:
    """A step's head in one C call after its layers have run (decode_head_f32): h ← h + delta,
    the final RMSNorm, the LM head's product and, for a `greedy` batch, each row's argmax
    (`batch.argmax`) — Transformer.head's kernels, so its logits. What the compiler's layer
    programs run after their layers; the fused decode step runs the same C code inside its
    own call (decode_step_f32)."""

    def __init__(self, model):
        self.model = model
        self.fn = kernel("decode_head_f32", P, P, P, P, P, P, L, L, I, source=SOURCE)
        self.weights = head_weights(model) if self.fn is not None else None
        self.ref = ctypes.byref(self.weights) if self.weights is not None else None

    @property
    def available(self) -> bool:
        return self.weights is not None

    def __call__(self, h: torch.Tensor, delta: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """Logits [rows, vocab] fp32 of every row of h [rows, hidden] (+ its pending delta,
        added into h in place where h is dense, as Transformer.head does)."""
        rows, hidden = h.shape
        h, delta = h.contiguous(), delta.contiguous()  # (dense rows: no copy)
        logits = torch.empty(rows, self.weights.vocab, dtype=torch.float32)
        tokens = (ctypes.c_long * rows)() if batch.greedy else None
        scratch = torch.empty(rows, hidden, dtype=torch.float32)
        self.fn(self.ref, h.data_ptr(), delta.data_ptr(), logits.data_ptr(), tokens,
                scratch.data_ptr(), rows, hidden, torch.get_num_threads())  # fmt: skip
        if tokens is not None:
            batch.argmax = tokens[:]
        return logits


class FusedDecode:
    """Built once per (model, KV cache); `run` returns the last layer's pending delta, or None
    when this step is not one it covers."""

    def __init__(self, model, kv_cache: PagedKVCache):
        self.model = model
        self.kv_cache = kv_cache
        self.fn = kernel("decode_layers_f32", P, L, P, P, P, I, P, I, source=SOURCE)
        self.scratch_floats = kernel(
            "decode_layers_scratch", P, source=SOURCE, restype=ctypes.c_long
        )
        self.layers = self._layer_table() if self.fn is not None else None
        self.step_fn = kernel("decode_step_f32", P, L, P, P, P, P, P, P, P, I, P, P,
                              source=SOURCE, restype=ctypes.c_long)  # fmt: skip
        self.head = FusedHead(model) if self.layers is not None and self.step_fn else None
        if self.head is not None and not self.head.available:
            self.head = None
        self.embed = embed_weights(model) if self.head is not None else None
        self._args: StepArgs | None = None  # (_step_args)
        self._kept: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # (_buffers)
        self._embed_ref = ctypes.byref(self.embed) if self.embed is not None else None
        self.stack_cost = StackCost(model, kv_cache)  # (a profiled call's work)

    def _layer_table(self):
        """The layers' weight pointers, or None when a layer is outside what the driver does."""
        model, cache = self.model, self.kv_cache
        if model.dtype != torch.float32 or model.rope_cache.dtype != torch.float32:
            return None
        if not cache.format.supports_fast_decode:  # the per-op path reads this KV format
            return None
        if not cache.storage.is_contiguous() or cache.storage.dtype not in _CACHE_DTYPES:
            return None
        table = (LayerWeights * len(model.layers))()
        for i, layer in enumerate(model.layers):
            attn, mlp = layer.attn, layer.mlp
            native = (
                attn.q_norm is None
                and attn.decode is DECODE_BACKENDS.get("native")
                and attn.rope is ROPE_BACKENDS.get("native")
                and mlp.act is SILU_MUL_BACKENDS.get("native")
                and layer.attn_norm.fn is layer.mlp_norm.fn is RMS_NORM_BACKENDS.get("native")
            )
            if not native:
                return None
            linears = (attn.qkv, attn.o, mlp.gate_up, mlp.down)
            if any(lin.weight.dim() != 3 for lin in linears):  # not in packed panels
                return None
            formats = [_decode_format(lin) for lin in linears]
            if None in formats:
                return None
            kv = cache.layer(i)
            table[i] = LayerWeights(
                _ptr(layer.attn_norm.weight),
                _ptr(attn.qkv.weight),
                _ptr(attn.qkv.bias),
                _ptr(attn.o.weight),
                _ptr(attn.o.bias),
                _ptr(layer.mlp_norm.weight),
                _ptr(mlp.gate_up.weight),
                _ptr(mlp.gate_up.bias),
                _ptr(mlp.down.weight),
                _ptr(mlp.down.bias),
                _ptr(kv.k),
                _ptr(kv.v),
                (ctypes.c_long * 4)(*formats),
                _ptr(kv.k_scale),
                _ptr(kv.v_scale),
                _ptr(kv.k_shift),
            )
        return table

    @property
    def available(self) -> bool:
        return self.layers is not None

    def run_prefix(
        self, h: torch.Tensor, batch: ForwardBatch, num_layers: int
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """`run` over the first `num_layers` layers only (self-speculation's drafts)."""
        return self.run(h, batch, num_layers)

    def _step_args(self, rows: int, batch: ForwardBatch) -> StepArgs | None:
        """The C step_args of a decode-only step; None for other steps, or when a layer is
        outside what the driver does. One struct, its model fields set once and the step's
        fields each call (a new struct of 16 fields cost ~40 us a step, cold)."""
        plan = batch.attn_plan
        if self.layers is None or not plan.decode_only:
            return None
        args = self._args
        if args is None:
            config = self.model.config
            args = self._args = StepArgs(
                0,
                config.hidden_size,
                config.num_attention_heads,
                config.num_key_value_heads,
                config.head_dim,
                config.intermediate_size,
                self.kv_cache.layer(0).k.shape[1],
                0,
                0,
                config.rms_norm_eps,
                self.model.layers[0].attn.scale,
            )
        tables = plan.decode_block_tables
        args.tokens, args.max_blocks, args.window = rows, tables.shape[1], plan.window
        args.positions, args.slots = batch.rope.positions.data_ptr(), batch.slot_mapping.data_ptr()
        args.block_tables, args.seq_lens = tables.data_ptr(), plan.decode_seq_lens.data_ptr()
        args.rope_cache = self.model.rope_cache.data_ptr()
        return args

    def _buffers(self, args: StepArgs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(h, delta, scratch) for a step of `args.tokens` rows: the last step's when it had as
        many (a decode step's rows are the driver's own: nothing outside keeps them)."""
        rows = args.tokens
        if self._kept is None or self._kept[0].shape[0] != rows:
            h = torch.empty(rows, self.model.config.hidden_size, dtype=torch.float32)
            scratch = torch.empty(self.scratch_floats(ctypes.byref(args)), dtype=torch.float32)
            self._kept = (h, torch.empty_like(h), scratch)
        return self._kept

    def run(
        self, h: torch.Tensor, batch: ForwardBatch, num_layers: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(h, the last layer's pending delta) of a decode-only step (h updated in place);
        None for other steps, or when a layer is outside what the driver does."""
        args = self._step_args(h.shape[0], batch)
        if args is None:
            return None
        layers = len(self.model.layers) if num_layers is None else num_layers
        if profiling.enabled():
            work = self.stack_cost(h.shape[0], batch.attn_plan, layers)
            with profiling.region("decode_layers", f"{layers} layers, one C call", work):
                return self._call(h, args, layers)
        return self._call(h, args, layers)

    def run_logits(self, batch: ForwardBatch) -> torch.Tensor | None:
        """The logits [rows, vocab] of a decode-only step whose every row is sampled, from its
        token ids: the embedding rows, all layers, then the final norm and the LM head in one
        C call (decode_step_f32; the embedding in Python where the driver does not read its
        format), and for a `greedy` batch each row's argmax (`batch.argmax`) while the logits
        are in cache. None where `run` is None, where the head is outside what the driver
        does, and under the profiler (whose regions name the embedding, the norm and the
        head: Transformer runs them)."""
        if self.head is None or profiling.enabled():
            return None
        ids = batch.input_ids
        rows = ids.shape[0]
        args = self._step_args(rows, batch)
        if args is None:
            return None
        h, delta, scratch = self._buffers(args)
        if self.embed is None:
            h = self.model.embed_rows(ids)
        elif ids.dtype != torch.int64 or not ids.is_contiguous():
            ids = ids.to(torch.int64).contiguous()
        logits = torch.empty(rows, self.head.weights.vocab, dtype=torch.float32)
        tokens = (ctypes.c_long * rows)() if batch.greedy else None
        bad = self.step_fn(self.layers, len(self.model.layers), ctypes.byref(args), h.data_ptr(),
                           delta.data_ptr(), self.head.ref, logits.data_ptr(), tokens,
                           scratch.data_ptr(), torch.get_num_threads(), self._embed_ref,
                           ids.data_ptr() if self.embed is not None else None)  # fmt: skip
        if bad >= 0:  # (checked before any layer ran)
            raise outside_rows(int(ids[bad]), self.embed.rows)
        if tokens is not None:
            batch.argmax = tokens[:]
        return logits

    def _call(self, h: torch.Tensor, args: StepArgs, layers: int):
        scratch = torch.empty(self.scratch_floats(ctypes.byref(args)), dtype=torch.float32)
        delta = torch.empty_like(h)
        self.fn(self.layers, layers, ctypes.byref(args), h.data_ptr(), delta.data_ptr(), 0,
                scratch.data_ptr(), torch.get_num_threads())  # fmt: skip
        return h, delta


class StackCost:
    """The work of decoder layers (the first n, or a run of one kind's) on a step of `tokens`
    rows, as the per-op path's regions count it (ops/*.py `cost`): per layer two norms (with the
    residual add but for the first; sandwich norms and QK-norms beside them), the projections
    with their weights as stored, RoPE + KV store, decode attention over the step's contexts,
    the gated activation (or a mixture of experts: `_mlp_cost`) — what a call that runs the
    whole stack does (this driver, the compiler's layer program). A mixer its module runs (the
    compiler's per-layer fallback) counts its layer's norms and MLP only: its own ops report
    their work. All but attention are affine in the token count: evaluated at 0 and 1 token
    once, per list of layers."""

    def __init__(self, model, kv_cache: PagedKVCache, attends: Callable[[int], bool] | None = None):
        self.model, self.kv_cache = model, kv_cache
        self._affine: dict[tuple[int, ...], tuple[profiling.Cost, profiling.Cost]] = {}
        # layer index → whether the call runs its attention itself (not: a mixer its module
        # runs, whose ops report their own work; default: every attention layer)
        self.attends = attends or (lambda index: hasattr(model.layers[index].attn, "qkv"))

    def __call__(
        self,
        tokens: int,
        plan: AttentionPlan | None,
        layers: int | list[int],
        native: dict | None = None,
    ) -> profiling.Cost:
        """The work of the first `layers` layers (or of the layers listed); `native`: layer
        index → the work of a mixer the call runs natively (the compiler's native decode
        steps), (tokens, plan) → Cost, as the module's own regions would count it."""
        key = tuple(range(layers)) if isinstance(layers, int) else tuple(layers)
        if key not in self._affine:
            fixed = self._layers(0, key)
            self._affine[key] = (fixed, self._layers(1, key) - fixed)
        fixed, per_token = self._affine[key]
        for index in key if native else ():
            if index in native:
                fixed += native[index](tokens, plan)
        attending = [i for i in key if self.attends(i)]
        if not attending or plan is None:
            return fixed + per_token * tokens
        config, kv = self.model.config, attention_part(self.kv_cache.layer(attending[0]))
        position = kv_store.slot_bytes(kv.k, kv.v)
        element = self.model.dtype.itemsize
        heads, dim = config.num_attention_heads, config.head_dim
        attention = (decode_cost if plan.decode_only else prefill_cost)(
            heads, dim, element, plan, position
        )  # (a step of prefills only: the prefill layer program's)
        return fixed + per_token * tokens + attention * len(attending)

    def _layers(self, tokens: int, layers: tuple[int, ...]) -> profiling.Cost:
        config = self.model.config
        heads, kv_heads, dim = (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        )
        element = self.model.dtype.itemsize
        total = profiling.Cost()
        for index in layers:
            layer, kv = self.model.layers[index], attention_part(self.kv_cache.layer(index))
            if layer.mlp is not None:
                total += _mlp_cost(layer.mlp, tokens, element)
            norms = [index > 0] + [True] * (layer.mlp is not None)
            norms += [False] * (2 if layer.post_attn_norm is not None else 0)
            for residual in norms:  # (sandwich norms: two more, without the residual add)
                total += rms_norm.cost(tokens, config.hidden_size, residual, element)
            if not self.attends(index):  # (a mixer the module runs: its ops count their own)
                continue
            attn = getattr(layer.attn, "attention", layer.attn)  # (beside an SSM: Falcon-H1)
            for linear in (attn.qkv, attn.o):
                total += linear.cost(tokens, element)
            if getattr(attn, "q_norm", None) is not None:  # QK-norm: per head
                for rows in (heads, kv_heads):
                    total += rms_norm.cost(tokens * rows, dim, False, element)
            total += rope.cost(tokens, heads + kv_heads, dim, element)
            total += kv_store.cost(tokens, kv_heads, dim, element, kv_store.slot_bytes(kv.k, kv.v))
        return total


def _mlp_cost(mlp, tokens: int, element: int) -> profiling.Cost:
    """A feed-forward's work: a gated MLP's two projections and its activation (SwiGLU or
    GeGLU: GATED_REGIONS' op); a mixture of experts' router and, per token, top_k experts'
    (their weights read once each: exact at one token, a lower bound past it, when the tokens
    pick more experts), and its shared experts' gated MLP."""
    if isinstance(mlp, MoE):
        moe = mlp.moe
        router = profiling.Cost(
            2 * tokens * moe.num_experts * mlp.router.shape[1], mlp.router.numel() * element
        )
        expert = mlp.gate_up[0].cost(tokens, element) + mlp.down[0].cost(tokens, element)
        act = silu_mul.cost(tokens, moe.intermediate_size, element)
        shared = profiling.Cost() if mlp.shared is None else _mlp_cost(mlp.shared, tokens, element)
        return router + (expert + act) * moe.top_k + shared
    act = GATED_COSTS[mlp.hidden_act](tokens, mlp.down.in_features, element)
    return mlp.gate_up.cost(tokens, element) + mlp.down.cost(tokens, element) + act


FAST_PATHS.register(
    "fused",
    FastPath(
        build=FusedDecode,
        description="the hand-written native decode step (kernels/decode_layers_f32.c)",
    ),
)


PHASES = (
    "norm1",
    "qkv",
    "rope+kv_store",
    "attention",
    "o_proj",
    "norm2",
    "gate_up",
    "silu_mul",
    "down",
    "final_norm",  # decode_step_f32's head
    "lm_head",
    "argmax",
)


class PhaseProfile:
    """Seconds per phase of the fused decode layers (summed over layers and steps) while the
    context is open: `with PhaseProfile() as prof: ...; prof.seconds` → {phase: s}."""

    def __enter__(self) -> PhaseProfile:
        self._fn = kernel("decode_layers_profile", I, P, source=SOURCE)
        self.seconds: dict[str, float] = {}
        if self._fn is not None:
            self._fn(1, None)
        return self

    def __exit__(self, *exc) -> None:
        if self._fn is None:
            return
        buf = (ctypes.c_double * len(PHASES))()
        self._fn(0, buf)
        self.seconds = dict(zip(PHASES, buf, strict=True))
