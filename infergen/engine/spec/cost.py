"""The cost model that decides how many drafts each sequence verifies (issue 24,
`num_speculative_tokens="auto"`).

Verifying drafts is not free: a step that computes n tokens takes t(n) seconds, and t grows
with n — slowly while a step is bound by reading the weights (batch 1 reads every weight
whatever n is), at the per-token compute cost once it is not (a large batch). Speculation pays
while the tokens a step emits grow faster than its time.

`StepTimes` is t(n), measured: the engine reports every step that computed only decodes
(verifying or not) with its wall time, kept as a moving average per token count — of the
step's time over a host-speed factor that every observation moves (`speed`), so that the
counts' times follow the host together (a count's own time, over the speed, moves 4x slower
than the speed: a drift of the host goes mostly into the speed). Without it, a count
measured only at verifying steps kept its time while drafts were off and the host slowed:
t(2) = 20.0 ms was measured while t(1) was 11.4 ms, and later, with t(1) at 15.9 ms, one
layerskip draft kept at α = 0.32 looked worth 5 % — layerskip on copy lost 12 %
(SmolLM2-135M, 2026-12-07). Between two
measured counts t is interpolated; beyond the largest it grows by the marginal cost `slope`
per token — the engine's measured prefill cost per token, the compute-bound rate — or by the
two largest measured counts' cost per token when that is more (a draft model's pass per
draft), so an unmeasured larger step is never assumed cheap.

Measured step times are noisy (one step here varies by ±10 %), and choosing the best of many
draft counts from noisy per-count averages picks the count whose average happens to be low —
a step of 19 tokens measured cheaper than one of 16, so at batch 16 drafts looked free. The
step curve is convex (flat while reading the weights bounds it, then rising at the compute
rate), so a token beyond the base costs at least the chord slope from a smaller measured count
to the base: `floor`, the chord from the smallest measured count (the longest one, the least
noisy; a chord from a nearer count bounds more tightly but carries its noise). The
choice reads `above`: t(base + m), never below t(base) + m × floor.

`choose` picks the drafts of one step. Sequence s has its proposer's drafts and an acceptance
α_s (spec/acceptance.py); its j-th draft adds α_s^j emitted tokens on average, gains that fall
with j. For every total m of drafts it takes the m largest gains (each sequence a prefix of
its drafts) and keeps the m that maximize (emitted tokens) / t(base + m) — tokens per second
of the step. At batch 1, t barely grows, and a sequence verifies its drafts while α is not
tiny; at large batch, t grows at the compute rate and only drafts likely to be kept are
worth their cost: the step turns speculation off by itself (m = 0).

A batch that drains — no request waits for a slot — ends when its last sequence does.
Another sequence's kept drafts then end it sooner without ending the batch sooner: its tokens
are computed either way, only earlier, while its rejected drafts are computed for nothing.
Where a token costs little beside the step (reading the weights bounds it: batch 1, a GPU's
small batches) those drafts still buy that request's latency for almost nothing; where a
token costs TOGETHER_SHARE of the step's average or more (`StepTimes.token_share`: batch 16
here, 0.5–0.8 as the host's memory speed drifts), the step drafts only for the sequences that
may still generate the most tokens (spec/speculator.py). (The rule first read
`compute_bound`, a share of 0.5: when this host's memory slowed, a batch-16 step's token fell
under it, every sequence drafted for itself, and copy x16 went to 0.91×.) Measured on a
closed batch of 16 (SmolLM2-135M, suffix, copy-heavy): drafting for every sequence, the
copying ones finished early and three that did not copy ran on alone — 0.88× the speed
without speculation; with the rule, 0.96×.
Those last sequences end the batch together: a step brings its end nearer only as far as
every one of them keeps its drafts (`choose_together`). While all sixteen may generate as
many tokens, drafting for each by its own gain (`choose`) still let the copying ones pull
ahead, which ended nothing sooner: copy x16 with suffix auto 0.95× (rounds 0.905–0.996,
2026-12-07 11:44); drafts for all sixteen kept at α ≈ 0.88 together with probability
0.13 — none are verified now, until few sequences are left last.

Drafts are verified only when they promise MARGIN more tokens per second than the step
without them (COMPUTE_MARGIN in a compute-bound step, below). The estimates the choice reads
are uncertain by about that much — per-count
step averages by ±5 %, and the acceptance of the sequences chosen (chosen for estimates that
are high) was 5–15 % above what they then kept (batch 16, SmolLM2-135M, this host) — so a
choice that promises less is as likely a loss. At batch 16 here drafts promise little (a
token costs 0.77 of the step's average; kept at α ≈ 0.8, that is a wash), and a closed batch
of 16 lost 5–10 % verifying them; at batch 1 drafts promise 30–300 % and the margin changes
nothing.

A compute-bound step (`StepTimes.compute_bound`) needs COMPUTE_MARGIN. There a draft costs
a token's share of the step, `floor`, so the most drafts can promise is α × (t(base) / base)
/ floor − 1: estimated at α ≈ 0.9 with a token at 0.76 of the step's average (batch 16
while this host's memory is fast: t(16) = 36–46 ms, 1.8 ms a token beyond it), ~+12 % — the
size of the estimates' bias (the sequences then kept 0.83–0.85 a token). With MARGIN alone
such steps verified drafts, and every one of 5 rounds of copy x16 lost (0.81–0.97× without
speculation, SmolLM2-135M, ngram auto, 2026-12-07). Drafts almost always kept still pay
there (α = 0.99: ~+28 %), and at batch 1 nothing changes (no count below the base is
measured: floor 0, never compute-bound).

A draft model (spec/draft.py) keeps KV of its own and computes, before it drafts, every
position the target computed since it last drafted: a one-off catch-up (the prompt, at a
sequence's first drafts) as dear per position as the draft model's prefill — for the target's
own weights in int4, the target's prefill: a 391-token prompt took 0.5 s here, a third of
the 128 tokens' decode (SmolLM2-135M, AVX-512). `CatchUp` measures it per position.
`catch_up_pays`: a sequence starts drafting only when its drafts, over the tokens it may still
generate, save more than that. A sequence whose drafts were turned off explores (a draft
now and then, spec/speculator.py) only while its catch-up costs at most EXPLORE_SHARE of the
decoding since it last drafted: the catch-up grows with that decoding, so a draft model whose
positions cost more than EXPLORE_SHARE of a decode step, like the target's own int4 weights
(0.1 here), explores never — with exploring, it lost 8-18 % where the cost model had turned
its drafts off (2.4 % of decodes verified drafts).
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Callable, Sequence

WEIGHT = 0.2  # of the newest step in the host's speed (and in a catch-up's rate)
SHAPE_WEIGHT = 0.05  # of the newest step in its count's own time (over the speed)
MARGIN = 0.05  # the least gain in tokens per second for which drafts are verified
COMPUTE_MARGIN = 0.15  # the same in a compute-bound step (module docstring)
COMPUTE_BOUND = 0.5  # a token's least cost, over the step's average, that makes it compute-bound
TOGETHER_SHARE = 0.25  # the same, for a draining batch to draft only for its last sequences
EXPLORE_SHARE = 0.03  # of the decoding since its last drafts, what an exploring catch-up may cost


class StepTimes:
    """t(n): seconds of a decode-only step that computes n tokens, measured."""

    def __init__(self):
        self._counts: list[int] = []  # measured token counts, ascending
        self._shape: dict[int, float] = {}  # per count: its time over the host's `speed`
        self.speed = 1.0  # how slow the host is now against when the counts were measured

    def observe(self, tokens: int, seconds: float) -> None:
        """A step of `tokens` took `seconds`: a count measured before moves the host's speed
        by WEIGHT of how far it is off, then its own time by SHAPE_WEIGHT of what is left —
        so that a drift of the host goes mostly into the speed, which every count follows
        (one count measured at every step cannot tell a slower host from a dearer count)."""
        old = self._shape.get(tokens)
        if old is None:
            bisect.insort(self._counts, tokens)
            self._shape[tokens] = seconds / self.speed
            return
        self.speed *= 1.0 + WEIGHT * (seconds / (old * self.speed) - 1.0)
        self._shape[tokens] = old + SHAPE_WEIGHT * (seconds / self.speed - old)

    def _at(self, tokens: int) -> float:
        """t(tokens) of a measured count, at the host's speed now."""
        return self._shape[tokens] * self.speed

    def seconds(self, tokens: int, slope: float) -> float | None:
        """t(tokens): measured, interpolated, or the nearest measured count's time plus
        `slope` per token more (None before any step was measured)."""
        counts = self._counts
        if not counts:
            return None
        at = bisect.bisect_left(counts, tokens)
        if at < len(counts) and counts[at] == tokens:
            return self._at(tokens)
        if at == len(counts):  # beyond the largest: the marginal cost per token
            top = counts[-1]
            return self._at(top) + self._marginal(slope) * (tokens - top)
        if at == 0:  # below the smallest: as much less, but not below a share of it
            low = counts[0]
            return max(self._at(low) - slope * (low - tokens), self._at(low) / 2)
        lo, hi = counts[at - 1], counts[at]
        t_lo, t_hi = self._at(lo), self._at(hi)
        return t_lo + (t_hi - t_lo) * (tokens - lo) / (hi - lo)

    def floor(self, base: int, slope: float) -> float:
        """The least seconds a token beyond `base` adds, were t convex: the slope of the chord
        from the smallest measured count to t(base) (0 when none is smaller)."""
        if not self._counts or self._counts[0] >= base:
            return 0.0
        low = self._counts[0]
        return max(0.0, (self.seconds(base, slope) - self._at(low)) / (base - low))

    def token_share(self, base: int, slope: float) -> float:
        """The least a token beyond `base` costs (`floor`) over t(base) / base, the step's
        average token (0 before anything is measured)."""
        t_base = self.seconds(base, slope)
        return 0.0 if not t_base else self.floor(base, slope) * base / t_base

    def compute_bound(self, base: int, slope: float) -> bool:
        """Whether a token beyond `base` costs at least COMPUTE_BOUND of the step's average."""
        return self.token_share(base, slope) >= COMPUTE_BOUND

    def above(self, base: int, slope: float) -> Callable[[int], float]:
        """m -> t(base + m) as the cost model reads it: measured or extrapolated, but at least
        t(base) + m × floor (noise in one count's average is not a cheap step)."""
        t_base, floor = self.seconds(base, slope), self.floor(base, slope)
        return lambda m: max(self.seconds(base + m, slope), t_base + m * floor)

    def _marginal(self, slope: float) -> float:
        """Seconds a token adds beyond the largest measured count: `slope`, or more when the
        two largest measured counts say so (a draft model's pass per draft costs more than a
        prefill token)."""
        if len(self._counts) < 2:
            return slope
        lo, hi = self._counts[-2], self._counts[-1]
        return max(slope, (self._at(hi) - self._at(lo)) / (hi - lo))


