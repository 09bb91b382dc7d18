"""`infergen profile` (bench/profile.py, profile_table.py, profile_plot.py, cli/profile.py) on
a tiny Llama: FLOPs and call counts of the rows against the model's config and the workload,
the trace's events, the plot, --json, compile=jit and a quantized weight scheme. Times are
only checked to be reported (speed belongs in benchmarks)."""

from __future__ import annotations

import json

import pytest
import torch

from infergen import LLM, profiling
from infergen.bench.profile import ProfileWorkload, profile_engine, write_trace
from infergen.bench.profile_plot import plot_roofline
from infergen.bench.profile_table import OVERHEAD_FACTOR, Roofline, format_phase
from infergen.cli import main
from infergen.kernels.build import I, L, P, kernel
from tests.hf_models import build_hf_model

PROMPT, BATCH, STEPS = 24, 2, 3
WORKLOAD = ProfileWorkload(prompt_tokens=PROMPT, batch=BATCH, decode_steps=STEPS, warmup=1,
                           prefill_runs=1)  # fmt: skip
ROOFLINE = Roofline(flops=50e9, bandwidth=10e9, source="test")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("profile") / "model"
    build_hf_model("llama_gqa", path)
    return path


def _rows(result, op: str, role: str = ""):
    return [r for r in result.rows if r.op == op and (not role or r.role == role)]


def _main_row(result, op: str, role: str = ""):
    """The op's row that carries its FLOPs and bytes (its main kernel)."""
    (row,) = [r for r in _rows(result, op, role) if r.flops or r.bytes]
    return row


def test_labels_round_trip_and_native_kernels_are_named():
    label = profiling.region("linear", "64->128 int8", profiling.Cost(12, 34)).name
    parsed = profiling.parse(label)
    assert (parsed.op, parsed.key, parsed.cost) == (
        "linear",
        "64->128 int8",
        profiling.Cost(12, 34),
    )
    assert profiling.parse("aten::mm") is None
    fn = kernel("silu_mul_f32", P, P, L, L, I)
    if fn is None:
        pytest.skip("no C compiler")
    x, out = torch.randn(3, 8), torch.empty(3, 4)
    with torch.profiler.profile() as prof:
        fn(x.data_ptr(), out.data_ptr(), 3, 4, 1)
    assert "native::silu_mul_f32" in {e.name for e in prof.events()}
    fn(x.data_ptr(), out.data_ptr(), 3, 4, 1)  # (no profiler: straight through)
    torch.testing.assert_close(out, torch.nn.functional.silu(x[:, :4]) * x[:, 4:])


