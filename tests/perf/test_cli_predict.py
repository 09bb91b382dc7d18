"""`infergen predict`: the JSON fields the issue names, --explain, --sweep (table and PNG), TP
and clear errors."""

from __future__ import annotations

import json

import pytest

from infergen.cli import main

LLAMA_70B = "tests/perf/configs/llama-3.1-70b.json"
GPT_OSS = "tests/perf/configs/gpt-oss-20b.json"


def run_json(capsys, *argv) -> dict:
    assert main(["predict", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_has_the_fields_and_tp_halves_the_weights_per_device(capsys):
    argv = ["-m", LLAMA_70B, "--gpu", "h200", "--weights", "fp8_e4m3", "--kv", "fp8_e4m3"]
    argv += ["--isl", "1000", "--osl", "100", "--num-requests", "32", "--concurrency", "8"]
    one = run_json(capsys, *argv)
    two = run_json(capsys, *argv, "--tp", "2")
    for key in ("params_total", "params_active", "weight_bytes", "kv_bytes_per_token"):
        assert one[key] == two[key] > 0
    assert set(one["ttft_ms"]) >= {"mean", "p50", "p90", "p99"}
    assert two["memory_per_device"]["weights"] == pytest.approx(
        one["memory_per_device"]["weights"] / 2
    )
    assert two["itl_ms"]["mean"] < one["itl_ms"]["mean"]  # half the weights to stream each
    assert two["gpus"] == 2 and two["cost_per_mtok_usd"] > 0
    assert one["max_concurrency"] >= 1


def test_moe_with_mxfp4_experts_and_expert_parallelism(capsys):
    base = ["-m", GPT_OSS, "--isl", "256", "--osl", "32", "--num-requests", "16"]
    bf16 = run_json(capsys, *base)
    mx = run_json(capsys, *base, "--expert-weights", "mxfp4")
    assert mx["weight_bytes"] < 0.4 * bf16["weight_bytes"]
    ep = run_json(capsys, *base, "--expert-weights", "mxfp4", "--ep", "2")
    assert ep["memory_per_device"]["weights"] < mx["memory_per_device"]["weights"]


def test_explain_names_the_bound_of_each_op(capsys):
    argv = ["predict", "-m", LLAMA_70B, "--tp", "2", "--concurrency", "1", "--isl", "2048"]
    assert main([*argv, "--osl", "64", "--explain"]) == 0
    decode, prefill = capsys.readouterr().out.split("\n\n")
    assert "all_reduce" in decode and "memory" in decode  # batch 1 streams the weights
    assert "2048-token prefill" in prefill and "compute" in prefill


def test_sweep_writes_a_table_and_a_png(capsys, tmp_path):
    png = tmp_path / "sweep.png"
    argv = ["predict", "-m", "tests/perf/configs/llama-3.1-8b.json", "--isl", "128"]
    argv += ["--osl", "32", "--num-requests", "64", "--sweep", "concurrency=1,4,16"]
    assert main([*argv, "--plot", str(png)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 4 and "out tok/s" in lines[0]
    throughputs = [float(line.split()[1]) for line in lines[1:]]
    assert throughputs == sorted(throughputs)  # more clients, more tokens per second
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--gpu", "tpu9"], "tpu9"),
        (["--sweep", "colour=1,2"], "sweep"),
        (["--isl", "10"], "--isl"),
        (["--weights", "fp7"], "fp7"),
        (["-m", "tests/perf/configs/llama-3.1-70b.json", "--gpu", "l40s"], "does not fit"),
    ],
)
def test_bad_input_gets_a_clear_error(capsys, argv, message):
    code = main(["predict", "-m", "tests/perf/configs/llama-3.1-8b.json", *argv])
    assert code != 0
    assert message in capsys.readouterr().err
