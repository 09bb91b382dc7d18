"""FLOPs and bytes of every op of one engine step, from a model description and a batch.

A step runs a chunk of new tokens for each sequence of the batch (a decode is a chunk of one;
a prefill chunk may continue a sequence whose first tokens are already cached). Per layer:

  attention   qkv and o projections (GEMMs), scores and weighted values over the keys each new
              token attends (causal, window-limited), KV reads (each sequence's attended keys
              once) and KV writes (the new tokens); a verifying decode's rows, each reading
              its own prefix, are the separate "verify attention" op
  mla         DeepSeek's latent attention in its absorbed form: the q path and the latent
              projection as GEMMs, scores and values over the kv_lora_rank + rope latent
  ssm         Mamba-2: in/out projections, the scan (state update and readout per token),
              the state read and written once per sequence
  linear      gated DeltaNet (Qwen3-Next): in/out projections, the delta rule per token
              (decay, k·S, rank-one update, q·S), the state read and written once per sequence
  attn+ssm    Falcon-H1: the attention and the SSM of the same layer, both
  dense       gate/up and down projections
  moe         router, the experts the tokens are routed to (FLOPs: top-k per token; weight
              bytes: the expected number of distinct experts a batch touches, for uniform
              routing E·(1 − (1 − k/E)^T)), shared experts as dense
  norm        read and write of the hidden states
  elementwise RoPE on q and k (read and written), the MLP's activation (silu(gate) * up:
              gate and up read, the product written)
plus the LM head for the rows that need logits (the last token of each chunk, every token of a
verifying decode's). Under tensor
parallelism, the communication: two all-reduces of the hidden states per layer (one for a
layer without a feed-forward) and one for the vocabulary-parallel embedding, the logits'
gather and the step's inputs broadcast from the scheduling rank.

Bytes count what an op must move from memory at least once: its weights (in the weight
format), its activations (in the activation format) and KV/state (in the KV format). FLOPs
count multiply and add separately (2 per multiply-accumulate). Time comes from these and a
device's peaks and efficiencies elsewhere; this module only counts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from infergen.config.description import (
    MLA,
    SSM,
    Attention,
    Dense,
    Layer,
    LinearAttention,
    ModelDesc,
    MoE,
    mixer_parts,
)


@dataclass(frozen=True)
class Chunk:
    """`new` tokens of one sequence whose length after this step is `context`; `verify`: a
    decode verifying new − 1 drafts, whose tokens attend as decode rows (the engine's
    ops/paged_attention.plan: each reads its own prefix, and the fused decode covers it)."""

    new: int
    context: int
    verify: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.new <= self.context:
            raise ValueError(f"a chunk needs 1 <= new <= context, got {self.new}, {self.context}")


@dataclass(frozen=True)
class Formats:
    """Storage widths: weights and KV in bits per value (scales included, e.g. MXFP4 4.25),
    activations in bytes. `expert_weight_bits` overrides the width of routed experts (gpt-oss
    ships MXFP4 experts next to bf16 attention). Activations narrower than 2 bytes are
    quantized before each GEMM: a "quantize" op reads them at 2 bytes and writes them narrow."""

    weight_bits: float = 16.0
    kv_bits: float = 16.0
    act_bytes: float = 2.0
    expert_weight_bits: float | None = None


@dataclass(frozen=True)
class Parallel:
    """Tensor parallelism `tp` (heads, GEMM columns/rows and the vocabulary split over tp
    devices; two all-reduces of the hidden states per layer) and expert parallelism `ep`
    (routed experts split over ep devices; an all-to-all dispatch and combine per MoE layer).
    Costs are per device."""

    tp: int = 1
    ep: int = 1

    def __post_init__(self) -> None:
        if self.tp < 1 or self.ep < 1:
            raise ValueError(f"tp and ep must be >= 1, got tp={self.tp}, ep={self.ep}")


@dataclass
class OpCost:
    name: str
    # gemm | attention | verify_attention | norm | elementwise | kv_write | scan | delta_scan |
    # lookup | quantize | comm
    kind: str
    flops: float = 0.0
    bytes: float = 0.0  # everything moved, weights included (comm: bytes over the link)
    weight_bytes: float = 0.0
    rows: int = 0  # GEMMs: the largest row count (tokens) of the op; its efficiency depends on it
    call_weight_bytes: float = 0.0  # GEMMs: the largest weight one call reads (its curve's)
    calls: int = 0  # comm: collectives (each pays the link latency)

    def add(
        self, flops: float, nbytes: float, weight_bytes: float = 0.0, rows: int = 0, times=1
    ) -> None:
        self.flops += flops * times
        self.bytes += (nbytes + weight_bytes) * times
        self.weight_bytes += weight_bytes * times
        self.rows = max(self.rows, rows)
        self.call_weight_bytes = max(self.call_weight_bytes, weight_bytes)


VERIFY_ATTENTION = "verify_attention"  # the op kind of verifying decodes' attention
# the op kinds of the recurrent layers' scans: Mamba2's SSD (its compute fraction calibrated on
# the engine's kernel, perf/calibrate.py) and DeltaNet's gated delta rule (not calibrated: the
# hardware's default fraction)
SCAN, DELTA_SCAN = "scan", "delta_scan"


def scan_flops(heads: int, head_dim: int, state_size: int) -> float:
    """FLOPs of one token through an SSD scan's recurrence: per state element, the decay, the
    outer-product update and the readout (6)."""
    return 6.0 * heads * head_dim * state_size


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
    """Cached positions the chunk's attention reads: the distinct ones, or for a verifying
    decode (a decode row per token) each row's own."""
    if chunk.verify:
        return attended_keys(chunk, window)
    return chunk.context if window is None else min(chunk.context, window + chunk.new - 1)


