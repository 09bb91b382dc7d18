"""What follows from a model's shapes, layer by layer: exact parameter counts (total, and
active per token for mixtures of experts), weight bytes in a storage format, KV-cache bytes per
token (and per sequence, where sliding windows cap it), and the constant-size state of
recurrent layers. `describe(ModelConfig)` builds it; the engine, `infergen info` and the
performance model (perf/) all count with it.

A layer is a token mixer — "attention" (MHA / GQA / MQA, optionally a sliding window and an
output gate), "mla" (DeepSeek's latent attention: one compressed KV vector of kv_lora_rank +
qk_rope_head_dim per token), "ssm" (Mamba-2: a fixed state per sequence), "linear_attention"
(gated DeltaNet) or "attention+ssm" (both side by side, Falcon-H1) — plus a feed-forward part:
"dense", "moe" or none.

Counting conventions, as transformers instantiates the models (the tests compare against
it on the meta device): embeddings once when tied; norms and biases included; buffers not
(DeepSeek-V3's e_score_correction_bias is one); multi-token-prediction layers excluded
(transformers does not build them; a note says so). "Active" parameters are those a token
multiplies with: the total minus the routed experts it does not use and minus the input
embedding table (a lookup; counted once when tied to the LM head).
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:  # annotations only (config.model imports this module)
    from infergen.config.model import ModelConfig
    from infergen.config.stored import StoredQuant


@dataclass(frozen=True)
class Attention:
    kind: ClassVar[str] = "attention"
    heads: int
    kv_heads: int
    head_dim: int
    window: int | None = None  # sliding window in tokens; None = full context
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False  # per-head RMSNorm of q and k (Qwen3)
    sinks: bool = False  # one learned logit per head (gpt-oss)
    output_gate: bool = False  # q_proj also yields a per-head output gate (Qwen3-Next)

    @property
    def q_proj_size(self) -> int:
        """Outputs of q_proj: the queries, and as many gate values when gated."""
        return self.heads * self.head_dim * (2 if self.output_gate else 1)

    def params(self, hidden: int) -> int:
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        n = hidden * (self.q_proj_size + 2 * kv) + q * hidden
        n += (self.q_proj_size + 2 * kv) * self.qkv_bias + hidden * self.o_bias
        n += 2 * self.head_dim * self.qk_norm + self.heads * self.sinks
        return n

    def kv_elements_per_token(self) -> int:
        return 2 * self.kv_heads * self.head_dim

    def state_elements(self) -> int:
        return 0


@dataclass(frozen=True)
class MLA:
    """Multi-head latent attention (DeepSeek-V2/V3)."""

    kind: ClassVar[str] = "mla"
    heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    window: int | None = None

    def params(self, hidden: int) -> int:
        qk_dim = self.qk_nope_head_dim + self.qk_rope_head_dim
        if self.q_lora_rank:
            q = (
                hidden * self.q_lora_rank
                + self.q_lora_rank
                + self.q_lora_rank * self.heads * qk_dim
            )
        else:
            q = hidden * self.heads * qk_dim
        kv_a = hidden * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
        kv_b = self.kv_lora_rank * self.heads * (self.qk_nope_head_dim + self.v_head_dim)
        return q + kv_a + kv_b + self.heads * self.v_head_dim * hidden

    def kv_elements_per_token(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim  # the latent, shared by K and V

    def state_elements(self) -> int:
        return 0


@dataclass(frozen=True)
class SSM:
    """A Mamba-2 mixer: constant state per sequence, nothing cached per token. `bias`: in_proj's
    bias; `out_bias`: out_proj's; `norm`: the gated RMSNorm before out_proj (Falcon-H1 may
    have none)."""

    kind: ClassVar[str] = "ssm"
    heads: int
    head_dim: int
    state_size: int
    groups: int
    conv_kernel: int
    bias: bool = False
    conv_bias: bool = True
    out_bias: bool = False
    norm: bool = True
    window: None = None

    @property
    def inner(self) -> int:
        return self.heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return self.inner + 2 * self.groups * self.state_size

    def params(self, hidden: int) -> int:
        in_proj = (
            hidden * (self.inner + self.conv_dim + self.heads)
            + (self.inner + self.conv_dim + self.heads) * self.bias
        )
        conv = self.conv_dim * self.conv_kernel + self.conv_dim * self.conv_bias
        out_proj = self.inner * hidden + hidden * self.out_bias
        return in_proj + conv + 3 * self.heads + self.inner * self.norm + out_proj  # dt_bias, A, D

    def kv_elements_per_token(self) -> int:
        return 0

    def state_elements(self) -> int:
        return self.conv_dim * (self.conv_kernel - 1) + self.heads * self.head_dim * self.state_size


@dataclass(frozen=True)
class LinearAttention:
    """A gated DeltaNet mixer (Qwen3-Next): constant state per sequence, no KV cache."""

    kind: ClassVar[str] = "linear_attention"
    k_heads: int
    v_heads: int
    k_dim: int
    v_dim: int
    conv_kernel: int
    window: None = None

    @property
    def conv_dim(self) -> int:
        return 2 * self.k_heads * self.k_dim + self.v_heads * self.v_dim

    def params(self, hidden: int) -> int:
        qkvz = hidden * (self.conv_dim + self.v_heads * self.v_dim)
        ba = hidden * 2 * self.v_heads
        out = self.v_heads * self.v_dim * hidden
        return qkvz + ba + self.conv_dim * self.conv_kernel + 2 * self.v_heads + self.v_dim + out

    def kv_elements_per_token(self) -> int:
        return 0

    def state_elements(self) -> int:
        return self.conv_dim * (self.conv_kernel - 1) + self.v_heads * self.k_dim * self.v_dim


@dataclass(frozen=True)
class AttentionSSM:
    """Attention and a Mamba-2 SSM side by side on the same input, outputs summed (Falcon-H1):
    the attention's KV cache and window, the SSM's state."""

    kind: ClassVar[str] = "attention+ssm"
    attention: Attention
    ssm: SSM

    @property
    def window(self) -> int | None:
        return self.attention.window

    def params(self, hidden: int) -> int:
        return self.attention.params(hidden) + self.ssm.params(hidden)

    def kv_elements_per_token(self) -> int:
        return self.attention.kv_elements_per_token()

    def state_elements(self) -> int:
        return self.ssm.state_elements()


Mixer = Attention | MLA | SSM | LinearAttention | AttentionSSM


def mixer_parts(mixer: Mixer) -> tuple[Attention | MLA | SSM | LinearAttention, ...]:
    """The single mixers a layer's mixer runs (two for AttentionSSM)."""
    return (mixer.attention, mixer.ssm) if isinstance(mixer, AttentionSSM) else (mixer,)


