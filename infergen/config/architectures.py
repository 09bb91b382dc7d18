"""Architecture table: an architecture is a row of data, not a copied model file.

Every supported architecture is the generic decoder of `models/transformer.py` with a few
switches.
Rows say how to recognise the architecture in a Hugging Face `config.json` (`model_type`) or a
GGUF file (`general.architecture`), and which optional parts it has.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from infergen.config.mixers import DeltaNetSpec, SSMSpec
from infergen.config.specs import MLAConfig, MoEConfig
from infergen.errors import ConfigError
from infergen.registry import Registry


@dataclass(frozen=True)
class LayerPattern:
    """The layer types transformers derives from a config.json without `layer_types`.

    rule "period": every `period`-th layer (1-based) is full attention, the others `other`
        (Gemma-3's sliding_window_pattern, gpt-oss's alternation, Qwen3-Next's
        full_attention_interval); rule "from": the layers from index `period` on are `other`
        (Qwen2/3's max_window_layers). `key` names the config value of `period` (None: always
        `default`).
    """

    rule: str
    other: str
    key: str | None
    default: int

    def layer_types(self, cfg: dict[str, Any], layers: int, source: str) -> tuple[str, ...]:
        period = cfg.get(self.key) if self.key else None
        period = self.default if period is None else period
        if not isinstance(period, int) or period < (1 if self.rule == "period" else 0):
            raise ConfigError("bad layer pattern", where=f"{source}: {self.key}", found=period,
                              expected="a positive integer")  # fmt: skip
        if self.rule == "period":
            return tuple(
                "full_attention" if (i + 1) % period == 0 else self.other for i in range(layers)
            )
        return tuple(self.other if i >= period else "full_attention" for i in range(layers))


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
    hf_aliases: (alias, key) pairs: config.json's `alias` stands for `key` when `key` is absent
        (gpt-oss's experts_per_token).
    layer_pattern: the layer types transformers derives when config.json lists no
        `layer_types` (LayerPattern); None: every layer full attention (or windowed, Mistral).
    mtp_layers_key: config key counting the multi-token-prediction layers the checkpoint
        carries beside the decoder (DeepSeek, Qwen3-Next); transformers does not build them
        and neither do we.
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
    hf_aliases: tuple[tuple[str, str], ...] = ()
    layer_pattern: LayerPattern | None = None
    mtp_layers_key: str | None = None

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
    return DeltaNetSpec.from_hf_config(cfg)


def _ssm_spec(cfg: dict[str, Any], source: str) -> Any:
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


def _need(cfg: dict[str, Any], key: str, source: str) -> Any:
    """A config value the mixture of experts cannot do without (a clear error when absent)."""
    if cfg.get(key) is None:
        raise ConfigError(f"required field {key!r} is missing", where=f"{source}: {key}",
                          expected="a positive integer")  # fmt: skip
    return cfg[key]


def _gpt_oss_moe(cfg: dict[str, Any], source: str) -> Any:
    return MoEConfig(
        num_experts=_need(cfg, "num_local_experts", source),
        top_k=_need(cfg, "num_experts_per_tok", source),
        intermediate_size=_need(cfg, "intermediate_size", source),
        router="softmax_topk",
        activation="clamped_swiglu",
        expert_bias=True,
        swiglu_limit=float(cfg.get("swiglu_limit", 7.0)),
        swiglu_alpha=float(cfg.get("swiglu_alpha", 1.702)),
        source=source,
    )


def _deepseek_moe(cfg: dict[str, Any], source: str) -> Any:
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
    experts = cfg.get("n_routed_experts") or _need(cfg, "num_local_experts", source)
    intermediate = _need(cfg, "moe_intermediate_size", source)
    return MoEConfig(
        num_experts=experts,
        top_k=_need(cfg, "num_experts_per_tok", source),
        intermediate_size=intermediate,
        router="sigmoid_group_limited" if v3 else routers[method],
        shared_intermediate_size=(cfg.get("n_shared_experts") or 0) * intermediate,
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
    step, only = cfg.get("decoder_sparse_step") or 1, set(cfg.get("mlp_only_layers") or ())
    return MoEConfig(
        num_experts=_need(cfg, "num_experts", source),
        top_k=_need(cfg, "num_experts_per_tok", source),
        intermediate_size=_need(cfg, "moe_intermediate_size", source),
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

# Qwen2/3 with use_sliding_window: the layers from max_window_layers on are windowed
_QWEN_WINDOWS = LayerPattern("from", "sliding_attention", "max_window_layers", 28)
# Gemma3TextConfig's defaults: a multimodal Gemma-3 config.json's text_config lists only the
# values that differ from them
_GEMMA3_TEXT_DEFAULTS = (
    ("vocab_size", 262_208),
    ("hidden_size", 2304),
    ("intermediate_size", 9216),
    ("num_hidden_layers", 26),
    ("num_attention_heads", 8),
    ("num_key_value_heads", 4),
    ("head_dim", 256),
    ("hidden_activation", "gelu_pytorch_tanh"),
    ("max_position_embeddings", 131_072),
    ("rms_norm_eps", 1e-6),
    ("tie_word_embeddings", True),
    ("query_pre_attn_scalar", 256),
    ("sliding_window", 4096),
    ("rope_theta", 1_000_000.0),
    ("rope_local_base_freq", 10_000.0),
)

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
        layer_pattern=_QWEN_WINDOWS,
    ),
    ArchSpec(
        "qwen3",
        ("qwen3",),
        "qwen3",
        o_bias=False,
        qk_norm=True,
        sliding_window_flag="use_sliding_window",
        layer_pattern=_QWEN_WINDOWS,
    ),
    ArchSpec(
        "gpt_oss",
        ("gpt_oss",),
        None,
        attention_sinks=True,
        mlp="gpt_oss_moe",
        hf_defaults=(("attention_bias", True),),  # GptOssConfig's default
        hf_aliases=(("experts_per_token", "num_experts_per_tok"),),
        layer_pattern=LayerPattern("period", "sliding_attention", None, 2),  # alternating
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
        layer_pattern=LayerPattern("period", "linear_attention", "full_attention_interval", 4),
        mtp_layers_key="mtp_num_hidden_layers",
    ),
    ArchSpec(
        "deepseek_v2",
        ("deepseek_v2",),
        None,
        mlp="deepseek_moe",
        mla=True,
        mtp_layers_key="num_nextn_predict_layers",
    ),
    ArchSpec(
        "deepseek_v3",
        ("deepseek_v3",),
        None,
        mlp="deepseek_moe",
        mla=True,
        mtp_layers_key="num_nextn_predict_layers",
    ),
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
        hf_defaults=_GEMMA3_TEXT_DEFAULTS,
        layer_pattern=LayerPattern("period", "sliding_attention", "sliding_window_pattern", 6),
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
