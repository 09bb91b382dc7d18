"""benchmarks/bench_formats_gpu.py without a GPU: its argument parsing, and a smoke run of
its measuring and line-writing logic on the CPU at a toy size."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

pytest.importorskip("triton")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_formats_gpu as bench  # noqa: E402


def test_help_and_defaults(capsys):
    with pytest.raises(SystemExit) as exit_:
        bench.parse_args(["--help"])
    assert exit_.value.code == 0
    assert "--sizes" in capsys.readouterr().out
    args = bench.parse_args([])
    assert args.sizes == [64 << 20, 256 << 20] and args.peer_size == 64 << 20
    assert bench.parse_args(["--sizes", "1K,4096,2M"]).sizes == [1024, 4096, 2 << 20]
    for bad in (["--tile", "1000"], ["--sizes", "100"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_cpu_smoke_run_writes_every_format_and_op(tmp_path):
    out = tmp_path / "formats.jsonl"
    formats = ["mxfp4", "fp8_e4m3", "int4"]
    bench.main(["--device", "cpu", "--sizes", "8K", "--peer-size", "8K",
                "--formats", ",".join(formats), "--out", str(out)])  # fmt: skip
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    results = {x["metric"]: x for x in lines if x["kind"] == "result"}
    assert results["copy_gb_s"]["value"] > 0
    for fmt in formats:
        for op in ("quantize", "dequantize"):
            line = results[f"{op}_gb_s_{fmt}"]
            assert line["params"]["numel"] == 8192 and line["fraction_of_copy"] > 0
            assert line["params"]["tile"] == 4096
    assert sum(x["kind"] == "ratio" for x in lines) == 2 * len(formats)
