"""The layer program's variants and tuner (program_variants.py, program_tune.py): every knob
value computes what the default variant does (itself checked against the per-op path in
test_runtime.py), the tuner records a winner per bucket, and a new engine runs the recorded
winners; labels that name no knob are ignored."""

from __future__ import annotations

import json

import pytest
import torch

from infergen import LLM, SamplingParams
from infergen.compiler import program_tune, runtime
from infergen.compiler.jit_cache import JitCache
from infergen.compiler.program import DEFAULT, tuning_key
from infergen.compiler.program_tune import decode_probe, tune_program
from infergen.compiler.program_variants import KNOBS, ProgramVariant
from infergen.compiler.startup import PREFILL, PROGRAM
from infergen.compiler.tune import BucketResult, TuningRecord
from infergen.registry import Registry
from infergen.timing import paired_speedup
from tests.hf_models import build_hf_model

PROMPTS = [[3, 17, 42], [5, 8, 150, 23, 77, 9, 11], [99]]

# two variants that between them set every knob to each of its other values
SPREAD = [
    ProgramVariant.parse(
        "attn_chunk=64,epilogue_min=0,gemm_small_top=1,gemm_prefetch=1,fork_min=8192"
    ),
    ProgramVariant.parse("attn_chunk=256,gemm_prefetch=2,fork_min=131072,threads=1"),
]


@pytest.fixture
def jit(tmp_path, monkeypatch):
    cache = JitCache(tmp_path / "jit")
    monkeypatch.setattr(runtime, "JitCache", lambda: cache)
    return cache


@pytest.fixture
def model_dir(tmp_path):
    # an MLP a whole number of 24-column panels wide: its GEMM + SiLU-mul has a fused form
    build_hf_model("llama_gqa", tmp_path / "model", intermediate_size=144)
    return str(tmp_path / "model")


def _program(llm):
    layers = llm.engine.runner.model.fast_path_for(llm.engine.kv_cache)
    assert layers.program is not None, layers.report.groups_op_by_op
    return layers.program


def test_labels():
    variant = ProgramVariant.parse("threads=1,attn_chunk=256")
    assert variant.label == "attn_chunk=256,threads=1"  # sorted, defaults left out
    assert ProgramVariant.parse(variant.label) == variant
    assert variant.prelude == "#define DECODE_ATTN_CHUNK 256\n"  # (threads: a call argument)
    assert variant.threads(2) == 1 and DEFAULT.threads(2) == 2
    # a macro of the generated program alone: in its prelude, not in the library's flags
    program_only = ProgramVariant.parse("epilogue_min=0,gemm_prefetch=1")
    assert program_only.defines == (("GEMM_EPILOGUE_MIN_TOKENS", 0), ("GEMM_PREFETCH_PANELS", 1))
    assert program_only.library_defines == (("GEMM_PREFETCH_PANELS", 1),)
    assert ProgramVariant.parse("attn_chunk=128") == DEFAULT  # the default value
    assert ProgramVariant.parse("default").label == "default"
    for name, value in SPREAD[0].settings + SPREAD[1].settings:
        assert value in KNOBS.get(name).values
    covered = {(n, v) for variant in SPREAD for n, v in variant.settings}
    for name, knob in KNOBS.items():
        assert {(name, v) for v in knob.values if v != knob.default} <= covered, name
    with pytest.raises(ValueError, match="knob 'warp'"):
        ProgramVariant.parse("warp=9")
    with pytest.raises(ValueError, match=r"attn_chunk=100: expected one of \[64, 128, 256\]"):
        ProgramVariant.parse("attn_chunk=100")
    with pytest.raises(ValueError, match="not an integer"):
        ProgramVariant.parse("threads=all")


def test_every_knob_value_computes_what_the_default_does(jit, model_dir):
    llm = LLM(model_dir, kv_cache_memory="4MiB", compile="jit")  # (the runner's model: kept)
    runner = _program(llm)
    for tokens in (1, 5):  # one token block, and two (of 4 rows) or one (of 8)
        h, step = decode_probe(runner.model, runner.kv_cache, tokens, context=300)
        assert step.attn_plan.decode_max_context == 300  # several chunks of 64, 128 and 256
        expected = runner.run(h.clone(), step, DEFAULT)
        for variant in SPREAD:
            got = runner.run(h.clone(), step, variant)
            for a, b in zip(got, expected, strict=True):
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * b.abs().max().item())
    assert len({built.key for built in runner.builds}) == 1 + len(SPREAD)  # a program each


