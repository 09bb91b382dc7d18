"""Gated delta rule (Gated DeltaNet linear attention) over a packed varlen batch, with a
recurrent state per sequence.

Per value head h (its query/key head is h // (v_heads / k_heads): GQA-style sharing), with
q̂ = l2norm(q)·k_dim^-1/2 and k̂ = l2norm(k) (l2norm(x) = x / sqrt(Σx² + 1e-6), in fp32), and
the state S [k_dim, v_dim] of the sequence (zeros when `fresh`), for each token t in order:

    S ← exp(g_t) · S                         (g_t ≤ 0: log of the decay)
    S ← S + k̂_t ⊗ β_t (v_t − Sᵀ k̂_t)         (delta rule: write the correction of the read)
    o_t = Sᵀ q̂_t

Two forms, chosen per sequence: a sequence with one new token takes one recurrent step (all
such sequences in one vectorised step: decode); longer ones use the chunked (WY / UT-transform)
form, all of them padded to a common number of chunks and batched (chunk C = min(chunk_size,
longest sequence); the padding costs (sequences · longest) rows of scratch). Within a chunk with
γ_t = Σ_{s≤t} g_s and decay D[t, s] = exp(γ_t − γ_s) for s ≤ t (0 above):

    (I + strict_lower(β k̂ k̂ᵀ ⊙ D)) Δ = β v − β exp(γ) k̂ S₀        (a unit-triangular solve)
    o = exp(γ) q̂ S₀ + (q̂ k̂ᵀ ⊙ D) Δ
    S₁ = exp(γ_last) S₀ + (exp(γ_last − γ) k̂)ᵀ Δ

Bytes moved: read T·(2·Hk·Dk + Hv·Dv + 2·Hv) inputs, write T·Hv·Dv outputs; read and write
N·Hv·Dk·Dv state (N sequences). Flops ≈ 6·T·Hv·Dk·Dv (state reads and writes, both forms),
plus ≈ T·C·Hv·(5·Dk + 3·Dv) within chunks in the chunked form (chunk C).
Everything is computed in fp32 (float64 in the reference); keep the state in fp32.

Backends (GATED_DELTA_RULE_BACKENDS): "torch".
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from infergen.config.mixers import DELTANET_CHUNK_SIZE
from infergen.ops.state_slots import read_states, write_states
from infergen.registry import Registry

GatedDeltaRuleFn = Callable[..., torch.Tensor]
GATED_DELTA_RULE_BACKENDS: Registry[GatedDeltaRuleFn] = Registry("gated_delta_rule backend")

L2NORM_EPS = 1e-6  # as flash-linear-attention's l2norm (and transformers' Qwen3-Next)
CHUNK_SIZE = DELTANET_CHUNK_SIZE  # config/mixers.py: the DeltaNet spec's default


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def _check(q, k, v, g, beta, state, query_start_loc, state_slots, fresh) -> None:
    tokens, k_heads, k_dim = k.shape
    v_heads, v_dim = v.shape[1:]
    num_seqs = len(query_start_loc) - 1
    if q.shape != k.shape or v.shape[0] != tokens:
        raise ValueError(
            f"gated_delta_rule: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: "
            "expected q, k [tokens, k_heads, k_dim] and v [tokens, v_heads, v_dim]"
        )
    if v_heads % k_heads:
        raise ValueError(f"gated_delta_rule: v_heads {v_heads} not a multiple of {k_heads}")
    if g.shape != (tokens, v_heads) or beta.shape != (tokens, v_heads):
        raise ValueError(
            f"gated_delta_rule: g {tuple(g.shape)}, beta {tuple(beta.shape)}, "
            f"expected [{tokens}, {v_heads}]"
        )
    if tuple(state.shape[1:]) != (v_heads, k_dim, v_dim):
        raise ValueError(
            f"gated_delta_rule: state {tuple(state.shape)}, "
            f"expected [slots, {v_heads}, {k_dim}, {v_dim}]"
        )
    if query_start_loc[0] != 0 or query_start_loc[-1] != tokens:
        raise ValueError(
            f"gated_delta_rule: query_start_loc {query_start_loc} must run from 0 to {tokens}"
        )
    if state_slots.shape != (num_seqs,) or fresh.shape != (num_seqs,):
        raise ValueError(
            f"gated_delta_rule: state_slots {tuple(state_slots.shape)} and fresh "
            f"{tuple(fresh.shape)} must both be [{num_seqs}] (one per sequence)"
        )


def _normalise_qk(
    q: torch.Tensor, k: torch.Tensor, v_heads: int, l2norm: bool, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """l2norm (optional), share each q/k head over its v heads, scale q by k_dim^-1/2."""
    q, k = q.to(dtype), k.to(dtype)
    if l2norm:
        q, k = _l2norm(q), _l2norm(k)
    repeat = v_heads // k.shape[1]
    if repeat > 1:  # value head h reads query/key head h // repeat
        q, k = q.repeat_interleave(repeat, dim=1), k.repeat_interleave(repeat, dim=1)
    return q * k.shape[-1] ** -0.5, k  # [tokens, v_heads, k_dim]


def reference(
    q: torch.Tensor,  # [tokens, k_heads, k_dim]
    k: torch.Tensor,  # [tokens, k_heads, k_dim]
    v: torch.Tensor,  # [tokens, v_heads, v_dim]
    g: torch.Tensor,  # [tokens, v_heads] log decay (≤ 0)
    beta: torch.Tensor,  # [tokens, v_heads]
    state: torch.Tensor,  # [slots, v_heads, k_dim, v_dim], updated in place
    query_start_loc: list[int],
    state_slots: torch.Tensor,  # [seqs] int64
    fresh: torch.Tensor,  # [seqs] bool
    *,
    l2norm: bool = True,
) -> torch.Tensor:
    """The per-token recurrence of the module doc, in float64. Returns [tokens, v_heads, v_dim]."""
    _check(q, k, v, g, beta, state, query_start_loc, state_slots, fresh)
    qn, kn = _normalise_qk(q, k, v.shape[1], l2norm, torch.float64)
    v64, g64, b64 = v.double(), g.double(), beta.double()
    out = torch.empty(v.shape, dtype=torch.float64)
    for i in range(len(query_start_loc) - 1):
        slot = int(state_slots[i])
        s = torch.zeros(state.shape[1:], dtype=torch.float64)  # [v_heads, k_dim, v_dim]
        if not bool(fresh[i]):
            s = state[slot].double()
        for t in range(query_start_loc[i], query_start_loc[i + 1]):
            s = s * torch.exp(g64[t])[:, None, None]
            read = torch.einsum("hk,hkv->hv", kn[t], s)
            correction = b64[t][:, None] * (v64[t] - read)  # [v_heads, v_dim]
            s = s + kn[t][:, :, None] * correction[:, None, :]
            out[t] = torch.einsum("hk,hkv->hv", qn[t], s)
        state[slot] = s.to(state.dtype)
    return out.to(q.dtype)


def recurrent_step(
    q: torch.Tensor,  # [seqs, heads, k_dim] (normalised, scaled)
    k: torch.Tensor,  # [seqs, heads, k_dim] (normalised)
    v: torch.Tensor,  # [seqs, heads, v_dim]
    g: torch.Tensor,  # [seqs, heads]
    beta: torch.Tensor,  # [seqs, heads]
    s: torch.Tensor,  # [seqs, heads, k_dim, v_dim]
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of each sequence: returns (o [seqs, heads, v_dim], the new state — `s`
    itself, updated in place)."""
    s.mul_(g.exp()[..., None, None])
    read = torch.einsum("nhk,nhkv->nhv", k, s)
    correction = beta[..., None] * (v - read)
    s.add_(k[..., :, None] * correction[..., None, :])
    return torch.einsum("nhk,nhkv->nhv", q, s), s


