"""`ModelConfig`: THE one description of a decoder model's shapes and numerics.

It is built from a checkpoint in one place, `ModelConfig.from_hf_dict` (a Hugging Face
config.json dict; GGUF metadata is first mapped onto the same keys by `infergen.io.gguf`), with
the architecture's row of `config/architectures.py` saying what the config leaves implicit.
Typed parts: RoPE scaling, MoE and MLA (config/specs.py), the recurrent mixers' specs
(config/mixers.py). What follows from the shapes (parameter counts, weight / KV / state bytes)
is `describe()` (config/description.py).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from infergen.config.architectures import ARCHITECTURES, ArchSpec, arch_for_hf_config
from infergen.config.description import ModelDesc, describe
from infergen.config.mixers import DeltaNetSpec, SSMSpec
from infergen.config.specs import MLAConfig, MoEConfig, RopeScaling, require, yarn_mscale
from infergen.config.stored import StoredQuant
from infergen.errors import ConfigError

HIDDEN_ACTS = ("silu", "gelu_pytorch_tanh")  # the gated MLP's activation (layers/mlp.py)
# per-layer mixer kinds: attention over the paged KV cache (full or windowed), a recurrent
# mixer with a per-sequence state (kvcache/state_cache.py): Qwen3-Next's gated DeltaNet,
# Mamba2's SSM, or both side by side (Falcon-H1: attention + SSM summed)
LAYER_TYPES = (
    "full_attention",
    "sliding_attention",
    "linear_attention",
    "mamba",
    "attention_mamba",
)
KV_LAYER_TYPES = ("full_attention", "sliding_attention", "attention_mamba")
# top-level keys of a multimodal config.json that hold for its text model (text_config)
TEXT_CONFIG_INHERITS = ("quantization_config", "bos_token_id", "eos_token_id")


@dataclass(frozen=True)
class ModelConfig:
    """Shapes and numerics of a decoder-only transformer.

    `architecture` names a row of `config/architectures.py` (ARCHITECTURES).
    """

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    sliding_window: int | None = None
    # per-layer attention kind, "full_attention" | "sliding_attention" (Gemma-3, GPT-OSS);
    # empty: every layer is full attention, or windowed when `sliding_window` is set (Mistral)
    layer_types: tuple[str, ...] = ()
    rope_local_theta: float | None = None  # RoPE base of the sliding layers (Gemma-3)
    partial_rotary_factor: float = 1.0  # RoPE on the first head_dim · this dims (Qwen3-Next)
    sink_tokens: int = 0  # windowed layers also read the first positions (StreamingLLM)
    query_pre_attn_scalar: float | None = None  # attention scale = this ** -0.5 (Gemma)
    hidden_act: str = "silu"
    moe: MoEConfig | None = None  # mixture-of-experts feed-forward (None: dense)
    mla: MLAConfig | None = None  # latent attention (None: multi-head / grouped-query)
    linear_attention: DeltaNetSpec | None = None  # the gated DeltaNet of linear layers
    ssm: SSMSpec | None = None  # the SSM of "mamba" layers
    # µP-style constant multipliers (Falcon-H1): checkpoint tensors whose name matches a regex
    # are multiplied by its factor at load; embeddings and logits by their own
    weight_multipliers: tuple[tuple[str, float], ...] = ()
    embedding_multiplier: float = 1.0
    logits_multiplier: float = 1.0
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    # how the checkpoint stores its weights (quantization_config; a GGUF's tensor types);
    # None: unquantized
    stored_weights: StoredQuant | None = None
    # multi-token-prediction layers the checkpoint carries beside the decoder (not built)
    mtp_layers: int = 0
    source: str = field(default="<memory>", compare=False)

    def __post_init__(self) -> None:
        self._check_shapes()
        self._check_numerics()
        self._check_layers()

    def _check_shapes(self) -> None:
        where = self.source
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "max_position_embeddings",
        ):
            value = getattr(self, name)
            require(
                isinstance(value, int) and value > 0,
                f"{name} must be a positive integer",
                where=f"{where}: {name}",
                found=value,
                expected="an integer > 0",
            )
        require(
            self.num_attention_heads % self.num_key_value_heads == 0,
            "num_attention_heads must be a multiple of num_key_value_heads (GQA groups)",
            where=f"{where}: num_key_value_heads",
            found=f"{self.num_key_value_heads} KV heads for {self.num_attention_heads} heads",
            expected=f"a divisor of {self.num_attention_heads}",
        )
        require(
            self.head_dim % 2 == 0,
            "head_dim must be even for rotary embeddings",
            where=f"{where}: head_dim",
            found=self.head_dim,
            expected="an even integer",
        )

    def _check_numerics(self) -> None:
        where = self.source
        require(
            self.rms_norm_eps > 0 and math.isfinite(self.rms_norm_eps),
            "rms_norm_eps must be positive and finite",
            where=f"{where}: rms_norm_eps",
            found=self.rms_norm_eps,
            expected="> 0",
        )
        require(
            self.rope_theta > 0,
            "rope_theta must be positive",
            where=f"{where}: rope_theta",
            found=self.rope_theta,
            expected="> 0",
        )
        require(
            self.hidden_act in HIDDEN_ACTS,
            "unsupported hidden activation",
            where=f"{where}: hidden_act",
            found=self.hidden_act,
            expected=f"one of {HIDDEN_ACTS}",
        )
        require(
            0 < self.partial_rotary_factor <= 1 and self.rotary_dim % 2 == 0,
            "partial_rotary_factor must leave an even number of rotary dims",
            where=f"{where}: partial_rotary_factor",
            found=self.partial_rotary_factor,
            expected=f"a factor in (0, 1] with head_dim {self.head_dim} · factor even",
        )

    def _check_layers(self) -> None:
        where = self.source
        if self.layer_types:
            require(
                len(self.layer_types) == self.num_hidden_layers,
                "layer_types must name one kind per layer",
                where=f"{where}: layer_types",
                found=f"{len(self.layer_types)} entries for {self.num_hidden_layers} layers",
                expected=f"{self.num_hidden_layers} entries",
            )
            unknown = sorted(set(self.layer_types) - set(LAYER_TYPES))
            require(
                not unknown,
                "unsupported layer type",
                where=f"{where}: layer_types",
                found=unknown,
                expected=f"entries from {LAYER_TYPES}",
            )
            require(
                "sliding_attention" not in self.layer_types or self.sliding_window is not None,
                "sliding_attention layers need a sliding_window",
                where=f"{where}: sliding_window",
                found=None,
                expected="an integer > 0",
            )
        if self.sliding_window is not None:
            require(
                self.sliding_window > 0,
                "sliding_window must be positive or null",
                where=f"{where}: sliding_window",
                found=self.sliding_window,
                expected="an integer > 0 or null",
            )

    # ---- derived values -------------------------------------------------------------------
    def layer_type(self, layer: int) -> str:
        return self.layer_types[layer] if self.layer_types else "full_attention"

    def has_kv(self, layer: int) -> bool:
        """The layer attends over the paged KV cache (else it keeps a recurrent state)."""
        return self.layer_type(layer) in KV_LAYER_TYPES

    def window(self, layer: int) -> int | None:
        """The sliding window of one layer (None: full attention)."""
        if not self.layer_types:
            return self.sliding_window
        return self.sliding_window if self.layer_types[layer] == "sliding_attention" else None

    def rope_theta_of(self, layer: int) -> float:
        """RoPE base of one layer: sliding layers may have their own (Gemma-3's local base)."""
        if self.rope_local_theta is not None and self.window(layer) is not None:
            return self.rope_local_theta
        return self.rope_theta

    @property
    def rotary_dim(self) -> int:
        """Dims of each head RoPE rotates (the first ones)."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def arch(self) -> ArchSpec:
        """This architecture's row of config/architectures.py."""
        return ARCHITECTURES.get(self.architecture, where=f"{self.source}: architecture")

    @property
    def attention_scale(self) -> float:
        """Softmax scale of q·k: query_pre_attn_scalar ** -0.5 when set, else head_dim ** -0.5
        (MLA: the full query-key dimension, × YaRN's mscale² when mscale_all_dim is set)."""
        if self.mla is not None:
            scale = 1.0 / math.sqrt(self.mla.qk_nope_head_dim + self.mla.qk_rope_head_dim)
            rope = self.rope_scaling
            if rope.rope_type != "default" and rope.mscale_all_dim:
                scale *= yarn_mscale(rope.factor, rope.mscale_all_dim) ** 2
            return scale
        return 1.0 / math.sqrt(self.query_pre_attn_scalar or self.head_dim)

    @property
    def cache_shape(self) -> tuple[int, int, int]:
        """(planes, heads, dim) of one token's cache entry in one layer: K and V of every KV
        head, or MLA's one latent + RoPE key entry (read as both K and V)."""
        if self.mla is not None:
            return 1, 1, self.mla.cache_dim
        return 2, self.num_key_value_heads, self.head_dim

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def num_parameters(self) -> int:
        return self.describe().params_total()

    def kv_bytes_per_token(self, dtype_bytes: int = 4) -> int:
        return int(self.describe().kv_bytes_per_token(dtype_bytes))

    def describe(self) -> ModelDesc:
        """Parameter counts, weight / KV / state bytes of this model (config/description.py)."""
        return describe(self)

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    # ---- construction from a Hugging Face config.json dict --------------------------------
    @classmethod
    def from_hf_dict(cls, cfg: dict[str, Any], *, source: str) -> ModelConfig:
        """Build from a Hugging Face `config.json` dict (GGUF metadata is mapped onto it). A
        multimodal config.json describes its text model in `text_config`: that is read."""
        text = cfg.get("text_config")
        if isinstance(text, dict):
            cfg = {**{k: cfg[k] for k in TEXT_CONFIG_INHERITS if k in cfg}, **text}
        arch = arch_for_hf_config(cfg, source=source)
        cfg = {**dict(arch.hf_defaults), **cfg}  # what the architecture leaves implicit
        for alias, key in arch.hf_aliases:
            if cfg.get(key) is None and cfg.get(alias) is not None:
                cfg[key] = cfg[alias]

        def need(key: str) -> Any:
            if cfg.get(key) is None:
                raise ConfigError(
                    f"required field {key!r} is missing", where=source, expected=f"{key} set"
                )
            return cfg[key]

        heads = need("num_attention_heads")
        hidden = need("hidden_size")
        heads, kv_heads, head_dim = _head_shapes(cfg, hidden, heads, source)
        rope, rope_theta, local_theta, scaling = _rope(cfg, source)
        mla = arch.read_mla(cfg, source)
        if mla is not None:  # RoPE acts on the decoupled key: its dims are the rotary dims
            head_dim = mla.qk_rope_head_dim
        qconfig = cfg.get("quantization_config")
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        window = cfg.get("sliding_window")
        if arch.sliding_window_flag and not cfg.get(arch.sliding_window_flag, False):
            window = None
        layer_types = _layer_types(cfg, arch, window, source)
        return cls(
            architecture=arch.name,
            vocab_size=need("vocab_size"),
            hidden_size=hidden,
            intermediate_size=need("intermediate_size"),
            num_hidden_layers=need("num_hidden_layers"),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=cfg.get("rms_norm_eps", cfg.get("layer_norm_epsilon", 1e-6)),
            rope_theta=float(rope_theta),
            rope_scaling=scaling,
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=arch.qkv_bias
            if arch.qkv_bias is not None
            else cfg.get("attention_bias", False),
            o_bias=arch.o_bias if arch.o_bias is not None else cfg.get("attention_bias", False),
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            qk_norm=arch.qk_norm,
            sliding_window=window,
            layer_types=layer_types,
            rope_local_theta=float(local_theta) if local_theta and window else None,
            partial_rotary_factor=float(
                rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
            ),
            query_pre_attn_scalar=cfg.get("query_pre_attn_scalar"),
            hidden_act=cfg.get("hidden_activation") or cfg.get("hidden_act", "silu"),
            moe=arch.read_moe(cfg, source),
            mla=mla,
            linear_attention=arch.read_mixer("linear_attention", layer_types, cfg, source),
            ssm=arch.read_mixer("mamba", {t.split("_")[-1] for t in layer_types}, cfg, source),
            weight_multipliers=arch.read_multipliers(cfg),
            embedding_multiplier=float(cfg.get("embedding_multiplier", 1.0)),
            logits_multiplier=float(cfg.get("lm_head_multiplier", 1.0)),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos_ids,
            stored_weights=StoredQuant.from_hf_config(qconfig, source) if qconfig else None,
            mtp_layers=int(cfg.get(arch.mtp_layers_key) or 0) if arch.mtp_layers_key else 0,
            source=source,
        )


def _head_shapes(cfg: dict[str, Any], hidden: Any, heads: Any, source: str):
    """(query heads, KV heads, head_dim) of a config.json: head_dim defaults to hidden / heads."""
    if not (isinstance(heads, int) and heads > 0):  # before dividing by it below
        raise ConfigError(
            "num_attention_heads must be a positive integer",
            where=f"{source}: num_attention_heads",
            found=heads,
            expected="an integer > 0",
        )
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or (hidden // heads if isinstance(hidden, int) else None)
    if cfg.get("head_dim") is None and isinstance(hidden, int) and hidden % heads != 0:
        raise ConfigError(
            "hidden_size is not divisible by num_attention_heads and head_dim is not given",
            where=f"{source}: hidden_size",
            found=f"{hidden} / {heads}",
            expected="hidden_size % num_attention_heads == 0, or an explicit head_dim",
        )
    return heads, kv_heads, head_dim


# RopeScaling fields read from rope_parameters / rope_scaling (config name → ours)
_ROPE_KEYS = {
    "factor": "factor",
    "low_freq_factor": "low_freq_factor",
    "high_freq_factor": "high_freq_factor",
    "original_max_position_embeddings": "original_max_position_embeddings",
    "beta_fast": "beta_fast",
    "beta_slow": "beta_slow",
    "mscale": "mscale",
    "mscale_all_dim": "mscale_all_dim",
    "attention_factor": "yarn_attention_factor",
    "truncate": "truncate",
}


def _rope(cfg: dict[str, Any], source: str):
    """(merged RoPE parameters, base, the local layers' base or None, RopeScaling) of a
    config.json: `rope_parameters` (per layer type for Gemma-3: the global layers' parameters,
    the local layers' base) over the legacy `rope_scaling`."""
    rope = dict(cfg.get("rope_parameters") or {})
    local_rope = rope.get("sliding_attention")
    rope = {**(cfg.get("rope_scaling") or {}), **dict(rope.get("full_attention") or rope)}
    local_theta = local_rope.get("rope_theta") if local_rope else None
    local_theta = local_theta or cfg.get("rope_local_base_freq")
    rope_theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
    scaling = RopeScaling(
        rope_type=rope.get("rope_type", rope.get("type", "default")),
        source=f"{source}: rope_parameters",
        **{ours: rope[key] for key, ours in _ROPE_KEYS.items() if rope.get(key) is not None},
    )
    return rope, rope_theta, local_theta, scaling


def _layer_types(cfg: dict[str, Any], arch: ArchSpec, window: Any, source: str) -> tuple:
    """Every layer's mixer kind: the config's `layer_types`, the architecture's pattern (as
    transformers derives it) or its one mixer (Mamba2); () when no layer has a window."""
    layer_types = tuple(cfg.get("layer_types") or ())
    layers = cfg.get("num_hidden_layers")
    if not layer_types and arch.layer_pattern is not None and isinstance(layers, int):
        layer_types = arch.layer_pattern.layer_types(cfg, layers, source)
    if arch.layer_type is not None:  # every layer the same mixer (Mamba2)
        layer_types = (arch.layer_type,) * cfg.get("num_hidden_layers", 0)
    if not window and set(layer_types) <= {"full_attention", "sliding_attention"}:
        layer_types = ()  # windows off (Qwen2's use_sliding_window false): all full
    return layer_types
