"""Speculative sampling's verification (engine/spec/rejection.py): whatever is drafted, each
emitted token is distributed as the target's sample at its position — chi-square tests of the
first token's and of the second token's (given a kept first draft) empirical frequencies
against the target distributions, for drafts the target likes, dislikes and excludes; and
seeded runs repeat."""

from __future__ import annotations

import pytest
import torch

from infergen.engine.spec.rejection import verify_drafts

VOCAB, N = 6, 20000
# chi-square's 1 - 1e-4 quantiles by degrees of freedom (a false alarm once in 10^4 runs)
CHI2_CRITICAL = {1: 15.14, 2: 18.42, 3: 21.11, 4: 23.51, 5: 25.74}


def _dists(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    probs = torch.rand(3, VOCAB, generator=g) ** 2
    probs[:, 5] = 0.0  # a token the target never samples (cut by top-k / top-p / min-p)
    return probs / probs.sum(dim=-1, keepdim=True)


def _chi2_ok(counts: torch.Tensor, expected_probs: torch.Tensor) -> None:
    keep = expected_probs > 0
    assert counts[~keep].sum() == 0  # never a token the target excludes
    observed = counts[keep].double()
    expected = expected_probs[keep].double() * observed.sum()
    stat = float(((observed - expected) ** 2 / expected).sum())
    assert stat < CHI2_CRITICAL[int(keep.sum()) - 1], (counts.tolist(), expected.tolist())


@pytest.mark.parametrize("drafts", [[2, 3], [5, 1], [0, 5]])
def test_emitted_tokens_follow_the_target_distribution(drafts):
    probs = _dists(1)
    g = torch.Generator().manual_seed(7)
    first = torch.zeros(VOCAB, dtype=torch.int64)
    second = torch.zeros(VOCAB, dtype=torch.int64)
    lengths = torch.zeros(4, dtype=torch.int64)
    for _ in range(N):
        out = verify_drafts(probs, drafts, g)
        lengths[len(out)] += 1
        first[out[0]] += 1
        if out[0] == drafts[0]:  # the first draft kept: the second position was verified
            second[out[1]] += 1
    _chi2_ok(first, probs[0])
    if second.sum() > 0:
        _chi2_ok(second, probs[1])
    # runs stop at the first rejection; all kept: one more token after the drafts
    assert lengths[0] == 0 and lengths.sum() == N
    keep0 = float(probs[0, drafts[0]])
    assert abs(float(lengths[2:].sum()) / N - keep0) < 0.02  # kept with probability p(d)


def test_seeded_runs_repeat():
    probs = _dists(2)
    runs = [
        [verify_drafts(probs, [1, 2], torch.Generator().manual_seed(s)) for s in range(50)]
        for _ in range(2)
    ]
    assert runs[0] == runs[1]
