"""Typed parts of a model description: RoPE scaling, mixture-of-experts, latent attention.

Frozen dataclasses validated on construction (errors name the config field)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from infergen.errors import ConfigError


def require(cond: bool, what: str, *, where: str, found: object, expected: object) -> None:
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
        require(
            self.rope_type in self.SUPPORTED,
            "unsupported rope scaling type",
            where=f"{self.source}.rope_type",
            found=self.rope_type,
            expected=f"one of {self.SUPPORTED}",
        )
        require(
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
        require(
            0 < self.top_k <= self.num_experts,
            "num_experts_per_tok must be between 1 and the number of experts",
            where=f"{self.source}: num_experts_per_tok",
            found=self.top_k,
            expected=f"1..{self.num_experts}",
        )
        require(
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
