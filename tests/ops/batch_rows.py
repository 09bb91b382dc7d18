"""A product's rows do not depend on the batch: what the integer GEMMs' small-batch paths
(reading the panels directly up to 4 tokens, regrouping them past 4) must keep."""

from __future__ import annotations

import torch


def assert_rows_batch_invariant(apply, x: torch.Tensor, prepared, bias, n: int) -> None:
    """apply(x[rows]) equals those rows of apply(x) (9 tokens) bit for bit, for 1, 2 and 4 rows."""
    whole = apply(x, prepared, bias, n)
    for rows in (slice(0, 1), slice(1, 3), slice(5, 9)):
        assert torch.equal(apply(x[rows], prepared, bias, n), whole[rows])
