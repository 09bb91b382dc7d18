"""FLOPs and bytes of every op of one engine step, from a model description and a batch.

A step runs a chunk of new tokens for each sequence of the batch (a decode is a chunk of one;
a prefill chunk may continue a sequence whose first tokens are already cached). Per layer:

  attention   qkv and o projections (GEMMs), scores and weighted values over the keys each new
              token attends (causal, window-limited), KV reads (each sequence's attended keys
              once) and KV writes (the new tokens)
  mla         DeepSeek's latent attention in its absorbed form: the q path and the latent
              projection as GEMMs, scores and values over the kv_lora_rank + rope latent
  ssm         Mamba-2: in/out projections, the scan (state update and readout per token),
              the state read and written once per sequence
  dense       gate/up and down projections
  moe         router, the experts the tokens are routed to (FLOPs: top-k per token; weight
              bytes: the expected number of distinct experts a batch touches, for uniform
              routing E·(1 − (1 − k/E)^T)), shared experts as dense
  norm        read and write of the hidden states
plus the LM head for the rows that need logits (the last token of each chunk).

Bytes count what an op must move from memory at least once: its weights (in the weight
format), its activations (in the activation format) and KV/state (in the KV format). FLOPs
count multiply and add separately (2 per multiply-accumulate). Time comes from these and a
device's peaks and efficiencies elsewhere; this module only counts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from infergen.perf.model_desc import MLA, SSM, Attention, Dense, Layer, ModelDesc, MoE


@dataclass(frozen=True)
class Chunk:
    """`new` tokens of one sequence whose length after this step is `context`."""

    new: int
    context: int

    def __post_init__(self) -> None:
        if not 1 <= self.new <= self.context:
            raise ValueError(f"a chunk needs 1 <= new <= context, got {self.new}, {self.context}")


@dataclass(frozen=True)
class Formats:
    """Storage widths: weights and KV in bits per value (scales included, e.g. MXFP4 4.25),
    activations in bytes."""

    weight_bits: float = 16.0
    kv_bits: float = 16.0
    act_bytes: float = 2.0


@dataclass
class OpCost:
    name: str
    kind: str  # gemm | attention | norm | kv_write | scan | lookup
    flops: float = 0.0
    bytes: float = 0.0  # everything moved, weights included
    weight_bytes: float = 0.0
    rows: int = 0  # GEMMs: the largest row count (tokens) of the op; its efficiency depends on it

    def add(self, flops: float, nbytes: float, weight_bytes: float = 0.0, rows: int = 0) -> None:
        self.flops += flops
        self.bytes += nbytes + weight_bytes
        self.weight_bytes += weight_bytes
        self.rows = max(self.rows, rows)


def attended_keys(chunk: Chunk, window: int | None) -> int:
    """Sum over the chunk's new tokens of the keys each attends (itself included)."""
    first = chunk.context - chunk.new  # position of the first new token
    if window is None:
        return chunk.new * first + chunk.new * (chunk.new + 1) // 2
    total = 0
    # positions p = first .. context-1 attend min(p + 1, window) keys
    below = max(0, min(chunk.context, window) - first)  # tokens whose p + 1 <= window
    total += below * first + below * (below + 1) // 2
    total += (chunk.new - below) * window
    return total


def keys_read(chunk: Chunk, window: int | None) -> int:
    """Distinct cached positions the chunk's attention reads."""
    return chunk.context if window is None else min(chunk.context, window + chunk.new - 1)


def step_ops(desc: ModelDesc, chunks: Iterable[Chunk], fmt: Formats = Formats()) -> list[OpCost]:
    """The step's ops, summed over layers, in a fixed order; `chunks` is the batch."""
    chunks = list(chunks)
    tokens = sum(c.new for c in chunks)
    ops: dict[str, OpCost] = {}

    def op(name: str, kind: str) -> OpCost:
        return ops.setdefault(name, OpCost(name, kind))

    w_bytes, kv_bytes, act = fmt.weight_bits / 8, fmt.kv_bits / 8, fmt.act_bytes
    h = desc.hidden

    def gemm(name: str, k: int, n: int, rows: int = tokens, weight_copies: float = 1.0) -> None:
        weights = k * n * w_bytes * weight_copies
        op(name, "gemm").add(2.0 * rows * k * n, rows * (k + n) * act, weights, rows)

    op("embedding", "lookup").add(0.0, tokens * h * act, tokens * h * w_bytes)
    for layer in desc.layers:
        op("norm", "norm").add(0.0, 2 * tokens * h * act * (2 if layer.ffn else 1))
        _mixer(layer, chunks, tokens, h, gemm, op, kv_bytes, act)
        _ffn(layer, tokens, h, gemm)
    rows = len(chunks)  # logits for the last new token of each sequence
    gemm("lm_head", h, desc.vocab, rows=rows)
    return list(ops.values())


