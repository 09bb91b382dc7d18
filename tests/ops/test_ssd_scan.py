"""ssd_scan: every backend against the float64 per-token recurrence (`reference`) on odd sizes,
varlen batches mixing prefill and decode, fresh and carried state; and metamorphic checks:
one prefill == chunked prefills carrying state == token-by-token decode."""

from __future__ import annotations

import math

import pytest
import torch

from infergen.ops import ssd_scan
from tests.kernel_isa import assert_ok_with_isa

BACKENDS = ssd_scan.SSD_SCAN_BACKENDS.names()


def _inputs(lengths, heads, head_dim, groups, state, slots=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    tokens = sum(lengths)

    def randn(*shape):
        return torch.randn(*shape, generator=g)

    return {
        "x": randn(tokens, heads, head_dim),
        "dt": randn(tokens, heads),
        "A": -torch.rand(heads, generator=g) * 3 - 0.1,
        "B": randn(tokens, groups, state),
        "C": randn(tokens, groups, state),
        "D": randn(heads),
        "dt_bias": randn(heads),
        "ssm_state": randn(slots, heads, head_dim, state),
        "query_start_loc": [0, *torch.tensor(lengths).cumsum(0).tolist()],
    }


def _run(fn, inputs, slots, fresh, **kwargs):
    args = dict(inputs, ssm_state=inputs["ssm_state"].clone())
    y = fn(
        state_slots=torch.tensor(slots), fresh=torch.tensor(fresh), dt_softplus=True,
        **args, **kwargs,
    )  # fmt: skip
    return y, args["ssm_state"]


def _close(got, want):
    scale = want.abs().max().clamp_min(1.0)
    torch.testing.assert_close(got, want, rtol=0, atol=2e-5 * scale)


CASES = [
    # lengths, heads, head_dim, groups, state, chunk
    ([1], 1, 1, 1, 1, 4),
    ([1, 1, 1], 3, 5, 1, 7, 4),
    ([7], 2, 3, 2, 5, 4),
    ([8], 4, 2, 2, 3, 4),
    ([13, 1, 5, 2, 1], 6, 5, 3, 7, 4),
    ([1, 33, 0, 9], 4, 8, 1, 16, 8),
    ([17, 3], 2, 4, 1, 6, 256),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("lengths,heads,head_dim,groups,state,chunk", CASES)
def test_matches_reference(backend, lengths, heads, head_dim, groups, state, chunk):
    inputs = _inputs(lengths, heads, head_dim, groups, state)
    seqs = len(lengths)
    slots = [(3 * i + 2) % 8 for i in range(seqs)]
    fresh = [i % 2 == 0 for i in range(seqs)]  # fresh and carried-over state alternate
    fn = ssd_scan.SSD_SCAN_BACKENDS.get(backend)
    y, st = _run(fn, inputs, slots, fresh, chunk_size=chunk)
    y_ref, st_ref = _run(ssd_scan.reference, inputs, slots, fresh)
    _close(y, y_ref)
    _close(st, st_ref)
    untouched = [s for s in range(8) if s not in slots]
    assert torch.equal(st[untouched], inputs["ssm_state"][untouched])


@pytest.mark.parametrize("backend", BACKENDS)
def test_time_step_limit_and_no_D(backend):
    inputs = _inputs([1, 10, 3], 4, 3, 2, 5)
    inputs["D"] = None
    kwargs = {"chunk_size": 4, "dt_limit": (0.05, 0.4)}
    fn = ssd_scan.SSD_SCAN_BACKENDS.get(backend)
    y, st = _run(fn, inputs, [0, 1, 2], [True, False, True], **kwargs)
    y_ref, st_ref = _run(ssd_scan.reference, inputs, [0, 1, 2], [True, False, True], **kwargs)
    _close(y, y_ref)
    _close(st, st_ref)
    y_free, _ = _run(fn, inputs, [0, 1, 2], [True, False, True], chunk_size=4)
    assert not torch.allclose(y, y_free)  # the clamp mattered


@pytest.mark.parametrize("backend", BACKENDS)
def test_fresh_slot_ignores_garbage(backend):
    """A fresh sequence's slot may hold NaN from a previous owner: it must not leak."""
    inputs = _inputs([1, 6], 2, 3, 1, 4)
    inputs["ssm_state"][:] = math.nan
    y, st = _run(ssd_scan.SSD_SCAN_BACKENDS.get(backend), inputs, [4, 6], [True, True],
                 chunk_size=4)  # fmt: skip
    assert torch.isfinite(y).all() and torch.isfinite(st[[4, 6]]).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_prefill_equals_chunked_prefill_equals_decode(backend):
    """Metamorphic: the same sequences scanned (a) in one prefill, (b) as prefill pieces of
    uneven sizes carrying state, (c) token by token, give the same outputs and final state."""
    fn = ssd_scan.SSD_SCAN_BACKENDS.get(backend)
    lengths = [11, 6, 19]
    heads, head_dim, groups, state = 4, 3, 2, 5
    inputs = _inputs(lengths, heads, head_dim, groups, state)
    qsl = inputs["query_start_loc"]
    slots = torch.tensor([5, 0, 2])
    seq_rows = [list(range(qsl[i], qsl[i + 1])) for i in range(len(lengths))]

    def scan_pieces(pieces: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """pieces[i]: how many tokens each step gives sequence i (0: it sits the step out)."""
        st = inputs["ssm_state"].clone()
        out = torch.empty_like(inputs["x"])
        done = [0] * len(lengths)
        for step in range(len(pieces[0])):
            rows, bounds = [], [0]
            for i, piece in enumerate(pieces):
                rows += seq_rows[i][done[i] : done[i] + piece[step]]
                bounds.append(len(rows))
            idx = torch.tensor(rows, dtype=torch.long)
            y = fn(
                inputs["x"][idx], inputs["dt"][idx], inputs["A"], inputs["B"][idx],
                inputs["C"][idx], inputs["D"], st, bounds, slots,
                torch.tensor([d == 0 for d in done]), chunk_size=4,
                dt_bias=inputs["dt_bias"], dt_softplus=True,
            )  # fmt: skip
            out[idx] = y
            done = [d + piece[step] for d, piece in zip(done, pieces, strict=True)]
        assert done == lengths
        return out, st

    one_shot = scan_pieces([[n] for n in lengths])
    chunked = scan_pieces([[5, 0, 6], [1, 4, 1], [9, 7, 3]])  # sizes not multiples of 4
    widest = max(lengths)
    by_token = scan_pieces([[1] * n + [0] * (widest - n) for n in lengths])
    for got in (chunked, by_token):
        _close(got[0], one_shot[0])
        _close(got[1], one_shot[1])
    # and the one-shot run is right, not just self-consistent
    y_ref, st_ref = _run(ssd_scan.reference, inputs, slots.tolist(), [True] * 3)
    _close(one_shot[0], y_ref)
    _close(one_shot[1], st_ref)


def test_chunk_size_invariance():
    inputs = _inputs([37, 2], 2, 4, 2, 3)
    fn = ssd_scan.SSD_SCAN_BACKENDS.get("torch")
    results = [_run(fn, inputs, [1, 3], [True, False], chunk_size=c) for c in (1, 3, 16, 64)]
    for y, st in results[1:]:
        _close(y, results[0][0])
        _close(st, results[0][1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_strided_views_as_the_mixer_passes_them(backend):
    """x, B and C are column slices of one [T, I + 2·G·N] tensor (the conv's output split as
    Mamba2Mixer splits it): rows strided, each row's own values contiguous."""
    lengths, heads, head_dim, groups, state = [9, 1, 4], 4, 3, 2, 5
    inputs = _inputs(lengths, heads, head_dim, groups, state)
    tokens, gn = sum(lengths), groups * state
    packed = torch.cat(
        [t.reshape(tokens, -1) for t in (inputs["x"], inputs["B"], inputs["C"])], dim=1
    )
    xs, B, C = packed.split([heads * head_dim, gn, gn], dim=1)
    views = dict(
        inputs,
        x=xs.view(tokens, heads, head_dim),
        B=B.view(tokens, groups, state),
        C=C.view(tokens, groups, state),
    )
    assert views["x"].stride(0) == packed.shape[1]  # the case under test: strided rows
    fn = ssd_scan.SSD_SCAN_BACKENDS.get(backend)
    y, st = _run(fn, views, [3, 0, 5], [True, False, False], chunk_size=4)
    y_ref, st_ref = _run(ssd_scan.reference, inputs, [3, 0, 5], [True, False, False])
    _close(y, y_ref)
    _close(st, st_ref)


_PORTABLE_CHECK = """
import torch
from infergen.kernels.build import try_load
from infergen.ops import causal_conv1d as cc, ssd_scan
assert try_load("ssd_scan_f32") is not None and try_load("causal_conv1d_f32") is not None
g = torch.Generator().manual_seed(1)
T, H, Pd, G, N = 23, 4, 8, 2, 16
x, dt, B, C = (torch.randn(*s, generator=g) for s in ((T, H, Pd), (T, H), (T, G, N), (T, G, N)))
A, D = -torch.rand(H, generator=g) - 0.1, torch.randn(H, generator=g)
state = torch.randn(4, H, Pd, N, generator=g)
args = (x, dt, A, B, C, D)
qsl, slots, fresh = [0, 17, 18, 23], torch.tensor([2, 0, 3]), torch.tensor([True, False, False])
outs = []
for fn in (ssd_scan.ssd_scan_native, ssd_scan.reference):
    st = state.clone()
    outs.append((fn(*args, st, qsl, slots, fresh, dt_softplus=True), st))
for got, want in zip(outs[0], outs[1]):
    torch.testing.assert_close(got, want, rtol=0, atol=2e-5 * want.abs().max().item())
xc, w, b = torch.randn(T, 40, generator=g), torch.randn(40, 4, generator=g), torch.randn(40)
outs = []
for fn in (cc.causal_conv1d_native, cc.reference):
    st = torch.randn(4, 40, 3, generator=torch.Generator().manual_seed(2))
    outs.append((fn(xc, w, b, st, qsl, slots, fresh), st))
for got, want in zip(outs[0], outs[1]):
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
print("ok")
"""


def test_portable_kernels(tmp_path):
    """The scan's and the conv's C kernels built for the portable scalar path
    (INFERGEN_KERNEL_ISA=generic: no AVX) agree with the float64 references too."""
    assert_ok_with_isa("generic", _PORTABLE_CHECK, tmp_path)
