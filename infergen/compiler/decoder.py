"""The graphs of a decoder model: its decoder layers and the head, captured from the model code
(`Transformer.layers[i].forward`, `Transformer.head`) with the step's inputs described as IR
values. Layers of one kind share a graph: their weights are graph inputs, bound per layer; a
model whose layers are of several kinds (DeepSeek's dense first layer, Qwen3-Next's DeltaNet
and attention layers) has one graph per kind (`capture_kinds`).

The per-layer fallback: a mixer capture has no ops for (a recurrent state mixer, latent
attention: `whole_mixers`) is one MIXER node that runs the module itself; the rest of its
layer (norms, MLP or experts, residual adds; Falcon-H1's attention beside its Mamba2 mixer)
is captured as for any other. Qwen3-Next's gated attention is captured whole: its partial
RoPE a ROPE on the first dims beside the rest (CONCAT), its gate a SIGMOID and MUL.

Dynamic dimensions: T (tokens in the step) and B (KV cache blocks, fixed per engine but not
part of what a kernel is specialised for). Everything else comes from the config.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from infergen.compiler.capture import BLOCKS, Captured, CaptureError, Struct, capture
from infergen.compiler.ir import TOKENS, Value
from infergen.kvcache.kv_protocol import attention_part
from infergen.kvcache.paged_cache import PagedKVCache
from infergen.layers.attention import Attention
from infergen.layers.state_mixer import ParallelMixer


def whole_mixers(model, index: int) -> tuple[dict, str | None]:
    """The modules of layer `index`'s mixer seat that capture keeps whole (MIXER nodes) →
    their labels, and why (None: the mixer is captured op by op). Falcon-H1's attention beside
    a Mamba2 mixer keeps the Mamba2 mixer whole only: its attention is captured."""
    mixer, kind = model.layers[index].attn, model.config.layer_type(index)
    if isinstance(mixer, ParallelMixer) and _attention_why(model, mixer.attention) is None:
        return {mixer.ssm: "mamba"}, "mamba mixer beside the attention (StateMixer)"
    if not isinstance(mixer, Attention):
        return {mixer: kind}, f"{kind} mixer ({type(mixer).__name__})"
    why = _attention_why(model, mixer)
    return ({}, None) if why is None else ({mixer: kind}, why)


def _attention_why(model, attention) -> str | None:
    """Why capture keeps an attention whole (latent attention: another class), or None."""
    return None if isinstance(attention, Attention) else type(attention).__name__


def module_mixer(model, index: int) -> str | None:
    """Why (part of) layer `index`'s mixer runs as its module (a MIXER node), or None."""
    return whole_mixers(model, index)[1]


def attention_captured(model, index: int) -> bool:
    """Whether layer `index` has an attention that capture turns into ops (an ATTENTION node
    the layer program runs)."""
    mixer = model.layers[index].attn
    attention = mixer.attention if isinstance(mixer, ParallelMixer) else mixer
    return _attention_why(model, attention) is None


def step_inputs(model, kv_cache: PagedKVCache, index: int = 0) -> dict[str, Value | Struct]:
    """Decoder layer `index`'s arguments (h, delta, batch, kv) as graph inputs (a layer whose
    mixer is one MIXER node gets its cache layer whole: `kv` has no fields; an attention
    beside a recurrent mixer gets the pair: kv.0 the attention's, kv.1 the states)."""
    config, dtype = model.config, model.dtype
    hidden = (TOKENS, config.hidden_size)
    args = {name: Value(name, hidden, dtype, "input") for name in ("h", "delta")}
    if not attention_captured(model, index):  # (the module reads its arguments itself)
        return {**args, "batch": Struct(), "kv": Struct()}
    batch = Struct(
        slot_mapping=Value("slots", (TOKENS,), torch.int64, "input"),
        attn_plan=Value("plan", (), None, "opaque"),
        rope=Struct(
            positions=Value("positions", (TOKENS,), torch.int64, "input"),
            cache=Value("rope_table", tuple(model.rope_cache.shape), torch.float32, "weight"),
        ),
    )
    kv = Struct(**_kv_inputs(model, kv_cache, index))
    if isinstance(model.layers[index].attn, ParallelMixer):
        kv = Struct(**{"0": kv, "1": Struct()})
    return {**args, "batch": batch, "kv": kv}