def chunked(
    q: torch.Tensor,  # [batch, heads, T, k_dim] (normalised, scaled)
    k: torch.Tensor,  # [batch, heads, T, k_dim] (normalised)
    v: torch.Tensor,  # [batch, heads, T, v_dim]
    g: torch.Tensor,  # [batch, heads, T]
    beta: torch.Tensor,  # [batch, heads, T]
    s: torch.Tensor,  # [batch, heads, k_dim, v_dim] initial state
    chunk: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunked form over T = a multiple of `chunk` tokens: returns (o [batch, heads, T,
    v_dim], the final state). Trailing padding with k = v = g = beta = 0 leaves the state as is."""
    batch, heads, length, k_dim = k.shape
    v_dim = v.shape[-1]
    n = length // chunk
    q, k, v = (t.reshape(batch, heads, n, chunk, -1) for t in (q, k, v))
    g, beta = (t.reshape(batch, heads, n, chunk) for t in (g, beta))

    gamma = g.cumsum(-1)  # [batch, heads, n, chunk] log decay from the chunk's start through t
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=k.device).tril()
    # decay[t, s] = exp(γ_t − γ_s) for s ≤ t, else 0 (masked before exp: no overflow)
    decay = (gamma[..., :, None] - gamma[..., None, :]).masked_fill(~causal, float("-inf")).exp()
    k_beta = k * beta[..., None]
    # (I + strictly lower part of this) is the UT system; its diagonal is ignored by the solve
    system = (k_beta @ k.transpose(-1, -2)) * decay  # [batch, heads, n, chunk, chunk]
    rhs = torch.cat([v * beta[..., None], k_beta * gamma.exp()[..., None]], dim=-1)
    solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    values, keys_read = solved.split([v_dim, k_dim], dim=-1)  # Δ = values − keys_read @ S₀

    scores = (q @ k.transpose(-1, -2)) * decay  # intra-chunk attention, diagonal included
    q_decayed = q * gamma.exp()[..., None]  # reads S₀ through the decay so far
    k_decayed = k * (gamma[..., -1:] - gamma).exp()[..., None]  # decay to the chunk's end
    chunk_decay = gamma[..., -1].exp()[..., None, None]  # [batch, heads, n, 1, 1]

    out = torch.empty(batch, heads, n, chunk, v_dim, dtype=v.dtype, device=v.device)
    for c in range(n):
        delta = values[:, :, c] - keys_read[:, :, c] @ s  # [batch, heads, chunk, v_dim]
        out[:, :, c] = q_decayed[:, :, c] @ s + scores[:, :, c] @ delta
        s = s * chunk_decay[:, :, c] + k_decayed[:, :, c].transpose(-1, -2) @ delta
    return out.reshape(batch, heads, length, v_dim), s


@GATED_DELTA_RULE_BACKENDS.decorator("torch")
def gated_delta_rule(
    q: torch.Tensor,  # [tokens, k_heads, k_dim]
    k: torch.Tensor,  # [tokens, k_heads, k_dim]
    v: torch.Tensor,  # [tokens, v_heads, v_dim]
    g: torch.Tensor,  # [tokens, v_heads] log decay (≤ 0)
    beta: torch.Tensor,  # [tokens, v_heads]
    state: torch.Tensor,  # [slots, v_heads, k_dim, v_dim], updated in place
    query_start_loc: list[int],
    state_slots: torch.Tensor,  # [seqs] int64, distinct
    fresh: torch.Tensor,  # [seqs] bool: start from zeros, not the slot's content
    *,
    l2norm: bool = True,
    chunk_size: int = CHUNK_SIZE,
) -> torch.Tensor:
    """Returns o [tokens, v_heads, v_dim] in q's dtype; updates each sequence's state slot.

    Sequences are rows query_start_loc[i]:query_start_loc[i+1]; `l2norm=True` normalises q
    and k here (Hugging Face's use_qk_l2norm_in_kernel=True); q is always scaled by
    k_dim^-1/2. A sequence of 0 tokens keeps its state (zeroed when fresh)."""
    _check(q, k, v, g, beta, state, query_start_loc, state_slots, fresh)
    device, f32 = v.device, torch.float32
    v_heads = v.shape[1]
    qn, kn = _normalise_qk(q, k, v_heads, l2norm, f32)  # [tokens, v_heads, k_dim]
    v32, g32, b32 = v.to(f32), g.to(f32), beta.to(f32)
    out = torch.empty(v.shape, dtype=f32, device=device)

    lengths = [b - a for a, b in zip(query_start_loc[:-1], query_start_loc[1:], strict=True)]
    starts_all = torch.tensor(query_start_loc[:-1], dtype=torch.int64, device=device)
    slots_all = state_slots.to(device=device, dtype=torch.int64)
    keep_all = ~fresh.to(device)
    decode = [i for i, n in enumerate(lengths) if n == 1]
    prefill = [i for i, n in enumerate(lengths) if n > 1]
    empty = [i for i, n in enumerate(lengths) if n == 0]

    def initial(idx: torch.Tensor) -> torch.Tensor:  # [len(idx), v_heads, k_dim, v_dim]
        s0 = state.index_select(0, slots_all[idx]).to(f32)
        # where, not a multiply by 0: a reused slot may hold NaN from an earlier sequence
        return torch.where(keep_all[idx][:, None, None, None], s0, torch.zeros_like(s0))

    if decode:
        idx = torch.tensor(decode, dtype=torch.int64, device=device)
        rows = starts_all[idx]
        s, in_place = read_states(state, slots_all[idx], ~keep_all[idx])  # maybe a view
        o, s = recurrent_step(qn[rows], kn[rows], v32[rows], g32[rows], b32[rows], s)
        out[rows] = o
        write_states(state, slots_all[idx], s, in_place)

    if prefill:
        idx = torch.tensor(prefill, dtype=torch.int64, device=device)
        seq_lengths = torch.tensor([lengths[i] for i in prefill], device=device)
        longest = max(lengths[i] for i in prefill)
        chunk = min(chunk_size, longest)
        padded = -(-longest // chunk) * chunk
        total = sum(lengths[i] for i in prefill)
        # token j of prefill sequence p sits at row p·padded + j of the padded batch
        member = torch.repeat_interleave(
            torch.arange(len(prefill), device=device), seq_lengths, output_size=total
        )
        first = torch.cumsum(seq_lengths, 0) - seq_lengths
        pos = torch.arange(total, device=device) - first[member]
        src = starts_all[idx][member] + pos
        dst = member * padded + pos

        def pad(
            t: torch.Tensor,
        ) -> torch.Tensor:  # [total, heads, ...] → [seqs, heads, padded, ...]
            buf = torch.zeros(len(prefill) * padded, *t.shape[1:], dtype=f32, device=device)
            buf[dst] = t[src]
            return buf.reshape(len(prefill), padded, *t.shape[1:]).transpose(1, 2)

        o, s = chunked(
            pad(qn), pad(kn), pad(v32), pad(g32), pad(b32), initial(idx), chunk
        )  # o [seqs, v_heads, padded, v_dim]
        out[src] = o.transpose(1, 2).reshape(len(prefill) * padded, v_heads, -1)[dst]
        state.index_copy_(0, slots_all[idx], s.to(state.dtype))

    if empty:
        idx = torch.tensor(empty, dtype=torch.int64, device=device)
        state.index_copy_(0, slots_all[idx], initial(idx).to(state.dtype))
    return out.to(q.dtype)