def test_tuner_records_winners_and_a_new_engine_runs_them(jit, model_dir, monkeypatch):
    reference = LLM(model_dir, kv_cache_memory="4MiB")
    tuned = LLM(model_dir, kv_cache_memory="4MiB", compile="jit")
    runner = _program(tuned)
    threads_only = Registry("layer program knob")  # (no compiling: a run-time knob)
    threads_only.register("threads", KNOBS.get("threads"))
    monkeypatch.setattr(program_tune, "KNOBS", threads_only)
    found = tune_program(runner, ["1", "2-8"], seconds=30, rounds=2)
    assert set(found) == {"1", "2-8"}
    for result in found.values():
        assert set(result.seconds) == {"default", "threads=1"}
        assert result.winner in result.seconds
    key = tuning_key(runner.program, jit)
    record = TuningRecord(jit)
    assert record.labels(key) == {b: r.winner for b, r in found.items()}
    # a recorded winner with a compiled knob, and one from a knob this version lacks
    record.store(key, {"1": BucketResult("attn_chunk=256", {}), "2-8": BucketResult("warp=9", {})})
    llm = LLM(model_dir, kv_cache_memory="4MiB", compile="jit")
    program = _program(llm)
    assert program.by_bucket == {"1": ProgramVariant.parse("attn_chunk=256")}
    assert llm.engine.compile_report.tuned_buckets >= 1
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    expected = reference.generate(PROMPTS, params)
    for a, b in zip(expected, llm.generate(PROMPTS, params), strict=True):
        assert a.token_ids == b.token_ids


def test_a_winner_records_the_times_that_confirmed_it(jit, model_dir, monkeypatch):
    """The knob's round found threads=1 faster; the confirming paired rounds agree, but the
    default had one lucky time in the knob's round: the recorded times are the confirming
    rounds' (the gain is the margin it won by, never negative). A winner the confirming rounds
    reject is not recorded: by the best of each side, or by the median of the rounds' ratios
    though the best of each side says faster (one lucky round of its own)."""
    llm = LLM(model_dir, kv_cache_memory="4MiB", compile="jit")
    runner = _program(llm)
    threads_only = Registry("layer program knob")
    threads_only.register("threads", KNOBS.get("threads"))
    monkeypatch.setattr(program_tune, "KNOBS", threads_only)
    cases = (
        (1.25, {"default": 0.010, "threads=1": 0.008}, "threads=1"),
        (1.01, {"default": 0.010, "threads=1": 0.0099}, "default"),
        (1.005, {"default": 0.010, "threads=1": 0.008}, "default"),  # (the median: no)
    )
    for speedup, confirmed, winner in cases:
        monkeypatch.setattr(
            program_tune, "time_variants",
            lambda runner, variants, h, step, rounds=2: {
                v: {"default": 0.005, "threads=1": 0.004}[v.label] for v in variants
            },
        )  # fmt: skip
        monkeypatch.setattr(
            program_tune, "confirm",
            lambda runner, variant, h, step, rounds, s=speedup, c=confirmed: (
                s, {DEFAULT: c["default"], variant: c[variant.label]}
            ),
        )  # fmt: skip
        (result,) = tune_program(runner, ["1"], seconds=30, rounds=2).values()
        assert result.winner == winner, (speedup, confirmed)
        if winner != "default":
            assert result.seconds == confirmed
        assert result.seconds[winner] <= result.seconds["default"]


def test_confirm_times_both_sides_in_turns(jit, model_dir):
    """timing.paired_speedup through `confirm` on a real step (each side's best time and the
    median ratio, both positive), and the order within a round alternating."""
    llm = LLM(model_dir, kv_cache_memory="4MiB", compile="jit")
    runner = _program(llm)
    h, step = program_tune.decode_probe(runner.model, runner.kv_cache, 1, 32)
    variant = DEFAULT.with_value("threads", 1)
    speedup, times = program_tune.confirm(runner, variant, h, step, 4)
    assert speedup > 0 and set(times) == {DEFAULT, variant} and min(times.values()) > 0
    order = []
    ratio, _, _ = paired_speedup(lambda: order.append("a"), lambda: order.append("b"), 4)
    assert order[2:] == ["a", "b", "b", "a", "a", "b", "b", "a"]  # (after one warm-up each)