def _kv_inputs(model, kv_cache: PagedKVCache, index: int) -> dict[str, Value]:
    """An attention layer's cache (and the scaled formats' scales) as graph inputs."""
    config, layer = model.config, attention_part(kv_cache.layer(index))
    if not kv_cache.format.supports_fast_decode:
        raise CaptureError(
            f"capture: KV format {kv_cache.kv_format!r} is not in the IR yet",
            expected="the unquantized cache or a scaled format (fp8_e4m3)",
        )
    cache_shape = (BLOCKS, *layer.k.shape[1:])
    fmt = kv_cache.kv_format
    kv = dict(
        k=Value("k_cache", cache_shape, layer.k.dtype, "cache", fmt),
        v=Value("v_cache", cache_shape, layer.v.dtype, "cache", fmt),
    )
    if layer.k_scale is not None:  # codes of (x - shift) / scale per KV head
        heads, dim = config.num_key_value_heads, config.head_dim
        kv.update(
            k_scale=Value("k_scale", (heads,), torch.float32, "weight"),
            v_scale=Value("v_scale", (heads,), torch.float32, "weight"),
            k_shift=Value("k_shift", (heads, dim), torch.float32, "weight"),
        )
    return kv


def capture_layer(model, kv_cache: PagedKVCache, index: int = 0) -> Captured:
    """The IR of decoder layer `index` (outputs: the MLP's delta, the updated residual stream
    h, the updated caches); its mixer a MIXER node where `module_mixer` says why."""
    mixers, _ = whole_mixers(model, index)
    args = step_inputs(model, kv_cache, index)
    return capture(model.layers[index], "forward", args, "decoder_layer", mixers)


def _kind(model, index: int) -> tuple[str, str, str]:
    """What may make a layer's graph differ from another's: its layer type (full or sliding
    attention, ...), its mixer's and its feed-forward's classes (DeepSeek: dense first)."""
    layer = model.layers[index]
    mlp = "no MLP" if layer.mlp is None else type(layer.mlp).__name__  # (Mamba2)
    return model.config.layer_type(index), type(layer.attn).__name__, mlp


@dataclass
class LayerKind:
    """Decoder layers that share one graph."""

    captured: Captured
    layers: list[int]  # their indices, ascending
    label: str  # "full_attention Attention GatedMLP" (their `_kind`s, joined)
    module_mixer: str | None  # why their mixer is a MIXER node (None: captured op by op)

    def describe(self) -> str:
        """ "layers 1-2, 5 (linear_attention StateMixer MoE)" """
        return f"{_spans(self.layers)} ({self.label})"


def capture_kinds(model, kv_cache: PagedKVCache) -> list[LayerKind]:
    """The distinct graphs of the decoder layers, in order of their first layer: the first
    layer of each `_kind` captured, kinds whose graphs are equal merged (Gemma-3's sliding and
    full layers differ only in what they bind: their cache group and RoPE table)."""
    kinds: list[LayerKind] = []
    of_kind: dict[tuple[str, str, str], LayerKind] = {}
    by_graph: dict[str, LayerKind] = {}  # canonical graph text → its kind
    for index in range(len(model.layers)):
        key = _kind(model, index)
        if key not in of_kind:
            captured = capture_layer(model, kv_cache, index)
            same = by_graph.get(canonical := captured.graph.canonical())
            if same is None:
                same = LayerKind(captured, [], " ".join(key), module_mixer(model, index))
                kinds.append(same)
                by_graph[canonical] = same
            elif " ".join(key) not in same.label:
                same.label += " / " + " ".join(key)
            of_kind[key] = same
        of_kind[key].layers.append(index)
    return kinds


def capture_layers(model, kv_cache: PagedKVCache) -> Captured:
    """The IR every decoder layer shares (`capture_kinds`'s one kind); CaptureError when the
    layers are of several kinds."""
    kinds = capture_kinds(model, kv_cache)
    if len(kinds) > 1:
        raise CaptureError(
            f"capture: the layers are of {len(kinds)} kinds: "
            + "; ".join(kind.describe() for kind in kinds),
            expected="layers that differ only in their cache group and RoPE table",
        )
    return kinds[0].captured


def _spans(indices: list[int]) -> str:
    """[0, 1, 2, 5] → "layers 0-2, 5"; [3] → "layer 3"."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and runs[-1][-1] == i - 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    text = ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)
    return f"layer{'s' if len(indices) > 1 else ''} {text}"


def capture_head(model) -> Captured:
    """The IR of the final norm and LM head over sampled rows (R of them)."""
    rows = (TOKENS, model.config.hidden_size)
    args = {
        "h": Value("h", rows, model.dtype, "input"),
        "delta": Value("delta", rows, model.dtype, "input"),
    }
    return capture(model, "head", args, "head")