@dataclass(frozen=True)
class Dense:
    kind: ClassVar[str] = "dense"
    intermediate: int
    bias: bool = False
    gated: bool = True  # gate and up projections (SwiGLU); False: one up projection

    def params(self, hidden: int) -> int:
        ups = 2 if self.gated else 1
        return (ups + 1) * hidden * self.intermediate + (
            (ups * self.intermediate + hidden) * self.bias
        )

    def active_params(self, hidden: int) -> int:
        return self.params(hidden)


@dataclass(frozen=True)
class MoE:
    """Routed experts (and shared ones). `router_bias`: the router's own bias (gpt-oss);
    DeepSeek-V3's routing correction bias is a buffer, not counted."""

    kind: ClassVar[str] = "moe"
    experts: int
    top_k: int
    intermediate: int  # per routed expert
    shared_intermediate: int = 0  # all shared experts together (0 = none)
    router_bias: bool = False
    expert_bias: bool = False
    shared_gate: bool = False  # the shared experts' output × sigmoid(x·w) (Qwen3-Next)

    def _expert(self, hidden: int) -> int:
        return 3 * hidden * self.intermediate + (2 * self.intermediate + hidden) * self.expert_bias

    def params(self, hidden: int) -> int:
        router = self.experts * hidden + self.experts * self.router_bias
        shared = 3 * hidden * self.shared_intermediate + hidden * self.shared_gate
        return router + shared + self.experts * self._expert(hidden)

    def active_params(self, hidden: int) -> int:
        return self.params(hidden) - (self.experts - self.top_k) * self._expert(hidden)


