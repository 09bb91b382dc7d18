"""The tuner: for each token-count bucket, which kernel variant of a fused group
(codegen_c.VARIANTS: when to split rows over threads, and the row tile) runs fastest on this
machine (the variants that render the group differently: codegen_c.variants_for).

Each variant is compiled (through the JIT cache) and timed on random inputs with the bucket's
representative token count, round robin, until its time share is spent; the winner per bucket
is stored in `tuning.json` beside the JIT cache entries (keyed by the group's canonical graph
and target), written atomically under a lock. The runtime reads it at engine start and gives
each bucket its winner.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from infergen.compiler.buckets import BUCKET_TOKENS
from infergen.compiler.codegen_c import VARIANTS, variants_for
from infergen.compiler.ir import TOKENS, Graph
from infergen.compiler.jit_cache import JitCache
from infergen.compiler.kernel import compile_group


def group_key(graph: Graph, cache: JitCache) -> str:
    return cache.key(graph.canonical(), "tuning")


def random_inputs(graph: Graph, tokens: int, seed: int = 0) -> list[torch.Tensor]:
    """Random inputs of the group's shapes at `tokens` rows, indices within the gathered table
    (the tuner's, the budget's and the kernel tests' inputs)."""
    generator = torch.Generator().manual_seed(seed)
    table_rows = min(
        (v.shape[0] for v in graph.inputs if v.role == "weight" and v.rank == 2), default=1
    )
    out = []
    for v in graph.inputs:
        shape = [tokens if d == TOKENS else d for d in v.shape]
        if v.dtype == torch.int64:
            out.append(torch.randint(0, table_rows, shape, generator=generator))
        else:
            out.append(torch.randn(shape, generator=generator))
    return out


@dataclass
class BucketResult:
    winner: str
    seconds: dict[str, float]  # best time per variant


def tune_group(
    graph: Graph, cache: JitCache, buckets: list[str], seconds: float
) -> dict[str, BucketResult]:
    """Time every variant of the group in each bucket within about `seconds` in all."""
    kernels = {name: compile_group(graph, cache, name) for name in variants_for(graph)}
    share = seconds / max(1, len(buckets))
    found = {}
    for bucket in buckets:
        inputs = random_inputs(graph, BUCKET_TOKENS[bucket])
        best = dict.fromkeys(kernels, float("inf"))
        for kernel in kernels.values():
            kernel(*inputs)  # warm-up
        deadline = time.perf_counter() + share
        rounds = 0
        while rounds < 3 or (time.perf_counter() < deadline and rounds < 200):
            for name, kernel in kernels.items():
                started = time.perf_counter()
                kernel(*inputs)
                best[name] = min(best[name], time.perf_counter() - started)
            rounds += 1
        found[bucket] = BucketResult(min(best, key=best.get), best)
    return found


class TuningRecord:
    """tuning.json: {group key: {bucket: {"winner": variant, "seconds": {...}}}}."""

    def __init__(self, cache: JitCache):
        self.path = Path(cache.root) / "tuning.json"

    def load(self) -> dict:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}  # none yet, or unreadable: untuned
        return data if isinstance(data, dict) else {}

    def results(self, key: str) -> dict[str, BucketResult]:
        """bucket → its result as recorded (the winner's label not checked; timings that are
        not numbers left out)."""
        entry = self.load().get(key, {})
        if not isinstance(entry, dict):
            return {}
        found = {}
        for bucket, row in entry.items():
            if isinstance(row, dict) and isinstance(row.get("winner"), str):
                seconds = row.get("seconds")
                seconds = seconds if isinstance(seconds, dict) else {}
                timed = {k: v for k, v in seconds.items() if isinstance(v, float)}
                found[bucket] = BucketResult(row["winner"], timed)
        return found

    def labels(self, key: str) -> dict[str, str]:
        """bucket → the winner's label as recorded (not checked)."""
        return {bucket: result.winner for bucket, result in self.results(key).items()}

    def winners(self, key: str) -> dict[str, str]:
        """bucket → a fused group's winning variant (codegen_c.VARIANTS; others ignored)."""
        return {b: w for b, w in self.labels(key).items() if w in VARIANTS}

    def store(self, key: str, results: dict[str, BucketResult]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            data = self.load()
            entry = data.setdefault(key, {})
            for bucket, result in results.items():
                entry[bucket] = {"winner": result.winner, "seconds": result.seconds}
            tmp = self.path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(data, indent=1))
            os.replace(tmp, self.path)
