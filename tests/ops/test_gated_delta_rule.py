"""gated_delta_rule: the torch backend (chunked prefill + recurrent decode) against the float64
per-token reference on odd sizes, size 1, mixed batches and continuations; against
transformers' own Qwen3-Next torch functions; and metamorphic: one call == chunks carrying
state == token-by-token decode, for any chunk size."""

from __future__ import annotations

import importlib

import pytest
import torch

from infergen.ops import gated_delta_rule as gdr

BACKENDS = gdr.GATED_DELTA_RULE_BACKENDS.names()


def _starts(lengths: list[int]) -> list[int]:
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    return starts


def _inputs(tokens, k_heads, v_heads, k_dim, v_dim, seed, strong_decay=False):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(tokens, k_heads, k_dim, generator=gen)
    k = torch.randn(tokens, k_heads, k_dim, generator=gen)
    v = torch.randn(tokens, v_heads, v_dim, generator=gen)
    scale = 20.0 if strong_decay else 0.5
    g = -scale * torch.rand(tokens, v_heads, generator=gen)
    beta = torch.rand(tokens, v_heads, generator=gen)
    return q, k, v, g, beta


def _assert_close(got, want, rel=1e-5):
    atol = rel * max(1.0, float(want.abs().max()))
    torch.testing.assert_close(got, want, rtol=rel * 10, atol=atol)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "lengths",
    [[1], [2], [1, 1, 1], [5, 1, 64, 1, 3], [65, 1, 130], [3, 0, 2, 1]],
)
@pytest.mark.parametrize("heads", [(1, 1, 1, 1), (2, 4, 8, 5), (3, 3, 16, 7), (1, 3, 4, 6)])
def test_against_reference(backend, lengths, heads):
    k_heads, v_heads, k_dim, v_dim = heads
    q, k, v, g, beta = _inputs(sum(lengths), k_heads, v_heads, k_dim, v_dim, seed=len(lengths))
    slots_total = len(lengths) + 2
    state = torch.randn(slots_total, v_heads, k_dim, v_dim)
    slots = torch.randperm(slots_total, generator=torch.Generator().manual_seed(1))[: len(lengths)]
    fresh = torch.tensor([i % 2 == 1 for i in range(len(lengths))])  # the rest continue
    qsl = _starts(lengths)
    state_ref, state_got = state.clone(), state.clone()
    want = gdr.reference(q, k, v, g, beta, state_ref, qsl, slots, fresh)
    got = gdr.GATED_DELTA_RULE_BACKENDS.get(backend)(q, k, v, g, beta, state_got, qsl, slots, fresh)
    _assert_close(got, want)
    _assert_close(state_got, state_ref)
    unused = [s for s in range(slots_total) if s not in slots.tolist()]
    torch.testing.assert_close(state_got[unused], state[unused], rtol=0, atol=0)


@pytest.mark.parametrize("chunk_size", [1, 4, 64])
def test_strong_decay_and_chunk_sizes(chunk_size):
    """g down to −20 per token (exp underflows over a chunk) and any chunk size: no NaN."""
    q, k, v, g, beta = _inputs(150, 2, 4, 8, 6, seed=5, strong_decay=True)
    state = torch.randn(2, 4, 8, 6)
    qsl, slots, fresh = [0, 100, 150], torch.tensor([1, 0]), torch.tensor([False, True])
    state_ref, state_got = state.clone(), state.clone()
    want = gdr.reference(q, k, v, g, beta, state_ref, qsl, slots, fresh)
    got = gdr.gated_delta_rule(
        q, k, v, g, beta, state_got, qsl, slots, fresh, chunk_size=chunk_size
    )
    assert torch.isfinite(got).all()
    _assert_close(got, want)
    _assert_close(state_got, state_ref)


def test_against_transformers_functions():
    """A second, independent oracle: Hugging Face's torch chunked and recurrent forms."""
    qwen3_next = importlib.import_module("transformers.models.qwen3_next.modeling_qwen3_next")
    q, k, v, g, beta = _inputs(77, 2, 4, 8, 6, seed=9)
    s0 = torch.randn(1, 4, 8, 6)
    state = s0.clone()
    got = gdr.gated_delta_rule(
        q, k, v, g, beta, state, [0, 77], torch.tensor([0]), torch.tensor([False])
    )
    for hf in (
        qwen3_next.torch_chunk_gated_delta_rule,
        qwen3_next.torch_recurrent_gated_delta_rule,
    ):
        want, final = hf(
            q[None],
            k[None],
            v[None],
            g[None],
            beta[None],
            initial_state=s0.clone(),
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
        )
        _assert_close(got, want[0])
        _assert_close(state, final)


@pytest.mark.parametrize("backend", BACKENDS)
def test_chunked_and_token_by_token_match_one_call(backend):
    fn = gdr.GATED_DELTA_RULE_BACKENDS.get(backend)
    length = 100
    splits = {0: [7, 13, 1, 1, 64, 14], 1: [1] * length, 2: [2, 97, 1]}
    q, k, v, g, beta = _inputs(3 * length, 2, 4, 8, 6, seed=21)
    slots = torch.tensor([1, 2, 0])
    whole_state = torch.zeros(3, 4, 8, 6)
    whole = fn(
        q,
        k,
        v,
        g,
        beta,
        whole_state,
        [0, length, 2 * length, 3 * length],
        slots,
        torch.ones(3, dtype=torch.bool),
    )

    state = torch.randn(3, 4, 8, 6)  # garbage: the first pieces are fresh
    done = [0, 0, 0]
    pieces: list[list[torch.Tensor]] = [[], [], []]
    for step in range(length):
        members = [i for i in splits if step < len(splits[i])]
        if not members:
            break
        lengths = [splits[i][step] for i in members]
        rows = torch.cat(
            [torch.arange(n) + i * length + done[i] for i, n in zip(members, lengths, strict=True)]
        )
        fresh = torch.tensor([done[i] == 0 for i in members])
        out = fn(
            q[rows],
            k[rows],
            v[rows],
            g[rows],
            beta[rows],
            state,
            _starts(lengths),
            slots[members],
            fresh,
        )
        for i, n, piece in zip(members, lengths, out.split(lengths), strict=True):
            pieces[i].append(piece)
            done[i] += n
    assert done == [length] * 3
    _assert_close(torch.cat([torch.cat(p) for p in pieces]), whole)
    _assert_close(state, whole_state)


def test_bad_shapes_are_named():
    q, k, v, g, beta = _inputs(3, 2, 3, 4, 5, seed=0)
    with pytest.raises(ValueError, match="multiple"):
        gdr.gated_delta_rule(
            q,
            k,
            v,
            g,
            beta,
            torch.zeros(1, 3, 4, 5),
            [0, 3],
            torch.tensor([0]),
            torch.tensor([True]),
        )
