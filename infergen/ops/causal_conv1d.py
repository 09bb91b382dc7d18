"""Short causal depthwise convolution over a packed varlen batch, with per-sequence state.

For each sequence i (rows query_start_loc[i]:query_start_loc[i+1] of x) and channel c, with
the sequence's previous inputs prepended (its state slot, or zeros when `fresh[i]`):

    ext_i = [state_i (width-1 columns) | x_i^T]                       # [channels, width-1+L]
    y_i[t, c] = act(bias[c] + Σ_{j<width} weight[c, j] · ext_i[c, t + j])
    state_i ← ext_i[:, -(width-1):]                                   (in place)

(the cross-correlation of F.conv1d with width-1 zeros/state on the left). Used by the Qwen3-Next
gated DeltaNet mixer and by Mamba2.

Bytes moved: read T·C inputs, C·W weights and N·C·(W-1) state; write T·C outputs and
N·C·(W-1) state (N sequences, T tokens, C channels, W width).

Backends (CAUSAL_CONV1D_BACKENDS): "torch" (gathers into a buffer with each sequence's state
rows in front of its tokens, then W shifted multiply-adds: no Python loop over tokens or
sequences); "native" (kernels/causal_conv1d_f32.c: one pass per sequence and block of
channels, the state in registers; fp32 inputs and state, width ≤ 8, else the torch row).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from infergen.kernels.build import I, L, P, kernel
from infergen.ops.state_slots import read_states, write_states
from infergen.registry import Registry

NATIVE_MAX_WIDTH = 8  # kernels/causal_conv1d_f32.c MAX_WIDTH
CausalConv1dFn = Callable[..., torch.Tensor]
CAUSAL_CONV1D_BACKENDS: Registry[CausalConv1dFn] = Registry("causal_conv1d backend")

ACTIVATIONS: dict[str | None, Callable[[torch.Tensor], torch.Tensor]] = {
    None: lambda t: t,
    "silu": F.silu,
}


def _check(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    query_start_loc: list[int],
    state_slots: torch.Tensor,
    fresh: torch.Tensor,
    activation: str | None,
) -> None:
    channels, width = weight.shape
    num_seqs = len(query_start_loc) - 1
    if x.dim() != 2 or x.shape[1] != channels:
        raise ValueError(f"causal_conv1d: x {tuple(x.shape)}, expected [tokens, {channels}]")
    if tuple(conv_state.shape[1:]) != (channels, width - 1):
        raise ValueError(
            f"causal_conv1d: conv_state {tuple(conv_state.shape)}, "
            f"expected [slots, {channels}, {width - 1}]"
        )
    if query_start_loc[0] != 0 or query_start_loc[-1] != x.shape[0]:
        raise ValueError(
            f"causal_conv1d: query_start_loc {query_start_loc} must run from 0 to {x.shape[0]}"
        )
    if state_slots.shape != (num_seqs,) or fresh.shape != (num_seqs,):
        raise ValueError(
            f"causal_conv1d: state_slots {tuple(state_slots.shape)} and fresh "
            f"{tuple(fresh.shape)} must both be [{num_seqs}] (one per sequence)"
        )
    if activation not in ACTIVATIONS:
        raise ValueError(f"causal_conv1d: activation {activation!r}, expected one of silu, None")


def reference(
    x: torch.Tensor,  # [tokens, channels]
    weight: torch.Tensor,  # [channels, width]
    bias: torch.Tensor | None,  # [channels]
    conv_state: torch.Tensor,  # [slots, channels, width-1], updated in place
    query_start_loc: list[int],
    state_slots: torch.Tensor,  # [seqs] int64
    fresh: torch.Tensor,  # [seqs] bool
    activation: str | None = "silu",
) -> torch.Tensor:
    """Plain loops over sequences, tokens and taps, in float64."""
    _check(x, weight, conv_state, query_start_loc, state_slots, fresh, activation)
    channels, width = weight.shape
    w64 = weight.double()
    out = torch.empty(x.shape, dtype=torch.float64)
    for i in range(len(query_start_loc) - 1):
        start, end = query_start_loc[i], query_start_loc[i + 1]
        slot = int(state_slots[i])
        history = [torch.zeros(channels, dtype=torch.float64) for _ in range(width - 1)]
        if not bool(fresh[i]):
            history = [conv_state[slot, :, j].double() for j in range(width - 1)]
        for t in range(start, end):
            history.append(x[t].double())
            window = history[-width:]  # oldest first: tap j multiplies window[j]
            acc = torch.zeros(channels, dtype=torch.float64)
            if bias is not None:
                acc += bias.double()
            for j in range(width):
                acc += w64[:, j] * window[j]
            out[t] = ACTIVATIONS[activation](acc)
        for j in range(width - 1):
            conv_state[slot, :, j] = history[len(history) - (width - 1) + j]
    return out.to(x.dtype)


def _decode_step(x, weight, bias, conv_state, state_slots, fresh, activation) -> torch.Tensor:
    """One token per sequence: the window is the state's width-1 inputs and the token; the new
    state drops the oldest (in place when the slots are a contiguous range, as usual)."""
    acc_dtype = torch.promote_types(x.dtype, torch.float32)
    slots = state_slots.to(device=x.device, dtype=torch.int64)
    prev, in_place = read_states(conv_state, slots, fresh)  # [seqs, channels, hist] fp32
    window = torch.cat([prev.to(acc_dtype), x.to(acc_dtype)[:, :, None]], dim=-1)
    y = (window * weight.to(acc_dtype)).sum(-1)
    if bias is not None:
        y += bias.to(acc_dtype)
    if in_place:
        prev.copy_(window[..., 1:])
    else:
        write_states(conv_state, slots, window[..., 1:], False)
    return ACTIVATIONS[activation](y).to(x.dtype)


@CAUSAL_CONV1D_BACKENDS.decorator("torch")
def causal_conv1d(
    x: torch.Tensor,  # [tokens, channels]
    weight: torch.Tensor,  # [channels, width]
    bias: torch.Tensor | None,  # [channels]
    conv_state: torch.Tensor,  # [slots, channels, width-1], updated in place
    query_start_loc: list[int],
    state_slots: torch.Tensor,  # [seqs] int64
    fresh: torch.Tensor,  # [seqs] bool
    activation: str | None = "silu",
) -> torch.Tensor:
    """Returns y [tokens, channels] in x's dtype (accumulated in fp32); see the module doc.

    Each sequence must use a distinct state slot. Zero-length sequences are allowed (their
    state is kept, or zeroed when fresh)."""
    _check(x, weight, conv_state, query_start_loc, state_slots, fresh, activation)
    channels, width = weight.shape
    hist = width - 1
    num_seqs = len(query_start_loc) - 1
    tokens = x.shape[0]
    if tokens == num_seqs and hist > 0:  # a decode step: one token per sequence
        return _decode_step(x, weight, bias, conv_state, state_slots, fresh, activation)
    device = x.device
    acc_dtype = torch.promote_types(x.dtype, torch.float32)

    starts = torch.tensor(query_start_loc, dtype=torch.int64, device=device)
    lengths = starts[1:] - starts[:-1]  # [seqs]
    seq_of_token = torch.repeat_interleave(
        torch.arange(num_seqs, device=device), lengths, output_size=tokens
    )  # [tokens]
    # Buffer rows: sequence i owns rows [starts[i] + i·hist, starts[i+1] + (i+1)·hist): its
    # hist state rows first, then its tokens.
    seq_base = starts[:-1] + hist * torch.arange(num_seqs, device=device)  # [seqs]
    token_row = torch.arange(tokens, device=device) + hist * (seq_of_token + 1)  # [tokens]
    slots = state_slots.to(device=device, dtype=torch.int64)

    prev = conv_state.index_select(0, slots).to(acc_dtype)  # [seqs, channels, hist]
    # where, not a multiply by 0: a reused slot may hold NaN from an earlier sequence
    prev = torch.where(fresh.to(device)[:, None, None], torch.zeros_like(prev), prev)
    ext = torch.empty(tokens + num_seqs * hist, channels, dtype=acc_dtype, device=device)
    if hist > 0:
        state_rows = seq_base[:, None] + torch.arange(hist, device=device)  # [seqs, hist]
        ext[state_rows.reshape(-1)] = prev.transpose(1, 2).reshape(-1, channels)
    ext[token_row] = x.to(acc_dtype)

    # y[t] = Σ_j w[:, j] · ext[token_row[t] - hist + j]
    window_start = token_row - hist  # [tokens]
    w = weight.to(acc_dtype)
    y = ext[window_start] * w[:, 0]
    for j in range(1, width):
        y += ext[window_start + j] * w[:, j]
    if bias is not None:
        y += bias.to(acc_dtype)
    y = ACTIVATIONS[activation](y)

    if hist > 0:  # the last hist rows of each sequence's buffer span become its state
        last_rows = (seq_base + lengths)[:, None] + torch.arange(hist, device=device)
        new_state = ext[last_rows.reshape(-1)].reshape(num_seqs, hist, channels)
        conv_state.index_copy_(0, slots, new_state.transpose(1, 2).to(conv_state.dtype))
    return y.to(x.dtype)


@CAUSAL_CONV1D_BACKENDS.decorator("native")
def causal_conv1d_native(
    x: torch.Tensor,  # [tokens, channels]
    weight: torch.Tensor,  # [channels, width]
    bias: torch.Tensor | None,  # [channels]
    conv_state: torch.Tensor,  # [slots, channels, width-1], updated in place
    query_start_loc: list[int],
    state_slots: torch.Tensor,  # [seqs] int64
    fresh: torch.Tensor,  # [seqs] bool
    activation: str | None = "silu",
) -> torch.Tensor:
    """The torch row's contract, computed by kernels/causal_conv1d_f32.c; the torch row off
    the CPU, without a compiler, or for what the kernel does not take."""
    fn = kernel("causal_conv1d_f32", P, L, P, P, P, P, P, P, P, L, L, L, I, I)
    f32 = torch.float32
    native = (
        fn is not None
        and x.device.type == "cpu"
        and all(t.dtype == f32 for t in (x, weight, conv_state))
        and (bias is None or bias.dtype == f32)
        and conv_state.is_contiguous()
        and x.dim() == 2
        and 1 <= weight.shape[1] <= NATIVE_MAX_WIDTH
        and (x.shape[0] == 0 or x.stride(1) == 1)
    )
    if native:
        _check(x, weight, conv_state, query_start_loc, state_slots, fresh, activation)
        channels, width = weight.shape
        weight = weight.contiguous()
        bias = bias.contiguous() if bias is not None else None
        starts = torch.tensor(query_start_loc, dtype=torch.int64)
        slots = state_slots.to("cpu", torch.int64).contiguous()
        fresh_bytes = fresh.to("cpu", torch.uint8).contiguous()
        y = torch.empty(x.shape, dtype=f32)
        fn(
            x.data_ptr(), x.stride(0) if x.shape[0] > 1 else channels, weight.data_ptr(),
            bias.data_ptr() if bias is not None else None, conv_state.data_ptr(),
            starts.data_ptr(), slots.data_ptr(), fresh_bytes.data_ptr(), y.data_ptr(),
            len(query_start_loc) - 1, channels, width, int(activation == "silu"),
            torch.get_num_threads(),
        )  # fmt: skip
        return y
    return causal_conv1d(
        x, weight, bias, conv_state, query_start_loc, state_slots, fresh, activation
    )
