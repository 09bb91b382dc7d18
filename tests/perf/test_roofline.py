"""Roofline step time, calibration of cpu-local, and `infergen perf step`."""

from __future__ import annotations

import dataclasses

import pytest

from infergen.perf.calibrate import save
from infergen.perf.hardware import HARDWARE, Hardware, bits_of, load_file
from infergen.perf.roofline import Efficiency, op_times, step_seconds
from infergen.perf.step_cost import VERIFY_ATTENTION, OpCost

HW = Hardware("toy", "toy", memory_bytes=1e9, bandwidth=1e9, flops={"bf16": 1e12})
TINY = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 211,
}


def test_each_op_takes_the_longer_of_compute_and_memory_plus_launches():
    ops = [OpCost("a", "gemm", flops=4e9, bytes=1e6), OpCost("b", "attention", 1e6, 5e6)]
    eff = Efficiency(compute={"gemm": 0.5}, memory={"attention": 0.25}, overhead_s=1e-5)
    times = op_times(ops, HW, "bf16", eff, launches=10)
    assert [t.bound for t in times] == ["compute", "memory", "overhead"]
    assert times[0].seconds == pytest.approx(4e9 / 0.5e12)
    assert times[1].seconds == pytest.approx(5e6 / 0.25e9)
    assert step_seconds(times) == pytest.approx(8e-3 + 2e-2 + 1e-4)


def test_bits_of_formats():
    assert (bits_of("fp32"), bits_of("bf16"), bits_of("mxfp4"), bits_of("nvfp4")) == (
        32.0,
        16.0,
        4.25,
        4.5,
    )


def test_calibration_round_trips_as_a_hardware_row(tmp_path, capsys):
    from infergen.cli import main

    assert main(["perf", "calibrate", "--quick", "--out", str(tmp_path / "c.json")]) == 0
    out = capsys.readouterr().out
    assert "% of the bandwidth (decode)" in out and "% of the GEMM peak (prefill)" in out
    assert "disk read" in out and "disk write" in out
    (hw,) = load_file(tmp_path / "c.json")
    assert hw.flops["fp32"] > 1e9 and hw.bandwidth > 1e8 and 0 < hw.launch_overhead_s < 1e-2
    disk = hw.disk  # the KV disk tier's costs: a file takes time, a larger one more
    assert 0 < disk.read_seconds(16 << 10) < disk.read_seconds(1 << 20) < 1.0
    assert 0 < disk.write_seconds(16 << 10) < disk.write_seconds(1 << 20) < 1.0
    for by_kind in ("memory_efficiency_by_kind", "compute_efficiency_by_kind"):
        assert 0 < getattr(hw, by_kind)["attention"] <= 1
    assert 0 < hw.memory_efficiency_by_kind[VERIFY_ATTENTION] <= 1  # a verifying decode's rows
    assert 0 < hw.compute_efficiency_by_kind[VERIFY_ATTENTION] <= 1  # (both from one time)
    assert f"{VERIFY_ATTENTION}" in out
    # the SSD scan's recurrence, timed on the engine's kernel: well below the GEMM peak
    assert 0 < hw.compute_efficiency_by_kind["scan"] < 1 and "an SSD scan's prefill" in out
    # the link between two tensor-parallel ranks (gloo): a latency and a bandwidth
    assert "link" in out and 0 < hw.link_latency_s < 0.1 and 1e6 < hw.interconnect < 1e12
    (row,) = load_file(save(dataclasses.replace(hw, name="cpu-test"), tmp_path / "t.json"))
    assert HARDWARE.get("cpu-test") is row and dataclasses.replace(row, name=hw.name) == hw