FeedForward = Dense | MoE | None


@dataclass(frozen=True)
class Layer:
    mixer: Mixer
    ffn: FeedForward
    sandwich_norms: bool = False  # the mixer's and the MLP's outputs normed too (Gemma-3)

    @property
    def norms(self) -> int:
        """RMSNorms of width hidden: one before the mixer and one before the feed-forward,
        twice as many with sandwich norms."""
        return (2 if self.ffn is not None else 1) * (2 if self.sandwich_norms else 1)

    def params(self, hidden: int) -> int:
        norms = hidden * self.norms
        return norms + self.mixer.params(hidden) + (self.ffn.params(hidden) if self.ffn else 0)

    def active_params(self, hidden: int) -> int:
        inactive = self.ffn.params(hidden) - self.ffn.active_params(hidden) if self.ffn else 0
        return self.params(hidden) - inactive


@dataclass(frozen=True)
class ModelDesc:
    name: str
    architecture: str
    hidden: int
    vocab: int
    layers: tuple[Layer, ...]
    tied_embeddings: bool
    max_context: int | None = None
    source: str = ""
    notes: tuple[str, ...] = field(default=())
    stored_weights: StoredQuant | None = None  # the checkpoint's weight formats (None: plain)

    # ---- parameters --------------------------------------------------------------------------
    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    def params_total(self) -> int:
        layers = sum(layer.params(self.hidden) for layer in self.layers)
        return self.embedding_params + layers + self.hidden  # + the final norm

    def params_active(self) -> int:
        """Parameters a token's forward pass multiplies with: routed experts top-k only, and
        the input embedding table not at all (a lookup) unless it is tied to the LM head.
        (The convention of the gpt-oss and DeepSeek-V3 model cards.)"""
        layers = sum(layer.active_params(self.hidden) for layer in self.layers)
        return self.vocab * self.hidden + layers + self.hidden

    def routed_expert_params(self) -> int:
        """Parameters of all routed experts (MoE layers), the part expert parallelism splits
        and an expert-only format (gpt-oss's MXFP4) applies to."""
        return sum(
            lyr.ffn.experts * lyr.ffn._expert(self.hidden)
            for lyr in self.layers
            if isinstance(lyr.ffn, MoE)
        )

    def weight_bytes(self, bits_per_value: float, expert_bits: float | None = None) -> float:
        """Stored weight bytes; routed experts at `expert_bits` when given."""
        experts = self.routed_expert_params()
        rest = self.params_total() - experts
        return (rest * bits_per_value + experts * (expert_bits or bits_per_value)) / 8

    # ---- KV cache and state --------------------------------------------------------------------
    def kv_bytes_per_token(self, bytes_per_element: float) -> float:
        """Bytes one more token adds to the KV cache while every window still grows."""
        return sum(lyr.mixer.kv_elements_per_token() for lyr in self.layers) * bytes_per_element

    def kv_bytes_for_context(self, tokens: int, bytes_per_element: float) -> float:
        """KV bytes of one sequence of `tokens` tokens: sliding-window layers keep only the
        last `window` tokens."""
        total = 0
        for layer in self.layers:
            window = layer.mixer.window
            kept = tokens if window is None else min(tokens, window)
            total += layer.mixer.kv_elements_per_token() * kept
        return total * bytes_per_element

    def state_bytes_per_sequence(self, bytes_per_element: float) -> float:
        """Constant-size recurrent state (SSM and linear-attention layers) of one sequence."""
        return sum(lyr.mixer.state_elements() for lyr in self.layers) * bytes_per_element

    def summary(self) -> dict:
        kinds: dict[str, int] = {}
        for layer in self.layers:
            key = layer.mixer.kind
            if getattr(layer.mixer, "window", None):
                key += f"(window {layer.mixer.window})"
            kinds[key] = kinds.get(key, 0) + 1
        ffns: dict[str, int] = {}
        for layer in self.layers:
            key = type(layer.ffn).__name__.lower() if layer.ffn else "none"
            if isinstance(layer.ffn, MoE):
                key += f"({layer.ffn.experts} experts, top {layer.ffn.top_k})"
            ffns[key] = ffns.get(key, 0) + 1
        return {
            "name": self.name,
            "architecture": self.architecture,
            "layers": len(self.layers),
            "mixers": kinds,
            "ffn": ffns,
            "params_total": self.params_total(),
            "params_active": self.params_active(),
            "kv_bytes_per_token_bf16": self.kv_bytes_per_token(2),
        }


