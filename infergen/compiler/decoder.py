"""The graphs of a decoder model: one decoder layer and the head, captured from the model code
(`Transformer.layers[i].forward`, `Transformer.head`) with the step's inputs described as IR
values. Layers of one model share a graph: their weights are graph inputs, bound per layer.

Dynamic dimensions: T (tokens in the step) and B (KV cache blocks, fixed per engine but not
part of what a kernel is specialised for). Everything else comes from the config.
"""

from __future__ import annotations

import torch

from infergen.compiler.capture import BLOCKS, Captured, CaptureError, Struct, capture
from infergen.compiler.ir import TOKENS, Value
from infergen.kvcache.paged_cache import PagedKVCache


def step_inputs(model, kv_cache: PagedKVCache) -> dict[str, Value | Struct]:
    """The decoder layer's arguments (h, delta, batch, kv) as graph inputs."""
    config, dtype = model.config, model.dtype
    if not kv_cache.format.supports_fast_decode:
        raise CaptureError(
            f"capture: KV format {kv_cache.kv_format!r} is not in the IR yet",
            expected="the unquantized cache or a scaled format (fp8_e4m3)",
        )
    layer = kv_cache.layer(0)
    cache_shape = (BLOCKS, *layer.k.shape[1:])
    hidden = (TOKENS, config.hidden_size)
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
    return {
        "h": Value("h", hidden, dtype, "input"),
        "delta": Value("delta", hidden, dtype, "input"),
        "batch": Struct(
            slot_mapping=Value("slots", (TOKENS,), torch.int64, "input"),
            attn_plan=Value("plan", (), None, "opaque"),
            rope=Struct(
                positions=Value("positions", (TOKENS,), torch.int64, "input"),
                cache=Value("rope_table", tuple(model.rope_cache.shape), torch.float32, "weight"),
            ),
        ),
        "kv": Struct(**kv),
    }


def capture_layer(model, kv_cache: PagedKVCache, index: int = 0) -> Captured:
    """The IR of decoder layer `index` (outputs: the MLP's delta, the updated residual stream
    h, the updated caches)."""
    return capture(model.layers[index], "forward", step_inputs(model, kv_cache), "decoder_layer")


def _kind(model, index: int) -> tuple[str, str, str]:
    """What may make a layer's graph differ from another's: its layer type (full or sliding
    attention, ...), its mixer's and its feed-forward's classes (DeepSeek: dense first)."""
    layer = model.layers[index]
    mixer, mlp = type(layer.attn).__name__, type(layer.mlp).__name__
    return model.config.layer_type(index), mixer, mlp


def capture_layers(model, kv_cache: PagedKVCache) -> Captured:
    """The IR every decoder layer shares: layer 0's, checked against the first layer of each
    other kind (`_kind`; Gemma-3's sliding and full layers differ only in what they bind:
    their cache group and RoPE table). CaptureError when one computes something else."""
    captured = capture_layer(model, kv_cache)
    seen = {_kind(model, 0)}
    for index in range(1, len(model.layers)):
        kind = _kind(model, index)
        if kind in seen:
            continue
        seen.add(kind)
        other = capture_layer(model, kv_cache, index).graph
        if other.canonical() != captured.graph.canonical():
            raise CaptureError(
                f"capture: layer {index} ({', '.join(kind)}) is not the same graph as layer 0 "
                f"({', '.join(_kind(model, 0))})",
                expected="layers that differ only in their cache group and RoPE table",
            )
    return captured


def capture_head(model) -> Captured:
    """The IR of the final norm and LM head over sampled rows (R of them)."""
    rows = (TOKENS, model.config.hidden_size)
    args = {
        "h": Value("h", rows, model.dtype, "input"),
        "delta": Value("delta", rows, model.dtype, "input"),
    }
    return capture(model, "head", args, "head")