def logit_rows(chunk: Chunk) -> int:
    """Rows of the chunk the LM head computes: its last token's, or every token's of a
    verifying decode (each row's logits check the draft after it, the last one's give the
    next token). With Gemma-3-270M's 262k-token vocabulary the head is 168M of its 268M
    parameters: at 9 rows a verifying step's head alone is ~3 GFLOPs."""
    return chunk.new if chunk.verify else 1


def step_ops(
    desc: ModelDesc,
    chunks: Iterable[Chunk],
    fmt: Formats = Formats(),
    par: Parallel = Parallel(),
) -> list[OpCost]:
    """The step's ops on one device, summed over layers, in a fixed order; `chunks` is the
    batch. Identical layers are counted once and multiplied, so a step costs
    O(distinct layers x sequences)."""
    chunks = list(chunks)
    step = _Step(chunks, fmt, par, desc.hidden)
    h = desc.hidden
    step.op("embedding", "lookup").add(
        0.0, step.tokens * h * fmt.act_bytes, step.tokens * h * step.w_bytes
    )
    for layer, count in Counter(desc.layers).items():
        step.times = count
        step.op("norm", "norm").add(0.0, 2 * step.tokens * h * fmt.act_bytes * layer.norms,
                                    times=count)  # fmt: skip
        for mixer in mixer_parts(layer.mixer):
            _mixer(mixer, step)
        _ffn(layer, step)
        if par.tp > 1:  # after the mixer's and the feed-forward's row-parallel GEMM
            step.all_reduce(2 if layer.ffn else 1)
    step.times = 1
    rows = sum(logit_rows(chunk) for chunk in chunks)
    step.gemm("lm_head", h, desc.vocab, rows=rows, split=par.tp)
    if par.tp > 1:
        step.all_reduce(1)  # the vocabulary-parallel embedding's rows
        step.gather_logits(rows, desc.vocab)
        step.broadcast_inputs()
    return list(step.ops.values())


