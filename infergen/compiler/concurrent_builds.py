"""Builds side by side: an engine start compiles its kernels (fused groups, fused GEMMs, the
layer programs) on a pool of threads, one C compiler process each, instead of one after the
other. A C compile runs in a subprocess, so the threads wait without the GIL; the Python
around each (rendering the source, loading the library) is short.

The results come back in the order the builds were asked for, each as an `Outcome` — the value,
or the exception the build raised — so the caller handles them exactly as it would have one by
one (the same compile report, the same first error raised), only sooner. Two builds of one JIT
cache entry (the decode and prefill layer programs share one) meet at the entry's file lock:
the second loads what the first built.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from infergen.kernels.build import compile_workers as workers  # (cores, at most 8)


@dataclass(frozen=True)
class Outcome:
    """What one build gave: its value, or the exception it raised (`get` re-raises it)."""

    value: Any = None
    error: BaseException | None = None

    def get(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


def _outcome(build: Callable[[], Any]) -> Outcome:
    try:
        return Outcome(build())
    except Exception as error:  # (handed to the caller, in order)
        return Outcome(error=error)


def run_builds(
    builds: Sequence[Callable[[], Any]], parallel: bool = True, first: Sequence[int] = ()
) -> list[Outcome]:
    """Call every build (on `workers()` threads when `parallel` and there are several; the
    builds at indices `first` started before the rest: the longest, so that none is left
    alone at the end) and return their outcomes in the order given."""
    count = min(len(builds), workers()) if parallel else 1
    if count <= 1:
        return [_outcome(build) for build in builds]
    order = list(dict.fromkeys([*first, *range(len(builds))]))
    pool = ThreadPoolExecutor(max_workers=count, thread_name_prefix="infergen-build")
    try:
        futures = {index: pool.submit(_outcome, builds[index]) for index in order}
        return [futures[index].result() for index in range(len(builds))]
    finally:  # (interrupted while waiting: the builds not started yet are dropped)
        pool.shutdown(wait=True, cancel_futures=True)
