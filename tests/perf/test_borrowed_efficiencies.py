"""GPUs nobody calibrated: a row without efficiencies of its own (a100, b200, l40s, a user's
row) borrows those of a calibrated row (h200 by default, or its `efficiencies_from`) as
fractions of its OWN peaks, and every prediction says where they came from. Expected times
are computed here from the rows' numbers and step_cost's byte / FLOP counts."""

from __future__ import annotations

import json

import pytest

from infergen.cli import main
from infergen.errors import ConfigError
from infergen.io.model_config import read_model_config
from infergen.perf.hardware import DEFAULT_DONOR, HARDWARE, load_file
from infergen.perf.roofline import launches, predict_step, step_seconds
from infergen.perf.step_cost import Chunk, Formats, step_ops

LLAMA_8B = "tests/perf/configs/llama-3.1-8b.json"
BF16 = Formats(weight_bits=16, kv_bits=16, act_bytes=2)
PEAKS = {"memory_bytes": 64e9, "bandwidth": 1.2e12, "flops": {"bf16": 250e12}}


@pytest.fixture(scope="module")
def desc():
    return read_model_config(LLAMA_8B).describe()


def decode_itl(desc, hw) -> float:
    return step_seconds(predict_step(desc, hw, [Chunk(1, 1024)], BF16, "bf16"))


def expected_decode_itl(desc, gpu, donor) -> float:
    """A batch-1 decode is memory-bound in every op: the bytes it moves at the GPU's own
    bandwidth x the donor's measured bandwidth efficiency, plus the donor's launch cost."""
    nbytes = sum(op.bytes for op in step_ops(desc, [Chunk(1, 1024)], BF16))
    return nbytes / (gpu.bandwidth * donor.memory_efficiency) + (
        launches(desc) * donor.launch_overhead_s
    )


def test_the_donor_is_calibrated_and_uncalibrated_rows_borrow_from_it():
    donor = HARDWARE.get(DEFAULT_DONOR)
    assert donor.calibrated.startswith("2026-") and not donor.borrowed
    assert donor.memory_efficiency < 1 and donor.compute_efficiency
    for name in ("a100", "b200", "gb200", "l40s"):
        hw = HARDWARE.get(name)
        assert hw.calibrated is None and hw.efficiencies_from == DEFAULT_DONOR
        assert {"memory_efficiency", "compute_efficiency", "launch_overhead_s"} <= set(hw.borrowed)
        assert hw.memory_efficiency == donor.memory_efficiency
        assert hw.efficiency_note().startswith(
            f"efficiencies borrowed from {DEFAULT_DONOR} (calibrated {donor.calibrated})"
        )
    # a format the donor did not calibrate takes its nearest wider one's fraction
    assert HARDWARE.get("b200").compute_efficiency_for("fp4") == donor.compute_efficiency_for("fp8")
    assert HARDWARE.get("a100").compute_efficiency_for("fp8") == donor.compute_efficiency_for(
        "bf16"
    )
    assert HARDWARE.get("l40s").link_latency_s == 0  # no interconnect: no latency borrowed


def test_a100_decode_streams_at_its_own_bandwidth_times_the_donors_efficiency(desc):
    a100, h200 = HARDWARE.get("a100"), HARDWARE.get(DEFAULT_DONOR)
    itl = decode_itl(desc, a100)
    assert itl == pytest.approx(expected_decode_itl(desc, a100, h200), rel=1e-3)
    # neither the raw peak (efficiency 1) nor the donor's absolute bandwidth
    nbytes = sum(op.bytes for op in step_ops(desc, [Chunk(1, 1024)], BF16))
    assert itl > 1.05 * nbytes / a100.bandwidth
    assert itl > 2 * nbytes / (h200.bandwidth * h200.memory_efficiency)