class _Step:
    """Accumulates one step's ops; `times` multiplies everything added (identical layers)."""

    def __init__(self, chunks: list[Chunk], fmt: Formats, par: Parallel, hidden: int):
        self.chunks, self.fmt, self.par, self.hidden = chunks, fmt, par, hidden
        self.tokens = sum(c.new for c in chunks)
        self.w_bytes, self.kv_bytes = fmt.weight_bits / 8, fmt.kv_bits / 8
        self.ops: dict[str, OpCost] = {}
        self.times = 1

    def op(self, name: str, kind: str) -> OpCost:
        return self.ops.setdefault(name, OpCost(name, kind))

    def gemm(
        self,
        name: str,
        k: int,
        n: int,
        rows: int | None = None,
        weight_copies: float = 1.0,
        split: int | None = None,
        weight_bits: float | None = None,
    ) -> None:
        """rows x k @ k x n, the weight split `split` ways (tp by default) across devices."""
        rows = self.tokens if rows is None else rows
        split = self.par.tp if split is None else split
        act = self.fmt.act_bytes
        w_bytes = (weight_bits or self.fmt.weight_bits) / 8
        weights = k * n * w_bytes * weight_copies / split
        self.op(name, "gemm").add(
            2.0 * rows * k * n / split, rows * (k + n / split) * act, weights, rows, self.times
        )
        if act < 2:  # the input is quantized to the activation format first
            self.op("quantize", "quantize").add(0.0, rows * k * (2 + act), times=self.times)

    def attention(
        self, window: int | None, flops_per_key: float, bytes_per_key: float, token_bytes: float
    ) -> None:
        """The layer's attention over the step's chunks: `flops_per_key` per attended key,
        `bytes_per_key` per key read (keys_read), `token_bytes` per new token (its queries
        and outputs). Verifying decodes' rows are their own op ("verify attention", kind
        VERIFY_ATTENTION): each row reads its own prefix, the rows after the first mostly
        from the caches the first filled, so a calibration gives them their own efficiency
        (perf/calibrate.py)."""
        for verify, name, kind in ((False, "attention", "attention"),
                                   (True, "verify attention", VERIFY_ATTENTION)):  # fmt: skip
            chunks = [c for c in self.chunks if c.verify == verify]
            if not chunks:
                continue
            keys = sum(attended_keys(c, window) for c in chunks)
            reads = sum(keys_read(c, window) for c in chunks)
            tokens = sum(c.new for c in chunks)
            self.op(name, kind).add(
                flops_per_key * keys, reads * bytes_per_key + tokens * token_bytes, times=self.times
            )

    def activation(self, rows: float, width: float, gated: bool = True) -> None:
        """The activation on `rows` rows of `width` (per device): gated, silu(gate) * up
        reads two inputs; plain, act(up) one; the output is written."""
        self.op("activation", "elementwise").add(
            0.0, (3 if gated else 2) * rows * width * self.fmt.act_bytes, times=self.times
        )

    def all_reduce(self, count: int) -> None:
        """Ring all-reduce of the step's hidden states: 2 (tp - 1) / tp of them per device."""
        tp = self.par.tp
        nbytes = 2 * (tp - 1) / tp * self.tokens * self.hidden * self.fmt.act_bytes
        comm = self.op("all_reduce", "comm")
        comm.add(0.0, nbytes * count, times=self.times)
        comm.calls += count * self.times

    def gather_logits(self, rows: int, vocab: int) -> None:
        """Each device's vocabulary slice of the logits (fp32) gathered on every device:
        (tp − 1) / tp of them arrive."""
        tp = self.par.tp
        comm = self.op("gather_logits", "comm")
        comm.add(0.0, (tp - 1) / tp * rows * vocab * 4)
        comm.calls += 1

    def broadcast_inputs(self) -> None:
        """The step's inputs from the scheduling rank (engine/workers.py: pickled token ids,
        positions, slots — about 3 int64 per token — as a size, then the bytes)."""
        comm = self.op("broadcast", "comm")
        comm.add(0.0, 3 * 8 * self.tokens)
        comm.calls += 2

    def all_to_all(self, top_k: int) -> None:
        """Dispatch each token's hidden state to its top-k experts' devices and combine back:
        (ep - 1) / ep of the assignments leave the device, twice."""
        ep = self.par.ep
        nbytes = 2 * (ep - 1) / ep * self.tokens * top_k * self.hidden * self.fmt.act_bytes
        comm = self.op("all_to_all", "comm")
        comm.add(0.0, nbytes, times=self.times)
        comm.calls += 2 * self.times


