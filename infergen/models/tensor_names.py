"""Canonical (Hugging Face style) tensor names and shapes of the generic decoder, per
architecture (config/architectures.py rows): what a checkpoint must hold."""

from __future__ import annotations

from typing import Any

from infergen.config.architectures import ArchSpec


# Canonical (Hugging Face) tensor names; GGUF names are mapped onto these by io/gguf.py.
def layer_tensor_names(config: Any, layer: int) -> dict[str, tuple[int, ...]]:
    """Expected tensor names and shapes of one decoder layer."""
    p = f"model.layers.{layer}."
    h, d = config.hidden_size, config.head_dim
    q, kv = config.q_size, config.kv_size
    spec = config.arch
    names: dict[str, tuple[int, ...]] = {p + "input_layernorm.weight": (h,)}
    if spec.mlp != "none":
        names[p + "post_attention_layernorm.weight"] = (h,)
        names[p + spec.mlp_norm_name + ".weight"] = (h,)
    kind = config.layer_type(layer)
    if kind in STATE_TENSORS:
        names.update(STATE_TENSORS[kind](config, p))
    if kind == "attention_mamba":  # Falcon-H1: both, side by side
        names.update(_mamba_tensors(config, p))
    if not config.has_kv(layer):
        return _with_mlp(config, spec, layer, p, names)
    if config.mla is not None:
        names.update(_mla_tensors(config, p + "self_attn."))
    else:
        names.update({
            p + "self_attn.q_proj.weight": (q * (1 + spec.attention_output_gate), h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
        })  # fmt: skip
    if config.qkv_bias:
        names[p + "self_attn.q_proj.bias"] = (q,)
        names[p + "self_attn.k_proj.bias"] = (kv,)
        names[p + "self_attn.v_proj.bias"] = (kv,)
    if config.o_bias:
        names[p + "self_attn.o_proj.bias"] = (h,)
    if spec.sandwich_norms:
        names[p + "post_feedforward_layernorm.weight"] = (h,)
    if config.qk_norm:
        names[p + "self_attn.q_norm.weight"] = (d,)
        names[p + "self_attn.k_norm.weight"] = (d,)
    if spec.attention_sinks:
        names[p + "self_attn.sinks"] = (config.num_attention_heads,)
    return _with_mlp(config, spec, layer, p, names)


def _with_mlp(config: Any, spec: ArchSpec, layer: int, p: str, names: dict) -> dict:
    moe = config.moe
    if spec.mlp == "none":
        pass
    elif moe is not None and moe.is_moe_layer(layer):
        names.update(MOE_TENSORS[spec.mlp](config, p + "mlp."))
    else:
        names.update(_dense_mlp(config, p + "mlp.", config.intermediate_size))
    return names


def _mamba_tensors(config: Any, p: str) -> dict[str, tuple[int, ...]]:
    s, h = config.ssm, config.hidden_size
    p += "mamba."
    names = {
        p + "in_proj.weight": (s.projection_size, h),
        p + "conv1d.weight": (s.conv_dim, 1, s.conv_kernel),
        p + "dt_bias": (s.num_heads,),
        p + "A_log": (s.num_heads,),
        p + "D": (s.num_heads,),
        p + "out_proj.weight": (h, s.intermediate_size),
    }
    if s.conv_bias:
        names[p + "conv1d.bias"] = (s.conv_dim,)
    if s.in_proj_bias:
        names[p + "in_proj.bias"] = (s.projection_size,)
    if s.out_proj_bias:
        names[p + "out_proj.bias"] = (h,)
    if s.rms_norm:
        names[p + "norm.weight"] = (s.intermediate_size,)
    return names


def _deltanet_tensors(config: Any, p: str) -> dict[str, tuple[int, ...]]:
    s, h = config.linear_attention, config.hidden_size
    p += "linear_attn."
    r = s.v_per_k
    return {
        p + "in_proj_qkvz.weight": (s.num_k_heads * (2 * s.k_head_dim + 2 * r * s.v_head_dim), h),
        p + "in_proj_ba.weight": (s.num_k_heads * 2 * r, h),
        p + "conv1d.weight": (s.conv_dim, 1, s.conv_width),
        p + "A_log": (s.num_v_heads,),
        p + "dt_bias": (s.num_v_heads,),
        p + "norm.weight": (s.v_head_dim,),
        p + "out_proj.weight": (h, s.value_dim),
    }


# recurrent layer kind → its tensors (canonical names)
STATE_TENSORS = {"mamba": _mamba_tensors, "linear_attention": _deltanet_tensors}


def _mla_tensors(config: Any, p: str) -> dict[str, tuple[int, ...]]:
    mla, h, heads = config.mla, config.hidden_size, config.num_attention_heads
    qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    names = {
        p + "kv_a_proj_with_mqa.weight": (mla.kv_lora_rank + mla.qk_rope_head_dim, h),
        p + "kv_a_layernorm.weight": (mla.kv_lora_rank,),
        p + "kv_b_proj.weight": (heads * (mla.qk_nope_head_dim + mla.v_head_dim), mla.kv_lora_rank),
        p + "o_proj.weight": (h, heads * mla.v_head_dim),
    }
    if mla.q_lora_rank:
        names[p + "q_a_proj.weight"] = (mla.q_lora_rank, h)
        names[p + "q_a_layernorm.weight"] = (mla.q_lora_rank,)
        names[p + "q_b_proj.weight"] = (heads * qk, mla.q_lora_rank)
    else:
        names[p + "q_proj.weight"] = (heads * qk, h)
    return names


def _dense_mlp(config: Any, p: str, i: int) -> dict[str, tuple[int, ...]]:
    h = config.hidden_size
    names = {p + "gate_proj.weight": (i, h), p + "up_proj.weight": (i, h),
             p + "down_proj.weight": (h, i)}  # fmt: skip
    if config.mlp_bias:
        names.update({p + "gate_proj.bias": (i,), p + "up_proj.bias": (i,),
                      p + "down_proj.bias": (h,)})  # fmt: skip
    return names


def _gpt_oss_tensors(config: Any, p: str) -> dict[str, tuple[int, ...]]:
    e, h, i = config.moe.num_experts, config.hidden_size, config.moe.intermediate_size
    return {
        p + "router.weight": (e, h),
        p + "router.bias": (e,),
        p + "experts.gate_up_proj": (e, h, 2 * i),
        p + "experts.gate_up_proj_bias": (e, 2 * i),
        p + "experts.down_proj": (e, i, h),
        p + "experts.down_proj_bias": (e, h),
    }


def _deepseek_tensors(config: Any, p: str) -> dict[str, tuple[int, ...]]:
    moe, h = config.moe, config.hidden_size
    names = {p + "gate.weight": (moe.num_experts, h)}
    if moe.router == "sigmoid_group_limited":
        names[p + "gate.e_score_correction_bias"] = (moe.num_experts,)
    for e in range(moe.num_experts):
        names.update(_dense_mlp(config, f"{p}experts.{e}.", moe.intermediate_size))
    if moe.shared_intermediate_size:
        names.update(_dense_mlp(config, f"{p}{moe.shared_name}.", moe.shared_intermediate_size))
    if moe.shared_gate:
        names[p + "shared_expert_gate.weight"] = (1, h)
    return names


MOE_TENSORS = {
    "gpt_oss_moe": _gpt_oss_tensors,
    "deepseek_moe": _deepseek_tensors,
    "qwen3_next_moe": _deepseek_tensors,  # the same layout, one gated shared expert
}


def mtp_tensor_names(config: Any) -> dict[str, tuple[int, ...]]:
    """The tensors of the multi-token-prediction layers a checkpoint may carry beside the
    decoder (`config.mtp_layers`; DeepSeek-V3's layout: layer N + j after the N decoder
    layers is a decoder layer of its own, plus the norms of its two inputs, their projection
    and a shared head — models/mtp.py). Optional: checkpoints often drop them. The layer's
    own copy of the embedding (DeepSeek-V3 stores one; the target's is used) is in
    `mtp_optional_names`."""
    if not config.mtp_layers or config.architecture not in MTP_ARCHITECTURES:
        return {}
    h, names = config.hidden_size, {}
    for j in range(config.mtp_layers):
        p = f"model.layers.{config.num_hidden_layers + j}."
        names.update(layer_tensor_names(config, config.num_hidden_layers + j))
        names.update({
            p + "enorm.weight": (h,),
            p + "hnorm.weight": (h,),
            p + "eh_proj.weight": (h, 2 * h),
            p + "shared_head.norm.weight": (h,),
            p + "shared_head.head.weight": (config.vocab_size, h),
        })  # fmt: skip
    return names


# architectures whose checkpoints lay out multi-token-prediction layers as mtp_tensor_names
# reads them (Qwen3-Next's `mtp.*` layout is not read)
MTP_ARCHITECTURES = ("deepseek_v2", "deepseek_v3")


def mtp_optional_names(config: Any) -> dict[str, tuple[int, ...]]:
    """Tensors a checkpoint's multi-token-prediction layers may carry that are not read: each
    layer's copy of the shared embedding."""
    shape = (config.vocab_size, config.hidden_size)
    return {
        f"model.layers.{config.num_hidden_layers + j}.embed_tokens.weight": shape
        for j in range(config.mtp_layers if mtp_tensor_names(config) else 0)
    }


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