def test_engine_start_budget_builds_what_fits_and_runs_the_rest_op_by_op(jit, model_dir):
    reference = LLM(model_dir, kv_cache_memory="4MiB")
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    expected = [o.token_ids for o in reference.generate(PROMPTS, params)]
    nothing = LLM(
        model_dir, kv_cache_memory="4MiB", compile="jit", compile_budget_s=0, compile_traffic="1=1"
    )
    plan = nothing.engine.compile_plan
    assert plan and all(i.status == "skipped" for i in plan)
    assert any(i.group == "layer program" and i.gain_ms > 0 for i in plan)  # (predicted)
    report = nothing.engine.compile_report
    skipped = report.groups_op_by_op + report.epilogues_unfused
    assert skipped and all("not built within the startup budget" in s for s in skipped)
    assert [o.token_ids for o in nothing.generate(PROMPTS, params)] == expected
    assert not list(jit.root.glob("*.so"))  # nothing compiled
    some = LLM(
        model_dir, kv_cache_memory="4MiB", compile="jit", compile_budget_s=20, compile_traffic="1=1"
    )
    status = {(i.kind, i.group.split(" ->")[0]): i.status for i in some.engine.compile_plan}
    assert status[("compile", "layer program")] == "built"
    # (one C source holds both programs: the decode program's compile built it)
    assert status[("compile", "prefill layer program")] == "cached"
    assert status[("tune 1", "layer program")] == "skipped"  # (its search takes ~30 s)
    assert status[("compile", "group 0")] == "built"
    assert status[("tune 1", "group 0")] == "tuned"
    assert status[("compile", "GEMM epilogue gemm_silu_mul")] == "built"
    for item in some.engine.compile_plan:
        if item.status in ("built", "tuned"):  # built: expected beside measured
            assert item.gain_ms is not None and item.measured_ms is not None
    assert some.engine.compile_report.groups_op_by_op == []
    assert some.engine.compile_report.epilogues_unfused == []
    program = _program(some)
    assert [o.token_ids for o in some.generate(PROMPTS, params)] == expected
    # a bucket searched before (tuning.json) is taken as recorded, with its recorded gain
    record = {"1": BucketResult("threads=1", {"default": 0.010, "threads=1": 0.008})}
    TuningRecord(jit).store(tuning_key(program.program, jit), record)
    again = LLM(
        model_dir, kv_cache_memory="4MiB", compile="jit", compile_budget_s=0, compile_traffic="1=1"
    )
    (tune,) = [i for i in again.engine.compile_plan if i.kind == "tune 1" and i.group == PROGRAM]
    assert tune.status == "recorded: threads=1" and abs(tune.measured_ms - 2.0) < 1e-9
    assert _program(again).by_bucket == {"1": ProgramVariant.parse("threads=1")}


def _budget_start(name: str, directory) -> tuple[LLM, list[list[int]]]:
    """An engine of test variant `name` started with a 20 s budget for batch-1 traffic, and
    the per-op path's greedy tokens for PROMPTS."""
    build_hf_model(name, directory)
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    reference = LLM(str(directory), kv_cache_memory="4MiB")
    expected = [o.token_ids for o in reference.generate(PROMPTS, params)]
    llm = LLM(str(directory), kv_cache_memory="4MiB", compile="jit", compile_budget_s=20,
              compile_traffic="1=1")  # fmt: skip
    return llm, expected