class CatchUp:
    """Seconds per position of a draft model's catch-up (module docstring), measured: a moving
    average of each catch-up's seconds per position."""

    def __init__(self):
        self.per_position: float | None = None

    def observe(self, positions: int, seconds: float) -> None:
        if positions <= 0:
            return
        rate = seconds / positions
        old = self.per_position
        self.per_position = rate if old is None else old + WEIGHT * (rate - old)

    def seconds(self, positions: int, prior: float) -> float:
        """The catch-up of `positions`: at the measured rate, else `prior` seconds each."""
        per = prior if self.per_position is None else self.per_position
        return positions * per


def catch_up_pays(rate: float, drafts: int, remaining: int, t_plain: float, t_step: float,
                  catch_up: float) -> bool:  # fmt: skip
    """Whether a sequence's catch-up of `catch_up` seconds is earned back by verifying
    `drafts` drafts a step at acceptance `rate` over the `remaining` tokens it may still
    generate: a token takes `t_plain` without drafts, `t_step` / (1 + α + … + α^drafts) with
    them."""
    emitted = sum(rate**j for j in range(drafts + 1))
    return remaining * (t_plain - t_step / emitted) > catch_up


def margin(times: StepTimes, base: int, slope: float) -> float:
    """The least gain in tokens per second for which a step of `base` tokens verifies
    drafts: COMPUTE_MARGIN where the step is compute-bound, else MARGIN."""
    return COMPUTE_MARGIN if times.compute_bound(base, slope) else MARGIN


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
    step = times.above(base, slope)
    t_base, floor = step(0), times.floor(base, slope)
    emitted, extra = float(decodes), 0.0
    best, best_rate, taken = 0, emitted / t_base * (1.0 + margin(times, base, slope)), []
    for m, (gain, s) in enumerate(gains, start=1):
        taken.append(s)
        emitted -= gain
        if recompute:  # the j-th draft's share of the expected recomputation
            j, rate = taken.count(s), rates[s]
            extra += slope * rate ** (j - 1) * (1.0 - rate) * j
        rate = emitted / (step(m) + extra)
        if rate > best_rate:
            best, best_rate = m, rate
        # more drafts add at most -gain tokens each (the gains fall) and at least `floor`
        # seconds each on average (t ≥ t_base + m × floor): their rate is at most the larger
        # of these two — when neither beats the best, none can (a large batch stops early)
        if floor > 0 and max(emitted / (t_base + m * floor), -gain / floor) <= best_rate:
            break
    for s in taken[:best]:
        chosen[s] += 1
    return chosen


