"""Timing a callable the way the benchmarks and calibration do: one warm-up call, then the
best of several (the least disturbed run on a noisy machine)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Hashable, Mapping


def best_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def best_seconds_each(fns: Mapping[Hashable, Callable[[], object]], repeats: int) -> dict:
    """best_seconds of several callables, their repeats taken in turn (round robin): a
    disturbed window of the machine then costs each of them one repeat, not one of them all
    of its repeats (which bends a curve measured point by point)."""
    for fn in fns.values():
        fn()
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for key, fn in fns.items():
            start = time.perf_counter()
            fn()
            best[key] = min(best[key], time.perf_counter() - start)
    return best


def paired_speedup(
    baseline: Callable[[], object], candidate: Callable[[], object], rounds: int
) -> tuple[float, float, float]:
    """(median over rounds of baseline / candidate seconds, best baseline, best candidate):
    each round times both back to back, the order reversed every other round, so a drift of
    the machine's speed moves both sides of a round's ratio and an outlier round moves the
    median little (a best-of of each side alone can pair one's lucky run with the other's
    ordinary one)."""
    baseline()
    candidate()
    ratios, best = [], [float("inf"), float("inf")]
    for index in range(rounds):
        seconds = [0.0, 0.0]
        for side in (0, 1) if index % 2 == 0 else (1, 0):
            start = time.perf_counter()
            (baseline, candidate)[side]()
            seconds[side] = time.perf_counter() - start
            best[side] = min(best[side], seconds[side])
        ratios.append(seconds[0] / seconds[1])
    return statistics.median(ratios), best[0], best[1]
