"""The cost model that decides how many drafts each sequence verifies (issue 24,
`num_speculative_tokens="auto"`).

Verifying drafts is not free: a step that computes n tokens takes t(n) seconds, and t grows
with n — slowly while a step is bound by reading the weights (batch 1 reads every weight
whatever n is), at the per-token compute cost once it is not (a large batch). Speculation pays
while the tokens a step emits grow faster than its time.

`StepTimes` is t(n), measured: the engine reports every step that computed only decodes
(verifying or not) with its wall time, kept as a moving average per token count. Between two
measured counts t is interpolated; beyond the largest it grows by the marginal cost `slope`
per token — the engine's measured prefill cost per token, the compute-bound rate — or by the
two largest measured counts' cost per token when that is more (a draft model's pass per
draft), so an unmeasured larger step is never assumed cheap.

`choose` picks the drafts of one step. Sequence s has its proposer's drafts and an acceptance
α_s (spec/acceptance.py); its j-th draft adds α_s^j emitted tokens on average, gains that fall
with j. For every total m of drafts it takes the m largest gains (each sequence a prefix of
its drafts) and keeps the m that maximize (emitted tokens) / t(base + m) — tokens per second
of the step. At batch 1, t barely grows, and a sequence verifies its drafts while α is not
tiny; at large batch, t grows at the compute rate and only drafts likely to be kept are
worth their cost: the step turns speculation off by itself (m = 0).
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Sequence

WEIGHT = 0.2  # of the newest step in a count's moving average


class StepTimes:
    """t(n): seconds of a decode-only step that computes n tokens, measured."""

    def __init__(self):
        self._counts: list[int] = []  # measured token counts, ascending
        self._seconds: dict[int, float] = {}

    def observe(self, tokens: int, seconds: float) -> None:
        old = self._seconds.get(tokens)
        if old is None:
            bisect.insort(self._counts, tokens)
            self._seconds[tokens] = seconds
        else:
            self._seconds[tokens] = old + WEIGHT * (seconds - old)

    def seconds(self, tokens: int, slope: float) -> float | None:
        """t(tokens): measured, interpolated, or the nearest measured count's time plus
        `slope` per token more (None before any step was measured)."""
        counts = self._counts
        if not counts:
            return None
        at = bisect.bisect_left(counts, tokens)
        if at < len(counts) and counts[at] == tokens:
            return self._seconds[tokens]
        if at == len(counts):  # beyond the largest: the marginal cost per token
            top = counts[-1]
            return self._seconds[top] + self._marginal(slope) * (tokens - top)
        if at == 0:  # below the smallest: as much less, but not below a share of it
            low = counts[0]
            return max(self._seconds[low] - slope * (low - tokens), self._seconds[low] / 2)
        lo, hi = counts[at - 1], counts[at]
        t_lo, t_hi = self._seconds[lo], self._seconds[hi]
        return t_lo + (t_hi - t_lo) * (tokens - lo) / (hi - lo)

    def _marginal(self, slope: float) -> float:
        """Seconds a token adds beyond the largest measured count: `slope`, or more when the
        two largest measured counts say so (a draft model's pass per draft costs more than a
        prefill token)."""
        if len(self._counts) < 2:
            return slope
        lo, hi = self._counts[-2], self._counts[-1]
        return max(slope, (self._seconds[hi] - self._seconds[lo]) / (hi - lo))


def choose(
    drafts: Sequence[int],
    rates: Sequence[float],
    decodes: int,
    base: int,
    times: StepTimes,
    slope: float,
    recompute: bool = False,
) -> list[int]:
    """How many of its drafts each sequence verifies this step: `drafts[s]` proposed,
    `rates[s]` its acceptance α, `decodes` the tokens the step emits without drafts (a token
    per decode), `base` the tokens it computes anyway (a token per decode, the prefill
    chunks), `slope` seconds per token beyond the measured counts. With `recompute`
    (recurrent layers, spec/rollback.py), a rejection costs the kept tokens computed again
    at the next step: with j drafts, Σ_{a<j} α^a (1 − α) (a + 1) tokens on average, at
    `slope` each — counted in the step's time."""
    chosen = [0] * len(drafts)
    if times.seconds(base, slope) is None:  # nothing measured yet: a plain step first
        return chosen
    # the gains α^j, largest first (each sequence's fall with j: a prefix of them is taken)
    gains = heapq.merge(
        *[[(-(rate**j), s) for j in range(1, n + 1)] for s, (n, rate) in enumerate(
            zip(drafts, rates, strict=True))],
    )  # fmt: skip
    emitted, extra = float(decodes), 0.0
    best, best_rate, taken = 0, emitted / times.seconds(base, slope), []
    for m, (gain, s) in enumerate(gains, start=1):
        taken.append(s)
        emitted -= gain
        if recompute:  # the j-th draft's share of the expected recomputation
            j, rate = taken.count(s), rates[s]
            extra += slope * rate ** (j - 1) * (1.0 - rate) * j
        rate = emitted / (times.seconds(base + m, slope) + extra)
        if rate > best_rate:
            best, best_rate = m, rate
    for s in taken[:best]:
        chosen[s] += 1
    return chosen