def choose_together(
    drafts: Sequence[int],
    rates: Sequence[float],
    base: int,
    times: StepTimes,
    slope: float,
    recompute: bool = False,
    lead: int | None = None,
) -> list[int]:
    """The drafts of a draining batch's last sequences (those that may still generate the
    most tokens; module docstring): the batch ends when the last of them does, so a step
    brings its end nearer by i steps only where every one of them keeps i drafts —
    probability Π_s α_s^i — and by no more than `lead`, how many more tokens they may
    generate than the batch's next sequences (beyond it those end the batch; None: no
    bound). Each verifies the same j drafts (0: none), the j that advances the batch's
    end the most per second, (1 + Σ_{i≤min(j, lead)} Π_s α_s^i) / t(base + |S| j), and by
    more than the margin against a plain step. Sixteen sequences at α = 0.9 keep a draft
    together with probability 0.19: their drafts never pay; one left at that rate does.
    `recompute`: as `choose`."""
    chosen = [0] * len(drafts)
    if not drafts or times.seconds(base, slope) is None:
        return chosen
    step = times.above(base, slope)
    best, best_rate = 0, (1.0 + margin(times, base, slope)) / step(0)
    together, ahead, extra = math.prod(rates), 1.0, 0.0
    for j in range(1, min(drafts) + 1):
        if lead is None or j <= lead:
            ahead += together**j
        if recompute:  # (as choose: the j-th draft's share of the expected recomputation)
            extra += slope * sum(rate ** (j - 1) * (1.0 - rate) * j for rate in rates)
        rate = ahead / (step(len(drafts) * j) + extra)
        if rate > best_rate:
            best, best_rate = j, rate
    return [best] * len(drafts)
