"""The cost model of num_speculative_tokens="auto" (engine/spec/cost.py) against a brute-force
search over every choice of drafts, and the running acceptance estimates it reads
(engine/spec/acceptance.py)."""

from __future__ import annotations

import itertools
import random

import pytest

from infergen.engine.spec.acceptance import DECAY, PRIOR, PRIOR_WEIGHT, Acceptance
from infergen.engine.spec.cost import (
    COMPUTE_MARGIN,
    MARGIN,
    CatchUp,
    StepTimes,
    catch_up_pays,
    choose,
    choose_together,
    margin,
)


def _times(t) -> StepTimes:
    times = StepTimes()
    for n, seconds in t.items():
        times.observe(n, seconds)
    return times


def test_step_times_measured_interpolated_and_extrapolated():
    times = StepTimes()
    assert times.seconds(4, 1.0) is None
    times = _times({2: 10.0, 6: 18.0})
    assert times.seconds(2, 1.0) == 10.0
    assert times.seconds(3, 1.0) == pytest.approx(12.0)  # on the line between 2 and 6
    assert times.seconds(9, 1.5) == pytest.approx(18.0 + 3 * 2.0)  # 2 and 6's: 2 a token
    assert times.seconds(9, 2.5) == pytest.approx(18.0 + 3 * 2.5)  # the slope when more
    assert times.seconds(1, 1.0) == pytest.approx(9.0)  # below the smallest: minus the slope
    assert times.seconds(1, 8.0) == pytest.approx(5.0)  # but not below half of it
    # a count measured again moves the host's speed by 0.2 of how far off it is (2x: the
    # speed 1.2), then its own time by 0.05 of what is left; every count follows the speed
    times.observe(2, 20.0)
    speed = 1.0 + 0.2 * (20.0 / 10.0 - 1.0)
    assert times.speed == pytest.approx(speed)
    assert times.seconds(2, 1.0) == pytest.approx((10.0 + 0.05 * (20.0 / speed - 10.0)) * speed)
    assert times.seconds(6, 1.0) == pytest.approx(18.0 * speed)


def _expected_rate(counts, rates, decodes, base, times, slope, recompute=False) -> float:
    """Tokens per second of a step with `counts` drafts: the geometric model's expectation;
    with `recompute`, a rejection after a kept drafts costs a + 1 tokens at `slope` more,
    summed over the chain's outcomes one by one."""
    pairs = list(zip(counts, rates, strict=True))
    emitted = decodes + sum(sum(r**j for j in range(1, k + 1)) for k, r in pairs)
    seconds = times.above(base, slope)(sum(counts))
    if recompute:
        for k, r in pairs:
            for kept in range(k):  # exactly `kept` drafts kept, then one rejected
                seconds += slope * (kept + 1) * r**kept * (1 - r)
    return emitted / seconds


@pytest.mark.parametrize("below", [False, True])
@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("seed", range(40))
def test_choice_is_the_best_of_every_choice(seed, recompute, below):
    """Whatever the step-time curve (measured at every count, concave or not; `below`: at a
    smaller count too, so that a token beyond the base costs at least the chord from there
    and the search may stop early), the drafts chosen give the highest expected tokens per
    second of all choices of prefixes; with a recurrent model's recomputation after a
    rejection, within 1 % of it (the drafts are still taken in the order of their gains);
    none when the best gains less than the margin (MARGIN, COMPUTE_MARGIN when the step is
    compute-bound)."""
    rng = random.Random(seed)
    seqs = rng.randint(1, 4)
    drafts = [rng.randint(0, 4) for _ in range(seqs)]
    rates = [rng.choice([0.0, 0.05, rng.random(), 0.9, 1.0]) for _ in range(seqs)]
    decodes = seqs + rng.randint(0, 3)  # decodes without drafts emit a token too
    base = decodes + rng.choice([0, 0, 17])  # a prefill chunk in the step
    t, total = {}, 10.0 * rng.random() + 1.0
    for n in range(base, base + sum(drafts) + 1):
        t[n] = total
        total += rng.choice([0.0, 0.1, 1.0, 5.0]) * rng.random()
    if below and base > 1:
        t[rng.randint(1, base - 1)] = t[base] * rng.choice([0.2, 0.9, 0.99])
    times = _times(t)
    slope = rng.choice([0.1, 1.0, 3.0]) if recompute else 1.0
    got = choose(drafts, rates, decodes, base, times, slope, recompute)
    assert all(0 <= g <= d for g, d in zip(got, drafts, strict=True))
    best = max(
        _expected_rate(c, rates, decodes, base, times, slope, recompute)
        for c in itertools.product(*[range(d + 1) for d in drafts])
    )
    rate = _expected_rate(got, rates, decodes, base, times, slope, recompute)
    plain = _expected_rate([0] * seqs, rates, decodes, base, times, slope, recompute)
    least = margin(times, base, slope)  # (COMPUTE_MARGIN where a token costs half a step's)
    if best <= plain * (1 + least) * (1 - 1e-9):  # no choice is worth its uncertainty
        assert got == [0] * seqs
    elif recompute:
        assert best * 0.99 <= rate <= best * (1 + 1e-9)
    else:
        assert rate == pytest.approx(best)