def test_per_op_rows_match_the_config(model_dir, tmp_path):
    """kernels="torch" runs every step op by op: each projection's and attention's FLOPs and
    calls per phase from the config and the workload's shapes."""
    llm = LLM(str(model_dir), kv_cache_memory="4MiB", kernels="torch")
    config, layers = llm.config, llm.config.num_hidden_layers
    result = profile_engine(llm.engine, WORKLOAD, ROOFLINE, say=lambda text: None)
    prefill, decode = result.phases["prefill"], result.phases["decode"]
    hidden, q, kv = config.hidden_size, config.q_size, config.kv_size
    shapes = {"attn.qkv": (hidden, q + 2 * kv), "attn.o": (q, hidden),
              "mlp.gate_up": (hidden, 2 * config.intermediate_size),
              "mlp.down": (config.intermediate_size, hidden)}  # fmt: skip
    assert prefill.steps == 1 and prefill.tokens_per_step == BATCH * PROMPT
    assert decode.steps == STEPS and decode.tokens_per_step == BATCH
    for role, (n_in, n_out) in shapes.items():
        row = _main_row(prefill, "linear", role)
        assert row.flops == 2 * BATCH * PROMPT * n_in * n_out * layers
        assert row.calls == layers  # one prefill step
        row = _main_row(decode, "linear", role)
        assert row.flops == 2 * BATCH * n_in * n_out * layers * STEPS
        assert row.calls == layers * STEPS
    head = _main_row(decode, "linear", "lm_head")  # one row per sequence, each step
    assert head.flops == 2 * BATCH * hidden * config.vocab_size * STEPS
    heads, dim = config.num_attention_heads, config.head_dim
    causal = PROMPT * (PROMPT + 1) // 2  # (query, key) pairs of one prompt
    assert (
        _main_row(prefill, "attention.prefill").flops == 4 * heads * dim * causal * BATCH * layers
    )
    # after the warm-up step, decode step i reads PROMPT + 2 + i positions; timed and profiled
    # steps take turns in blocks (of one step here): timed, profiled | profiled, timed | timed,
    # profiled — the profiled ones are steps 1, 2 and 5
    keys = sum(PROMPT + 2 + i for i in (1, 2, 5)) * BATCH
    assert _main_row(decode, "attention.decode").flops == 4 * heads * dim * keys * layers
    for phase in (prefill, decode):
        assert phase.measured_step_s > 0 and phase.coverage > 0 and phase.rows_coverage > 0
        total = sum(r.seconds for r in phase.rows)
        assert total == pytest.approx(sum(phase.profiled_s), rel=1e-3)  # each µs in one row
        text = format_phase(phase)
        assert "% of the measured step" in text and "linear[64->128 torch] attn.qkv" in text
    # the trace has an event for every kernel row and every op region
    path = tmp_path / "trace.json"
    write_trace(result, path)
    names = {e.get("name") for e in json.loads(path.read_text())["traceEvents"]}
    ops = {f"{p.op}[{p.key}]" for p in map(profiling.parse, names) if p is not None}
    for phase in (prefill, decode):
        for row in phase.rows:
            assert row.host or row.kernel in names, row
            assert row.op == "engine" or f"{row.op}[{row.key}]" in ops, row
    plot = tmp_path / "roofline.png"
    plot_roofline(result.phases, str(plot))
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_prefills_after_a_cached_prefix_compute_only_their_own_tokens(model_dir):
    """--cached-tokens: every prompt starts with one shared prefix, computed before the runs,
    so a prefill step computes each prompt's own tokens, whose queries attend the cached ones
    too (a conversation's next turn)."""
    llm = LLM(str(model_dir), kv_cache_memory="4MiB", kernels="torch")
    config, layers = llm.config, llm.config.num_hidden_layers
    new, cached = 8, 32  # (two whole 16-token blocks cached)
    work = ProfileWorkload(prompt_tokens=new, batch=BATCH, prefill_runs=1, phases=("prefill",),
                           cached_tokens=cached)  # fmt: skip
    prefill = profile_engine(llm.engine, work, ROOFLINE, say=lambda text: None).phases["prefill"]
    assert prefill.steps == 1 and prefill.tokens_per_step == BATCH * new
    hidden, q, kv = config.hidden_size, config.q_size, config.kv_size
    qkv = _main_row(prefill, "linear", "attn.qkv")
    assert qkv.flops == 2 * BATCH * new * hidden * (q + 2 * kv) * layers
    pairs = new * cached + new * (new + 1) // 2  # (query, key) pairs of one prompt's chunk
    heads, dim = config.num_attention_heads, config.head_dim
    assert _main_row(prefill, "attention.prefill").flops == 4 * heads * dim * pairs * BATCH * layers


def test_fused_decode_is_one_named_call(model_dir):
    """The native kernels' decode steps run every layer in one C call: one row per step,
    its FLOPs at least the projections', the call broken down by the driver's phase timers."""
    llm = LLM(str(model_dir), kv_cache_memory="4MiB")
    config, layers = llm.config, llm.config.num_hidden_layers
    workload = ProfileWorkload(PROMPT, BATCH, STEPS, warmup=1, phases=("decode",))
    decode = profile_engine(llm.engine, workload, say=lambda text: None).phases["decode"]
    row = _main_row(decode, "decode_layers")
    assert row.kernel == "native::decode_layers_f32" and row.calls == STEPS
    params = config.hidden_size * (config.q_size + 2 * config.kv_size)
    params += config.q_size * config.hidden_size + 3 * config.hidden_size * config.intermediate_size
    assert row.flops >= 2 * BATCH * params * layers * STEPS
    assert set(decode.c_timers) >= {"qkv", "attention", "down"}
    assert decode.c_timers_of == "the fused decode call by phase"
    assert decode.roofline is None and row.bound(None) == ("-", None)


