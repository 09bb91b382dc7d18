"""A startup budget: which kernels to compile and which buckets to tune in S seconds, chosen
by expected gain under a traffic mix, and what the skipped ones would have saved.

The expected gain of compiling a fused group, per bucket, is measured, not guessed: the time
of running its ops one by one (the reference executors, what the runtime does with a group it
has no kernel for) minus the time a kernel of it is predicted to take — a kernel call that does
no work (the wrapper's argument passing and output allocation, measured with a native no-op
in place of the kernel), plus what a copy of the rows the group reads and writes costs beyond
one token's copy (their bytes), plus its pointwise arithmetic (each primitive's reference op
timed once, less an add moving as many bytes: a sigmoid's exponential) — at the bucket's
token count, times the layers that run it,
weighted by the bucket's share of the traffic. Once built, the kernel's own time replaces the
prediction (`Item.measured_ms`). A kernel found in the JIT cache costs nothing to take.
Compiling is done most-gain-per-second first while the budget lasts (the cost of a compile is
estimated from the ones done so far); tuning then takes the remaining budget, buckets in
traffic order. A tuned bucket's gain is what its winner saves over the default variant; a
skipped one's expected gain is the tuned ones' mean relative gain applied to it
("unmeasured" when nothing was tuned).
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable
from dataclasses import dataclass
from math import prod
from pathlib import Path

import torch

from infergen.compiler.buckets import BUCKET_TOKENS
from infergen.compiler.codegen_c import PARALLEL_MIN_ELEMENTS, CodegenError, variants_for
from infergen.compiler.interpret import EXECUTORS, run
from infergen.compiler.ir import TOKENS, Graph, Node, Op, OpKind
from infergen.compiler.jit_cache import Built, JitCache
from infergen.compiler.kernel import GroupKernel, compile_group
from infergen.compiler.tune import TuningRecord, group_key, random_inputs, tune_group
from infergen.timing import best_seconds, best_seconds_each

COMPILE_SECONDS_PRIOR = 0.2  # per kernel, until this machine has compiled one
# timings per measurement, the best kept: a one-token group runs in microseconds, where a gain
# of a few is what is measured (5 left the expected / measured ratio swinging by 30 %)
REPEATS = 20
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
    # what it saves, measured once built: the ops one by one against the built kernel (a
    # tuning: the default variant against the winner); None when not built
    measured_ms: float | None = None


def _time_ops(graph: Graph, inputs: list[torch.Tensor]) -> float:
    env = {v.name: x for v, x in zip(graph.inputs, inputs, strict=True)}
    return best_seconds(lambda: run(graph, env), REPEATS)


def _time_one_pass(graph: Graph, inputs: list[torch.Tensor]) -> float:
    """A copy of the token rows the group reads and writes (weights and gathered tables are
    left out: a kernel reads a weight once and a table's rows by index)."""
    outputs = run(graph, {v.name: x for v, x in zip(graph.inputs, inputs, strict=True)})
    rowed = [x for v, x in zip(graph.inputs, inputs, strict=True) if v.role != "weight"]
    tensors = [t for t in (*rowed, *outputs) if isinstance(t, torch.Tensor) and t.dim() > 1]
    return best_seconds(lambda: [t.clone() for t in tensors], REPEATS)


def _time_call(graph: Graph, inputs: list[torch.Tensor]) -> float:
    """A call of a compiled kernel of this group that does no work: the wrapper's argument
    passing and output allocation, and the native call (into libc's abs, which ignores the
    arguments)."""
    noop = ctypes.CDLL(None).abs
    kernel = GroupKernel(graph, Built(noop, "noop", Path(), 0.0, True))
    return best_seconds(lambda: kernel(*inputs), REPEATS)


CALIBRATION_SHAPE = (64, 4096)  # where a primitive's arithmetic is timed (in L2)
_ARITHMETIC: dict[tuple, float] = {}  # (op, attrs) → seconds per element (this process)


def element_seconds(node: Node) -> float:
    """Seconds of arithmetic per element of a pointwise primitive, beyond moving its bytes,
    on this machine's threads: its reference executor on CALIBRATION_SHAPE inputs less what an
    add moving as many bytes takes (a sigmoid's exponential and division: ~0.15 ns here; an
    add or a multiply: 0). Measured once per process."""
    coarse = (Op.CAST, Op.SILU_MUL, Op.GELU_MUL, Op.ROPE)
    if node.op.kind is not OpKind.POINTWISE or node.op in coarse:
        return 0.0
    key = (node.op, repr(sorted(node.attrs.items())))
    if key not in _ARITHMETIC:
        xs = [torch.randn(CALIBRATION_SHAPE) for _ in node.inputs]
        a, b = torch.randn(CALIBRATION_SHAPE), torch.randn(CALIBRATION_SHAPE)
        t_op = best_seconds(lambda: EXECUTORS[node.op](xs, node.attrs, {}), REPEATS)
        moved = best_seconds(lambda: torch.add(a, b), REPEATS) * (len(xs) + 1) / 3
        _ARITHMETIC[key] = max(0.0, t_op - moved) / prod(CALIBRATION_SHAPE)
    return _ARITHMETIC[key]


def _arithmetic_seconds(graph: Graph, tokens: int) -> float:
    """The group's pointwise arithmetic at `tokens` rows (on one thread when the kernel keeps
    the step on one: codegen_c's fork threshold)."""
    elements = sum(
        element_seconds(node) * tokens * prod(node.outputs[0].shape[1:])
        for node in graph.nodes
        if node.outputs and node.outputs[0].rank and node.outputs[0].shape[0] == TOKENS
    )
    row = sum(prod(v.shape[1:]) for v in graph.outputs)
    serial = tokens * row < PARALLEL_MIN_ELEMENTS
    return elements * (torch.get_num_threads() if serial else 1)


def predicted_seconds(graph: Graph, inputs: list[torch.Tensor]) -> float:
    """What a compiled kernel of the group is expected to take on `inputs`: a call that does
    no work, plus what one pass over its rows costs beyond one token's pass (the bytes), plus
    its pointwise arithmetic (element_seconds)."""
    one_token = [x[:1] if v.rank and v.shape[0] == TOKENS else x
                 for v, x in zip(graph.inputs, inputs, strict=True)]  # fmt: skip
    data = max(0.0, _time_one_pass(graph, inputs) - _time_one_pass(graph, one_token))
    tokens = next(x.shape[0] for v, x in zip(graph.inputs, inputs, strict=True)
                  if v.rank and v.shape[0] == TOKENS)  # fmt: skip
    return _time_call(graph, inputs) + data + _arithmetic_seconds(graph, tokens)


def group_gain_ms(
    graph: Graph, traffic: dict[str, float], layers: int, kernel: Callable | None = None
) -> float:
    """Expected ms saved per step by compiling this group (see the module docstring); with
    the built `kernel`, the measured ms it saves (its time instead of the predicted one)."""
    gain = 0.0
    for bucket, weight in traffic.items():
        inputs = random_inputs(graph, BUCKET_TOKENS[bucket])
        if kernel is None:
            ops, fused = _time_ops(graph, inputs), predicted_seconds(graph, inputs)
        else:  # (in turns: a drift of this host's speed moves both, not the difference alone)
            env = {v.name: x for v, x in zip(graph.inputs, inputs, strict=True)}
            both = best_seconds_each(
                {"ops": lambda e=env: run(graph, e), "kernel": lambda x=inputs: kernel(*x)}, REPEATS
            )
            ops, fused = both["ops"], both["kernel"]
        gain += weight * (ops - fused) * layers
    return gain * 1e3


def plan_and_build(
    groups: list[tuple[str, Graph]],
    traffic: dict[str, float],
    layers: int,
    budget_s: float,
    cache: JitCache,
) -> list[Item]:
    """Compile and tune within `budget_s`; returns every item with what happened to it."""
    deadline = time.perf_counter() + budget_s
    plan = compile_groups(groups, traffic, layers, deadline, cache)
    tune_groups(plan, traffic, layers, deadline, cache)
    return plan.items


@dataclass
class GroupPlan:
    """The groups' items (compiles first, then tunings as tune_groups adds them)."""

    items: list[Item]
    compiles: list[tuple[Item, Graph]]  # in the order they were considered
    compile_times: list[float]  # seconds of the compiles done (a compile's estimate)


def compile_groups(
    groups: list[tuple[str, Graph]],
    traffic: dict[str, float],
    layers: int,
    deadline: float,
    cache: JitCache,
) -> GroupPlan:
    """Compile the groups, most expected gain per second first, until `deadline`
    (time.perf_counter()); what was cached costs nothing and is always taken."""
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
        if item.cost_s and time.perf_counter() + estimate > deadline:
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
        item.measured_ms = group_gain_ms(graph, traffic, layers, kernel)
        if not kernel.built.cached:
            compile_times.append(kernel.built.seconds)
    return GroupPlan(items, compiles, compile_times)


def tune_groups(
    plan: GroupPlan, traffic: dict[str, float], layers: int, deadline: float, cache: JitCache
) -> None:
    """Tune the built groups' buckets, in traffic order, until `deadline`; adds the items."""
    compiles, items, compile_times = plan.compiles, plan.items, plan.compile_times
    record = TuningRecord(cache)
    per_compile = (sum(compile_times) / len(compile_times)) if compile_times else 0.2
    relative: list[float] = []
    pending: list[tuple[Item, Graph, str]] = []
    for bucket in sorted(traffic, key=lambda b: -traffic[b]):
        for item, graph in compiles:
            if item.status in ("built", "cached"):  # (a shared kernel is tuned once)
                cost = per_compile * (len(variants_for(graph)) - 1) + TUNE_MEASURE_SECONDS
                tune = Item(item.group, f"tune {bucket}", None, cost)
                items.append(tune)
                pending.append((tune, graph, bucket))
    for tune, graph, bucket in pending:
        if time.perf_counter() + tune.cost_s > deadline:
            continue
        t0 = time.perf_counter()
        result = tune_group(graph, cache, [bucket], TUNE_MEASURE_SECONDS)[bucket]
        record.store(group_key(graph, cache), {bucket: result})
        tune.spent_s, tune.status = time.perf_counter() - t0, "tuned"
        default, best = result.seconds["default"], result.seconds[result.winner]
        # (a tuning's gain is known only by measuring it: both columns show that)
        tune.gain_ms = tune.measured_ms = (default - best) * layers * traffic[bucket] * 1e3
        relative.append((default - best) / default if default > 0 else 0.0)
    if relative:  # skipped tunings: the tuned ones' mean relative gain on their default time
        mean = sum(relative) / len(relative)
        for tune, graph, bucket in pending:
            if tune.status == "skipped":
                inputs = random_inputs(graph, BUCKET_TOKENS[bucket])
                kernel = compile_group(graph, cache)  # built above: from memory
                default = best_seconds(lambda k=kernel, x=inputs: k(*x), 3)
                tune.gain_ms = mean * default * layers * traffic[bucket] * 1e3
