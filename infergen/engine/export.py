"""`infergen quantize`: write a compressed-tensors checkpoint (io/compressed_tensors.py has the
layout) from any checkpoint we load — codes and scales exactly as our weight schemes compute
them, so `LLM(model=DIR)` runs the same values as `LLM(model=SRC, weights=SCHEME)` (the LM head
and embedding stay in full precision, as compressed-tensors checkpoints keep them).

q/k/v and gate/up are quantized fused, as the engine holds them, then split: per-tensor scales
(FP8, NVFP4's global) are then shared by the parts, so the loader can fuse them again.
With an FP8 KV cache, per-head K / V scales are calibrated as the engine does
(kvcache/calibrate.py) but for the keys as they are (the checkpoint format has no key shift).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch

from infergen.config import ModelConfig
from infergen.engine.build import build
from infergen.engine.options import engine_config
from infergen.engine.scoring import scratch_runner
from infergen.errors import ConfigError
from infergen.io.checkpoint import hf_config_dict, load_checkpoint
from infergen.io.compressed_tensors import (
    ACTIVATION_ARGS,
    INPUT_SCALES,
    pack_int32,
    unpack_int32,
)
from infergen.kvcache.calibrate import calibrate_kv_scales
from infergen.ops import linear_grouped as lg
from infergen.ops import linear_quantized as lq
from infergen.quant.activations import HF_PROJECTIONS


def _int8(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per output channel, codes stored unsigned (+128) 4 a word."""
    out, inp = weight.shape
    codes, scales = lq.quantize_weight(weight, "int8")
    q = codes.view(torch.int8).to(torch.int16) + 128
    return {"weight_packed": pack_int32(q, 8), "weight_scale": scales.reshape(out, 1),
            "weight_shape": torch.tensor([out, inp])}  # fmt: skip