def test_calibration_over_processes_keeps_each_rate_the_fastest(tmp_path, capsys):
    """`--processes 2`: two fresh calibrating processes; the row saved has the faster read
    bandwidth and 1-row GEMM rate of the two each reported; `--processes 0` is refused."""
    import json
    import re

    from infergen.cli import main
    from infergen.perf.hardware import from_dict

    out = tmp_path / "c.json"
    assert main(["perf", "calibrate", "--quick", "--processes", "2", "--out", str(out)]) == 0
    reported = re.findall(
        r"process \d/2: read bandwidth ([\d.]+) GB/s, 1-row GEMM ([\d.]+) GB/s",
        capsys.readouterr().err,
    )
    assert len(reported) == 2
    ((name, fields),) = json.loads(out.read_text()).items()
    hw = from_dict(name, fields, str(out))
    assert hw.bandwidth / 1e9 == pytest.approx(max(float(r) for r, _ in reported), abs=0.051)
    one_row = hw.flops["fp32"] * hw.gemm_efficiency_at(1) * 2 / 1e9
    assert one_row == pytest.approx(max(float(g) for _, g in reported), abs=0.051)
    assert main(["perf", "calibrate", "--processes", "0", "--out", str(out)]) != 0
    assert "--processes" in capsys.readouterr().err


def test_a_kinds_compute_efficiency_divides_its_peak_only():
    from infergen.config import ModelConfig
    from infergen.perf.roofline import predict_step
    from infergen.perf.step_cost import Chunk, Formats

    desc = ModelConfig.from_hf_dict(TINY, source="tiny").describe()
    fmt = Formats(weight_bits=16, kv_bits=16, act_bytes=2)
    prefill = [Chunk(512, 512)]
    plain = {t.name: t for t in predict_step(desc, HW, prefill, fmt, "bf16")}
    slow = dataclasses.replace(HW, compute_efficiency_by_kind={"attention": 0.25})
    tuned = {t.name: t for t in predict_step(desc, slow, prefill, fmt, "bf16")}
    assert tuned["attention"].compute_s == pytest.approx(4 * plain["attention"].compute_s)
    assert tuned["mlp_up"].compute_s == plain["mlp_up"].compute_s


def _arch_desc(name: str):
    """A tiny model of an architecture family (tests/hf_models.py), described."""
    transformers = pytest.importorskip("transformers")
    from infergen.config import ModelConfig
    from tests.hf_models import ARCH_VARIANTS, BASE

    cls_name, extra = ARCH_VARIANTS[name]
    cfg = getattr(transformers, cls_name)(**{**BASE, **extra})
    return ModelConfig.from_hf_dict(cfg.to_dict(), source=name).describe()


def test_an_ssd_scan_is_priced_at_its_own_fraction_a_delta_scan_is_not():
    """Mamba2's scan op takes the "scan" kind's calibrated fraction, counted as the
    recurrence's FLOPs (6 per state element a token) + the conv's; Qwen3-Next's gated delta
    rule (its own kind, not calibrated) keeps the default fraction; the GEMMs are unchanged."""
    from infergen.perf.roofline import predict_step
    from infergen.perf.step_cost import Chunk, Formats, scan_flops

    fmt, prefill = Formats(weight_bits=32, kv_bits=32, act_bytes=4), [Chunk(256, 256)]
    hw = dataclasses.replace(HW, flops={"fp32": 1e12})
    slow = dataclasses.replace(hw, compute_efficiency_by_kind={"scan": 0.25})
    for name, ssd in (("mamba2", True), ("qwen3_next", False)):
        desc = _arch_desc(name)
        plain = {t.name: t for t in predict_step(desc, hw, prefill, fmt, "fp32")}
        tuned = {t.name: t for t in predict_step(desc, slow, prefill, fmt, "fp32")}
        assert tuned["scan"].compute_s == pytest.approx(
            (4.0 if ssd else 1.0) * plain["scan"].compute_s
        )
        assert tuned["in_proj"].compute_s == plain["in_proj"].compute_s
        if ssd:
            (m,) = {layer.mixer for layer in desc.layers}
            per_token = 2.0 * m.conv_dim * m.conv_kernel + scan_flops(
                m.heads, m.head_dim, m.state_size
            )
            peak = hw.peak_flops("fp32") * hw.compute_efficiency_for("fp32")
            assert plain["scan"].compute_s == pytest.approx(
                len(desc.layers) * 256 * per_token / peak
            )


