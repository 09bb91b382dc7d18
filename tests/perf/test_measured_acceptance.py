"""perf/measured_acceptance.chain_acceptance: the per-token α whose chain of d drafts (or of
a histogram's draft counts) emits T tokens a verifying step, against the geometric sum
computed term by term."""

from __future__ import annotations

import pytest

from infergen.perf.measured_acceptance import chain_acceptance


@pytest.mark.parametrize("drafts", [1, 2, 4, 8])
@pytest.mark.parametrize("alpha", [0.05, 0.3, 0.5, 0.8, 0.97])
def test_inverts_the_geometric_chain(alpha, drafts):
    tokens = sum(alpha**i for i in range(drafts + 1))
    assert chain_acceptance(tokens, drafts) == pytest.approx(alpha, abs=1e-9)


def test_the_ends():
    assert chain_acceptance(1.0, 4) == 0.0  # nothing kept
    assert chain_acceptance(5.0, 4) == 1.0  # every draft kept
    assert chain_acceptance(3.0, 0) == 0.0  # no drafts: nothing to keep


@pytest.mark.parametrize("alpha", [0.1, 0.5, 0.9])
def test_inverts_the_chains_of_a_drafts_histogram(alpha):
    histogram = {1: 3, 4: 5, 8: 2}  # verifying steps by their drafts
    steps = sum(histogram.values())
    tokens = sum(n * sum(alpha**i for i in range(d + 1)) for d, n in histogram.items()) / steps
    assert chain_acceptance(tokens, histogram) == pytest.approx(alpha, abs=1e-9)
    assert chain_acceptance(tokens, {4: 1}) == chain_acceptance(tokens, 4)
    assert chain_acceptance(4.9, histogram) == 1.0  # (3·2 + 5·5 + 2·9) / 10: every one kept