def _programs_planned(llm: LLM, kinds: int) -> list[list[int]]:
    """Each kind's decode and prefill programs were planned and built within the budget
    (expected gain beside measured), the engine runs them (no layer walked op by op); the
    engine's greedy tokens."""
    plan = llm.engine.compile_plan
    prefixes = [f"kind {k} " for k in range(kinds)] if kinds > 1 else [""]
    for prefix in prefixes:
        for name in (PROGRAM, PREFILL):
            (item,) = [i for i in plan if i.kind == "compile" and i.group == prefix + name]
            assert item.status in ("built", "cached"), (item.group, item.status)
            assert item.gain_ms is not None and item.measured_ms is not None
    layers = llm.engine.runner.model.fast_path_for(llm.engine.kv_cache)
    for phase, programs in layers.programs.items():
        assert len(programs) == kinds and all(p is not None for p in programs), phase
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    return [o.token_ids for o in llm.generate(PROMPTS, params)]


def test_engine_start_budget_plans_each_kind_of_layer(jit, tmp_path):
    """DeepSeek-V2: a dense first layer and MoE layers (two graphs, MLA in both). The startup
    budget plans each kind's groups (gains times its own layers) and each kind's layer
    programs (their gains timed on that kind's layers), and the engine's tokens equal the
    per-op path's."""
    llm, expected = _budget_start("deepseek_v2", tmp_path / "model")
    plan = llm.engine.compile_plan
    kinds = {i.group.split(" group")[0] for i in plan if " group " in i.group}
    assert kinds == {"kind 0", "kind 1"}, [i.group for i in plan]
    compiles = [i for i in plan if i.kind == "compile" and " group " in i.group]
    # (a group both kinds hold is built once: the other's status names it, "= kind 1 ...")
    assert compiles and all(i.status in ("built", "cached") or i.status.startswith("= kind")
                            for i in compiles)  # fmt: skip
    assert any(i.status == "built" for i in compiles)
    assert _programs_planned(llm, 2) == expected


@pytest.mark.parametrize("name", ["mamba2", "qwen3_next"])
def test_engine_start_budget_with_recurrent_layers(jit, tmp_path, name):
    """Mamba2 (one kind of layer, recurrent states, no KV cache) and Qwen3-Next (DeltaNet and
    gated-attention layers): the budget's probes step the recurrent states too, so their
    layer programs are planned, built and run, and the engine's tokens equal the per-op
    path's."""
    llm, expected = _budget_start(name, tmp_path / "model")
    kinds = len(runtime.jit_kinds(llm.engine.runner.model, llm.engine.kv_cache))
    assert _programs_planned(llm, kinds) == expected


def test_probes_step_the_states(jit, tmp_path):
    """The decode probe of a recurrent model gives each sequence its own state slot (wrapped
    around the cache's slots) and one token row; the prefill probe one fresh sequence."""
    build_hf_model("mamba2", tmp_path / "model")
    llm = LLM(str(tmp_path / "model"), kv_cache_memory="4MiB")
    model, cache = llm.engine.runner.model, llm.engine.kv_cache
    slots = cache.states.num_slots
    h, step = decode_probe(model, cache, slots + 2)
    assert h.shape == (slots + 2, model.config.hidden_size)
    assert step.query_start_loc == list(range(slots + 3)) and step.attn_plan is None
    assert step.state_slots.tolist() == [*range(slots), 0, 1] and not step.fresh.any()
    h, step = program_tune.prefill_probe(model, cache, 5)
    assert step.query_start_loc == [0, 5] and step.fresh.tolist() == [True]


def test_bad_traffic_option(jit, model_dir):
    with pytest.raises(Exception, match="traffic bucket '3'"):
        LLM(model_dir, kv_cache_memory="4MiB", compile="jit", compile_budget_s=1,
            compile_traffic="3=1")  # fmt: skip


def test_tuning_record_labels_tolerate_garbage(tmp_path):
    record = TuningRecord(JitCache(tmp_path))
    record.path.parent.mkdir(parents=True, exist_ok=True)
    record.path.write_text(json.dumps({"k": {"1": {"winner": 3}, "2-8": "x"}, "j": [1]}))
    assert record.labels("k") == {} and record.labels("j") == {} and record.labels("z") == {}
    odd = {"winner": "threads=1", "seconds": {"default": 0.5, "threads=1": "fast"}}
    record.path.write_text(json.dumps({"k": {"1": odd, "9-64": {"winner": "default"}}}))
    assert record.results("k") == {
        "1": BucketResult("threads=1", {"default": 0.5}),  # (a timing that is no number: out)
        "9-64": BucketResult("default", {}),
    }