def test_a100_prefill_gemm_runs_at_its_own_peak_times_the_donors_compute_efficiency(desc):
    a100, h200 = HARDWARE.get("a100"), HARDWARE.get(DEFAULT_DONOR)
    chunks = [Chunk(2048, 2048)]
    (up,) = [op for op in step_ops(desc, chunks, BF16) if op.name == "mlp_up"]
    (time,) = [t for t in predict_step(desc, a100, chunks, BF16, "bf16") if t.name == "mlp_up"]
    assert time.compute_s == pytest.approx(
        up.flops / (a100.flops["bf16"] * h200.compute_efficiency["bf16"])
    )


def test_a_users_row_without_calibration_borrows_too(tmp_path, desc):
    path = tmp_path / "mine.yaml"
    path.write_text(
        "my-uncalibrated-gpu:\n" + "".join(f"  {k}: {json.dumps(v)}\n" for k, v in PEAKS.items())
    )
    (mine,) = load_file(path)
    h200 = HARDWARE.get(DEFAULT_DONOR)
    assert mine.efficiencies_from == DEFAULT_DONOR and "memory_efficiency" in mine.borrowed
    assert decode_itl(desc, mine) == pytest.approx(expected_decode_itl(desc, mine, h200), rel=1e-3)


def test_a_row_names_its_donor_and_keeps_what_it_measured(tmp_path):
    rows = {
        "my-calibrated": {**PEAKS, "memory_efficiency": 0.7, "calibrated": "2026-12-02: mine"},
        "my-borrower": {**PEAKS, "efficiencies_from": "my-calibrated"},
        "my-partial": {**PEAKS, "memory_efficiency": 0.6, "efficiencies_from": "h200"},
    }
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(rows))
    calibrated, borrower, partial = load_file(path)
    assert not calibrated.borrowed and calibrated.compute_efficiency_for("bf16") == 1.0
    assert borrower.memory_efficiency == 0.7 and borrower.borrowed == ("memory_efficiency",)
    assert "borrowed from my-calibrated (calibrated 2026-12-02: mine)" in (
        borrower.efficiency_note()
    )
    h200 = HARDWARE.get("h200")
    assert partial.memory_efficiency == 0.6 and "memory_efficiency" not in partial.borrowed
    assert partial.compute_efficiency_for("bf16") == h200.compute_efficiency_for("bf16")


@pytest.mark.parametrize(
    "donor,message",
    [("no-such-gpu", "which is not defined"), ("a100", "not calibrated on its own")],
)
def test_a_donor_must_exist_and_be_calibrated(tmp_path, donor, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({f"borrows-{donor}": {**PEAKS, "efficiencies_from": donor}}))
    with pytest.raises(ConfigError, match=message):
        load_file(path)


def test_cli_says_where_the_efficiencies_came_from(capsys, tmp_path):
    with pytest.raises(SystemExit):
        main(["predict", "--help"])
    assert "borrows the efficiencies measured on a calibrated GPU" in " ".join(
        capsys.readouterr().out.split()
    )
    base = ["-m", LLAMA_8B, "--isl", "128", "--osl", "8", "--num-requests", "2"]
    assert main(["predict", *base, "--gpu", "a100", "--json"]) == 0
    eff = json.loads(capsys.readouterr().out)["efficiencies"]
    h200 = HARDWARE.get("h200")
    assert eff["borrowed_from"] == "h200" and eff["donor_calibrated"] == h200.calibrated
    assert eff["memory_efficiency"] == h200.memory_efficiency and eff["calibrated"] is None
    assert main(["predict", *base, "--gpu", "a100"]) == 0
    assert f"efficiencies borrowed from h200 (calibrated {h200.calibrated})" in (
        capsys.readouterr().out
    )
    assert main(["predict", *base, "--gpu", "h200"]) == 0
    assert f"efficiencies of h200 itself (calibrated {h200.calibrated})" in (
        capsys.readouterr().out
    )
    path = tmp_path / "cli.json"
    path.write_text(json.dumps({"my-cli-gpu": PEAKS}))
    argv = ["predict", *base, "--gpu", "my-cli-gpu", "--hardware-file", str(path), "--explain"]
    assert main(argv) == 0
    assert "efficiencies borrowed from h200" in capsys.readouterr().out