def test_a_recurrent_models_recomputation_after_rejections_costs_drafts():
    """At α = 0.6 the batch-1 drafts pay for themselves; once each rejection recomputes the
    kept tokens at the prefill rate, fewer do, and none when a token costs twice a step —
    while drafts almost always kept still do."""
    single = _times({1: 0.020, 2: 0.022, 5: 0.025})
    assert choose([4], [0.6], 1, 1, single, slope=0.005) == [4]
    assert 0 < choose([4], [0.6], 1, 1, single, slope=0.005, recompute=True)[0] < 4
    assert choose([4], [0.6], 1, 1, single, slope=0.04, recompute=True) == [0]
    assert choose([4], [0.95], 1, 1, single, slope=0.04, recompute=True)[0] > 0


def test_a_draft_pass_per_draft_is_extrapolated():
    """Measured at 1 and 2 tokens only, a step that costs twice one more per draft (a draft
    model's pass) is not assumed cheap at 9 tokens: even drafts always kept do not pay;
    a cheap second token (a free proposer) still does."""
    dear = _times({1: 0.020, 2: 0.060})
    assert choose([8], [1.0], 1, 1, dear, slope=0.0014) == [0]
    cheap = _times({1: 0.020, 2: 0.0205})
    assert choose([8], [1.0], 1, 1, cheap, slope=0.0014) == [8]


def _simulated_seconds(
    rate: float, drafts: int, remaining: int, t_step: float, rng: random.Random
) -> float:
    """Seconds to emit `remaining` tokens verifying `drafts` drafts a step, each draft kept
    with probability `rate` while those before it were (drawn), `t_step` a step."""
    emitted = steps = 0
    while emitted < remaining:
        kept = 0
        while kept < drafts and rng.random() < rate:
            kept += 1
        emitted, steps = emitted + kept + 1, steps + 1
    return steps * t_step


@pytest.mark.parametrize(
    ("rate", "drafts", "remaining", "t_step", "catch_up"),
    [
        (0.9, 4, 128, 0.030, 0.5),  # kept often, a long answer: earned back
        (0.9, 4, 16, 0.030, 0.5),  # too few tokens left
        (0.5, 2, 128, 0.016, 0.47),  # a 391-token prompt caught up at the prefill rate
        (0.5, 2, 1000, 0.016, 0.47),  # ... for a long answer
        (0.2, 3, 1000, 0.025, 0.01),  # drafts that do not pay at all
    ],
)
def test_a_catch_up_is_drafted_only_where_the_drafts_earn_it_back(
    rate, drafts, remaining, t_step, catch_up
):
    """The decision against a simulation (drafts kept at random, steps counted until the
    tokens are emitted): drafting, catch-up included, is quicker than 12 ms a plain token."""
    rng = random.Random(0)
    runs = [_simulated_seconds(rate, drafts, remaining, t_step, rng) for _ in range(400)]
    quicker = catch_up + sum(runs) / len(runs) < remaining * 0.012
    assert catch_up_pays(rate, drafts, remaining, 0.012, t_step, catch_up) == quicker