def _mixer(layer: Layer, chunks, tokens, h, gemm, op, kv_bytes, act) -> None:
    m = layer.mixer
    if isinstance(m, Attention):
        q, kv = m.heads * m.head_dim, m.kv_heads * m.head_dim
        gemm("qkv_proj", h, q + 2 * kv)
        gemm("o_proj", q, h)
        attn = op("attention", "attention")
        for c in chunks:
            keys = attended_keys(c, m.window)
            flops = 4.0 * m.heads * m.head_dim * keys  # q·k and p·v
            reads = keys_read(c, m.window) * 2 * kv * kv_bytes
            attn.add(flops, reads + 2 * c.new * q * act)
        op("kv_write", "kv_write").add(0.0, tokens * 2 * kv * kv_bytes)
    elif isinstance(m, MLA):
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        if m.q_lora_rank:
            gemm("q_a_proj", h, m.q_lora_rank)
            gemm("q_b_proj", m.q_lora_rank, m.heads * qk)
        else:
            gemm("q_proj", h, m.heads * qk)
        gemm("kv_a_proj", h, m.kv_lora_rank + m.qk_rope_head_dim)
        # absorbed: q_nope into the latent, and the latent output back to v (kv_b_proj twice)
        gemm("kv_b_absorb", m.kv_lora_rank, m.heads * (m.qk_nope_head_dim + m.v_head_dim))
        gemm("o_proj", m.heads * m.v_head_dim, h)
        latent = m.kv_lora_rank + m.qk_rope_head_dim
        attn = op("attention", "attention")
        for c in chunks:
            keys = attended_keys(c, m.window)
            flops = 2.0 * m.heads * keys * (latent + m.kv_lora_rank)
            attn.add(
                flops,
                keys_read(c, m.window) * latent * kv_bytes + 2 * c.new * m.heads * latent * act,
            )
        op("kv_write", "kv_write").add(0.0, tokens * latent * kv_bytes)
    elif isinstance(m, SSM):
        gemm("in_proj", h, m.inner + m.conv_dim + m.heads)
        gemm("out_proj", m.inner, h)
        # per token: conv over the kernel, state decay + outer-product update + readout
        per_token = 2.0 * m.conv_dim * m.conv_kernel + 6.0 * m.heads * m.head_dim * m.state_size
        state = m.state_elements() * 4.0  # fp32 state, read and written once per sequence
        op("scan", "scan").add(
            per_token * tokens, 2 * state * len(chunks) + tokens * m.conv_dim * act
        )


def _ffn(layer: Layer, tokens: int, h: int, gemm) -> None:
    f = layer.ffn
    if isinstance(f, Dense):
        ups = 2 if f.gated else 1
        gemm("mlp_up", h, ups * f.intermediate)
        gemm("mlp_down", f.intermediate, h)
    elif isinstance(f, MoE):
        gemm("router", h, f.experts)
        if f.shared_intermediate:
            gemm("shared_up", h, 2 * f.shared_intermediate)
            gemm("shared_down", f.shared_intermediate, h)
        touched = expected_experts(f.experts, f.top_k, tokens)
        assignments = tokens * f.top_k
        gemm("experts_up", h, 2 * f.intermediate, rows=assignments, weight_copies=touched)
        gemm("experts_down", f.intermediate, h, rows=assignments, weight_copies=touched)


def expected_experts(experts: int, top_k: int, tokens: int) -> float:
    """Expected distinct experts `tokens` tokens route to, top_k each, uniformly at random."""
    if tokens <= 0:
        return 0.0
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)