def test_cli_perf_step_explains_a_step(capsys):
    from infergen.cli import main

    config = "tests/perf/configs/llama-3.1-8b.json"
    argv = ["perf", "step", "--model", config, "--gpu", "h200", "--batch", "1"]
    assert main([*argv, "--context", "1024"]) == 0
    out = capsys.readouterr().out
    assert "mlp_up" in out and "memory" in out  # batch-1 decode streams the weights
    assert main([*argv, "--new", "512", "--context", "512"]) == 0
    assert "compute" in capsys.readouterr().out  # a 512-token prefill is compute-bound


def test_gemm_efficiency_curve_by_rows():
    hw = Hardware("curve", "c", 1e9, 1e9, {"fp32": 1e12}, gemm_efficiency={1: 0.1, 8: 0.6, 64: 0.9})
    assert hw.gemm_efficiency_at(1) == 0.1 and hw.gemm_efficiency_at(64) == 0.9
    assert hw.gemm_efficiency_at(16) == pytest.approx(0.7)  # a third of the way in log2
    assert hw.gemm_efficiency_at(512) == 0.9 and HW.gemm_efficiency_at(8) == 1.0
    (t,) = op_times([OpCost("g", "gemm", flops=1e9, bytes=0.0, rows=16)], hw, "fp32")
    assert t.seconds == pytest.approx(1e9 / (1e12 * 0.7))


def test_gemm_time_never_falls_with_more_rows():
    """rows / efficiency (a GEMM's time over the same weights) never falls as rows grow: an
    interpolated point or a measured one faster than a smaller count is capped at that
    count's time."""
    hw = Hardware("curve", "c", 1e9, 1e9, {"fp32": 1e12}, gemm_efficiency={1: 0.1, 4: 0.4, 5: 0.6})
    assert hw.gemm_efficiency_at(2) == pytest.approx(0.2)  # 0.25 interpolated: capped
    assert hw.gemm_efficiency_at(5) == pytest.approx(0.5)  # measured 0.6: 5 rows in 1 row's time
    times = [rows / hw.gemm_efficiency_at(rows) for rows in range(1, 9)]
    assert all(b >= a * (1 - 1e-12) for a, b in zip(times, times[1:], strict=False))


def test_gemm_curve_by_the_size_of_one_call_s_weight():
    """With a large weight's curve, a GEMM's efficiency mixes the two curves by where its
    weight's size lies between theirs in log (clamped at the ends); without its weight's
    size, or without the large curve, the first curve alone. Each curve is capped first, so
    the time still never falls with rows."""
    small, large = {1: 0.1, 9: 0.5}, {1: 0.2, 9: 0.9}
    hw = Hardware("curve", "c", 1e9, 1e9, {"fp32": 1e12}, gemm_efficiency=small,
                  gemm_efficiency_large=large, gemm_weight_bytes=(1e6, 1e8))  # fmt: skip
    for rows in (1, 9):
        assert hw.gemm_efficiency_at(rows) == small[rows]
        assert hw.gemm_efficiency_at(rows, 1e5) == small[rows]
        assert hw.gemm_efficiency_at(rows, 1e6) == small[rows]
        assert hw.gemm_efficiency_at(rows, 1e8) == pytest.approx(large[rows])
        assert hw.gemm_efficiency_at(rows, 1e9) == pytest.approx(large[rows])
        middle = (small[rows] + large[rows]) / 2  # 1e7: halfway in log
        assert hw.gemm_efficiency_at(rows, 1e7) == pytest.approx(middle)
    one_curve = dataclasses.replace(hw, gemm_efficiency_large={}, gemm_weight_bytes=())
    assert one_curve.gemm_efficiency_at(9, 1e8) == small[9]
    # the roofline passes each op's largest weight of one call
    op = OpCost("head", "gemm")
    op.add(2e9, 0.0, weight_bytes=1e8, rows=9, times=2)
    assert op.call_weight_bytes == 1e8 and op.weight_bytes == 2e8
    (t,) = op_times([op], hw, "fp32")
    assert t.compute_s == pytest.approx(4e9 / (1e12 * 0.9))
    times = [rows / hw.gemm_efficiency_at(rows, 3e7) for rows in range(1, 12)]
    assert all(b >= a * (1 - 1e-12) for a, b in zip(times, times[1:], strict=False))


