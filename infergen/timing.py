"""Timing a callable the way the benchmarks and calibration do: one warm-up call, then the
best of several (the least disturbed run on a noisy machine)."""

from __future__ import annotations

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
