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

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))


@pytest.mark.slow
def test_bench_kv_tiers_quick(tmp_path):
    from report import render

    out = tmp_path / "kv_tiers.jsonl"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_kv_tiers.py"), "--quick",
                    "--models", "smollm2-135m", "--no-peer", "--out", str(out)], check=True,
                   capture_output=True, timeout=360)  # fmt: skip
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
    predicted = [ln for ln in lines if ln["kind"] == "target" and "predicted" in ln["metric"]]
    assert len([ln for ln in lines if ln["kind"] == "target"]) == 5 + len(predicted)
    shares = {ln["config"]: ln["value"] for ln in lines if "cache_served_share" in ln["metric"]
              and ln["kind"] == "result"}  # fmt: skip
    assert shares["host"] == shares["host + disk"] == 1.0  # nothing reusable is recomputed
    for ln in lines:  # the steps counted in a TTFT ran inside it (at least the one returning it)
        if ln["kind"] == "breakdown":
            assert ln["steps"] >= 1 and ln["forward_s"] > 0 and ln["outside_s"] >= -1e-6


def _request(turn: int, ttft: float) -> dict:
    return dict(session=0, turn=turn, reusable=32, needed_blocks=2, cached=32, shared=16,
                answer=[1, 2], prompt_tokens=40, ttft_s=ttft, schedule_s=0.0, forward_s=ttft,
                after_s=0.0, outside_s=0.0, steps=1)  # fmt: skip


def _run(ttft: float, tiers: bool = True) -> dict:
    return dict(requests=[_request(0, 1.0), _request(1, ttft)], seconds=1.0, other_cpu_cores=0.0,
                preemptions=0, engine_seconds=dict(schedule_s=0.0, forward_s=1.0, after_s=0.0,
                steps=2), stats={"loaded": 1} if tiers else None, options={})  # fmt: skip


def test_kv_tiers_targets_against_no_tiers_not_the_peer():
    """The target lines take the ratios against no tiers / the cold start (hand-computed here),
    not the llama-server ratios of the same metric; the predicted gain's line compares with
    the measured one."""
    from kv_tiers_lines import COLD, DISK, HOST, NONE, RESTART, build_lines

    found = {NONE: _run(1.0, tiers=False), HOST: _run(0.5), DISK: _run(0.25),
             RESTART: _run(0.5), COLD: _run(1.0, tiers=False), "control_stats": {},
             "control": {NONE: [dict(value=1.0, other_cpu_cores=0.0)],
                         HOST: [dict(value=0.99, other_cpu_cores=0.0)]}}  # fmt: skip
    cache = "llama-server (prompt cache)"
    llama = {"version": "b1", "setup": {}, "results": [
        ("ttft_p50_s_turn2on", cache, dict(value=0.1, other_cpu_cores=0.0)),
        ("throughput_tok_s", cache, dict(value=9.0, other_cpu_cores=0.0))]}  # fmt: skip
    flops = lambda computed, prompt: 10.0 * computed + prompt  # noqa: E731 - a stand-in count
    lines, bad = build_lines([found], {"bench": "kv_tiers", "row": "r"}, llama,
                             {"value": 3.0, "rates": "in-run"}, flops)  # fmt: skip
    assert not bad
    targets = {ln["metric"].split(": ", 1)[1]: ln["value"] for ln in lines
               if ln["kind"] == "target"}  # fmt: skip
    assert targets["host + disk: p50 TTFT from turn 2 >= 5x lower than no tiers"] == 4.0
    assert targets["host + disk: throughput >= 1.5x no tiers"] == 1.0
    restart = "restart with the disk tier: first-turn TTFT >= 3x lower than a cold start"
    assert targets[restart] == 1.0 / 0.75  # medians of (1.0, 1.0) over (1.0, 0.5)
    shares = [v for k, v in targets.items() if "served from" in k]
    assert shares == [1.0]  # 32 of 32 reusable tokens cached
    reported = {ln["metric"]: ln["value"] for ln in lines if ln["kind"] == "result"}
    assert reported["r: tier_loaded_share [host + disk]"] == 0.25  # 1 block of the 2 + 2 needed
    assert reported["r: pool_resident_share [host + disk]"] == 0.5  # 16 of the 32 reusable
    (predicted,) = [ln for ln in lines if ln["kind"] == "target" and "predicted" in ln["metric"]]
    assert predicted["value"] == 0.25 and predicted["met"]  # |3 - 4| / 4
    assert predicted["prediction"] == {"rates": "in-run"}
    (gain,) = [ln for ln in lines if ln["metric"] == "r: ttft_p50_s_turn2on [host + disk]"
               and ln["kind"] == "ratio" and ln["peer"] == NONE]  # fmt: skip
    # every turn-2 request computes 40 - 32 = 8 of its 40 tokens: (80 + 40) / (80 + 40)
    assert gain["flops_ratio"] == 1.0 and gain["computed_tokens_ratio"] == 1.0
    peer = [ln for ln in lines if ln["kind"] == "ratio" and ln["peer"] == "llama-server"]
    assert [round(ln["value"], 3) for ln in peer] == [0.4, 0.444]


def test_flops_ratio_is_the_ratio_of_median_request_flops():
    """The FLOP bound: median request FLOPs without tiers over those with them, each request's
    prefill counted over its computed tokens (prompt − cached, at least one)."""
    from kv_tiers_lines import flops_ratio

    def requests(*cached):
        return [dict(_request(1, 0.1), cached=c) for c in cached]

    def flops(computed, prompt):
        return 10.0 * computed + prompt

    # computed 40, 8, 24 (median 24 → 280) against 8, 8, 0 → 1 (median 8 → 120)
    assert flops_ratio(requests(0, 32, 16), requests(32, 32, 40), flops) == 280 / 120
