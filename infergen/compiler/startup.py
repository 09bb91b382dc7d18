"""What an engine start (`compile_budget_s`) or `infergen compile` builds within a time budget,
and what each item is expected to save beside what it saved once built.

Order: the fused groups (budget.py: most expected gain per second first), the GEMMs with
their tails fused (epilogue_budget.py), the decode layer program, the prefill layer program
(its gain measured on one 64-token prompt, per step of the multi-token buckets), then the decode
layer program's tuning per bucket (program_tune.py; a bucket tuning.json already holds
is taken as recorded, not searched again), then the groups' tuning with what is left. The
layer program's expected gain per bucket is measured, not guessed, the way a group's is: a
decode step walked op by op (compile="eager", what runs without it) minus the time that walk
spends in the GEMMs and attention (what the program calls too, and cannot beat), times the
bucket's share of the traffic; once built, its gain is that walk minus the program's own
step, the two timed in turns. The walk's other ops are the pointwise work and the per-op
dispatch; the groups' gains count the pointwise part again (they serve the steps the program
does not run: prefill and mixed steps), so the items' gains overlap for decode buckets.

A model with several kinds of layer (decoder.py) has programs per kind, each planned on its
own layers ("kind K layer program"), every kind's built before any is tuned. A mixer the
module runs counts in the floor whole (the program calls it back), or by its projections
where the decode program has its native step (program.NATIVE_MIXERS).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from infergen.compiler.buckets import BUCKET_TOKENS
from infergen.compiler.budget import Item, compile_groups, tune_groups
from infergen.compiler.codegen_c import CodegenError
from infergen.compiler.epilogue_budget import epilogue_items
from infergen.compiler.ir import Graph
from infergen.compiler.jit_cache import JitCache
from infergen.compiler.program import (
    DEFAULT,
    LIBRARY,
    LayerProgramRunner,
    ProgramUnavailable,
    is_mixer,
    model_program,
    native_row,
    program_key,
    tuning_key,
)
from infergen.compiler.program_tune import decode_probe, prefill_probe, tune_program
from infergen.compiler.runtime import CompiledLayers, jit_kinds, pointwise_groups
from infergen.compiler.tune import TuningRecord
from infergen.kernels.build import library_built
from infergen.timing import best_seconds, best_seconds_each

PROGRAM_SECONDS_PRIOR = 1.0  # compiling the layer programs' own code
LIBRARY_SECONDS_PRIOR = 6.5  # the kernel library they link against, once per machine
PROGRAM_TUNE_SECONDS_PRIOR = 30.0  # the first bucket's search (compiles its variants)
PROGRAM = "layer program"  # the program's items' group name


def program_seconds() -> float:
    """The expected seconds of compiling the layer programs: their own code, and the kernel
    library of the default variant where it is not built yet."""
    return PROGRAM_SECONDS_PRIOR + (0.0 if library_built(LIBRARY) else LIBRARY_SECONDS_PRIOR)


def plan_startup(
    model, kv_cache, traffic: dict[str, float], budget_s: float, cache: JitCache
) -> list[Item]:
    """Build and tune within `budget_s` seconds under the traffic mix (bucket → share of
    steps); returns every item with what happened to it. Run it before the engine holds any
    sequence (timing the layer program writes KV slots)."""
    deadline = time.perf_counter() + budget_s
    kinds = jit_kinds(model, kv_cache)
    eager = CompiledLayers(model, kv_cache, "eager")  # the walk, and the weight bindings
    plans = []
    for k, (graph, indices) in enumerate(kinds):  # (a group's gain: times its kind's layers)
        prefix = f"kind {k} " if len(kinds) > 1 else ""
        groups = [
            (f"{prefix}group {i} -> {', '.join(v.name for v in node.outputs)}", node.attrs["graph"])
            for i, node in enumerate(pointwise_groups(graph))
        ]
        plan = compile_groups(groups, traffic, len(indices), deadline, cache)
        statics = [eager.static[i] for i in indices]
        plan.items += epilogue_items(graph, traffic, len(indices), deadline, cache, statics)
        plans.append((plan, len(indices)))
    tunings = []  # every kind's programs built before any is tuned (~30 s a bucket)
    for k, (graph, indices) in enumerate(kinds):
        prefix = f"kind {k} " if len(kinds) > 1 else ""
        items, tune = program_items(
            model, kv_cache, graph, traffic, deadline, cache, eager, indices, prefix
        )
        plans[k][0].items += items
        tunings.append(tune)
    for tune in tunings:
        tune()
    for plan, layers in plans:
        tune_groups(plan, traffic, layers, deadline, cache)
    return [item for plan, _ in plans for item in plan.items]


def program_items(
    model, kv_cache, graph: Graph, traffic: dict[str, float], deadline: float, cache: JitCache,
    eager: CompiledLayers, layers: list[int], prefix: str = "",
) -> tuple[list[Item], Callable[[], None]]:  # fmt: skip
    """The layer programs' compile and tuning items for the "jit" layer graph `graph` of the
    model's `layers` (see the module docstring), their groups named `prefix` + PROGRAM or
    PREFILL; `eager` walks the layers op by op. Builds the programs that fit; returns the
    items and what tunes the decode program within the deadline (the tuning items' status)."""
    name = prefix + PROGRAM
    try:
        program = model_program(model, graph)
    except CodegenError as error:  # (the walker runs decode steps)
        return [Item(name, "compile", None, 0.0, status=f"not renderable ({error})")], _nothing
    key = program_key(program.source, cache)
    cached = any(record["key"] == key for record in cache.entries())
    build = Item(name, "compile", None, 0.0 if cached else program_seconds())
    items = [build]
    probes = {b: decode_probe(model, kv_cache, BUCKET_TOKENS[b]) for b in traffic}
    walks = {
        b: _walk_seconds(eager, *probes[b], layers, _native_floor(eager, layers, BUCKET_TOKENS[b]))
        for b in traffic
    }
    build.gain_ms = 1e3 * sum(traffic[b] * (walk - floor) for b, (walk, floor) in walks.items())
    order = sorted(traffic, key=lambda b: -traffic[b])
    tunes = [Item(name, f"tune {b}", None, PROGRAM_TUNE_SECONDS_PRIOR) for b in order]
    runner = None
    if not (build.cost_s and time.perf_counter() + build.cost_s > deadline):
        started = time.perf_counter()
        try:
            runner = LayerProgramRunner(model, kv_cache, graph, eager.static, cache,
                                        layers=layers)  # fmt: skip
            build.spent_s = time.perf_counter() - started
            build.status = "cached" if runner.built.cached else "built"
        except ProgramUnavailable as why:
            build.status = f"unavailable ({why})"
    # the prefill program's build before the decode program's tuning (~30 s a bucket)
    items.append(
        _prefill_item(model, kv_cache, graph, traffic, deadline, cache, eager, layers, prefix)
    )
    items += tunes
    if runner is None:
        return items, _nothing
    steps = {b: _walk_and_program(eager, runner, *probes[b], walks[b][0], layers) for b in traffic}
    build.measured_ms = 1e3 * sum(
        traffic[b] * (steps[b]["walk"] - steps[b]["program"]) for b in traffic
    )
    recorded = TuningRecord(cache).results(tuning_key(program, cache))

    def tune() -> None:
        searched = False  # a bucket's search done: the variants are built (the next ones time)
        for bucket, item in zip(order, tunes, strict=True):
            if bucket in recorded:  # searched before
                winner, seconds = recorded[bucket].winner, recorded[bucket].seconds
                item.status = f"recorded: {winner}"
                if "default" in seconds and winner in seconds:
                    item.gain_ms = item.measured_ms = (
                        1e3 * traffic[bucket] * (seconds["default"] - seconds[winner])
                    )
                continue
            cost = item.cost_s / 10 if searched else item.cost_s
            if time.perf_counter() + cost > deadline:
                continue
            started = time.perf_counter()
            found = tune_program(runner, [bucket], deadline - time.perf_counter())
            if bucket not in found:
                continue
            result, searched = found[bucket], True
            item.spent_s, item.status = time.perf_counter() - started, f"tuned: {result.winner}"
            default, best = result.seconds["default"], result.seconds[result.winner]
            item.gain_ms = item.measured_ms = 1e3 * traffic[bucket] * (default - best)

    return items, tune


def _nothing() -> None:
    pass


PREFILL_PROBE_TOKENS = 64  # the prompt the prefill program's gain is measured on
PREFILL = "prefill layer program"


def _prefill_item(
    model, kv_cache, graph: Graph, traffic: dict[str, float], deadline: float, cache: JitCache,
    eager: CompiledLayers, layers: list[int], prefix: str,
) -> Item:  # fmt: skip
    """The prefill layer program's compile item. Its gain is measured on one prompt of
    PREFILL_PROBE_TOKENS tokens (expected: that prefill walked op by op minus the walk's GEMMs
    and attention; measured: the walk minus the program, in turns), per step of the traffic's
    buckets above one token (the steps that may be prefills: the record counts steps by
    token count, not by kind)."""
    name = prefix + PREFILL
    try:
        program = model_program(model, graph, "prefill")
    except CodegenError as error:
        return Item(name, "compile", None, 0.0, status=f"not renderable ({error})")
    cached = any(r["key"] == program_key(program.source, cache) for r in cache.entries())
    item = Item(name, "compile", None, 0.0 if cached else program_seconds())
    share = sum(w for b, w in traffic.items() if BUCKET_TOKENS[b] > 1)
    h, step = prefill_probe(model, kv_cache, PREFILL_PROBE_TOKENS)
    native = _native_floor(eager, layers, h.shape[0], prefill=True)
    walk, floor = _walk_seconds(eager, h, step, layers, native)
    item.gain_ms = 1e3 * share * (walk - floor)
    if item.cost_s and time.perf_counter() + item.cost_s > deadline:
        return item
    started = time.perf_counter()
    try:
        runner = LayerProgramRunner(model, kv_cache, graph, eager.static, cache,
                                    phase="prefill", layers=layers)  # fmt: skip
    except ProgramUnavailable as why:
        item.status = f"unavailable ({why})"
        return item
    item.spent_s = time.perf_counter() - started
    item.status = "cached" if runner.built.cached else "built"
    both = _walk_and_program(eager, runner, h, step, walk, layers)
    item.measured_ms = 1e3 * share * (both["walk"] - both["program"])
    return item


# what a layer program calls too and cannot beat: the GEMMs, attention, and a mixer the
# module runs (called back, or its native step: the same projections and scan)
FLOOR_OPS = ("linear", "attention", "mixer")
STEP_SECONDS = 0.3  # timing per step measurement: repeats = this / the step, within 3..20


def _repeats(seconds: float) -> int:
    return max(3, min(20, int(STEP_SECONDS / max(seconds, 1e-6))))


def _walker(eager: CompiledLayers, h: torch.Tensor, step, layers: list[int]):
    def walk():
        x, delta = h.clone(), torch.zeros_like(h)
        for index in layers:
            x, delta = eager.run_layer(index, x, delta, step)

    return walk


def _walk_seconds(
    eager: CompiledLayers, h: torch.Tensor, step, layers: list[int], native: float | None = None
) -> tuple[float, float]:
    """(a step of `layers` walked op by op, the part of it the program runs too: GEMMs,
    attention, and the mixers the modules run, or `native` seconds for them where the
    program has native steps for them): the best of as many walks as fit in about
    STEP_SECONDS (3 to 20), timed plainly and, in turns, profiled per node (the profile's own
    cost kept out of the walk's time)."""
    ops = FLOOR_OPS if native is None else tuple(op for op in FLOOR_OPS if op != "mixer")
    walk = _walker(eager, h, step, layers)
    started = time.perf_counter()
    walk()  # (warm, and the size of a walk)
    total = floor = float("inf")
    for _ in range(_repeats(time.perf_counter() - started)):
        started = time.perf_counter()
        walk()
        total = min(total, time.perf_counter() - started)
        eager.profile = {}
        walk()
        floor = min(floor, (native or 0.0) + sum(eager.profile.get(k, 0.0) for k in ops))
        eager.profile = None
    return total, floor


def _native_floor(
    eager: CompiledLayers, layers: list[int], tokens: int, prefill: bool = False
) -> float | None:
    """Seconds of the projections of `layers`' mixers at `tokens` rows, where each has a
    native step that runs a step of them (program.NATIVE_MIXERS: every decode step; a prefill
    of a fresh prompt of at most its prefill_rows and prefill_context; the step runs those
    GEMMs as the module does, the rest of the module's work is what it saves); None where
    one has none (the program calls it back: its whole time is the floor)."""
    total = 0.0
    for index in layers:
        for module in filter(is_mixer, eager.static[index].values()):
            found = native_row(module)
            if found is None:
                return None
            row, inner = found
            if prefill and not (
                tokens <= row.prefill_rows and tokens <= (row.prefill_context or tokens)
            ):
                return None
            for linear in filter(None, (getattr(inner, name) for name in row.projections)):
                x = torch.randn(tokens, linear.in_features, dtype=eager.model.dtype)
                total += best_seconds(lambda linear=linear, x=x: linear(x), 5)
    return total


def _walk_and_program(
    eager, runner: LayerProgramRunner, h: torch.Tensor, step, walk: float, layers: list[int]
):
    """{"walk", "program"}: the two timed in turns on `layers` (a busy spell of the machine
    costs both alike), best of as many rounds as a walk of `walk` seconds fits in
    STEP_SECONDS."""
    fns = {
        "walk": _walker(eager, h, step, layers),
        "program": lambda: runner.run(h.clone(), step, DEFAULT),
    }
    return best_seconds_each(fns, _repeats(walk))


def plan_lines(items: list[Item]) -> list[str]:
    """The plan as a table: each item's status, seconds spent, expected and measured gain (ms
    per step of the traffic mix), then what the skipped items would have saved."""
    lines = [f"{'item':<44} {'status':<26} {'spent s':>8} {'expected ms':>12} {'measured ms':>12}"]
    for item in items:
        label = f"{item.kind}: {item.group}"[:44]
        lines.append(
            f"{label:<44} {item.status[:26]:<26} {item.spent_s:>8.2f} "
            f"{_ms(item.gain_ms):>12} {_ms(item.measured_ms):>12}"
        )
    skipped = [i for i in items if i.status == "skipped"]
    lost = sum(i.gain_ms or 0.0 for i in skipped)
    lines.append(f"skipped {len(skipped)} items; their expected gain: {lost:.3f} ms per step")
    return lines


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
