"""Frozen configuration dataclasses, composed (not inherited), validated on construction.

`ModelConfig` describes a decoder's shapes and numerics. It is built from a checkpoint in one
place: `ModelConfig.from_hf_dict` (GGUF metadata is first mapped onto the same keys by
`infergen.io.gguf`). `CacheConfig`, `SchedulerConfig` and `EngineConfig` describe the engine.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any

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


def _require(cond: bool, what: str, *, where: str, found: object, expected: object) -> None:
    if not cond:
        raise ConfigError(what, where=where, found=found, expected=expected)


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention magnitude correction for a context extended `factor` times."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


@dataclass(frozen=True)
class RopeScaling:
    """Rotary-embedding frequency scaling. `rope_type` "default" means none.

    "linear": inv_freq / factor.  "llama3": the Llama-3.1 piecewise rule (long wavelengths
    divided by `factor`, short ones kept, a smooth blend between low/high_freq_factor).
    "yarn" (YaRN, arXiv 2309.00071): frequencies between the beta_fast / beta_slow rotation
    bounds blend from kept to divided by `factor`; cos/sin are multiplied by
    `attention_factor` (default 0.1·ln(factor) + 1, or the mscale / mscale_all_dim ratio).
    """

    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    yarn_attention_factor: float | None = None
    truncate: bool = True
    source: str = field(default="rope_scaling", compare=False)

    SUPPORTED = ("default", "linear", "llama3", "yarn")

    @property
    def attention_factor(self) -> float:
        """What cos and sin are multiplied by (YaRN's magnitude correction; 1 otherwise)."""
        if self.rope_type != "yarn":
            return 1.0
        if self.yarn_attention_factor is not None:
            return self.yarn_attention_factor
        if self.mscale and self.mscale_all_dim:
            return yarn_mscale(self.factor, self.mscale) / yarn_mscale(
                self.factor, self.mscale_all_dim
            )
        return yarn_mscale(self.factor)

    def __post_init__(self) -> None:
        _require(
            self.rope_type in self.SUPPORTED,
            "unsupported rope scaling type",
            where=f"{self.source}.rope_type",
            found=self.rope_type,
            expected=f"one of {self.SUPPORTED}",
        )
        _require(
            self.factor > 0,
            "rope scaling factor must be positive",
            where=f"{self.source}.factor",
            found=self.factor,
            expected="> 0",
        )


@dataclass(frozen=True)
class MoEConfig:
    """A mixture-of-experts feed-forward (layers/moe.py). `router` names a ROUTERS row:
    "softmax_topk" (GPT-OSS: top-k logits, softmax over them), "softmax_greedy" (DeepSeek-V2,
    Qwen3-Next with norm_topk) and "softmax_group_limited" (DeepSeek-V2),
    "sigmoid_group_limited" (DeepSeek-V3: sigmoid
    scores + a correction bias for the choice, the best `topk_groups` of `num_groups` groups).
    `activation`: "silu" (SwiGLU) or "clamped_swiglu" (GPT-OSS)."""

    num_experts: int
    top_k: int
    intermediate_size: int  # per expert
    router: str
    activation: str = "silu"
    shared_intermediate_size: int = 0  # all shared experts together (every token; 0: none)
    routed_scaling: float = 1.0
    norm_topk: bool = False
    num_groups: int = 1
    topk_groups: int = 1
    expert_bias: bool = False  # experts and router carry biases (GPT-OSS)
    swiglu_limit: float = 7.0
    swiglu_alpha: float = 1.702
    dense_layers: tuple[int, ...] = ()  # layers with a dense MLP instead (DeepSeek's first)
    shared_gate: bool = False  # the shared experts' output × sigmoid(x·w) (Qwen3-Next)
    shared_name: str = "shared_experts"  # their checkpoint name inside the MLP
    source: str = field(default="<memory>", compare=False)

    def __post_init__(self) -> None:
        _require(
            0 < self.top_k <= self.num_experts,
            "num_experts_per_tok must be between 1 and the number of experts",
            where=f"{self.source}: num_experts_per_tok",
            found=self.top_k,
            expected=f"1..{self.num_experts}",
        )
        _require(
            self.num_experts % self.num_groups == 0 and self.topk_groups <= self.num_groups,
            "experts must split evenly into n_group groups, topk_group of them kept",
            where=f"{self.source}: n_group / topk_group",
            found=f"{self.num_experts} experts, n_group {self.num_groups}, "
            f"topk_group {self.topk_groups}",
            expected="n_group dividing the experts, topk_group <= n_group",
        )

    def is_moe_layer(self, layer: int) -> bool:
        return layer not in self.dense_layers


@dataclass(frozen=True)
class MLAConfig:
    """Multi-head latent attention (DeepSeek-V2/V3, layers/mla.py): K and V of every head are
    decompressed from one `kv_lora_rank` latent per token; RoPE acts on a separate
    `qk_rope_head_dim` key shared by all heads. The cache holds latent + RoPE key per token.
    `rope_interleave`: the checkpoint's RoPE dimensions are interleaved pairs (undone at load)."""

    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_interleave: bool = True

    @property
    def cache_dim(self) -> int:
        """One token's cache entry: the latent, then the RoPE key."""
        return self.kv_lora_rank + self.qk_rope_head_dim


@dataclass(frozen=True)
class ModelConfig:
    """Shapes and numerics of a decoder-only transformer.

    `architecture` names a row of `infergen.models.arch.ARCHITECTURES`.
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
    linear_attention: Any = None  # layers.linear_attention.DeltaNetSpec of linear layers
    ssm: Any = None  # layers.ssm.SSMSpec of "mamba" layers
    # µP-style constant multipliers (Falcon-H1): checkpoint tensors whose name matches a regex
    # are multiplied by its factor at load; embeddings and logits by their own
    weight_multipliers: tuple[tuple[str, float], ...] = ()
    embedding_multiplier: float = 1.0
    logits_multiplier: float = 1.0
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    source: str = field(default="<memory>", compare=False)

    def __post_init__(self) -> None:
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
            _require(
                isinstance(value, int) and value > 0,
                f"{name} must be a positive integer",
                where=f"{where}: {name}",
                found=value,
                expected="an integer > 0",
            )
        _require(
            self.num_attention_heads % self.num_key_value_heads == 0,
            "num_attention_heads must be a multiple of num_key_value_heads (GQA groups)",
            where=f"{where}: num_key_value_heads",
            found=f"{self.num_key_value_heads} KV heads for {self.num_attention_heads} heads",
            expected=f"a divisor of {self.num_attention_heads}",
        )
        _require(
            self.head_dim % 2 == 0,
            "head_dim must be even for rotary embeddings",
            where=f"{where}: head_dim",
            found=self.head_dim,
            expected="an even integer",
        )
        _require(
            self.rms_norm_eps > 0 and math.isfinite(self.rms_norm_eps),
            "rms_norm_eps must be positive and finite",
            where=f"{where}: rms_norm_eps",
            found=self.rms_norm_eps,
            expected="> 0",
        )
        _require(
            self.rope_theta > 0,
            "rope_theta must be positive",
            where=f"{where}: rope_theta",
            found=self.rope_theta,
            expected="> 0",
        )
        _require(
            self.hidden_act in HIDDEN_ACTS,
            "unsupported hidden activation",
            where=f"{where}: hidden_act",
            found=self.hidden_act,
            expected=f"one of {HIDDEN_ACTS}",
        )
        _require(
            0 < self.partial_rotary_factor <= 1 and self.rotary_dim % 2 == 0,
            "partial_rotary_factor must leave an even number of rotary dims",
            where=f"{where}: partial_rotary_factor",
            found=self.partial_rotary_factor,
            expected=f"a factor in (0, 1] with head_dim {self.head_dim} · factor even",
        )
        if self.layer_types:
            _require(
                len(self.layer_types) == self.num_hidden_layers,
                "layer_types must name one kind per layer",
                where=f"{where}: layer_types",
                found=f"{len(self.layer_types)} entries for {self.num_hidden_layers} layers",
                expected=f"{self.num_hidden_layers} entries",
            )
            unknown = sorted(set(self.layer_types) - set(LAYER_TYPES))
            _require(
                not unknown,
                "unsupported layer type",
                where=f"{where}: layer_types",
                found=unknown,
                expected=f"entries from {LAYER_TYPES}",
            )
            _require(
                "sliding_attention" not in self.layer_types or self.sliding_window is not None,
                "sliding_attention layers need a sliding_window",
                where=f"{where}: sliding_window",
                found=None,
                expected="an integer > 0",
            )
        if self.sliding_window is not None:
            _require(
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
    def arch(self):
        """This architecture's row of infergen.models.arch.ARCHITECTURES."""
        from infergen.models.arch import ARCHITECTURES

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

    def describe(self):
        """The performance model's description of this model (infergen.perf.model_desc):
        parameter counts, weight and KV bytes are computed there, once for every config."""
        from infergen.perf.model_desc import from_model_config

        return from_model_config(self)

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    # ---- construction from a Hugging Face config.json dict --------------------------------
    @classmethod
    def from_hf_dict(cls, cfg: dict[str, Any], *, source: str) -> ModelConfig:
        """Build from a Hugging Face `config.json` dict (GGUF metadata is mapped onto it)."""
        from infergen.models.arch import arch_for_hf_config

        arch = arch_for_hf_config(cfg, source=source)
        cfg = {**dict(arch.hf_defaults), **cfg}  # what the architecture leaves implicit

        def need(key: str) -> Any:
            if cfg.get(key) is None:
                raise ConfigError(
                    f"required field {key!r} is missing", where=source, expected=f"{key} set"
                )
            return cfg[key]

        heads = need("num_attention_heads")
        hidden = need("hidden_size")
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
        rope = dict(cfg.get("rope_parameters") or {})
        # per-layer-type RoPE (Gemma-3): the global layers' parameters, the local layers' base
        local_rope = rope.get("sliding_attention")
        rope = dict(rope.get("full_attention") or rope)
        legacy = cfg.get("rope_scaling") or {}
        rope = {**legacy, **rope}
        local_theta = local_rope.get("rope_theta") if local_rope else None
        local_theta = local_theta or cfg.get("rope_local_base_freq")
        rope_theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        renamed = {"attention_factor": "yarn_attention_factor"}
        scaling = RopeScaling(
            rope_type=rope_type,
            source=f"{source}: rope_parameters",
            **{
                renamed.get(k, k): rope[k]
                for k in (
                    "factor",
                    "low_freq_factor",
                    "high_freq_factor",
                    "original_max_position_embeddings",
                    "beta_fast",
                    "beta_slow",
                    "mscale",
                    "mscale_all_dim",
                    "attention_factor",
                    "truncate",
                )
                if rope.get(k) is not None
            },
        )
        mla = arch.read_mla(cfg, source)
        if mla is not None:  # RoPE acts on the decoupled key: its dims are the rotary dims
            head_dim = mla.qk_rope_head_dim
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        window = cfg.get("sliding_window")
        if arch.sliding_window_flag and not cfg.get(arch.sliding_window_flag, False):
            window = None
        layer_types = tuple(cfg.get("layer_types") or ())
        if arch.layer_type is not None:  # every layer the same mixer (Mamba2)
            layer_types = (arch.layer_type,) * cfg.get("num_hidden_layers", 0)
        if not window and set(layer_types) <= {"full_attention", "sliding_attention"}:
            layer_types = ()  # windows off (Qwen2's use_sliding_window false): all full
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
            source=source,
        )


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)


