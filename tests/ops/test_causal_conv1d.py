"""causal_conv1d: the vectorised backend against the plain-loop reference (odd sizes, size 1,
mixed prefill + decode batches, continuations), against F.conv1d, and metamorphic: one call
== the same tokens split into chunks carrying state == token-by-token decode."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from infergen.ops import causal_conv1d as cc

BACKENDS = cc.CAUSAL_CONV1D_BACKENDS.names()


def _starts(lengths: list[int]) -> list[int]:
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    return starts


def _case(lengths, channels, width, slots_total, seed, bias=True):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(sum(lengths), channels, generator=gen)
    weight = torch.randn(channels, width, generator=gen)
    b = torch.randn(channels, generator=gen) if bias else None
    state = torch.randn(slots_total, channels, width - 1, generator=gen)
    slots = torch.randperm(slots_total, generator=gen)[: len(lengths)]
    return x, weight, b, state, slots


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "lengths",
    [[1], [2], [1, 1, 1, 1, 1], [5, 1, 17, 1, 3], [1, 70, 2, 1], [3, 0, 4]],
)
# (3, 9): wider than the native kernel takes (its torch fallback); 70 channels: two blocks
@pytest.mark.parametrize(
    "channels,width", [(1, 1), (1, 4), (5, 2), (33, 4), (7, 5), (3, 9), (70, 4)]
)
@pytest.mark.parametrize("activation", ["silu", None])
def test_against_reference(backend, lengths, channels, width, activation):
    x, weight, bias, state, slots = _case(lengths, channels, width, len(lengths) + 3, seed=7)
    fresh = torch.tensor([i % 2 == 0 for i in range(len(lengths))])  # the rest continue
    qsl = _starts(lengths)
    state_ref, state_got = state.clone(), state.clone()
    want = cc.reference(x, weight, bias, state_ref, qsl, slots, fresh, activation)
    got = cc.CAUSAL_CONV1D_BACKENDS.get(backend)(
        x, weight, bias, state_got, qsl, slots, fresh, activation
    )
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state_got, state_ref, rtol=0, atol=0)
    unused = [s for s in range(state.shape[0]) if s not in slots.tolist()]
    torch.testing.assert_close(state_got[unused], state[unused], rtol=0, atol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_strided_rows_as_the_mixer_passes_them(backend):
    """x is a column slice of a wider projection (Mamba2Mixer's xBC out of in_proj)."""
    lengths, channels = [6, 1, 3], 9
    x, weight, bias, state, slots = _case(lengths, channels, 4, 5, seed=11)
    wide = torch.cat([torch.randn(len(x), 5), x, torch.randn(len(x), 2)], dim=1)
    view = wide[:, 5 : 5 + channels]
    assert view.stride(0) == wide.shape[1]
    fresh = torch.tensor([False, True, False])
    state_ref, state_got = state.clone(), state.clone()
    want = cc.reference(x, weight, bias, state_ref, _starts(lengths), slots, fresh)
    got = cc.CAUSAL_CONV1D_BACKENDS.get(backend)(
        view, weight, bias, state_got, _starts(lengths), slots, fresh
    )
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state_got, state_ref, rtol=0, atol=0)


def test_reference_matches_conv1d():
    """A fresh sequence is F.conv1d with width-1 zeros on the left (the oracle's oracle)."""
    x, weight, bias, state, slots = _case([11], 6, 4, 2, seed=3)
    got = cc.reference(x, weight, bias, state, [0, 11], slots, torch.tensor([True]))
    want = F.conv1d(x.T[None], weight[:, None], bias, padding=3, groups=6)[0, :, :11].T
    torch.testing.assert_close(got, F.silu(want), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(state[slots[0]], x[-3:].T, rtol=0, atol=0)


def test_short_continuation_keeps_older_state():
    """One new token after a state: the new state is the last two old inputs + the new one."""
    weight = torch.randn(3, 4)
    state = torch.randn(1, 3, 3)
    old = state.clone()
    x = torch.randn(1, 3)
    cc.causal_conv1d(x, weight, None, state, [0, 1], torch.tensor([0]), torch.tensor([False]))
    torch.testing.assert_close(state[0], torch.cat([old[0, :, 1:], x.T], dim=1), rtol=0, atol=0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("width", [1, 2, 4])
def test_chunked_and_token_by_token_match_one_call(backend, width):
    fn = cc.CAUSAL_CONV1D_BACKENDS.get(backend)
    splits = {0: [7, 13, 1, 1, 2, 6], 1: [1] * 30, 2: [29, 1]}  # three sequences of 30 tokens
    channels = 9
    gen = torch.Generator().manual_seed(11)
    xs = [torch.randn(30, channels, generator=gen) for _ in splits]
    weight, bias = torch.randn(channels, width, generator=gen), torch.randn(channels, generator=gen)
    slots = torch.tensor([2, 0, 1])

    whole_state = torch.randn(3, channels, width - 1)
    whole = fn(
        torch.cat(xs),
        weight,
        bias,
        whole_state,
        [0, 30, 60, 90],
        slots,
        torch.ones(3, dtype=torch.bool),
    )

    state = torch.randn(3, channels, width - 1)  # garbage: the first pieces are fresh
    done = [0, 0, 0]
    pieces: list[list[torch.Tensor]] = [[], [], []]
    step = 0
    while any(d < 30 for d in done):  # a batch per step: each sequence's next piece, if any
        members = [i for i in splits if step < len(splits[i])]
        lengths = [splits[i][step] for i in members]
        x = torch.cat([xs[i][done[i] : done[i] + n] for i, n in zip(members, lengths, strict=True)])
        fresh = torch.tensor([done[i] == 0 for i in members])
        y = fn(x, weight, bias, state, _starts(lengths), slots[members], fresh)
        for i, piece in zip(members, y.split(lengths), strict=True):
            pieces[i].append(piece)
            done[i] += splits[i][step]
        step += 1
    torch.testing.assert_close(
        torch.cat([torch.cat(p) for p in pieces]), whole, rtol=1e-5, atol=1e-6
    )
    torch.testing.assert_close(state, whole_state, rtol=0, atol=0)


def test_bad_shapes_are_named():
    weight, state = torch.randn(4, 3), torch.zeros(2, 4, 2)
    with pytest.raises(ValueError, match="conv_state"):
        cc.causal_conv1d(
            torch.randn(2, 4),
            weight,
            None,
            torch.zeros(2, 4, 3),
            [0, 2],
            torch.tensor([0]),
            torch.tensor([True]),
        )
    with pytest.raises(ValueError, match="query_start_loc"):
        cc.causal_conv1d(
            torch.randn(2, 4), weight, None, state, [0, 1], torch.tensor([0]), torch.tensor([True])
        )
