"""The layer program's tuner: per token-count bucket, which variant (program_variants.py) runs
a decode step of the model fastest on this machine.

The search is by coordinate: from the default variant, each knob in turn (KNOBS' order) has
its values compiled (through the JIT cache) and timed round robin on the same decode step —
`tokens` sequences (the bucket's representative count) each `context` positions long, over
blocks of the engine's still empty KV cache — and the fastest value is kept before the next
knob when it beats the value kept by more than MARGIN (these machines are noisy); a winner
other than the default must beat it again, by MARGIN, in paired rounds of their own — both
the median of the rounds' ratios and the best of each side (whose times are the two recorded:
a winner's recorded gain is never below the margin). With the best of each side alone, a
winner whose lucky round met the default's ordinary ones ran 1-2.5 % slower than the default
in a new engine (bench_tuner, 2026-12-07: 0.975x, 0.987x, 0.981x). The winner
per bucket and every variant's best time go into tuning.json under the program's tuning key;
LayerProgramRunner runs the winners from then on. It stops where the time given runs out: a
knob whose values are not all built by then keeps its value, the buckets after get nothing
(it overruns by at most one compile and one knob's timing).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from infergen.compiler.buckets import BUCKET_TOKENS
from infergen.compiler.program import DEFAULT, LayerProgramRunner, tuning_key
from infergen.compiler.program_variants import KNOBS, ProgramVariant
from infergen.compiler.tune import BucketResult, TuningRecord
from infergen.ops.paged_attention import AttentionPlan, PrefillItem
from infergen.ops.rope import RopeInputs
from infergen.timing import best_seconds_each, paired_speedup

PROBE_CONTEXT = 512  # positions per sequence in the timed decode step
ROUNDS = 5  # timings per candidate per knob (round robin; the best counts)
MARGIN = 0.02  # a value replaces the one kept only when its step is this much faster


@dataclass(frozen=True)
class ProbeStep:
    """The parts of a step the layer programs and the layers walked op by op read: the
    attention plan, KV slots and RoPE inputs (None: a model without KV layers, Mamba2), and
    for recurrent layers each sequence's token rows, state slot and fresh flag."""

    attn_plan: AttentionPlan | None
    slot_mapping: torch.Tensor | None
    rope: RopeInputs
    query_start_loc: list[int]
    state_slots: torch.Tensor
    fresh: torch.Tensor

    @property
    def attn_plans(self) -> list[AttentionPlan]:
        return [self.attn_plan] if self.attn_plan is not None else []

    @property
    def num_tokens(self) -> int:
        return self.query_start_loc[-1]

    @property
    def positions(self) -> torch.Tensor:
        return self.rope.positions

    def view(self, group: int, rope_index: int) -> ProbeStep:
        """What every layer reads (ForwardBatch.view): the probe has one cache group's
        blocks and one RoPE table, the same work for a timing."""
        return self