def test_catch_up_seconds_per_position_measured_else_the_prior():
    catch_up = CatchUp()
    assert catch_up.seconds(100, prior=0.001) == pytest.approx(0.1)
    catch_up.observe(0, 0.5)  # (nothing caught up: nothing learnt)
    assert catch_up.seconds(100, prior=0.001) == pytest.approx(0.1)
    catch_up.observe(400, 0.8)
    catch_up.observe(16, 0.064)  # 2 ms, then 4 ms a position: the newest weighs WEIGHT
    assert catch_up.seconds(10, prior=1.0) == pytest.approx(10 * (0.002 + 0.2 * 0.002))


def test_batch_one_speculates_and_a_large_batch_turns_itself_off():
    """Measured on this kind of host (fp32, 2 threads): a batch-1 step of 5 tokens costs 1.25×
    one of 1, so 4 drafts at α = 0.6 pay (2.3 tokens a step); at batch 16 each token adds
    the compute rate, and drafts at α = 0.3 cost more than they give."""
    single = _times({1: 0.020, 2: 0.022, 5: 0.025})
    assert choose([4], [0.6], 1, 1, single, slope=0.0014) == [4]
    assert choose([4], [0.02], 1, 1, single, slope=0.0014) == [0]  # nothing kept: off
    batch = _times({16: 0.040})
    assert choose([4] * 16, [0.3] * 16, 16, 16, batch, slope=0.0014) == [0] * 16
    # sequences that copy (α = 0.95) still verify a draft or more beside those that do not
    mixed = choose([4] * 16, [0.95] * 4 + [0.3] * 12, 16, 16, batch, slope=0.0014)
    assert all(k > 0 for k in mixed[:4]) and mixed[4:] == [0] * 12


def test_a_noisy_cheap_count_above_the_base_is_not_taken_for_free_drafts():
    """Batch 16 as measured here (SmolLM2-135M fp32, 2 threads): per-count averages of noisy
    steps put 19 tokens below 16. Alone, that dip makes 3 drafts look free even at α = 0.63;
    with smaller counts measured, the curve's convexity bounds each token beyond 16 by the
    chord from them (1.8 ms a token), and no draft pays — while drafts almost always kept
    still do."""
    high = {16: 0.0409, 17: 0.0408, 18: 0.0441, 19: 0.0399}
    assert sum(choose([4] * 16, [0.63] * 16, 16, 16, _times(high), slope=0.0014)) > 0
    times = _times({1: 0.0137, 5: 0.0222, 9: 0.0309, **high})
    floor = (0.0409 - 0.0137) / 15  # the chord from 1 to 16
    assert times.floor(16, 0.0014) == pytest.approx(floor)
    assert times.above(16, 0.0014)(3) == pytest.approx(0.0409 + 3 * floor)  # not 19's 0.0399
    assert times.above(16, 0.0014)(13) == pytest.approx(0.0409 + 13 * floor)  # > 19's + slope
    assert times.above(1, 0.0014)(4) == pytest.approx(times.seconds(5, 0.0014))
    assert choose([4] * 16, [0.63] * 16, 16, 16, times, slope=0.0014) == [0] * 16
    assert sum(choose([4] * 16, [0.98] * 16, 16, 16, times, slope=0.0014)) > 0
    assert times.floor(1, 0.0014) == 0.0  # batch 1: nothing smaller, the curve as measured
    assert times.compute_bound(16, 0.0014)  # a token beyond 16 costs 0.67 of the average
    assert not times.compute_bound(5, 0.0014)  # (0.0021 a token of 0.0044: 0.48)
    assert not times.compute_bound(1, 0.0014)


def test_nothing_measured_means_no_drafts():
    assert choose([4, 2], [0.9, 0.9], 2, 2, StepTimes(), slope=0.001) == [0, 0]


def test_acceptance_counts_matches_until_the_first_mismatch():
    acc = Acceptance()
    assert acc.rate("a") == PRIOR
    acc.proposed("a", [5, 6, 7])
    for token in (5, 6, 9, 7):  # kept, kept, rejected (the proposal ends there), ignored
        acc.appended("a", token)
    kept = (1.0 * DECAY + 1.0) * DECAY  # decayed per observation: 5 kept, 6 kept, 9 rejected
    overall = (kept + PRIOR_WEIGHT * PRIOR) / (kept + 1.0 + PRIOR_WEIGHT)
    assert acc.rate("b") == pytest.approx(overall)  # a new sequence: the proposer's rate
    assert acc.rate("a") == pytest.approx((kept + PRIOR_WEIGHT * overall) / (kept + 1.0 + 2.0))
    acc.finish("a")
    assert acc.rate("a") == pytest.approx(overall)