def parse_bytes(text: str | int, *, where: str = "size") -> int:
    """Parse '512MiB', '2GB', '1.5G' or a plain integer into bytes (KiB = 1024, KB = 1000)."""
    if isinstance(text, int):
        return text
    match = _SIZE.match(str(text))
    if not match:
        raise ConfigError(
            "could not parse a byte size", where=where, found=text, expected="e.g. 512MiB, 2GB"
        )
    number, unit = float(match.group(1)), (match.group(2) or "B").upper()
    base = 1024 if "I" in unit else 1000
    return int(number * base ** "BKMGT".index(unit[0]))


@dataclass(frozen=True)
class CacheConfig:
    """Paged KV cache: `block_size` tokens per block; the pool holds `num_blocks` blocks,
    or as many as fit in `memory_bytes` when `num_blocks` is None."""

    block_size: int = 16
    memory_bytes: int = 1 << 30
    num_blocks: int | None = None
    enable_prefix_caching: bool = True
    kv_format: str | None = None  # a kvcache.KV_FORMATS row, e.g. "fp8_e4m3" (None: engine dtype)
    # Quest-style sparse decode (ops/sparse_decode.py): each decode query reads only this many
    # KV blocks per KV head — its sequence's last block, the first `sparse_keep_first` ones,
    # the rest the best by a min/max block-summary bound of q·k. None: dense decode
    sparse_decode_blocks: int | None = None
    sparse_keep_first: int = 1

    def __post_init__(self) -> None:
        if self.kv_format is not None:
            from infergen.kvcache.kv_format import KV_FORMATS

            KV_FORMATS.get(self.kv_format, where="kv_format")  # unknown → clear error now
            if self.blocked and self.block_size < 2:
                raise ConfigError("block-quantized KV formats need blocks of several tokens",
                                  where="cache.block_size", found=self.block_size,
                                  expected=">= 2")  # fmt: skip
        if self.sparse_decode_blocks is not None:
            _require(
                self.sparse_decode_blocks > self.sparse_keep_first >= 0,
                "sparse decode must read more blocks than the kept first ones",
                where="cache.sparse_decode_blocks",
                found=f"{self.sparse_decode_blocks} blocks, {self.sparse_keep_first} kept first",
                expected="sparse_decode_blocks > sparse_keep_first >= 0",
            )
        _require(
            self.block_size > 0,
            "block_size must be positive",
            where="cache.block_size",
            found=self.block_size,
            expected="> 0",
        )
        if self.num_blocks is not None:
            _require(
                self.num_blocks >= 1,
                "num_blocks must be at least 1",
                where="cache.num_blocks",
                found=self.num_blocks,
                expected=">= 1",
            )
        _require(
            self.memory_bytes > 0,
            "KV cache memory must be positive",
            where="cache.memory_bytes",
            found=self.memory_bytes,
            expected="> 0",
        )

    @property
    def blocked(self) -> bool:
        """The KV format quantizes whole blocks (kvcache/kv_blocked.py)."""
        if self.kv_format is None:
            return False
        from infergen.kvcache.kv_blocked import BlockedKVFormat
        from infergen.kvcache.kv_format import KV_FORMATS

        return isinstance(KV_FORMATS.get(self.kv_format), BlockedKVFormat)

    def element_bytes(self, dtype_bytes: int) -> int:
        """Bytes a cached K / V element takes: the KV format's, else the engine dtype's (a
        block-quantized format has no element size: see bytes_per_token)."""
        if self.kv_format is None:
            return dtype_bytes
        from infergen.kvcache.kv_format import KV_FORMATS

        return KV_FORMATS.get(self.kv_format).element_bytes

    def bytes_per_token(self, model: ModelConfig, dtype_bytes: int) -> float:
        """KV cache bytes one token takes over all layers (codes and their scales)."""
        if not self.blocked:
            return model.kv_bytes_per_token(self.element_bytes(dtype_bytes))
        from infergen.kvcache.kv_format import KV_FORMATS

        fmt = KV_FORMATS.get(self.kv_format)
        per_block = fmt.bytes_per_block(self.block_size, model.num_key_value_heads, model.head_dim)
        return model.num_hidden_layers * per_block / self.block_size

    def blocks_for(
        self, model: ModelConfig, dtype_bytes: int, tail_blocks: int = 0, reserved_bytes: int = 0
    ) -> int:
        """Blocks in the pool: `num_blocks`, or as many as `memory_bytes` holds at this
        format's bytes per token (the per-head scales of a scaled format are not counted: a
        few bytes a layer) after `reserved_bytes` (recurrent layers' state slots); a
        block-quantized format first sets aside `tail_blocks` fp32 blocks for the blocks
        being filled. A model without attention layers gets one (unused) block."""
        from infergen.kvcache.groups import cache_groups

        if self.num_blocks is not None:
            return self.num_blocks
        groups = cache_groups(model)
        if not groups:
            return 1
        budget = self.memory_bytes - reserved_bytes
        if self.blocked:
            budget -= tail_blocks * model.kv_bytes_per_token(4) * self.block_size
        # a block is a page of one cache group's layers (kvcache/groups.py)
        group_share = len(groups[0].layers) / sum(len(g.layers) for g in groups)
        per_block = self.bytes_per_token(model, dtype_bytes) * self.block_size * group_share
        if self.sparse_decode_blocks is not None:  # + each block's key min / max per layer
            kv_layers = len(groups[0].layers)
            per_block += kv_layers * model.num_key_value_heads * 2 * model.head_dim * 4
        blocks = budget // per_block
        if blocks < 1:
            raise ConfigError(
                "KV cache memory budget is smaller than one block",
                where="cache.memory_bytes",
                found=self.memory_bytes,
                expected=f">= {per_block:.0f} bytes (one block of {self.block_size} tokens"
                + (", after the fp32 blocks being filled)" if self.blocked else ")"),
            )
        return int(blocks)


