"""Architecture table: an architecture is a row of data, not a copied model file.

Every supported architecture is the generic decoder of `transformer.py` with a few switches.
Rows say how to recognise the architecture in a Hugging Face `config.json` (`model_type`) or a
GGUF file (`general.architecture`), and which optional parts it has.
"""

from __future__ import annotations

import re
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
    norm_offset: RMSNorm multiplies by (offset + weight): Gemma stores weight − 1. The model
        adds it once at load (layers run a plain RMSNorm).
    sandwich_norms: the attention and MLP outputs are normalised before the residual add
        (Gemma-2/3: post_attention_layernorm, pre_/post_feedforward_layernorm).
    embed_scale: embeddings are multiplied by sqrt(hidden_size) (Gemma).
    attention_sinks: each attention head has a learned sink logit (GPT-OSS: self_attn.sinks).
    mlp: the feed-forward block: "dense" (the gated MLP) or a MOE_READERS row
        ("gpt_oss_moe", "deepseek_moe": mixtures of experts, layers/moe.py).
    mla: the attention is DeepSeek's multi-head latent attention (layers/mla.py).
    attention_output_gate: q_proj also yields a per-head gate; the attention output is
        multiplied by sigmoid(gate) (Qwen3-Next).
    layer_type: every layer's mixer when the config does not list `layer_types` per layer
        (Mamba2: "mamba"); None: `layer_types`, else full attention.
    hf_defaults: config.json keys the architecture leaves implicit (Mamba2 has no attention
        heads: placeholders the attention-free layers never use).
    hf_renames: (regex, replacement) pairs mapping the checkpoint's tensor names onto the
        canonical ones (Mamba2: backbone.* → model.*, mixer → mamba).
    """

    name: str
    hf_model_types: tuple[str, ...]
    gguf_arch: str | None
    qkv_bias: bool | None = None
    o_bias: bool | None = None
    qk_norm: bool = False
    sliding_window_flag: str | None = None
    gguf_permute_qk: bool = False
    norm_offset: float = 0.0
    sandwich_norms: bool = False
    embed_scale: bool = False
    attention_sinks: bool = False
    mlp: str = "dense"
    mla: bool = False
    layer_type: str | None = None
    attention_output_gate: bool = False
    hf_defaults: tuple[tuple[str, Any], ...] = ()
    hf_renames: tuple[tuple[str, str], ...] = ()

    def read_multipliers(self, cfg: dict[str, Any]) -> tuple[tuple[str, float], ...]:
        """(tensor-name regex, factor) pairs folding the config's constant multipliers into
        the weights (Falcon-H1's µP multipliers)."""
        return MULTIPLIER_RULES[self.name](cfg) if self.name in MULTIPLIER_RULES else ()

    def read_mixer(self, kind: str, layer_types, cfg: dict, source: str) -> Any:
        """The spec of the recurrent mixer `kind` ("linear_attention": DeltaNetSpec, "mamba":
        SSMSpec) when some layer uses it, else None."""
        if kind not in layer_types:
            return None
        return MIXER_SPECS[kind](cfg, source)

    def rename(self, name: str) -> str:
        """A checkpoint tensor name in canonical (Llama-style Hugging Face) form."""
        for pattern, replacement in self.hf_renames:
            name = re.sub(pattern, replacement, name)
        return name

    def read_mla(self, cfg: dict[str, Any], source: str) -> Any:
        """The MLAConfig of a Hugging Face config.json (None unless the layers use MLA)."""
        if not self.mla:
            return None
        from infergen.config import MLAConfig

        if cfg.get("attention_bias"):
            raise ConfigError("MLA with attention biases is not supported",
                              where=f"{source}: attention_bias", found=True,
                              expected="false")  # fmt: skip

        def need(key: str) -> int:
            if not cfg.get(key):
                raise ConfigError(f"MLA needs {key!r}", where=f"{source}: {key}",
                                  expected="a positive integer")  # fmt: skip
            return cfg[key]

        return MLAConfig(
            q_lora_rank=cfg.get("q_lora_rank"),
            kv_lora_rank=need("kv_lora_rank"),
            qk_nope_head_dim=need("qk_nope_head_dim"),
            qk_rope_head_dim=need("qk_rope_head_dim"),
            v_head_dim=need("v_head_dim"),
            # V2 rotates interleaved pairs always; V3 unless rope_interleave is false
            rope_interleave=bool(cfg.get("rope_interleave", True)),
        )

    def read_moe(self, cfg: dict[str, Any], source: str) -> Any:
        """The MoEConfig of a Hugging Face config.json (None for a dense architecture)."""
        return MOE_READERS[self.mlp](cfg, source) if self.mlp in MOE_READERS else None

    @property
    def mlp_norm_name(self) -> str:
        """Checkpoint name of the norm in front of the MLP."""
        return "pre_feedforward_layernorm" if self.sandwich_norms else "post_attention_layernorm"


ARCHITECTURES: Registry[ArchSpec] = Registry("architecture")


def _normalise_floats(value: Any) -> Any:
    """transformers writes non-finite floats in config.json as {"__float__": "Infinity"}."""
    if isinstance(value, dict) and set(value) == {"__float__"}:
        return float(value["__float__"])
    if isinstance(value, list | tuple):
        return [_normalise_floats(v) for v in value]
    return value


def _deltanet_spec(cfg: dict[str, Any], source: str) -> Any:
    from infergen.layers.linear_attention import DeltaNetSpec

    return DeltaNetSpec.from_hf_config(cfg)


def _ssm_spec(cfg: dict[str, Any], source: str) -> Any:
    from infergen.layers.ssm import SSMSpec

    return SSMSpec.from_hf_config({k: _normalise_floats(v) for k, v in cfg.items()})


def _falcon_h1_multipliers(cfg: dict[str, Any]) -> tuple[tuple[str, float], ...]:
    """Falcon-H1's multipliers on the attention input / keys / output, the SSM output and the
    MLP's gate and down projections, as weight factors (the SSM's input multipliers are folded
    by its mixer, layers/ssm.py)."""
    attn_in, key = cfg.get("attention_in_multiplier", 1.0), cfg.get("key_multiplier", 1.0)
    gate, down = cfg.get("mlp_multipliers") or (1.0, 1.0)
    rules = [
        (r"\.self_attn\.[qv]_proj\.weight$", attn_in),
        (r"\.self_attn\.k_proj\.weight$", attn_in * key),
        (r"\.self_attn\.k_proj\.bias$", key),
        (r"\.self_attn\.o_proj\.(weight|bias)$", cfg.get("attention_out_multiplier", 1.0)),
        (r"\.mamba\.out_proj\.(weight|bias)$", cfg.get("ssm_out_multiplier", 1.0)),
        (r"\.mlp\.gate_proj\.(weight|bias)$", gate),
        (r"\.mlp\.down_proj\.(weight|bias)$", down),
    ]
    return tuple((pattern, float(f)) for pattern, f in rules if f != 1.0)


MULTIPLIER_RULES = {"falcon_h1": _falcon_h1_multipliers}

# recurrent layer kind → reader of its mixer spec from config.json
MIXER_SPECS = {"linear_attention": _deltanet_spec, "mamba": _ssm_spec}


def _gpt_oss_moe(cfg: dict[str, Any], source: str) -> Any:
    from infergen.config import MoEConfig

    return MoEConfig(
        num_experts=cfg["num_local_experts"],
        top_k=cfg["num_experts_per_tok"],
        intermediate_size=cfg["intermediate_size"],
        router="softmax_topk",
        activation="clamped_swiglu",
        expert_bias=True,
        swiglu_limit=float(cfg.get("swiglu_limit", 7.0)),
        swiglu_alpha=float(cfg.get("swiglu_alpha", 1.702)),
        source=source,
    )


def _deepseek_moe(cfg: dict[str, Any], source: str) -> Any:
    from infergen.config import MoEConfig

    v3 = cfg.get("model_type") == "deepseek_v3"
    method = cfg.get("topk_method", "greedy")
    routers = {"greedy": "softmax_greedy", "group_limited_greedy": "softmax_group_limited"}
    if not v3 and method not in routers:
        raise ConfigError(
            "unsupported DeepSeek-V2 topk_method",
            where=f"{source}: topk_method",
            found=method,
            expected=f"one of {sorted(routers)}",
        )
    return MoEConfig(
        num_experts=cfg.get("n_routed_experts") or cfg["num_local_experts"],
        top_k=cfg["num_experts_per_tok"],
        intermediate_size=cfg["moe_intermediate_size"],
        router="sigmoid_group_limited" if v3 else routers[method],
        shared_intermediate_size=(cfg.get("n_shared_experts") or 0) * cfg["moe_intermediate_size"],
        routed_scaling=float(cfg.get("routed_scaling_factor", 1.0)),
        norm_topk=bool(cfg.get("norm_topk_prob", False)) and v3,
        num_groups=cfg.get("n_group") or 1,
        topk_groups=cfg.get("topk_group") or 1,
        dense_layers=tuple(
            i
            for i in range(cfg["num_hidden_layers"])
            if i < (cfg.get("first_k_dense_replace") or 0) or i % (cfg.get("moe_layer_freq") or 1)
        ),
        source=source,
    )


def _qwen3_next_moe(cfg: dict[str, Any], source: str) -> Any:
    from infergen.config import MoEConfig

    step, only = cfg.get("decoder_sparse_step") or 1, set(cfg.get("mlp_only_layers") or ())
    return MoEConfig(
        num_experts=cfg["num_experts"],
        top_k=cfg["num_experts_per_tok"],
        intermediate_size=cfg["moe_intermediate_size"],
        router="softmax_greedy",
        shared_intermediate_size=cfg.get("shared_expert_intermediate_size") or 0,
        norm_topk=bool(cfg.get("norm_topk_prob", True)),
        dense_layers=tuple(
            i for i in range(cfg["num_hidden_layers"]) if i in only or (i + 1) % step
        ),
        shared_gate=True,
        shared_name="shared_expert",
        source=source,
    )


# ArchSpec.mlp → reader of its MoEConfig from config.json
MOE_READERS = {
    "gpt_oss_moe": _gpt_oss_moe,
    "deepseek_moe": _deepseek_moe,
    "qwen3_next_moe": _qwen3_next_moe,
}

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
    ArchSpec(
        "gpt_oss",
        ("gpt_oss",),
        None,
        attention_sinks=True,
        mlp="gpt_oss_moe",
    ),
    ArchSpec(
        "mamba2",
        ("mamba2",),
        None,
        mlp="none",
        layer_type="mamba",
        hf_defaults=(("num_attention_heads", 1), ("intermediate_size", 1)),
        hf_renames=(
            (r"^backbone\.embeddings\.", "model.embed_tokens."),
            (r"^backbone\.norm_f\.", "model.norm."),
            (r"^backbone\.layers\.(\d+)\.norm\.", r"model.layers.\1.input_layernorm."),
            (r"^backbone\.layers\.(\d+)\.mixer\.", r"model.layers.\1.mamba."),
        ),
    ),
    ArchSpec(
        "falcon_h1",
        ("falcon_h1",),
        None,
        layer_type="attention_mamba",
        hf_renames=(
            (r"\.feed_forward\.", ".mlp."),
            (r"\.pre_ff_layernorm\.", ".post_attention_layernorm."),
            (r"^model\.final_layernorm\.", "model.norm."),
        ),
    ),
    ArchSpec(
        "qwen3_next",
        ("qwen3_next",),
        None,
        qkv_bias=False,
        o_bias=False,
        qk_norm=True,
        norm_offset=1.0,
        mlp="qwen3_next_moe",
        attention_output_gate=True,
    ),
    ArchSpec("deepseek_v2", ("deepseek_v2",), None, mlp="deepseek_moe", mla=True),
    ArchSpec("deepseek_v3", ("deepseek_v3",), None, mlp="deepseek_moe", mla=True),
    ArchSpec(
        "gemma3",
        ("gemma3_text",),
        "gemma3",
        qkv_bias=False,
        o_bias=False,
        qk_norm=True,
        norm_offset=1.0,
        sandwich_norms=True,
        embed_scale=True,
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