def test_jit_layer_programs_are_broken_down_by_call_site(model_dir):
    """compile="jit": each phase's layer program is one call, and its own timers split it per
    call site (the projections, attention, the pointwise groups), summed over the layers:
    inside the call, so they add up to at most its time, and to most of it."""
    llm = LLM(str(model_dir), kv_cache_memory="4MiB", compile="jit")
    result = profile_engine(llm.engine, WORKLOAD, say=lambda text: None)
    for phase, name in (("prefill", "jit::prefill_program"), ("decode", "jit::layer_program")):
        found = result.phases[phase]
        (call,) = [r for r in found.rows if r.kernel == name]
        assert found.c_timers_of == f"the generated {phase} layer program by call site"
        sites = found.c_timers
        assert {"attn.qkv", "attention", "attn.o", "mlp.down", "kv_store"} <= set(sites), sites
        assert any(site.startswith("pointwise -> ") for site in sites), sites
        assert all(seconds > 0 for seconds in sites.values()), sites
        call_s = call.seconds / found.steps
        assert 0.5 * call_s < sum(sites.values()) <= call_s, (sites, call_s)


def test_every_kind_of_layer_program_is_broken_down_by_call_site(tmp_path):
    """Qwen3-Next's steps call three programs (DeltaNet layers with experts or a gated MLP,
    with their native mixer step; the gated attention layers): the call-site table holds each
    kind's sites under the kind's name — a DeltaNet kind's mixer never counted as attention,
    or the reverse — they add up to at most the programs' calls' time, and the table prints
    a line per kind."""
    build_hf_model("qwen3_next", tmp_path / "model")
    llm = LLM(str(tmp_path / "model"), kv_cache_memory="4MiB", compile="jit")
    result = profile_engine(llm.engine, WORKLOAD, say=lambda text: None)
    kinds = llm.engine.runner.model.fast_path_for(llm.engine.kv_cache).kinds
    assert len(kinds) == 3
    for phase, name in (("prefill", "jit::prefill_program"), ("decode", "jit::layer_program")):
        found = result.phases[phase]
        by_kind: dict[str, dict[str, float]] = {}
        for key, seconds in found.c_timers.items():
            kind, _, site = key.rpartition(": ")
            by_kind.setdefault(kind, {})[site] = seconds
        assert set(by_kind) == {kind.describe() for kind in kinds}, found.c_timers
        for kind in kinds:
            sites = by_kind[kind.describe()]
            assert all(seconds > 0 for seconds in sites.values()), sites
            if "linear_attention" in kind.label:
                assert "mixer linear_attention" in sites and "attention" not in sites, sites
            else:
                assert {"attention", "attn.qkv"} <= set(sites), sites
                assert "mixer linear_attention" not in sites, sites
        calls = [r for r in found.rows if r.kernel == name]
        assert calls and sum(found.c_timers.values()) <= sum(r.seconds for r in calls) / found.steps
        table = format_phase(found).split("\n")
        for kind in kinds:
            assert sum(kind.describe() + " (its C timers" in line for line in table) == 1, table