def _heads(heads: int, tp: int) -> int:
    """Heads per device; KV heads fewer than tp are replicated (at least one per device)."""
    return max(1, -(-heads // tp))


def _mixer(m: Attention | MLA | SSM | LinearAttention, step: _Step) -> None:
    h, tp, act = step.hidden, step.par.tp, step.fmt.act_bytes
    kv_bytes, times = step.kv_bytes, step.times
    if isinstance(m, Attention):
        heads, kv_heads = _heads(m.heads, tp), _heads(m.kv_heads, tp)
        q, kv = heads * m.head_dim, kv_heads * m.head_dim
        gated = q if m.output_gate else 0  # the gate's outputs of q_proj
        step.gemm("qkv_proj", h, q + gated + 2 * kv, split=1)  # already per device
        step.gemm("o_proj", q, h, split=1)
        step.op("rope", "elementwise").add(0.0, 2 * step.tokens * (q + kv) * act, times=times)
        # q.k and p.v per attended key; each read key's K and V; the queries and outputs
        step.attention(m.window, 4.0 * heads * m.head_dim, 2 * kv * kv_bytes, 2 * q * act)
        step.op("kv_write", "kv_write").add(0.0, step.tokens * 2 * kv * kv_bytes, times=times)
    elif isinstance(m, MLA):
        heads = _heads(m.heads, tp)
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        if m.q_lora_rank:
            step.gemm("q_a_proj", h, m.q_lora_rank, split=1)  # small, replicated
            step.gemm("q_b_proj", m.q_lora_rank, heads * qk, split=1)
        else:
            step.gemm("q_proj", h, heads * qk, split=1)
        latent = m.kv_lora_rank + m.qk_rope_head_dim
        step.gemm("kv_a_proj", h, latent, split=1)  # the latent is replicated on every device
        # absorbed: q_nope into the latent, and the latent output back to v (kv_b_proj twice)
        step.gemm(
            "kv_b_absorb", m.kv_lora_rank, heads * (m.qk_nope_head_dim + m.v_head_dim), split=1
        )
        step.gemm("o_proj", heads * m.v_head_dim, h, split=1)
        step.attention(m.window, 2.0 * heads * (latent + m.kv_lora_rank), latent * kv_bytes,
                       2 * heads * latent * act)  # fmt: skip
        step.op("kv_write", "kv_write").add(0.0, step.tokens * latent * kv_bytes, times=times)
    elif isinstance(m, SSM):
        step.gemm("in_proj", h, m.inner + m.conv_dim + m.heads)
        step.gemm("out_proj", m.inner, h)
        # per token: conv over the kernel, state decay + outer-product update + readout
        per_token = 2.0 * m.conv_dim * m.conv_kernel + scan_flops(m.heads, m.head_dim, m.state_size)
        state = m.state_elements() * 4.0 / tp  # fp32 state, read and written once per sequence
        step.op("scan", SCAN).add(
            per_token * step.tokens / tp,
            2 * state * len(step.chunks) + step.tokens * m.conv_dim * act / tp,
            times=times,
        )
    elif isinstance(m, LinearAttention):
        value = m.v_heads * m.v_dim
        step.gemm("in_proj", h, m.conv_dim + value + 2 * m.v_heads)  # q, k, v, z; b, a
        step.gemm("out_proj", value, h)
        # per token: conv over the kernel; per value head, on its k_dim x v_dim state: decay,
        # k·S, the rank-one update and q·S (7 FLOPs per state element)
        per_token = 2.0 * m.conv_dim * m.conv_kernel + 7.0 * m.v_heads * m.k_dim * m.v_dim
        state = m.state_elements() * 4.0 / tp  # fp32 state, read and written once per sequence
        step.op("scan", DELTA_SCAN).add(
            per_token * step.tokens / tp,
            2 * state * len(step.chunks) + step.tokens * m.conv_dim * act / tp,
            times=times,
        )


def _ffn(layer: Layer, step: _Step) -> None:
    f, h, tokens = layer.ffn, step.hidden, step.tokens
    if isinstance(f, Dense):
        ups = 2 if f.gated else 1
        step.gemm("mlp_up", h, ups * f.intermediate)
        step.activation(tokens, f.intermediate / step.par.tp, f.gated)
        step.gemm("mlp_down", f.intermediate, h)
    elif isinstance(f, MoE):
        step.gemm("router", h, f.experts, split=1)
        if f.shared_intermediate:
            step.gemm("shared_up", h, 2 * f.shared_intermediate + f.shared_gate)
            step.activation(tokens, f.shared_intermediate / step.par.tp)
            step.gemm("shared_down", f.shared_intermediate, h)
        # routed experts: split ep ways when expert-parallel, else tp ways like any GEMM
        split = step.par.ep if step.par.ep > 1 else step.par.tp
        touched = expected_experts(f.experts, f.top_k, tokens)
        rows = tokens * f.top_k
        bits = step.fmt.expert_weight_bits
        step.gemm("experts_up", h, 2 * f.intermediate, rows, touched, split, bits)
        step.activation(rows / split, f.intermediate)
        step.gemm("experts_down", f.intermediate, h, rows, touched, split, bits)
        if step.par.ep > 1:
            step.all_to_all(f.top_k)


def expected_experts(experts: int, top_k: int, tokens: int) -> float:
    """Expected distinct experts `tokens` tokens route to, top_k each, uniformly at random."""
    if tokens <= 0:
        return 0.0
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)