def test_the_large_curve_round_trips_and_needs_its_weight_sizes():
    import json

    from infergen.errors import ConfigError
    from infergen.perf.calibrate import as_row, best_of
    from infergen.perf.hardware import from_dict

    hw = Hardware("cpu-local", "c", 1e9, 1e9, {"fp32": 1e12}, gemm_efficiency={1: 0.1},
                  gemm_efficiency_large={1: 0.2, 9: 0.9}, gemm_weight_bytes=(1e6, 1e8),
                  calibrated="today")  # fmt: skip
    row = json.loads(json.dumps(as_row(hw)["cpu-local"]))  # as a file holds it
    back = from_dict("cpu-local", row, "a file")
    assert back.gemm_efficiency_large == hw.gemm_efficiency_large
    assert back.gemm_weight_bytes == hw.gemm_weight_bytes
    for broken in ({"gemm_weight_bytes": [1e8, 1e6]}, {"gemm_weight_bytes": None},
                   {"gemm_efficiency_large": {}}):  # fmt: skip
        with pytest.raises(ConfigError, match="gemm_weight_bytes and gemm_efficiency_large"):
            from_dict("x", {**row, **broken}, "a file")
    # best_of: point by point the faster achieved rate, against the combined peak
    faster = dataclasses.replace(hw, flops={"fp32": 2e12}, gemm_efficiency_large={1: 0.05, 9: 0.6})
    both = best_of(hw, faster)
    assert both.gemm_efficiency_large == pytest.approx({1: 0.1, 9: 0.6})
    assert both.gemm_weight_bytes == hw.gemm_weight_bytes


def test_calibration_fields_scale_the_roofline_and_host_time_is_per_step_and_sequence():
    from infergen.io.model_config import read_model_config
    from infergen.perf.roofline import predict_step
    from infergen.perf.step_cost import Chunk, Formats

    desc = read_model_config("tests/perf/configs/llama-3.1-8b.json").describe()
    raw = Hardware("raw", "r", 1e11, 1e14, {"bf16": 1e15, "fp8": 2e15})
    tuned = dataclasses.replace(
        raw,
        compute_efficiency={"fp8": 0.5},
        memory_efficiency=0.8,
        step_overhead_s=1e-3,
        sequence_overhead_s=1e-4,
    )
    prefill, decode = [Chunk(4096, 4096)], [Chunk(1, 100)] * 3

    def seconds(hw, chunks, fmt):
        return step_seconds(predict_step(desc, hw, chunks, Formats(8, 8, 1), fmt))

    # compute-bound prefill in fp8 takes twice as long at half the fp8 peak; bf16 untouched
    assert seconds(tuned, prefill, "fp8") - 1e-3 - 1e-4 == pytest.approx(
        2 * seconds(raw, prefill, "fp8"), rel=0.01
    )
    assert seconds(tuned, prefill, "bf16") - 1.1e-3 == pytest.approx(
        seconds(raw, prefill, "bf16"), rel=0.01
    )
    # memory-bound decode: 1 / 0.8 longer, plus 1 ms + 3 x 0.1 ms of host time
    assert seconds(tuned, decode, "fp8") == pytest.approx(
        seconds(raw, decode, "fp8") / 0.8 + 1.3e-3, rel=0.01
    )
    assert tuned.runs_as("fp4") == "fp8" and tuned.compute_efficiency_for("fp4") == 0.5


def test_compute_class_of_activation_formats():
    from infergen.config.stored import compute_class

    got = [compute_class(f) for f in ("fp32", "bf16", "fp8_e4m3", "mxfp6_e2m3", "nvfp4", "int8")]
    assert got == ["fp32", "bf16", "fp8", "fp8", "fp4", "int8"]


