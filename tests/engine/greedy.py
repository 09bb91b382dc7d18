"""Comparing greedy generations from two engine configurations.

Different batch shapes round differently in the last bits, so two correct runs may split at a
near-tie. The comparison accepts a split only where the two candidate tokens' logprobs are
within `tie` of each other in both runs, and compares nothing after it.
"""

from __future__ import annotations


def assert_greedy_equivalent(a, b, tie: float = 1e-3) -> None:
    for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids, strict=False)):
        if x == y:
            continue
        top_a = dict(a.logprobs[i].top) if a.logprobs else {}
        top_b = dict(b.logprobs[i].top) if b.logprobs else {}
        near_tie = (
            x in top_b
            and y in top_a
            and abs(top_a[x] - top_a[y]) < tie
            and abs(top_b[x] - top_b[y]) < tie
        )
        assert near_tie, f"outputs diverge at token {i}: {a.token_ids} vs {b.token_ids}"
        return
    assert a.token_ids == b.token_ids, f"{a.token_ids} vs {b.token_ids}"
    assert a.finish_reason == b.finish_reason
