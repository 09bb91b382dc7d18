"""benchmarks/calibrate_gpu.py, the GPU calibration of device_check.sh, dry-run on the CPU at
toy sizes: the same code path writes a hardware row that loads and a comparison line."""

from __future__ import annotations

import json
import pathlib
import sys

from infergen.perf.hardware import load_file

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))

import calibrate_gpu  # noqa: E402


def test_dry_run_writes_a_loadable_row_and_a_comparison_line(tmp_path):
    calibrate_gpu.main(["--device", "cpu", "--small", "--out", str(tmp_path)])
    (row,) = load_file(tmp_path / "h200-measured.json")  # efficiencies validated in (0, 1]
    assert row.name == "h200-measured" and "dry run" in row.description
    assert sorted(row.gemm_efficiency) == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096]
    assert 0 < row.memory_efficiency_by_kind["attention"] <= 1
    assert 0 < row.launch_overhead_s < 1e-2
    (line,) = [json.loads(x) for x in (tmp_path / "calibrate_gpu.jsonl").read_text().splitlines()]
    assert line["bench"] == "calibrate_gpu" and line["bf16_tflops"] > 0
    assert set(line["measured"]) >= {"bf16", "memory"}