@dataclass(frozen=True)
class SchedulerConfig:
    """Continuous batching limits: at most `max_num_seqs` running sequences and
    `max_num_batched_tokens` tokens (prefill chunks + decodes) per step."""

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    enable_chunked_prefill: bool = True

    def __post_init__(self) -> None:
        _require(
            self.max_num_seqs >= 1,
            "max_num_seqs must be at least 1",
            where="scheduler.max_num_seqs",
            found=self.max_num_seqs,
            expected=">= 1",
        )
        _require(
            self.max_num_batched_tokens >= 1,
            "max_num_batched_tokens must be at least 1",
            where="scheduler.max_num_batched_tokens",
            found=self.max_num_batched_tokens,
            expected=">= 1",
        )


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine needs besides the checkpoint itself."""

    model: str | None = None
    dtype: str = "float32"
    num_threads: int | None = None
    seed: int = 0
    kernels: str = "native"  # op backends: "native" (C kernels, torch fallback) | "torch"
    weights: str | None = None  # a quant.WEIGHT_SCHEMES row, e.g. "int8" (None: unquantized)
    # a projection whose load-time probe error is far above its scheme's level (quant/probe.py):
    # "fallback" keeps it at full precision (and says so), "refuse" stops the engine
    on_bad_layer: str = "fallback"
    # a quant.ACTIVATION_SCHEMES row: projection inputs quantized too, e.g. "fp8_e4m3" (W8A8
    # with weights="fp8_e4m3"), "int8" (W4A8 with weights="int4"), "nvfp4" (W4A4)
    activations: str | None = None
    # calibration (quant/): the clipping method of static activation scales ("max",
    # "percentile", "mse"; "mse" also clips quantized weights), smoothing ("smoothquant",
    # "awq") and a file to save the statistics and chosen scales to
    calibration: str = "max"
    smoothing: str | None = None
    calibration_stats: str | None = None
    calibration_text: str | None = None  # a text file to calibrate on (None: the shipped corpus)
    # projections (module-name globs, e.g. "lm_head", "layers.0.*") kept at full precision by
    # the weight and activation schemes
    keep: tuple[str, ...] = ()
    # attention operands (ops/attention_operands.py): "fp8_e4m3" computes Q·Kᵀ and P·V on FP8
    # Q, K, V and P (needs the FP8 KV cache); None: the engine dtype
    attention: str | None = None
    max_model_len: int | None = None  # context cap in tokens (None: the model's own)
    # the decoder layers through the compiler (compiler/runtime.py): "off" (the per-op path
    # and the hand-written fused decode step), "eager" (the captured graph op by op),
    # "jit" (fused groups as generated C kernels)
    compile: str = "off"
    # StreamingLLM (Xiao et al. 2023): every attention layer reads only the last
    # `streaming_window` positions and the first `streaming_sinks` (engine.py:_streaming)
    streaming_window: int | None = None
    streaming_sinks: int = 4
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)

    DTYPES = ("float32", "bfloat16", "float16")

    def _check_quantization(self) -> None:
        """Activation schemes, calibration methods and smoothings are registry rows; the
        calibrated options need a dtype and weights they can rewrite."""
        from infergen.quant.activations import ACTIVATION_SCHEMES
        from infergen.quant.clipping import CLIP_METHODS
        from infergen.quant.smoothing import SMOOTHINGS

        CLIP_METHODS.get(self.calibration, where="calibration")
        if self.smoothing is not None:
            SMOOTHINGS.get(self.smoothing, where="smoothing")
        if self.activations is not None:
            ACTIVATION_SCHEMES.get(self.activations, where="activations")
        if self.attention not in (None, "fp32"):
            from infergen.ops.attention_operands import ATTENTION_OPERANDS

            ATTENTION_OPERANDS.get(self.attention, where="attention")
            _require(
                self.cache.kv_format == self.attention,
                f"attention operands {self.attention!r} read K and V as the KV cache stores them",
                where="kv_format",
                found=self.cache.kv_format,
                expected=repr(self.attention),
            )
        calibrated = self.activations or self.smoothing or self.calibration != "max"
        if self.calibration_text is not None:
            import os

            _require(
                os.path.isfile(self.calibration_text),
                "calibration text file not found",
                where="calibration_text",
                found=self.calibration_text,
                expected="a readable text file",
            )
        _require(
            not calibrated or self.dtype == "float32",
            "quantized activations and calibration run on a float32 engine",
            where="dtype",
            found=self.dtype,
            expected="float32",
        )
        if self.weights is not None and (self.smoothing or self.calibration == "mse"):
            from infergen.quant.schemes import WEIGHT_SCHEMES

            _require(
                not WEIGHT_SCHEMES.get(self.weights).keep_blocks,
                f"weights {self.weights!r} run a file's blocks as stored: there is nothing to "
                "smooth or clip",
                where="smoothing" if self.smoothing else "calibration",
                found=self.smoothing or self.calibration,
                expected="a scheme that quantizes (e.g. 'q4_1', 'int4')",
            )

    def __post_init__(self) -> None:
        _require(
            self.dtype in self.DTYPES,
            "unsupported engine dtype",
            where="dtype",
            found=self.dtype,
            expected=f"one of {self.DTYPES}",
        )
        if self.streaming_window is not None:
            _require(
                self.streaming_window > 0 and self.streaming_sinks >= 0,
                "streaming_window must be positive and streaming_sinks not negative",
                where="streaming_window",
                found=f"window {self.streaming_window}, sinks {self.streaming_sinks}",
                expected="window > 0, sinks >= 0",
            )
        _require(
            self.on_bad_layer in ("fallback", "refuse"),
            "unknown load-time check policy",
            where="on_bad_layer",
            found=self.on_bad_layer,
            expected="'fallback' or 'refuse'",
        )
        if self.weights is not None:
            from infergen.quant.schemes import WEIGHT_SCHEMES

            scheme = WEIGHT_SCHEMES.get(self.weights, where="weights")
            _require(
                self.dtype in scheme.dtypes,
                f"weights {self.weights!r} are quantized from another engine dtype",
                where="dtype",
                found=self.dtype,
                expected=f"one of {scheme.dtypes}",
            )
        self._check_quantization()
        _require(
            self.compile in ("off", "eager", "jit"),
            f"unknown compile mode {self.compile!r}",
            where="compile",
            found=self.compile,
            expected="'off', 'eager' or 'jit'",
        )
        _require(
            self.max_model_len is None or self.max_model_len >= 2,
            "max_model_len must leave room for a prompt token and a generated one",
            where="max_model_len",
            found=self.max_model_len,
            expected="an integer >= 2 (or None for the model's own context length)",
        )