def _fp8(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """E4M3 values with one scale for the tensor."""
    codes, scales = lq.quantize_weight(weight, "fp8_e4m3")
    return {"weight": codes.view(torch.float8_e4m3fn), "weight_scale": scales[:1].clone()}


def _int4_groups(weight: torch.Tensor, scheme: str) -> tuple[Any, dict[str, torch.Tensor]]:
    """Groups of 32 along the input, codes 8 a word: (the encoded groups, the tensors)."""
    out, inp = weight.shape
    g = lg.GROUP_FORMATS[scheme].encode(weight)
    return g, {"weight_packed": pack_int32(g.codes, 4), "weight_scale": g.fields[0],
               "weight_shape": torch.tensor([out, inp])}  # fmt: skip


def _int4(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    return _int4_groups(weight, "int4")[1]


def _int4_asym(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """As int4, plus zero points (stored + 8 like the codes), packed over rows."""
    g, tensors = _int4_groups(weight, "int4_asym")
    tensors["weight_zero_point"] = pack_int32(g.fields[1].t(), 4).t().contiguous()
    return tensors


def _nibbles(codes: torch.Tensor) -> torch.Tensor:
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def _mxfp4(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """E2M1 codes two a byte, an E8M0 scale per 32."""
    g = lg.GROUP_FORMATS["mxfp4"].encode(weight)
    return {"weight_packed": _nibbles(g.codes), "weight_scale": g.fields[0]}


def _nvfp4(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """E2M1 codes two a byte, an E4M3 scale per 16, the global scale stored as a divisor."""
    g = lg.GROUP_FORMATS["nvfp4"].encode(weight)
    e4m3 = torch.stack(g.fields, dim=-1).reshape(weight.shape[0], -1).view(torch.float8_e4m3fn)
    divisor = torch.tensor([1.0 / g.scalar], dtype=torch.float32)
    return {"weight_packed": _nibbles(g.codes), "weight_scale": e4m3,
            "weight_global_scale": divisor}  # fmt: skip


class Layout(NamedTuple):
    """A weight scheme's compressed-tensors layout: the format, the weights' quantization
    args, and the writer of one weight [out, in] → its tensors (suffixes after `<p>.`)."""

    format: str
    args: dict
    write: Callable[[torch.Tensor], dict[str, torch.Tensor]]


# our weight scheme → its layout
EXPORTS = {
    "int8": Layout("pack-quantized", {"num_bits": 8, "type": "int", "symmetric": True,
                   "strategy": "channel", "group_size": None}, _int8),
    "int4": Layout("pack-quantized", {"num_bits": 4, "type": "int", "symmetric": True,
                   "strategy": "group", "group_size": 32}, _int4),
    "int4_asym": Layout("pack-quantized", {"num_bits": 4, "type": "int", "symmetric": False,
                        "strategy": "group", "group_size": 32}, _int4_asym),
    "fp8_e4m3": Layout("naive-quantized", {"num_bits": 8, "type": "float", "symmetric": True,
                       "strategy": "tensor", "group_size": None}, _fp8),
    "nvfp4": Layout("nvfp4-pack-quantized", {"num_bits": 4, "type": "float", "symmetric": True,
                    "strategy": "tensor_group", "group_size": 16,
                    "scale_dtype": "torch.float8_e4m3fn"}, _nvfp4),
    "mxfp4": Layout("mxfp4-pack-quantized", {"num_bits": 4, "type": "float", "symmetric": True,
                    "strategy": "group", "group_size": 32, "scale_dtype": "torch.uint8"}, _mxfp4),
}  # fmt: skip
FUSED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"), ("o_proj",), ("down_proj",))


def _split(stored: dict[str, torch.Tensor], sizes: list[int]) -> list[dict[str, torch.Tensor]]:
    """A fused weight's tensors → each part's (rows split; shared per-tensor scales copied)."""
    total = sum(sizes)
    parts: list[dict[str, torch.Tensor]] = [{} for _ in sizes]
    for key, t in stored.items():
        if key == "weight_shape":
            for part, rows in zip(parts, sizes, strict=True):
                part[key] = torch.tensor([rows, int(t[1])])
        elif key == "weight_zero_point":  # packed 8 rows a word: unpack, split, repack
            z = unpack_int32(t.t().contiguous(), 4, total).t()
            for part, chunk in zip(parts, z.split(sizes), strict=True):
                part[key] = pack_int32(chunk.t(), 4).t().contiguous()
        elif t.dim() >= 1 and t.shape[0] == total:
            for part, chunk in zip(parts, t.split(sizes), strict=True):
                part[key] = chunk.contiguous()
        else:  # per-tensor: the parts share it
            for part in parts:
                part[key] = t.clone()
    return parts


def export(
    model: str | None,
    scheme: str,
    out: str | Path,
    kv_format: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    activations: str | None = None,
    calibration: str = "max",
    smoothing: str | None = None,
    calibration_stats: str | None = None,
    calibration_text: str | None = None,
) -> Path:
    """Quantize `model`'s decoder projections with `scheme` (and calibrate KV scales for
    `kv_format`) into a compressed-tensors directory `out`; returns it. With `activations`,
    `calibration` or `smoothing` the engine calibrates first (quant/apply.py): the smoothed /
    clipped weights and norms are what is quantized and written, and static activation
    schemes store each projection's input scale."""
    from safetensors.torch import save_file

    _check_schemes(scheme, kv_format, activations)
    _check_exportable(load_checkpoint(model, load_weights=False).config)
    ckpt = load_checkpoint(model)
    config, tensors = ckpt.config, ckpt.tensors
    input_scales: dict[str, torch.Tensor] = {}
    if activations is not None or smoothing is not None or calibration != "max":
        input_scales = _calibrate(model, scheme, tensors, config, dict(
            activations=activations, calibration=calibration, smoothing=smoothing,
            calibration_stats=calibration_stats, calibration_text=calibration_text))  # fmt: skip
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    result = _projections(tensors, config.num_hidden_layers, EXPORTS[scheme], progress)
    result.update({name: t.contiguous() for name, t in tensors.items()})  # norms, embeddings
    for prefix, scale in input_scales.items():  # static activation scales
        stored = INPUT_SCALES[activations]
        result[prefix + stored.suffix] = stored.stored(scale)
    quant = _quantization_config(EXPORTS[scheme], activations)
    if kv_format is not None:
        scales = _kv_scales(model)
        for layer in range(config.num_hidden_layers):
            for j, kind in enumerate(("k_scale", "v_scale")):
                name = f"model.layers.{layer}.self_attn.{kind}"
                result[name] = scales[layer, j].reshape(-1, 1, 1)
        quant["kv_cache_scheme"] = {"num_bits": 8, "type": "float", "symmetric": True,
                                    "strategy": "attn_head", "dynamic": False}  # fmt: skip
    save_file(result, str(out / "model.safetensors"))
    hf = hf_config_dict(model)
    hf["quantization_config"] = quant
    (out / "config.json").write_text(json.dumps(hf, indent=1))
    if ckpt.tokenizer is not None:
        ckpt.tokenizer.save(out)
    return out


def _check_schemes(scheme: str, kv_format: str | None, activations: str | None) -> None:
    """Schemes a compressed-tensors checkpoint has a layout for."""
    if scheme not in EXPORTS:
        raise ConfigError(
            "no compressed-tensors layout for this weight scheme",
            where="--weights",
            found=scheme,
            expected=f"one of {sorted(EXPORTS)} (llama.cpp's blocks stay GGUF)",
        )
    if kv_format not in (None, "fp8_e4m3"):
        raise ConfigError("unsupported KV format", where="--kv", found=kv_format,
                          expected="fp8_e4m3")  # fmt: skip
    if activations is not None and activations not in ACTIVATION_ARGS:
        raise ConfigError("no compressed-tensors layout for this activation scheme",
                          where="--activations", found=activations,
                          expected=f"one of {sorted(ACTIVATION_ARGS)}")  # fmt: skip


def _projections(
    tensors: dict[str, torch.Tensor],
    layers: int,
    layout: Layout,
    progress: Callable[[int, int], None] | None,
) -> dict[str, torch.Tensor]:
    """Every decoder projection's stored tensors (popped from `tensors`): quantized fused as
    the engine holds them, then split per projection."""
    result: dict[str, torch.Tensor] = {}
    for layer in range(layers):
        for group in FUSED:
            module = "mlp" if group[0] in ("gate_proj", "down_proj") else "self_attn"
            prefix = f"model.layers.{layer}.{module}."
            names = [prefix + name for name in group]
            weights = [tensors.pop(n + ".weight") for n in names]
            fused = layout.write(torch.cat(weights))
            for name, part in zip(names, _split(fused, [w.shape[0] for w in weights]), strict=True):
                result.update({f"{name}.{key}": t for key, t in part.items()})
        if progress is not None:
            progress(layer + 1, layers)
    return result


def _quantization_config(layout: Layout, activations: str | None) -> dict:
    """The config.json's `quantization_config` (kv_cache_scheme set by the caller)."""
    return {
        "quant_method": "compressed-tensors",
        "format": layout.format,
        "quantization_status": "compressed",
        "global_compression_ratio": None,
        "ignore": ["lm_head"],
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {**layout.args, "dynamic": False},
                "input_activations": ACTIVATION_ARGS[activations] if activations else None,
                "output_activations": None,
                "format": layout.format,
            }
        },
        "kv_cache_scheme": None,
        "producer": "infergen quantize",
    }


def _check_exportable(config: ModelConfig) -> None:
    """The layout written here is q/k/v/o attention and a dense gate/up/down MLP in every
    layer: refuse, before any work, what it cannot hold."""
    arch = config.arch
    unsupported = [
        what
        for what, present in (
            ("mixture-of-experts feed-forward", config.moe is not None),
            ("latent attention (MLA)", config.mla is not None),
            (
                "recurrent layers",
                any(not config.has_kv(i) for i in range(config.num_hidden_layers)),
            ),
            ("attention beside an SSM", "attention_mamba" in config.layer_types),
            ("a gated attention output", arch.attention_output_gate),
            ("learned attention sinks", arch.attention_sinks),
            ("no feed-forward", arch.mlp == "none"),
        )
        if present
    ]
    if unsupported:
        raise ConfigError(
            f"infergen quantize cannot write {config.architecture}: " + ", ".join(unsupported),
            where=config.source,
            expected="a model whose layers are attention (q/k/v/o) + a dense MLP "
            "(llama, mistral, qwen2, qwen3, gemma3); run this one with --weights at load instead",
        )


def _kv_scales(model: str | None) -> torch.Tensor:
    """Per-head FP8 scales [layers, 2, kv_heads] of the unshifted keys and the values."""
    built = build(engine_config(model=model, kv_cache_memory=64 << 20))
    config = built.config
    run = scratch_runner(
        built.model, built.model_config, config.cache.block_size, torch.float32, config.scheduler
    )
    scales, _ = calibrate_kv_scales(
        run,
        built.tokenizer,
        built.model_config.vocab_size,
        built.max_model_len,
        "fp8_e4m3",
        smooth_keys=False,
    )
    return scales


def _calibrate(model, scheme, tensors, config, options) -> dict[str, torch.Tensor]:
    """Calibrate `model` as the engine does for `scheme` and `options`; replace the decoder's
    weights, biases and norms in `tensors` by the rewritten ones (smoothing, clipping) and
    return each projection's static input scale by Hugging Face prefix."""
    built = build(
        engine_config(
            model=model, weights=scheme, keep=("lm_head",), kv_cache_memory=64 << 20, **options
        ),  # the checkpoint keeps lm_head
        progress=True,
        keep_dense=True,
    )
    result = built.calibration
    dense = result.dense if result is not None else None
    q, kv, inter = config.q_size, config.kv_size, config.intermediate_size
    parts = {"attn.qkv": (("self_attn.q_proj", q), ("self_attn.k_proj", kv),
                          ("self_attn.v_proj", kv)),
             "attn.o": (("self_attn.o_proj", None),),
             "mlp.gate_up": (("mlp.gate_proj", inter), ("mlp.up_proj", inter)),
             "mlp.down": (("mlp.down_proj", None),)}  # fmt: skip
    norms = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}
    scales = {}
    for layer in range(config.num_hidden_layers):
        hf = f"model.layers.{layer}."
        for ours, hf_parts in parts.items():
            name = f"layers.{layer}.{ours}"
            if dense is not None:
                sizes = [size or dense.weights[name].shape[0] for _, size in hf_parts]
                for kind, value in (("weight", dense.weights[name]), ("bias", dense.biases[name])):
                    if value is None:
                        continue
                    for (proj, _), chunk in zip(hf_parts, value.split(sizes), strict=True):
                        tensors[f"{hf}{proj}.{kind}"] = chunk.contiguous()
            scale = result.chosen.get(f"{name}.input_scale") if result else None
            if scale is not None:
                scales.update({hf + proj: scale for proj, _ in hf_parts})
        if dense is not None:
            for ours, theirs in norms.items():
                tensors[f"{hf}{theirs}.weight"] = dense.norms[f"layers.{layer}.{ours}"].clone()
    assert set(HF_PROJECTIONS) == {p for ps in parts.values() for p, _ in ps}
    return scales
