"""benchmarks/bench_kv_tiers.py --quick runs end to end on the default model's row, without the
llama-server peer (figures meaningless at this size): every configuration writes its results,
the ratios against no tiers / a cold start render in report.py's table, the greedy answers
agree across configurations, the tiers were used (blocks saved below the pool; the restarted
engine found blocks on the disk tier), and every TTFT's breakdown counts the steps inside it."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))


def test_bench_kv_tiers_quick(tmp_path):
    from report import render

    out = tmp_path / "kv_tiers.jsonl"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_kv_tiers.py"), "--quick",
                    "--models", "smollm2-135m", "--no-peer", "--out", str(out)], check=True,
                   capture_output=True, timeout=240)  # fmt: skip
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(line["bench"] == "kv_tiers" and line["quick"] for line in lines)
    assert lines[0]["machine"]["cpu"] and lines[0]["machine"]["isa"]
    configs = {ln["config"] for ln in lines if ln["kind"] == "result"}
    assert configs == {"no tiers", "host", "host + disk", "restart", "cold start"}
    ratios = [ln for ln in lines if ln["kind"] == "ratio"]
    assert {ln["peer"] for ln in ratios} == {"no tiers", "cold start"}
    for ln in ratios:
        assert ln["value"] > 0 and ln["infergen_value"] > 0 and ln["peer_value"] > 0
        assert f"kv_tiers: {ln['metric']} (quick)" in render(lines)
    (agreement,) = [ln for ln in lines if ln["kind"] == "agreement"]
    assert agreement["equal"], agreement["mismatches"]
    tiers = {ln["config"]: ln for ln in lines if ln["kind"] == "tiers"}
    assert tiers["host"]["saved"] > 0 and tiers["host + disk"]["tiers"]["disk"]["puts"] > 0
    assert tiers["restart"]["tiers"]["disk"]["hits"] > 0
    assert len([ln for ln in lines if ln["kind"] == "target"]) == 6
    shares = {ln["config"]: ln["value"] for ln in lines if "cache_served_share" in ln["metric"]
              and ln["kind"] == "result"}  # fmt: skip
    assert shares["host"] == shares["host + disk"] == 1.0  # nothing reusable is recomputed
    for ln in lines:  # the steps counted in a TTFT ran inside it (at least the one returning it)
        if ln["kind"] == "breakdown":
            assert ln["steps"] >= 1 and ln["forward_s"] > 0 and ln["outside_s"] >= -1e-6