@pytest.mark.parametrize(
    "factor, message",
    [
        ('"compute_efficiency": {"bf16": 1.5}', "compute_efficiency"),
        ('"compute_efficiency_by_kind": {"attention": 0}', "compute_efficiency_by_kind must map"),
        ('"eager_layer_s": {"norm": [1e-5]}', "eager_layer_s must map layer parts"),
    ],
)
def test_hardware_rows_reject_bad_efficiencies(tmp_path, factor, message):
    from infergen.errors import ConfigError

    path = tmp_path / "bad.json"
    path.write_text(
        '{"bad": {"memory_bytes": 1e9, "bandwidth": 1e9, "flops": {"bf16": 1e12}, ' + factor + "}}"
    )
    with pytest.raises(ConfigError, match=message):
        load_file(path)


def test_best_of_two_calibrations_keeps_each_faster_rate():
    from infergen.perf.calibrate import best_of

    slow = Hardware(
        "cpu-local",
        "c",
        1e9,
        bandwidth=20e9,
        flops={"fp32": 100e9},
        launch_overhead_s=8e-6,
        gemm_efficiency={1: 0.2, 16: 0.9},
        memory_efficiency_by_kind={"attention": 0.5},
        compute_efficiency_by_kind={"attention": 0.3},
    )
    fast = dataclasses.replace(
        slow,
        bandwidth=40e9,
        flops={"fp32": 200e9},
        launch_overhead_s=6e-6,
        gemm_efficiency={1: 0.05, 16: 0.6},  # achieved 10 and 120 GFLOP/s
        memory_efficiency_by_kind={"attention": 0.2},  # achieved 8 GB/s
        compute_efficiency_by_kind={"attention": 0.25},  # achieved 50 GFLOP/s
    )
    hw = best_of(slow, fast)
    assert hw.flops == {"fp32": 200e9} and hw.bandwidth == 40e9 and hw.launch_overhead_s == 6e-6
    # achieved rates: GEMM rows 1 -> max(20, 10) = 20, rows 16 -> max(90, 120) = 120 GFLOP/s
    assert hw.gemm_efficiency == pytest.approx({1: 0.1, 16: 0.6})
    assert hw.memory_efficiency_by_kind == pytest.approx({"attention": 10e9 / 40e9})
    assert hw.compute_efficiency_by_kind == pytest.approx({"attention": 50e9 / 200e9})
    assert best_of(fast, slow) == hw
    # the link: the fit whose decode-sized all-reduce is shorter, latency and bandwidth together
    low_latency = dataclasses.replace(slow, interconnect=1e9, link_latency_s=300e-6)
    wide = dataclasses.replace(fast, interconnect=10e9, link_latency_s=500e-6)
    for a, b in ((low_latency, wide), (wide, low_latency)):
        both = best_of(a, b)
        assert (both.interconnect, both.link_latency_s) == (1e9, 300e-6)
    assert best_of(slow, wide).interconnect == 10e9  # (only one measured a link)


def test_a_verifying_decodes_attention_has_its_own_efficiency_else_decode_attentions():
    """The "verify attention" op (kind verify_attention: each row reads its own prefix, much
    of it from cache) takes its calibrated memory fraction; a row without one (a GPU's, a
    calibration older than the kind) takes decode attention's, and without that the
    default."""
    op = OpCost("verify attention", VERIFY_ATTENTION, flops=1.0, bytes=8e9)
    hw = Hardware("x", "x", 1e9, bandwidth=100e9, flops={"fp32": 1e15}, memory_efficiency=0.8,
                  memory_efficiency_by_kind={"attention": 0.4, VERIFY_ATTENTION: 0.5})  # fmt: skip

    def seconds(row: Hardware) -> float:
        return step_seconds(op_times([op], row, "fp32", Efficiency.of_hardware(row, "fp32")))

    assert seconds(hw) == pytest.approx(8e9 / (0.5 * 100e9))
    older = dataclasses.replace(hw, memory_efficiency_by_kind={"attention": 0.4})
    assert seconds(older) == pytest.approx(8e9 / (0.4 * 100e9))
    assert seconds(dataclasses.replace(hw, memory_efficiency_by_kind={})) == pytest.approx(0.1)


