"""benchmarks/bench_gpu.py runs end to end on the CPU on a toy model (its figures mean
nothing there: the GPU run is the device check's); every case it measures on the CPU writes
its line, and the decode lines carry the ratios to the eager torch peer and the roofline."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_bench_gpu_runs_on_a_toy_model(tmp_path):
    out = tmp_path / "gpu_engine.jsonl"
    args = ["--device", "cpu", "--layers", "1", "--hidden", "128", "--batches", "1", "2",
            "--no-compile-peer", "--out", str(out)]  # fmt: skip
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_gpu.py"), *args],
                   check=True, capture_output=True, timeout=300)  # fmt: skip
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    cases = {line["case"] for line in lines}
    assert {"copy", "peer", "decode", "prefill"} <= cases
    decode = [line for line in lines if line["case"] == "decode"]
    assert {(d["batch"], d["mode"]) for d in decode} == {(1, "graphs"), (1, "eager"),
                                                        (2, "graphs"), (2, "eager")}  # fmt: skip
    for line in decode:
        assert line["tok_per_s"] > 0 and 0 < line["roofline_pct"]
        assert line["vs_torch_eager"] > 0