@pytest.mark.parametrize(
    "options, op, kernel",
    [
        (["--compile", "jit"], "decode_layers", "jit::layer_program"),
        (["--weights", "int8"], "linear", None),
    ],
)
def test_cli_json(model_dir, tmp_path, capsys, options, op, kernel):
    rows_file = tmp_path / "hardware.json"
    rows_file.write_text(json.dumps({"testbox": {
        "description": "a test roofline", "memory_bytes": 1e9, "bandwidth": 1e10,
        "flops": {"fp32": 5e10}, "compute_efficiency": 1.0, "memory_efficiency": 1.0,
    }}))  # fmt: skip
    trace, plot = tmp_path / "t.json", tmp_path / "r.png"
    argv = ["profile", "-m", str(model_dir), "--kv-cache-memory", "4MiB", "--prompt-tokens",
            str(PROMPT), "--decode-steps", "2", "--warmup", "1", "--prefill-runs", "1", "--json",
            "--gpu", "testbox", "--hardware-file", str(rows_file), "--trace", str(trace),
            "--plot", str(plot), *options]  # fmt: skip
    assert main(argv) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["roofline"]["flops"] == 5e10 and set(document["phases"]) == {
        "prefill",
        "decode",
    }
    for phase in document["phases"].values():
        assert phase["coverage"] > 0 and phase["measured_step_s"] > 0
        for row in phase["rows"]:  # the bound rule of bench/profile_table.py
            compute, memory = row["flops"] / 5e10, row["bytes"] / 1e10
            ideal = max(compute, memory)
            if ideal == 0 or row["seconds"] > OVERHEAD_FACTOR * ideal:
                assert row["bound"] == "overhead"
            else:
                assert row["bound"] == ("compute" if compute >= memory else "memory")
    decode = document["phases"]["decode"]["rows"]
    assert any(r["op"] == op and (kernel is None or r["kernel"] == kernel) for r in decode)
    if "int8" in options:  # the weights as stored: a byte a value (and scales), not four
        (qkv,) = [r for r in document["phases"]["prefill"]["rows"]
                  if r["role"] == "attn.qkv" and r["bytes"]]  # fmt: skip
        layers, n_in, n_out = 3, 64, 128
        weights = qkv["bytes"] - PROMPT * (n_in + n_out) * 4 * layers  # (activations: fp32)
        assert qkv["key"] == "64->128 int8"
        assert n_in * n_out * layers <= weights < 1.5 * n_in * n_out * layers
    json.loads(trace.read_text())
    assert plot.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize(
    "name", ["gemma3", "gpt_oss", "mamba2", "falcon_h1", "deepseek_v2", "qwen3_next"]
)
def test_jit_program_work_equals_the_per_op_regions(name, tmp_path):
    """The work a profiled layer-program call is given (models/fused_decode.StackCost: sandwich
    norms, GeGLU, a mixture of experts' router and top-k experts; for a mixer the module runs,
    called back from the program, its layer's norms and MLP: the mixer's ops count their own,
    per run of one kind's layers) against the per-op path's
    own regions (ops/*.py `cost`, each op as it runs) on the same decode steps: the decode
    phases' FLOPs agree (the head's rows are the same on both sides)."""
    build_hf_model(name, tmp_path / "model")
    flops = {}
    for mode in ("off", "jit"):
        llm = LLM(str(tmp_path / "model"), kv_cache_memory="4MiB", compile=mode)
        result = profile_engine(llm.engine, WORKLOAD, say=lambda text: None)
        flops[mode] = sum(row.flops for row in result.phases["decode"].rows)
    assert flops["jit"] == pytest.approx(flops["off"], rel=0.02), flops


def test_a_product_is_measured_against_its_own_compute_class_peak():
    """A bf16 product's row against the roofline's bf16 peak, a W8A8 one's against int8's,
    the rest (fp32 weights, weight-only formats, attention) against the main peak; a class
    the roofline has no peak for falls back to the main one."""
    from infergen.bench.profile_table import Row, compute_of

    assert compute_of("linear", "576->3072 bf16") == "bf16"
    assert compute_of("linear", "576->3072 int8 a=int8") == "int8"
    assert compute_of("linear", "576->3072 int8") == ""
    assert compute_of("linear", "576->3072 native") == ""
    assert compute_of("attention.prefill", "h9/3 d64 kv float32") == ""
    roof = Roofline(flops=100e9, bandwidth=10e9, source="test", by_compute={"bf16": 1000e9})
    # 1 GFLOP and 1 MB in 2 ms: bf16 at its own peak is 1 ms ideal (50 %), at fp32's 10 ms
    bf16 = Row("linear", "576->3072 bf16", "native::gemm_bf16", calls=1, seconds=2e-3,
               flops=10**9, bytes=10**6)  # fmt: skip
    assert bf16.bound(roof) == ("compute", pytest.approx(50.0))
    fp32 = Row("linear", "576->3072 native", "native::gemm_packed_f32", calls=1, seconds=20e-3,
               flops=10**9, bytes=10**6)  # fmt: skip
    assert fp32.bound(roof) == ("compute", pytest.approx(50.0))
    w8a8 = Row("linear", "576->3072 int8 a=int8", "native::gemm_w8a8_i8", calls=1,
               seconds=20e-3, flops=10**9, bytes=10**6)  # fmt: skip
    assert w8a8.bound(roof) == ("compute", pytest.approx(50.0))  # (no int8 peak: fp32's)
