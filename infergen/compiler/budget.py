"""A startup budget: which kernels to compile and which buckets to tune in S seconds, chosen
by expected gain under a traffic mix, and what the skipped ones would have saved.

The expected gain of compiling a fused group, per bucket, is measured, not guessed: the time
of running its ops one by one (the reference executors, what the runtime does with a group it
has no kernel for) minus the time of one pass over the group's inputs and outputs (a copy of
their bytes: what a fused kernel cannot beat), at the bucket's token count, times the layers
that run it, weighted by the bucket's share of the traffic. A kernel found in the JIT cache
costs nothing to take. Compiling is done most-gain-per-second first while the budget lasts
(the cost of a compile is estimated from the ones done so far); tuning then takes the
remaining budget, buckets in traffic order. A tuned bucket's gain is what its winner saves over
the default variant; a skipped one's expected gain is the tuned ones' mean relative gain
applied to it ("unmeasured" when nothing was tuned).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from infergen.compiler.buckets import BUCKET_TOKENS
from infergen.compiler.codegen_c import VARIANTS, CodegenError
from infergen.compiler.interpret import run
from infergen.compiler.ir import Graph
from infergen.compiler.jit_cache import JitCache
from infergen.compiler.kernel import compile_group
from infergen.compiler.tune import TuningRecord, group_key, random_inputs, tune_group
from infergen.timing import best_seconds

COMPILE_SECONDS_PRIOR = 0.2  # per kernel, until this machine has compiled one
TUNE_MEASURE_SECONDS = 0.05  # timing share per (group, bucket)


def parse_traffic(text: str) -> dict[str, float]:
    """ "1=0.7,2-8=0.2,65-512=0.1" → bucket weights summing to 1."""
    weights: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        bucket, _, share = part.partition("=")
        if bucket not in BUCKET_TOKENS:
            raise ValueError(f"traffic bucket {bucket!r}: expected one of {list(BUCKET_TOKENS)}")
        try:
            weights[bucket] = float(share)
        except ValueError:
            raise ValueError(f"traffic share {share!r} of bucket {bucket}: not a number") from None
    total = sum(weights.values())
    if total <= 0:
        raise ValueError(f"traffic {text!r}: shares must add up to more than 0")
    return {b: w / total for b, w in weights.items()}


@dataclass
class Item:
    group: str
    kind: str  # "compile" or "tune <bucket>"
    gain_ms: float | None  # expected ms saved per step of the traffic mix (None: unmeasured)
    cost_s: float  # estimated seconds of startup
    spent_s: float = 0.0
    status: str = "skipped"  # built / cached / tuned / skipped / not renderable


def _time_ops(graph: Graph, inputs: list[torch.Tensor]) -> float:
    env = {v.name: x for v, x in zip(graph.inputs, inputs, strict=True)}
    return best_seconds(lambda: run(graph, env), 3)


def _time_one_pass(graph: Graph, inputs: list[torch.Tensor]) -> float:
    """A copy of the token rows the group reads and writes (weights and gathered tables are
    left out: a kernel reads a weight once and a table's rows by index)."""
    outputs = run(graph, {v.name: x for v, x in zip(graph.inputs, inputs, strict=True)})
    rowed = [x for v, x in zip(graph.inputs, inputs, strict=True) if v.role != "weight"]
    tensors = [t for t in (*rowed, *outputs) if isinstance(t, torch.Tensor) and t.dim() > 1]
    return best_seconds(lambda: [t.clone() for t in tensors], 3)


def group_gain_ms(graph: Graph, traffic: dict[str, float], layers: int) -> float:
    """Expected ms saved per step by compiling this group (see the module docstring)."""
    gain = 0.0
    for bucket, weight in traffic.items():
        inputs = random_inputs(graph, BUCKET_TOKENS[bucket])
        saved = _time_ops(graph, inputs) - _time_one_pass(graph, inputs)
        gain += weight * max(0.0, saved) * layers
    return gain * 1e3


def plan_and_build(
    groups: list[tuple[str, Graph]],
    traffic: dict[str, float],
    layers: int,
    budget_s: float,
    cache: JitCache,
) -> list[Item]:
    """Compile and tune within `budget_s`; returns every item with what happened to it."""
    started = time.perf_counter()
    cached = {record["key"] for record in cache.entries()}
    items: list[Item] = []
    compiles: list[tuple[Item, Graph]] = []
    keys: list[str] = []
    gains: dict[str, float] = {}  # kernel key → its gain, measured once (identical groups)
    for name, graph in groups:
        key = cache.key(graph.canonical(), "variant=default")
        if key not in gains:
            gains[key] = group_gain_ms(graph, traffic, layers)
        item = Item(name, "compile", gains[key], 0.0 if key in cached else COMPILE_SECONDS_PRIOR)
        items.append(item)
        compiles.append((item, graph))
        keys.append(key)
    # identical groups share one kernel: it gains what all of them gain, and the first of
    # them in graph order builds it (a fixed order, whatever the timings' noise)
    shared = {key: keys.count(key) * gain for key, gain in gains.items()}
    first = {key: keys.index(key) for key in gains}
    order = sorted(
        range(len(compiles)),
        key=lambda i: (-shared[keys[i]] / max(compiles[i][0].cost_s, 1e-3), first[keys[i]], i),
    )
    compiles = [compiles[i] for i in order]
    compile_times: list[float] = []
    built_now: dict[str, str] = {}  # kernel key → the group that built it in this plan
    for item, graph in compiles:
        estimate = (sum(compile_times) / len(compile_times)) if compile_times else item.cost_s
        if item.cost_s and time.perf_counter() - started + estimate > budget_s:
            continue
        t0 = time.perf_counter()
        try:
            kernel = compile_group(graph, cache)
        except CodegenError:
            item.status = "not renderable"
            continue
        item.spent_s = time.perf_counter() - t0
        if kernel.built.key in built_now:  # the same graph as another group: one kernel
            item.status = f"= {built_now[kernel.built.key]}"
            continue
        built_now[kernel.built.key] = item.group.split(" ->")[0]
        item.status = "cached" if kernel.built.cached else "built"
        if not kernel.built.cached:
            compile_times.append(kernel.built.seconds)
    _tune(compiles, traffic, layers, budget_s, started, cache, items, compile_times)
    return items


def _tune(compiles, traffic, layers, budget_s, started, cache, items, compile_times) -> None:
    record = TuningRecord(cache)
    per_compile = (sum(compile_times) / len(compile_times)) if compile_times else 0.2
    relative: list[float] = []
    pending: list[tuple[Item, Graph, str]] = []
    for bucket in sorted(traffic, key=lambda b: -traffic[b]):
        for item, graph in compiles:
            if item.status in ("built", "cached"):  # (a shared kernel is tuned once)
                cost = per_compile * (len(VARIANTS) - 1) + TUNE_MEASURE_SECONDS
                tune = Item(item.group, f"tune {bucket}", None, cost)
                items.append(tune)
                pending.append((tune, graph, bucket))
    for tune, graph, bucket in pending:
        if time.perf_counter() - started + tune.cost_s > budget_s:
            continue
        t0 = time.perf_counter()
        result = tune_group(graph, cache, [bucket], TUNE_MEASURE_SECONDS)[bucket]
        record.store(group_key(graph, cache), {bucket: result})
        tune.spent_s, tune.status = time.perf_counter() - t0, "tuned"
        default, best = result.seconds["default"], result.seconds[result.winner]
        tune.gain_ms = (default - best) * layers * traffic[bucket] * 1e3
        relative.append((default - best) / default if default > 0 else 0.0)
    if relative:  # skipped tunings: the tuned ones' mean relative gain on their default time
        mean = sum(relative) / len(relative)
        for tune, graph, bucket in pending:
            if tune.status == "skipped":
                inputs = random_inputs(graph, BUCKET_TOKENS[bucket])
                kernel = compile_group(graph, cache)  # built above: from memory
                default = best_seconds(lambda k=kernel, x=inputs: k(*x), 3)
                tune.gain_ms = mean * default * layers * traffic[bucket] * 1e3
