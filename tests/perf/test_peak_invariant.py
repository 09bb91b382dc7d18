"""The invariant of the performance model: no prediction on any hardware row implies a rate
above the row's physical peaks. Over every row of the table and a user's row, a grid of
models (dense GQA, MoE with sliding windows, MLA + MoE), precisions, batch sizes, context
lengths, decode and prefill chunks and tensor parallelism: each op's FLOPs and bytes (counted
by step_cost, not by the roofline) over its predicted time stay under the dtype's dense peak
FLOP/s, the HBM bandwidth and one direction of the interconnect; so does the whole step's.
A served prediction's TTFT and ITL, against the model's parameter count and weight bytes,
stay under the same peaks. Rows whose factors would break it are refused when read."""

from __future__ import annotations

import dataclasses
import itertools
import json

import pytest

from infergen.config.stored import compute_class
from infergen.errors import ConfigError
from infergen.io.model_config import read_model_config
from infergen.perf.hardware import HARDWARE, TABLE, bits_of, load_file
from infergen.perf.predict import Deployment, fixed_shapes, predict
from infergen.perf.roofline import predict_step, step_seconds
from infergen.perf.step_cost import Chunk, Formats, Parallel, step_ops

CONFIGS = "tests/perf/configs"
TABLE_ROWS = [name for name in json.loads(TABLE.read_text()) if not name.startswith("_")]
MODELS = ("llama-3.1-8b", "gpt-oss-20b", "deepseek-v3")
# weights, KV, activations (the compute class follows the activations)
PRECISIONS = (
    ("bf16", "bf16", "bf16"),
    ("fp8_e4m3", "fp8_e4m3", "fp8_e4m3"),
    ("mxfp4", "fp8_e4m3", "bf16"),  # weight-only 4-bit: multiplies in bf16
    ("nvfp4", "nvfp4", "nvfp4"),  # fp4 compute: runs as fp8 / bf16 where the GPU lacks it
)
TOLERANCE = 1 + 1e-9  # float rounding only
USER_ROW = {"memory_bytes": 96e9, "bandwidth": 1.6e12, "flops": {"bf16": 400e12}}


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    """The table's rows and a user's row without calibration (it borrows efficiencies)."""
    path = tmp_path_factory.mktemp("hw") / "user.json"
    path.write_text(json.dumps({"invariant-user-gpu": USER_ROW}))
    return [HARDWARE.get(name) for name in TABLE_ROWS] + load_file(path)


@pytest.fixture(scope="module")
def descs():
    return {name: read_model_config(f"{CONFIGS}/{name}.json").describe() for name in MODELS}


def _formats(weights: str, kv: str, activations: str) -> Formats:
    return Formats(bits_of(weights), bits_of(kv), bits_of(activations) / 8)


def _check_step(hw, desc, chunks, fmt, compute, par) -> None:
    times = {t.name: t for t in predict_step(desc, hw, chunks, fmt, compute, par)}
    ops = step_ops(desc, chunks, fmt, par)  # counted independently of the roofline
    peak_flops = hw.peak_flops(compute)
    where = f"{hw.name} {desc.name} {compute} tp{par.tp} {chunks[0]} x{len(chunks)}"
    for op in ops:
        seconds = times[op.name].seconds
        assert seconds > 0, f"{where}: {op.name} takes no time"
        if op.kind == "comm":
            # the table's interconnect is both directions together; a collective sends one way
            assert op.bytes / seconds <= hw.interconnect / 2 * TOLERANCE, f"{where}: {op.name}"
            continue
        assert op.flops / seconds <= peak_flops * TOLERANCE, f"{where}: {op.name} FLOP/s"
        assert op.bytes / seconds <= hw.bandwidth * TOLERANCE, f"{where}: {op.name} bytes/s"
    total = step_seconds(list(times.values()))
    local = [op for op in ops if op.kind != "comm"]
    assert sum(op.flops for op in local) / total <= peak_flops * TOLERANCE, where
    assert sum(op.bytes for op in local) / total <= hw.bandwidth * TOLERANCE, where