def test_acceptance_follows_a_sequence_that_stops_copying():
    acc = Acceptance()
    for _ in range(30):
        acc.proposed("a", [1])
        acc.appended("a", 1)
    high = acc.rate("a")
    for _ in range(30):
        acc.proposed("a", [1])
        acc.appended("a", 2)
    assert high > 0.9 and acc.rate("a") < 0.1


def test_a_compute_bound_step_needs_the_larger_margin(monkeypatch):
    """Batch 16 as measured while this host's memory was fast (SmolLM2-135M fp32, 2 threads,
    ngram auto on copy x16; the engine's own step averages, ms by tokens): a token beyond 16
    costs ~1.8 ms, 0.76 of the step's average, so drafts estimated at α = 0.9 promise ~+12 %
    — within the estimates' bias (the run kept 0.83-0.85 a token), and the rounds that
    verified them lost 3-19 %. With MARGIN alone 31 drafts are verified; in a compute-bound
    step they need COMPUTE_MARGIN and none are — while drafts almost always kept (α = 0.99)
    still are, and batch 1 (nothing measured below it: never compute-bound) chooses as with
    MARGIN alone."""
    ms = {1: 11.2, 2: 12.8, 3: 13.3, 4: 14.8, 5: 15.5, 9: 22.3, 10: 25.7, 11: 26.6, 14: 32.7,
          16: 38.2, 21: 47.8, 22: 49.5, 24: 52.6, 29: 62.8, 30: 65.8, 41: 84.9, 45: 92.5,
          47: 94.5, 50: 100.8, 65: 124.6}  # fmt: skip
    fast, slope = _times({n: t / 1000 for n, t in ms.items()}), 0.00124
    assert fast.compute_bound(16, slope) and margin(fast, 16, slope) == COMPUTE_MARGIN
    assert choose([2] * 16, [0.9] * 16, 16, 16, fast, slope) == [0] * 16
    assert sum(choose([4] * 16, [0.99] * 16, 16, 16, fast, slope)) > 0
    assert margin(fast, 1, slope) == MARGIN
    single = choose([4], [0.6], 1, 1, fast, slope)
    assert single[0] > 0
    monkeypatch.setattr("infergen.engine.spec.cost.COMPUTE_MARGIN", MARGIN)
    assert sum(choose([2] * 16, [0.9] * 16, 16, 16, fast, slope)) == 31
    assert choose([4], [0.6], 1, 1, fast, slope) == single


def _batch_end_rate(j, rates, base, times, slope, recompute=False, lead=None) -> float:
    """Steps by which a draining batch's end comes nearer, per second, when each of its last
    sequences verifies j drafts: enumerated over every outcome of their chains (each keeps
    exactly a < j drafts with probability r^a (1 - r), all j with r^j), the end moving by 1 +
    the fewest kept, but by no more than 1 + `lead` (then the next sequences end it); with
    `recompute`, each rejection after a kept costs a + 1 tokens at `slope`."""
    outcomes = [[(a, r**a * (1 - r)) for a in range(j)] + [(j, r**j)] for r in rates]
    advance = 0.0
    for combo in itertools.product(*outcomes):
        p = 1.0
        for _, q in combo:
            p *= q
        advance += p * (1 + min(min(a for a, _ in combo), j if lead is None else lead))
    seconds = times.above(base, slope)(len(rates) * j)
    if recompute:
        seconds += sum(slope * (a + 1) * r**a * (1 - r) for r in rates for a in range(j))
    return advance / seconds


