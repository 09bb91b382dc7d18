"""Mamba2 selective state-space scan (SSD) over a packed varlen batch with per-sequence state.

Per head h (scalar A_h < 0), for each token t of a sequence, with the state H [head_dim, state]:

    δ_t = clamp(softplus(dt_t + dt_bias), lo, hi)       (bias / softplus optional; clamp always)
    H_t = exp(δ_t·A) · H_{t-1} + δ_t · x_t ⊗ B_t        x_t [head_dim], B_t [state]
    y_t = H_t · C_t + D · x_t                           C_t [state], y_t [head_dim]

B and C are shared by groups of heads: head h reads group h // (heads / groups).

Chunked (SSD) form, chunk length Q, used for sequences with more than one new token. With
a_t = Σ_{s≤t} δ_s·A inside a chunk (exclusive of the carried state H_in):

    y_t   = Σ_{s≤t} exp(a_t − a_s) (C_t·B_s) δ_s x_s    intra-chunk, quadratic in Q
          + exp(a_t) · H_in · C_t                        the state carried into the chunk
    H_out = exp(a_Q) · H_in + Σ_s exp(a_Q − a_s) δ_s x_s ⊗ B_s

A sequence's tail chunk is padded with δ = 0 (decay 1, no input), so H_out of the tail chunk
is the state after its last real token. Sequences with one new token take the recurrent step
directly, vectorised over sequences. Both forms compute in fp32.

Layout (T packed tokens, S sequences; sequence i owns rows query_start_loc[i]:[i+1]):
    x [T, heads, head_dim], dt [T, heads], B, C [T, groups, state], A, D, dt_bias [heads],
    ssm_state [num_slots, heads, head_dim, state], updated in place at state_slots [S] (int64);
    fresh [S] (bool): True means the sequence starts from a zero state (its slot is not read).
Returns y [T, heads, head_dim] in x's dtype.

Bytes moved: read x, y written (2·T·heads·head_dim), dt (T·heads), B and C (2·T·groups·state),
and each sequence's state read + written (2·S·heads·head_dim·state). FLOPs: decode
~6·T·heads·head_dim·state; chunked adds the Q×Q intra-chunk block, ~2·T·Q·heads·(state +
head_dim), and holds a [chunks, heads, Q, Q] fp32 temporary (bound the prefill chunk size).

Backends (SSD_SCAN_BACKENDS): "torch" (the forms above in plain torch); "native"
(kernels/ssd_scan_f32.c: the per-token recurrence for every sequence, one (sequence, head) per
work item with its state in cache — about 10× the torch forms at a step's sizes on a CPU; fp32
inputs and state, else the torch row).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from infergen.kernels.build import I, L, P, kernel
from infergen.ops.state_slots import read_states, write_states
from infergen.registry import Registry

SSDScanFn = Callable[..., torch.Tensor]
SSD_SCAN_BACKENDS: Registry[SSDScanFn] = Registry("ssd_scan backend")

DtLimit = tuple[float, float]
NO_LIMIT: DtLimit = (0.0, math.inf)


def reference(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    ssm_state: torch.Tensor,
    query_start_loc: list[int],
    state_slots: torch.Tensor,
    fresh: torch.Tensor,
    chunk_size: int = 256,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
    dt_limit: DtLimit = NO_LIMIT,
) -> torch.Tensor:
    """The oracle: the per-token recurrence of the module docstring in float64 (chunk_size is
    accepted for a common signature and ignored)."""
    f64 = torch.float64
    heads, groups = x.shape[1], B.shape[1]
    rep = heads // groups
    A64 = A.to(f64)
    D64 = D.to(f64) if D is not None else torch.zeros_like(A64)
    out = torch.zeros(x.shape, dtype=f64, device=x.device)
    for i in range(len(query_start_loc) - 1):
        slot = int(state_slots[i])
        h = torch.zeros(ssm_state.shape[1:], dtype=f64, device=x.device)  # [heads, P, N]
        if not bool(fresh[i]):
            h = ssm_state[slot].to(f64)
        for t in range(query_start_loc[i], query_start_loc[i + 1]):
            d = dt[t].to(f64)  # [heads]
            if dt_bias is not None:
                d = d + dt_bias.to(f64)
            if dt_softplus:
                d = F.softplus(d)
            d = d.clamp(dt_limit[0], dt_limit[1])
            b = B[t].to(f64).repeat_interleave(rep, dim=0)  # [heads, N]
            c = C[t].to(f64).repeat_interleave(rep, dim=0)  # [heads, N]
            xt = x[t].to(f64)  # [heads, P]
            h = torch.exp(d * A64)[:, None, None] * h + (d[:, None] * xt)[:, :, None] * b[:, None]
            out[t] = (h * c[:, None, :]).sum(-1) + D64[:, None] * xt
        ssm_state[slot] = h.to(ssm_state.dtype)
    return out.to(x.dtype)


def discretize_dt(
    dt: torch.Tensor, dt_bias: torch.Tensor | None, dt_softplus: bool, dt_limit: DtLimit
) -> torch.Tensor:
    """δ = clamp(softplus(dt + dt_bias)) in fp32; dt [T, heads]."""
    dt = dt.float()
    if dt_bias is not None:
        dt = dt + dt_bias.float()
    if dt_softplus:
        dt = F.softplus(dt)
    if dt_limit[0] > 0.0 or dt_limit[1] < math.inf:
        dt = dt.clamp(dt_limit[0], dt_limit[1])
    return dt


def _initial_state(
    ssm_state: torch.Tensor, slots: torch.Tensor, fresh: torch.Tensor
) -> torch.Tensor:
    """The fp32 state each sequence starts from: [S, heads, P, N]; zeros where fresh (the slot
    of a fresh sequence may hold garbage, even NaN, so it is replaced rather than scaled)."""
    h = ssm_state.index_select(0, slots).float()
    return torch.where(fresh.view(-1, 1, 1, 1), torch.zeros((), device=h.device), h)


def _step(
    x: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    ssm_state: torch.Tensor,
    slots: torch.Tensor,
    fresh: torch.Tensor,
) -> torch.Tensor:
    """One token per sequence. x [n, H, P], delta [n, H] (discretized), B, C [n, G, N]."""
    n, heads, head_dim = x.shape
    groups, state = B.shape[1], B.shape[2]
    rep = heads // groups
    states, in_place = read_states(ssm_state, slots, fresh)  # [n, H, P, N], maybe a view
    h = states.view(n, groups, rep, head_dim, state)
    xf = x.float().view(n, groups, rep, head_dim)
    d = delta.view(n, groups, rep)
    decay = torch.exp(d * A.float().view(groups, rep))  # [n, G, R]
    h.mul_(decay[..., None, None])  # in place: with a view, the slots are updated directly
    h.add_((d[..., None] * xf)[..., None] * B.float()[:, :, None, None])
    y = torch.einsum("ngrpk,ngk->ngrp", h, C.float())  # [n, G, R, P]
    if D is not None:
        y = y + D.float().view(groups, rep, 1) * xf
    write_states(ssm_state, slots, states, in_place)
    return y.reshape(n, heads, head_dim)


def _segment_sum(a: torch.Tensor) -> torch.Tensor:
    """a [..., Q] → [..., Q, Q] with entry [t, s] = Σ_{s<r≤t} a_r for s ≤ t, −inf above the
    diagonal. Sums masked copies instead of subtracting two cumsums (no cancellation)."""
    q = a.shape[-1]
    below = torch.tril(torch.ones(q, q, dtype=torch.bool, device=a.device), diagonal=-1)
    on_or_below = torch.tril(torch.ones(q, q, dtype=torch.bool, device=a.device))
    grid = a[..., :, None].expand(*a.shape, q).masked_fill(~below, 0.0)  # [.., r, s] = a_r, r>s
    return grid.cumsum(-2).masked_fill(~on_or_below, -math.inf)


def _chunk_layout(
    starts: list[int], lengths: list[int], chunk: int, pad_row: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Cut each sequence into chunks of `chunk` rows. Returns token [K, Q] (the packed row of
    each chunk position, `pad_row` past a sequence's end), valid [K, Q], and chunk_map
    [S, max_chunks] (the chunk id of a sequence's c-th chunk, K where it has fewer)."""
    counts = [-(-n // chunk) for n in lengths]
    total, widest = sum(counts), max(counts)
    seq = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))  # [K]
    first = torch.tensor([0, *counts[:-1]]).cumsum(0)  # first chunk id of each sequence
    index_in_seq = torch.arange(total) - first[seq]
    start, end = torch.tensor(starts), torch.tensor(starts) + torch.tensor(lengths)
    token = start[seq, None] + index_in_seq[:, None] * chunk + torch.arange(chunk)  # [K, Q]
    valid = token < end[seq, None]
    token = torch.where(valid, token, pad_row)
    column = torch.arange(widest)
    chunk_map = torch.where(
        column < torch.tensor(counts)[:, None], first[:, None] + column, total
    )  # [S, max_chunks]
    return token.to(device), valid.to(device), chunk_map.to(device)