def _probe(model, kv_cache, lengths: list[int], tables, plan_of, positions, fresh: bool):
    """A ProbeStep of sequences of `lengths` new tokens each at `positions` (per token row),
    their KV through block `tables` ([seqs, width]; `plan_of(window)` their attention plan;
    None: the model caches no KV), sequence i in state slot i (wrapping around the cache's
    slots), its state fresh or not."""
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    seqs = len(lengths)
    plan = slots = None
    if tables is not None:
        block_size = kv_cache.block_size
        row_seq = torch.repeat_interleave(torch.arange(seqs), torch.tensor(lengths))
        slots = tables[row_seq, positions // block_size] * block_size + positions % block_size
        plan = plan_of(getattr(kv_cache.groups[0], "window", 0) or 0)
    states = kv_cache.states
    count = states.num_slots if states is not None else 1
    return ProbeStep(
        plan, slots, RopeInputs(positions, model.rope_cache), starts,
        torch.arange(seqs, dtype=torch.int64) % count,
        torch.full((seqs,), fresh, dtype=torch.bool),
    )  # fmt: skip


def _kv_blocks(kv_cache) -> int:
    """The blocks of the KV pool (0: a model without KV layers, Mamba2)."""
    return kv_cache.num_blocks if kv_cache.page_slot else 0


def decode_probe(model, kv_cache, tokens: int, context: int = PROBE_CONTEXT):
    """(h, step): a decode step of `tokens` sequences at `context` positions each (fewer when
    the cache is smaller), sequence i over cache blocks [i·n, (i+1)·n) (wrapping around a
    small cache), in state slot i (wrapping likewise). Each step writes one KV slot and the
    states of each sequence: run it before the engine holds any sequence."""
    blocks, block_size = _kv_blocks(kv_cache), kv_cache.block_size
    tables = None
    if blocks:
        context = max(1, min(context, max(1, blocks // tokens) * block_size))
        width = -(-context // block_size)
        tables = (torch.arange(tokens * width, dtype=torch.int64) % blocks).reshape(tokens, width)
    positions = torch.full((tokens,), context - 1, dtype=torch.int64)

    def plan_of(window: int) -> AttentionPlan:
        return AttentionPlan(
            decode_rows=torch.arange(tokens),
            prefills=[],
            decode_only=True,
            decode_block_tables=tables,
            decode_seq_lens=torch.full((tokens,), context, dtype=torch.int64),
            window=window,
            block_size=block_size,
            decode_max_context=context,
        )

    step = _probe(model, kv_cache, [1] * tokens, tables, plan_of, positions, fresh=False)
    generator = torch.Generator().manual_seed(0)
    return torch.randn(tokens, model.config.hidden_size, generator=generator), step


def prefill_probe(model, kv_cache, tokens: int):
    """(h, step): one sequence's prompt of `tokens` tokens (fewer when the cache is smaller)
    over cache blocks [0, n), from a fresh state in slot 0: what the prefill layer program
    runs. Writes those KV slots and that state: run it before the engine holds any
    sequence."""
    blocks, block_size = _kv_blocks(kv_cache), kv_cache.block_size
    tables = None
    if blocks:
        tokens = max(2, min(tokens, blocks * block_size))
        tables = torch.arange(-(-tokens // block_size), dtype=torch.int64).reshape(1, -1)
    positions = torch.arange(tokens, dtype=torch.int64)

    def plan_of(window: int) -> AttentionPlan:
        item = PrefillItem(0, tokens, tokens, 0, tables, block_size)
        return AttentionPlan(
            decode_rows=None, prefills=[item], window=window, block_tables=tables,
            block_size=block_size,
        )  # fmt: skip

    step = _probe(model, kv_cache, [tokens], tables, plan_of, positions, fresh=True)
    generator = torch.Generator().manual_seed(0)
    return torch.randn(tokens, model.config.hidden_size, generator=generator), step


def time_variants(
    runner: LayerProgramRunner, variants: list[ProgramVariant], h, step, rounds: int = ROUNDS
) -> dict[ProgramVariant, float]:
    """Best seconds of a decode step per variant, timed round robin (each built first)."""
    for variant in variants:
        runner.build(variant)
    fns = {v: (lambda v=v: runner.run(h.clone(), step, v)) for v in variants}
    return best_seconds_each(fns, rounds)


def confirm(
    runner: LayerProgramRunner, variant: ProgramVariant, h, step, rounds: int
) -> tuple[float, dict[ProgramVariant, float]]:
    """(median of the default's / `variant`'s step time over paired rounds, the best seconds
    of each): timing.paired_speedup on the same decode step."""
    speedup, default, candidate = paired_speedup(
        lambda: runner.run(h.clone(), step, DEFAULT),
        lambda: runner.run(h.clone(), step, variant),
        rounds,
    )
    return speedup, {DEFAULT: default, variant: candidate}


def tune_program(
    runner: LayerProgramRunner,
    buckets: list[str],
    seconds: float,
    context: int = PROBE_CONTEXT,
    rounds: int = ROUNDS,
) -> dict[str, BucketResult]:
    """Search each bucket's variant within about `seconds` in all; records the winners."""
    deadline = time.perf_counter() + seconds
    found: dict[str, BucketResult] = {}
    for bucket in buckets:
        if time.perf_counter() >= deadline:
            break
        h, step = decode_probe(runner.model, runner.kv_cache, BUCKET_TOKENS[bucket], context)
        current, best = DEFAULT, {}
        for name, knob in KNOBS.items():
            if time.perf_counter() >= deadline:
                break
            candidates = [current.with_value(name, value) for value in knob.values]
            for variant in candidates:  # (compiling: the budget is checked between builds)
                if time.perf_counter() >= deadline:
                    break
                runner.build(variant)
            if time.perf_counter() >= deadline:
                break  # (this knob's values not all built: it keeps its value)
            times = time_variants(runner, candidates, h, step, rounds)
            for variant, t in times.items():
                best[variant] = min(best.get(variant, float("inf")), t)
            fastest = min(candidates, key=times.get)
            if times[fastest] < (1.0 - MARGIN) * times[current]:  # clearly faster: take it
                current = fastest
        if current != DEFAULT:  # confirmed against the default in paired rounds of their own
            speedup, times = confirm(runner, current, h, step, 2 * rounds)
            faster = times[current] < (1.0 - MARGIN) * times[DEFAULT]
            if faster and speedup * (1.0 - MARGIN) > 1.0:
                best.update(times)  # (the gain recorded is the one that confirmed it)
            else:
                current = DEFAULT
                for variant, t in times.items():
                    best[variant] = min(best[variant], t)
        found[bucket] = BucketResult(current.label, {v.label: t for v, t in best.items()})
    if found:
        TuningRecord(runner.cache).store(tuning_key(runner.program, runner.cache), found)
        runner.by_bucket.update({b: ProgramVariant.parse(r.winner) for b, r in found.items()})
    return found
