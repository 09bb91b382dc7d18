"""Architecture table: an architecture is a row of data, not a copied model file.

Every supported architecture is the generic decoder of `transformer.py` with a few switches.
Rows say how to recognise the architecture in a Hugging Face `config.json` (`model_type`) or a
GGUF file (`general.architecture`), and which optional parts it has.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infergen.errors import ConfigError
from infergen.registry import Registry


@dataclass(frozen=True)
class ArchSpec:
    """One decoder architecture.

    qkv_bias / o_bias: True/False fixes the bias; None takes `attention_bias` from the config.
    qk_norm: RMSNorm on each head of q and k before RoPE (Qwen3).
    sliding_window_flag: config key that must be true for `sliding_window` to apply (Qwen2/3);
        None means `sliding_window` applies whenever set (Mistral).
    gguf_permute_qk: GGUF stores q/k rows permuted for llama.cpp's interleaved rotary layout;
        the loader undoes it so every architecture uses the half-split (NeoX) rotary layout.
    """

    name: str
    hf_model_types: tuple[str, ...]
    gguf_arch: str | None
    qkv_bias: bool | None = None
    o_bias: bool | None = None
    qk_norm: bool = False
    sliding_window_flag: str | None = None
    gguf_permute_qk: bool = False


ARCHITECTURES: Registry[ArchSpec] = Registry("architecture")

for _spec in (
    ArchSpec("llama", ("llama",), "llama", gguf_permute_qk=True),
    ArchSpec("mistral", ("mistral",), None, qkv_bias=False, o_bias=False),
    ArchSpec(
        "qwen2",
        ("qwen2",),
        "qwen2",
        qkv_bias=True,
        o_bias=False,
        sliding_window_flag="use_sliding_window",
    ),
    ArchSpec(
        "qwen3",
        ("qwen3",),
        "qwen3",
        o_bias=False,
        qk_norm=True,
        sliding_window_flag="use_sliding_window",
    ),
):
    ARCHITECTURES.register(_spec.name, _spec)


def arch_for_hf_config(cfg: dict[str, Any], *, source: str) -> ArchSpec:
    model_type = cfg.get("model_type")
    for _, spec in ARCHITECTURES.items():
        if model_type in spec.hf_model_types:
            return spec
    known = sorted(t for _, s in ARCHITECTURES.items() for t in s.hf_model_types)
    raise ConfigError(
        "unknown architecture",
        where=f"{source}: model_type",
        found=model_type,
        expected=f"one of {known}",
    )


def arch_for_gguf(gguf_arch: str, *, source: str) -> ArchSpec:
    for _, spec in ARCHITECTURES.items():
        if spec.gguf_arch == gguf_arch:
            return spec
    known = sorted(s.gguf_arch for _, s in ARCHITECTURES.items() if s.gguf_arch)
    raise ConfigError(
        "unknown GGUF architecture",
        where=f"{source}: general.architecture",
        found=gguf_arch,
        expected=f"one of {known}",
    )


# Canonical (Hugging Face) tensor names; GGUF names are mapped onto these by io/gguf.py.
def layer_tensor_names(config: Any, layer: int) -> dict[str, tuple[int, ...]]:
    """Expected tensor names and shapes of one decoder layer."""
    p = f"model.layers.{layer}."
    h, i, d = config.hidden_size, config.intermediate_size, config.head_dim
    q, kv = config.q_size, config.kv_size
    names: dict[str, tuple[int, ...]] = {
        p + "input_layernorm.weight": (h,),
        p + "self_attn.q_proj.weight": (q, h),
        p + "self_attn.k_proj.weight": (kv, h),
        p + "self_attn.v_proj.weight": (kv, h),
        p + "self_attn.o_proj.weight": (h, q),
        p + "post_attention_layernorm.weight": (h,),
        p + "mlp.gate_proj.weight": (i, h),
        p + "mlp.up_proj.weight": (i, h),
        p + "mlp.down_proj.weight": (h, i),
    }
    if config.qkv_bias:
        names[p + "self_attn.q_proj.bias"] = (q,)
        names[p + "self_attn.k_proj.bias"] = (kv,)
        names[p + "self_attn.v_proj.bias"] = (kv,)
    if config.o_bias:
        names[p + "self_attn.o_proj.bias"] = (h,)
    if config.mlp_bias:
        names[p + "mlp.gate_proj.bias"] = (i,)
        names[p + "mlp.up_proj.bias"] = (i,)
        names[p + "mlp.down_proj.bias"] = (h,)
    if config.qk_norm:
        names[p + "self_attn.q_norm.weight"] = (d,)
        names[p + "self_attn.k_norm.weight"] = (d,)
    return names


def expected_tensors(config: Any) -> dict[str, tuple[int, ...]]:
    """Every tensor the generic decoder needs, with its shape."""
    names: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (config.vocab_size, config.hidden_size),
        "model.norm.weight": (config.hidden_size,),
    }
    for layer in range(config.num_hidden_layers):
        names.update(layer_tensor_names(config, layer))
    if not config.tie_word_embeddings:
        names["lm_head.weight"] = (config.vocab_size, config.hidden_size)
    return names