def _chunked(
    x: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    ssm_state: torch.Tensor,
    starts: list[int],
    lengths: list[int],
    slots: torch.Tensor,
    fresh: torch.Tensor,
    chunk: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences with several new tokens. Returns (rows [T'] of x they own, y [T', H, P])."""
    tokens, heads, head_dim = x.shape
    groups, state = B.shape[1], B.shape[2]
    rep = heads // groups
    chunk = min(chunk, max(lengths))  # short prefills: no padding up to a whole chunk
    token, valid, chunk_map = _chunk_layout(starts, lengths, chunk, tokens, x.device)
    k = token.shape[0]

    def gather(t: torch.Tensor) -> torch.Tensor:  # pad row of zeros, then [K, Q, ...]
        return torch.cat([t.float(), t.new_zeros((1, *t.shape[1:]), dtype=torch.float32)])[token]

    xc = gather(x).view(k, chunk, groups, rep, head_dim)
    d = gather(delta).view(k, chunk, groups, rep)  # δ = 0 on padding: decay 1, no input
    Bc, Cc = gather(B), gather(C)  # [K, Q, G, N]
    a = d * A.float().view(groups, rep)  # [K, Q, G, R]
    a_cum = a.cumsum(1)
    xd = xc * d[..., None]  # δ_s x_s

    # intra-chunk: y_t = Σ_{s≤t} exp(a_t − a_s) (C_t·B_s) δ_s x_s
    decay_ts = torch.exp(_segment_sum(a.permute(0, 2, 3, 1)))  # [K, G, R, Q(t), Q(s)]
    scores = torch.einsum("ktgn,ksgn->kgts", Cc, Bc)  # [K, G, Q, Q]
    y = torch.einsum("kgrts,ksgrp->ktgrp", decay_ts * scores[:, :, None], xd)

    # each chunk's own end state: Σ_s exp(a_Q − a_s) δ_s x_s ⊗ B_s (suffix sums, no cancellation)
    to_end = torch.exp(F.pad(a.flip(1).cumsum(1).flip(1)[:, 1:], (0, 0, 0, 0, 0, 1)))
    own = torch.einsum("ksgrp,ksgn->kgrpn", xd * to_end[..., None], Bc)  # [K, G, R, P, N]
    own = own.reshape(k, heads, head_dim, state)
    chunk_decay = torch.exp(a_cum[:, -1]).reshape(k, heads)  # [K, H]

    # inter-chunk recurrence, one step per chunk index, vectorised over sequences; chunk id K
    # is a dummy (decay 1, no input) so finished sequences keep their final state
    own = torch.cat([own, own.new_zeros((1, heads, head_dim, state))])
    chunk_decay = torch.cat([chunk_decay, chunk_decay.new_ones((1, heads))])
    h = _initial_state(ssm_state, slots, fresh)  # [S, H, P, N]
    carried = own.new_empty(own.shape)  # state entering each chunk
    for c in range(chunk_map.shape[1]):
        ids = chunk_map[:, c]
        carried[ids] = h
        h = h * chunk_decay[ids][..., None, None] + own[ids]
    ssm_state.index_copy_(0, slots, h.to(ssm_state.dtype))

    # carried state → outputs: exp(a_t) · H_in · C_t
    carried = carried[:k].view(k, groups, rep, head_dim, state)
    y = y + torch.einsum("ktgn,kgrpn->ktgrp", Cc, carried) * torch.exp(a_cum)[..., None]
    if D is not None:
        y = y + D.float().view(groups, rep, 1) * xc
    y = y.reshape(k, chunk, heads, head_dim)
    return token[valid], y[valid]


def _check(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    ssm_state: torch.Tensor,
    query_start_loc: list[int],
    state_slots: torch.Tensor,
    fresh: torch.Tensor,
) -> None:
    tokens, heads, head_dim = x.shape
    groups, state = B.shape[1], B.shape[2]
    seqs = len(query_start_loc) - 1
    assert dt.shape == (tokens, heads) and A.shape == (heads,), (dt.shape, A.shape)
    assert B.shape == C.shape == (tokens, groups, state) and heads % groups == 0, B.shape
    assert ssm_state.shape[1:] == (heads, head_dim, state), ssm_state.shape
    assert state_slots.shape == fresh.shape == (seqs,), (state_slots.shape, fresh.shape)
    assert query_start_loc[0] == 0 and query_start_loc[-1] == tokens, query_start_loc


@SSD_SCAN_BACKENDS.decorator("torch")
def ssd_scan(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    ssm_state: torch.Tensor,
    query_start_loc: list[int],
    state_slots: torch.Tensor,
    fresh: torch.Tensor,
    chunk_size: int = 256,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
    dt_limit: DtLimit = NO_LIMIT,
) -> torch.Tensor:
    """The scan of the module docstring; one-token sequences take the recurrent step, longer
    ones the chunked form, in the same call. A sequence with no new tokens keeps its state
    (zeroed when fresh, as ops/causal_conv1d.py does)."""
    _check(x, dt, A, B, C, ssm_state, query_start_loc, state_slots, fresh)
    delta = discretize_dt(dt, dt_bias, dt_softplus, dt_limit)  # [T, H] fp32
    out = torch.empty_like(x)
    starts = query_start_loc[:-1]
    lengths = [end - start for start, end in zip(starts, query_start_loc[1:], strict=True)]
    one = [i for i, n in enumerate(lengths) if n == 1]
    many = [i for i, n in enumerate(lengths) if n > 1]
    empty = [i for i, n in enumerate(lengths) if n == 0]
    device = x.device
    state_slots, fresh = state_slots.to(device), fresh.to(device)
    if empty:
        seq = torch.tensor(empty, device=device)
        slots = state_slots[seq]
        initial = _initial_state(ssm_state, slots, fresh[seq])
        ssm_state.index_copy_(0, slots, initial.to(ssm_state.dtype))
    if one:
        seq = torch.tensor(one, device=device)
        rows = torch.tensor([starts[i] for i in one], device=device)
        out[rows] = _step(
            x[rows], delta[rows], A, B[rows], C[rows], D, ssm_state,
            state_slots[seq], fresh[seq],
        ).to(x.dtype)  # fmt: skip
    if many:
        seq = torch.tensor(many, device=device)
        rows, y = _chunked(
            x, delta, A, B, C, D, ssm_state, [starts[i] for i in many], [lengths[i] for i in many],
            state_slots[seq], fresh[seq], chunk_size,
        )  # fmt: skip
        out[rows] = y.to(x.dtype)
    return out


def _rows(t: torch.Tensor, width: int) -> int | None:
    """The token stride of t [T, ...] whose trailing dims hold `width` contiguous floats, or
    None when they do not (the caller then copies)."""
    inner = t[0] if t.shape[0] else t
    if inner.numel() and not inner.is_contiguous():
        return None
    return t.stride(0) if t.shape[0] > 1 else width


@SSD_SCAN_BACKENDS.decorator("native")
def ssd_scan_native(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    ssm_state: torch.Tensor,
    query_start_loc: list[int],
    state_slots: torch.Tensor,
    fresh: torch.Tensor,
    chunk_size: int = 256,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
    dt_limit: DtLimit = NO_LIMIT,
) -> torch.Tensor:
    """The torch row's contract, computed by kernels/ssd_scan_f32.c (chunk_size unused: the
    recurrence has no chunks). Falls back to the torch row off the CPU, without a compiler, or
    for inputs or a state that are not fp32."""
    fn = kernel("ssd_scan_f32", P, L, P, P, P, P, L, P, P, P, P, P, P, L, L, L, L, L, I)
    f32 = torch.float32
    if (
        fn is None
        or x.device.type != "cpu"
        or ssm_state.dtype != f32
        or not ssm_state.is_contiguous()
        or any(t.dtype != f32 for t in (x, B, C))
    ):
        return ssd_scan(
            x, dt, A, B, C, D, ssm_state, query_start_loc, state_slots, fresh, chunk_size,
            dt_bias, dt_softplus, dt_limit,
        )  # fmt: skip
    _check(x, dt, A, B, C, ssm_state, query_start_loc, state_slots, fresh)
    tokens, heads, head_dim = x.shape
    groups, state = B.shape[1], B.shape[2]
    x_rows = _rows(x, heads * head_dim)
    if x_rows is None:
        x = x.contiguous()
        x_rows = heads * head_dim
    bc_rows = _rows(B, groups * state)
    if bc_rows is None or _rows(C, groups * state) != bc_rows:
        B, C = B.contiguous(), C.contiguous()
        bc_rows = groups * state
    delta = discretize_dt(dt, dt_bias, dt_softplus, dt_limit).contiguous()
    starts = torch.tensor(query_start_loc, dtype=torch.int64)
    slots = state_slots.to("cpu", torch.int64).contiguous()
    fresh_bytes = fresh.to("cpu", torch.uint8).contiguous()
    A32 = A.float().contiguous()
    D32 = D.float().contiguous() if D is not None else None
    y = torch.empty(tokens, heads, head_dim, dtype=f32)
    fn(
        x.data_ptr(), x_rows, delta.data_ptr(), A32.data_ptr(), B.data_ptr(), C.data_ptr(),
        bc_rows, D32.data_ptr() if D32 is not None else None, ssm_state.data_ptr(),
        starts.data_ptr(), slots.data_ptr(), fresh_bytes.data_ptr(), y.data_ptr(),
        len(query_start_loc) - 1, heads, head_dim, state, groups, torch.get_num_threads(),
    )  # fmt: skip
    return y