@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("seed", range(30))
def test_a_draining_batchs_last_sequences_draft_together_at_the_best_count(seed, recompute):
    """The last sequences of a draining batch verify the same j drafts: the j of the highest
    expected advance of the batch's end per second, enumerated over every outcome of their
    chains (the cost model reads it as a product of acceptances), the end moving no further
    than their lead over the next sequences; none when no j beats a plain step by the
    margin."""
    rng = random.Random(seed)
    seqs = rng.choice([1, 2, 3, 4])
    drafts = [rng.randint(1, 4) for _ in range(seqs)]
    rates = [rng.choice([0.6, rng.random(), 0.9, 0.99, 1.0]) for _ in range(seqs)]
    base = seqs + rng.randint(0, 12)
    t, total = {}, 10.0 * rng.random() + 1.0
    for n in range(1, base + sum(drafts) + 1):  # (counts below the base: compute-bound too)
        t[n] = total
        total += rng.choice([0.1, 0.5, 1.0, 3.0]) * rng.random()
    times = _times(t)
    slope = rng.choice([0.1, 1.0, 3.0])
    lead = rng.choice([None, 1, 2, 8])
    got = choose_together(drafts, rates, base, times, slope, recompute, lead)
    assert len(set(got)) == 1 and 0 <= got[0] <= min(drafts)
    rates_by_j = {j: _batch_end_rate(j, rates, base, times, slope, recompute, lead)
                  for j in range(min(drafts) + 1)}  # fmt: skip
    best = max(rates_by_j.values())
    if best <= rates_by_j[0] * (1 + margin(times, base, slope)) * (1 - 1e-9):
        assert got[0] == 0
    else:
        assert rates_by_j[got[0]] == pytest.approx(best)


def test_sixteen_last_sequences_never_draft_together_one_does():
    """The batch-16 step curve of this host (as in the test below): sixteen sequences last
    together, each estimated at α = 0.9 (even 0.99), verify nothing — all sixteen keep a
    draft with probability 0.19 (0.85), not worth 16 tokens' compute; the batch's one last
    sequence at α = 0.9 verifies drafts. `choose`, reading each sequence's own tokens, would
    verify the sixteen's drafts at α = 0.99."""
    ms = {1: 11.2, 2: 12.8, 3: 13.3, 4: 14.8, 5: 15.5, 9: 22.3, 10: 25.7, 11: 26.6, 14: 32.7,
          16: 38.2, 21: 47.8, 22: 49.5, 24: 52.6, 29: 62.8, 30: 65.8, 41: 84.9, 45: 92.5,
          47: 94.5, 50: 100.8, 65: 124.6}  # fmt: skip
    times, slope = _times({n: t / 1000 for n, t in ms.items()}), 0.00124
    assert choose_together([4] * 16, [0.9] * 16, 16, times, slope) == [0] * 16
    assert choose_together([4] * 16, [0.99] * 16, 16, times, slope) == [0] * 16
    assert sum(choose([4] * 16, [0.99] * 16, 16, 16, times, slope)) > 0
    assert choose_together([4], [0.9], 16, times, slope)[0] > 0
    # a lead of one token over the next sequences: one draft at most brings the end nearer
    assert choose_together([4], [0.9], 16, times, slope, lead=1)[0] <= 1


def test_counts_measured_only_at_verifying_steps_follow_the_host():
    """The trace of layerskip on copy (SmolLM2-135M, batch 1): t(2) and t(3) measured once
    while t(1) was 11.4 ms; then the host slowed and t(1) read 15.9 ms for many steps while
    drafts were off. The stale counts follow most of it (the rest went into t(1)'s own
    time), and one draft at α = 0.35 does not pay (with t(2) left at 20.0 ms it looked
    worth 7 %: 1.35 / 20.0 against 1 / 15.9)."""
    times = _times({1: 0.0114, 2: 0.0200, 3: 0.0283})
    for _ in range(40):
        times.observe(1, 0.0159)
    assert times.seconds(1, 0.001) == pytest.approx(0.0159, rel=0.01)
    assert times.seconds(2, 0.001) > 0.0200 * 1.25  # (all of the drift: 1.39x)
    assert choose([8], [0.35], 1, 1, times, slope=0.001) == [0]
    assert choose([8], [0.9], 1, 1, times, slope=0.001)[0] > 0  # drafts kept still pay
    frozen = _times({1: 0.0159, 2: 0.0200, 3: 0.0283})  # (the stale counts as they were)
    assert choose([8], [0.35], 1, 1, frozen, slope=0.001) == [1]
