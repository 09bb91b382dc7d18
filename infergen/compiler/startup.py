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
"""

from __future__ import annotations

import time

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
    model_program,
    program_key,
    tuning_key,
)
from infergen.compiler.program_tune import decode_probe, prefill_probe, tune_program
from infergen.compiler.runtime import CompiledLayers, jit_kinds, pointwise_groups
from infergen.compiler.tune import TuningRecord
from infergen.kernels.build import library_built
from infergen.timing import best_seconds_each

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
    unplanned = _programs_unplanned(model, kinds)
    if unplanned is None:
        plans[0][0].items += program_items(
            model, kv_cache, kinds[0][0], traffic, deadline, cache, eager
        )
    else:  # (not built under a budget: the walker runs these layers)
        why = f"not planned ({unplanned}: built without compile_budget_s)"
        plans[0][0].items += [Item(name, "compile", None, 0.0, status=why)
                              for name in (PROGRAM, PREFILL)]  # fmt: skip
    for plan, layers in plans:
        tune_groups(plan, traffic, layers, deadline, cache)
    return [item for plan, _ in plans for item in plan.items]


def _programs_unplanned(model, kinds: list) -> str | None:
    """Why the layer programs are not planned (their probes are decode steps of attention
    layers of one kind), or None."""
    if len(kinds) > 1:
        return f"layers of {len(kinds)} kinds"
    if getattr(model, "state_layers", None):
        return "recurrent state layers"
    return None


def program_items(
    model, kv_cache, graph: Graph, traffic: dict[str, float], deadline: float, cache: JitCache,
    eager: CompiledLayers,
) -> list[Item]:  # fmt: skip
    """The layer program's compile and tuning items for the "jit" layer graph `graph` (see
    the module docstring); `eager` walks the layers op by op."""
    try:
        program = model_program(model, graph)
    except CodegenError as error:  # (the walker runs decode steps)
        return [Item(PROGRAM, "compile", None, 0.0, status=f"not renderable ({error})")]
    key = program_key(program.source, cache)
    cached = any(record["key"] == key for record in cache.entries())
    build = Item(PROGRAM, "compile", None, 0.0 if cached else program_seconds())
    items = [build]
    probes = {b: decode_probe(model, kv_cache, BUCKET_TOKENS[b]) for b in traffic}
    walks = {b: _walk_seconds(eager, *probes[b]) for b in traffic}
    build.gain_ms = 1e3 * sum(traffic[b] * (walk - floor) for b, (walk, floor) in walks.items())
    order = sorted(traffic, key=lambda b: -traffic[b])
    tunes = [Item(PROGRAM, f"tune {b}", None, PROGRAM_TUNE_SECONDS_PRIOR) for b in order]
    runner = None
    if not (build.cost_s and time.perf_counter() + build.cost_s > deadline):
        started = time.perf_counter()
        try:
            runner = LayerProgramRunner(model, kv_cache, graph, eager.static, cache)
            build.spent_s = time.perf_counter() - started
            build.status = "cached" if runner.built.cached else "built"
        except ProgramUnavailable as why:
            build.status = f"unavailable ({why})"
    # the prefill program's build before the decode program's tuning (~30 s a bucket)
    items.append(_prefill_item(model, kv_cache, graph, traffic, deadline, cache, eager))
    items += tunes
    if runner is None:
        return items
    steps = {b: _walk_and_program(eager, runner, *probes[b], walks[b][0]) for b in traffic}
    build.measured_ms = 1e3 * sum(
        traffic[b] * (steps[b]["walk"] - steps[b]["program"]) for b in traffic
    )
    searched = False  # a bucket's search done: the variants are built (the next ones time)
    recorded = TuningRecord(cache).results(tuning_key(program, cache))
    for bucket, tune in zip(order, tunes, strict=True):
        if bucket in recorded:  # searched before
            winner, seconds = recorded[bucket].winner, recorded[bucket].seconds
            tune.status = f"recorded: {winner}"
            if "default" in seconds and winner in seconds:
                tune.gain_ms = tune.measured_ms = (
                    1e3 * traffic[bucket] * (seconds["default"] - seconds[winner])
                )
            continue
        cost = tune.cost_s / 10 if searched else tune.cost_s
        if time.perf_counter() + cost > deadline:
            continue
        started = time.perf_counter()
        found = tune_program(runner, [bucket], deadline - time.perf_counter())
        if bucket not in found:
            continue
        result, searched = found[bucket], True
        tune.spent_s, tune.status = time.perf_counter() - started, f"tuned: {result.winner}"
        default, best = result.seconds["default"], result.seconds[result.winner]
        tune.gain_ms = tune.measured_ms = 1e3 * traffic[bucket] * (default - best)
    return items


PREFILL_PROBE_TOKENS = 64  # the prompt the prefill program's gain is measured on
PREFILL = "prefill layer program"


def _prefill_item(
    model, kv_cache, graph: Graph, traffic: dict[str, float], deadline: float, cache: JitCache,
    eager: CompiledLayers,
) -> Item:  # fmt: skip
    """The prefill layer program's compile item. Its gain is measured on one prompt of
    PREFILL_PROBE_TOKENS tokens (expected: that prefill walked op by op minus the walk's GEMMs
    and attention; measured: the walk minus the program, in turns), per step of the traffic's
    buckets above one token (the steps that may be prefills: the record counts steps by
    token count, not by kind)."""
    try:
        program = model_program(model, graph, "prefill")
    except CodegenError as error:
        return Item(PREFILL, "compile", None, 0.0, status=f"not renderable ({error})")
    cached = any(r["key"] == program_key(program.source, cache) for r in cache.entries())
    item = Item(PREFILL, "compile", None, 0.0 if cached else program_seconds())
    share = sum(w for b, w in traffic.items() if BUCKET_TOKENS[b] > 1)
    h, step = prefill_probe(model, kv_cache, PREFILL_PROBE_TOKENS)
    walk, floor = _walk_seconds(eager, h, step)
    item.gain_ms = 1e3 * share * (walk - floor)
    if item.cost_s and time.perf_counter() + item.cost_s > deadline:
        return item
    started = time.perf_counter()
    try:
        runner = LayerProgramRunner(model, kv_cache, graph, eager.static, cache, phase="prefill")
    except ProgramUnavailable as why:
        item.status = f"unavailable ({why})"
        return item
    item.spent_s = time.perf_counter() - started
    item.status = "cached" if runner.built.cached else "built"
    both = _walk_and_program(eager, runner, h, step, walk)
    item.measured_ms = 1e3 * share * (both["walk"] - both["program"])
    return item


STEP_SECONDS = 0.3  # timing per step measurement: repeats = this / the step, within 3..20


def _repeats(seconds: float) -> int:
    return max(3, min(20, int(STEP_SECONDS / max(seconds, 1e-6))))


def _walker(eager: CompiledLayers, h: torch.Tensor, step):
    layers = len(eager.model.layers)

    def walk():
        x, delta = h.clone(), torch.zeros_like(h)
        for index in range(layers):
            x, delta = eager.run_layer(index, x, delta, step)

    return walk


def _walk_seconds(eager: CompiledLayers, h: torch.Tensor, step) -> tuple[float, float]:
    """(a decode step walked op by op, the part of it in GEMMs and attention): the best of as
    many walks as fit in about STEP_SECONDS (3 to 20), timed plainly and, in turns, profiled
    per node (the profile's own cost kept out of the walk's time)."""
    walk = _walker(eager, h, step)
    started = time.perf_counter()
    walk()  # (warm, and the size of a walk)
    total = floor = float("inf")
    for _ in range(_repeats(time.perf_counter() - started)):
        started = time.perf_counter()
        walk()
        total = min(total, time.perf_counter() - started)
        eager.profile = {}
        walk()
        floor = min(floor, sum(eager.profile.get(k, 0.0) for k in ("linear", "attention")))
        eager.profile = None
    return total, floor


def _walk_and_program(eager, runner: LayerProgramRunner, h: torch.Tensor, step, walk: float):
    """{"walk", "program"}: the two timed in turns (a busy spell of the machine costs both
    alike), best of as many rounds as a walk of `walk` seconds fits in STEP_SECONDS."""
    fns = {"walk": _walker(eager, h, step), "program": lambda: runner.run(h.clone(), step, DEFAULT)}
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