@pytest.mark.parametrize("model", MODELS)
def test_no_step_exceeds_the_rows_peaks(rows, descs, model):
    desc = descs[model]
    grid = itertools.product(rows, PRECISIONS, (1, 64), (128, 32768), (1, 2048), (1, 8))
    checked = 0
    for hw, precision, batch, context, new, tp in grid:
        if tp > 1 and not hw.interconnect:
            continue
        chunks = [Chunk(min(new, context), context)] * batch
        compute = compute_class(precision[2])
        _check_step(hw, desc, chunks, _formats(*precision), compute, Parallel(tp=tp))
        checked += 1
    assert checked >= len(rows) * 40


@pytest.mark.parametrize("gpu", [*TABLE_ROWS, "invariant-user-gpu"])
def test_served_latencies_imply_rates_under_the_peaks(rows, descs, gpu):
    """One request at a time: its TTFT carries at least 2 x active parameters x prompt FLOPs
    and each ITL the weights per device, so neither may imply more than the peaks."""
    hw = next(row for row in rows if row.name == gpu)
    desc = descs["llama-3.1-8b"]
    for precision in (PRECISIONS[0], PRECISIONS[1]):
        compute = compute_class(precision[2])
        tp = 2 if hw.interconnect else 1
        dep = Deployment(desc, hw, _formats(*precision), compute, Parallel(tp=tp))
        isl = 2048
        r = predict(dep, fixed_shapes(isl, 16, 2), concurrency=1)
        flops_per_device = 2 * desc.params_active() * isl / tp
        assert flops_per_device / (r["ttft_ms"]["p50"] / 1e3) <= hw.peak_flops(compute)
        weights = r["memory_per_device"]["weights"]
        assert weights / (r["itl_ms"]["p50"] / 1e3) <= hw.bandwidth


@pytest.mark.parametrize(
    "extra,message",
    [
        ({"memory_efficiency": 1.2}, "memory_efficiency must be a fraction"),
        ({"memory_efficiency": 0}, "memory_efficiency must be a fraction"),
        ({"gemm_efficiency": {"1": 0.1, "64": 1.3}}, "gemm_efficiency must map"),
        ({"gemm_efficiency": {"0": 0.1}}, "gemm_efficiency must map"),
        ({"launch_overhead_s": -1e-6}, "launch_overhead_s must be seconds >= 0"),
        ({"step_overhead_s": -1e-3}, "step_overhead_s must be seconds >= 0"),
        ({"interconnect": -1}, "interconnect must be a positive number"),
    ],
)
def test_rows_that_would_beat_their_peaks_are_refused(tmp_path, extra, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"too-fast": {**USER_ROW, **extra}}))
    with pytest.raises(ConfigError, match=message):
        load_file(path)
    assert "too-fast" not in HARDWARE


def test_the_check_catches_a_row_faster_than_its_peak(descs):
    """The check above is not vacuous: a row reaching 110 % of its bandwidth (decode) or of
    its FLOP/s (prefill GEMMs) fails it."""
    desc, fmt, a100 = descs["llama-3.1-8b"], _formats("bf16", "bf16", "bf16"), HARDWARE.get("a100")
    fast_memory = dataclasses.replace(a100, memory_efficiency=1.1)
    with pytest.raises(AssertionError, match="bytes/s"):
        _check_step(fast_memory, desc, [Chunk(1, 1024)], fmt, "bf16", Parallel())
    fast_gemm = dataclasses.replace(a100, gemm_efficiency={1: 1.0, 4096: 1.3})
    with pytest.raises(AssertionError, match="FLOP/s"):
        _check_step(fast_gemm, desc, [Chunk(2048, 2048)], fmt, "bf16", Parallel())