def model_name(source: str) -> str:
    """A model's name: its directory for a config.json, else the file's stem."""
    path = pathlib.Path(source)
    return (path.parent.name if path.name == "config.json" else path.stem) or source


def describe(cfg: ModelConfig) -> ModelDesc:
    """The engine's own ModelConfig (any checkpoint infergen loads) as a description."""
    arch = cfg.arch

    def attention(index: int) -> Attention | MLA:
        if cfg.mla is not None:
            m = cfg.mla
            return MLA(cfg.num_attention_heads, m.q_lora_rank, m.kv_lora_rank,
                       m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim)  # fmt: skip
        return Attention(
            heads=cfg.num_attention_heads,
            kv_heads=cfg.num_key_value_heads,
            head_dim=cfg.head_dim,
            window=cfg.window(index),
            qkv_bias=cfg.qkv_bias,
            o_bias=cfg.o_bias,
            qk_norm=cfg.qk_norm,
            sinks=arch.attention_sinks,
            output_gate=arch.attention_output_gate,
        )

    def ssm() -> SSM:
        m = cfg.ssm
        return SSM(
            heads=m.num_heads,
            head_dim=m.head_dim,
            state_size=m.state_size,
            groups=m.n_groups,
            conv_kernel=m.conv_kernel,
            bias=m.in_proj_bias,
            conv_bias=m.conv_bias,
            out_bias=m.out_proj_bias,
            norm=m.rms_norm,
        )

    def linear_attention() -> LinearAttention:
        m = cfg.linear_attention
        return LinearAttention(m.num_k_heads, m.num_v_heads, m.k_head_dim, m.v_head_dim,
                               m.conv_width)  # fmt: skip

    # layer type → its mixer (config/model.py LAYER_TYPES)
    mixers = {
        "full_attention": attention,
        "sliding_attention": attention,
        "mamba": lambda index: ssm(),
        "linear_attention": lambda index: linear_attention(),
        "attention_mamba": lambda index: AttentionSSM(attention(index), ssm()),
    }

    def layer(index: int) -> Layer:
        mixer = mixers[cfg.layer_type(index)](index)
        moe = cfg.moe
        if arch.mlp == "none":
            ffn = None
        elif moe is not None and moe.is_moe_layer(index):
            bias = moe.expert_bias  # gpt-oss: router and experts both carry biases
            ffn = MoE(moe.num_experts, moe.top_k, moe.intermediate_size,
                      moe.shared_intermediate_size, bias, bias, moe.shared_gate)  # fmt: skip
        else:
            ffn = Dense(cfg.intermediate_size, cfg.mlp_bias)
        return Layer(mixer, ffn, arch.sandwich_norms)

    notes = ()
    if cfg.mtp_layers:
        notes = (
            f"{cfg.mtp_layers} multi-token-prediction layer(s) not counted "
            "(transformers does not build them)",
        )
    return ModelDesc(
        name=model_name(cfg.source),
        architecture=cfg.architecture,
        hidden=cfg.hidden_size,
        vocab=cfg.vocab_size,
        layers=tuple(layer(i) for i in range(cfg.num_hidden_layers)),
        tied_embeddings=cfg.tie_word_embeddings,
        max_context=cfg.max_position_embeddings,
        source=cfg.source,
        notes=notes,
        stored_weights=cfg.stored_weights,
    )