def test_a_verifying_decodes_attention_is_bound_by_its_compute_fraction_too():
    """Calibrated from one time, the verify attention's memory and compute fractions give the
    same seconds at the calibration's rates; when the read bandwidth later doubles (this VM's
    swings), the op stays at its compute bound instead of halving (each row's dot products
    are its own); a row without the compute fraction takes prefill attention's."""
    op = OpCost("verify attention", VERIFY_ATTENTION, flops=4e9, bytes=8e9)
    hw = Hardware(
        "x",
        "x",
        1e9,
        bandwidth=100e9,
        flops={"fp32": 1e12},
        memory_efficiency_by_kind={VERIFY_ATTENTION: 0.5},
        compute_efficiency_by_kind={"attention": 0.8, VERIFY_ATTENTION: 0.025},
    )

    def seconds(row: Hardware) -> float:
        return step_seconds(op_times([op], row, "fp32", Efficiency.of_hardware(row, "fp32")))

    assert seconds(hw) == pytest.approx(8e9 / (0.5 * 100e9)) == pytest.approx(4e9 / 0.025e12)
    faster = dataclasses.replace(hw, bandwidth=200e9)
    assert seconds(faster) == pytest.approx(seconds(hw))
    older = dataclasses.replace(faster, compute_efficiency_by_kind={"attention": 0.8})
    assert seconds(older) == pytest.approx(8e9 / (0.5 * 200e9))


def test_verify_attention_fractions_come_from_one_measured_time():
    """calibrate's two fractions for a verifying decode's rows imply the same seconds: the
    bytes each row reads over bandwidth x memory fraction, the FLOPs over peak x compute
    fraction (the cost model's counts: perf/step_cost.py)."""
    from infergen.perf import calibrate
    from infergen.perf.step_cost import Chunk, attended_keys, keys_read

    bandwidth, peak, layers = 1e15, 1e17, 2  # (far above any rate: no fraction clipped at 1)
    memory, compute = calibrate._verify_attention_efficiency(bandwidth, peak, 1, layers)
    chunk = Chunk(calibrate.VERIFY_ROWS, calibrate.VERIFY_CONTEXT, verify=True)
    nbytes = layers * 2 * keys_read(chunk, None) * calibrate.KV_HEADS * calibrate.DIM * 4
    flops = layers * 4 * calibrate.HEADS * calibrate.DIM * attended_keys(chunk, None)
    assert 0 < memory < 1 and 0 < compute < 1
    assert nbytes / (bandwidth * memory) == pytest.approx(flops / (peak * compute), rel=1e-9)


def test_the_low_precision_product_peaks_round_trip_and_stay_out_of_the_cost_model():
    """cpu-local's measured bf16 / W8A8 product peaks (for `infergen profile`): written and
    read back, the faster of two calibrations kept per class, a non-positive one refused; the
    cost model's bf16 peak is still the fp32 one (the CPU engine computes in fp32)."""
    import json

    from infergen.errors import ConfigError
    from infergen.perf.calibrate import as_row, best_of
    from infergen.perf.hardware import from_dict

    hw = Hardware("cpu-local", "c", 1e9, 1e9, {"fp32": 1e11},
                  product_flops={"bf16": 2e12, "int8": 1e12})  # fmt: skip
    row = json.loads(json.dumps(as_row(hw)["cpu-local"]))
    back = from_dict("cpu-local", row, "a file")
    assert back.product_flops == hw.product_flops
    assert back.peak_flops("bf16") == 1e11
    with pytest.raises(ConfigError, match="must be a positive number"):
        from_dict("x", {**row, "product_flops": {"bf16": 0}}, "a file")
    other = dataclasses.replace(hw, product_flops={"bf16": 1e12, "int8": 3e12})
    assert best_of(hw, other).product_flops == {"bf16": 2e12, "int8": 3e12}
