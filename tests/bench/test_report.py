"""Serving-benchmark summaries against numpy and the definitions (REFERENCES §6)."""

from __future__ import annotations

import numpy as np
import pytest

from infergen.bench.client import RequestResult
from infergen.bench.report import summarize


def test_summary_percentiles_tpot_throughput_and_goodput():
    rng = np.random.default_rng(0)
    results = []
    for _ in range(50):
        ttft = float(rng.uniform(0.05, 0.5))
        gaps = list(rng.uniform(0.01, 0.05, size=9))
        results.append(
            RequestResult(
                ok=True,
                input_tokens=20,
                output_tokens=10,
                ttft=ttft,
                e2e=ttft + sum(gaps),
                itl=gaps,
            )
        )
    results.append(RequestResult(ok=False, error="HTTP 503"))
    s = summarize(results, wall=10.0, slo_ttft=0.3, slo_tpot=0.04)
    ttfts = [r.ttft for r in results if r.ok]
    assert s["ttft_s"]["p90"] == pytest.approx(np.percentile(ttfts, 90))
    assert s["ttft_s"]["mean"] == pytest.approx(np.mean(ttfts))
    all_gaps = [g for r in results if r.ok for g in r.itl]
    assert s["itl_s"]["p99"] == pytest.approx(np.percentile(all_gaps, 99))
    assert s["itl_s"]["n"] == 50 * 9
    tpots = [(r.e2e - r.ttft) / 9 for r in results if r.ok]
    assert s["tpot_s"]["p50"] == pytest.approx(np.percentile(tpots, 50))
    assert s["output_tok_s"] == pytest.approx(500 / 10.0)
    assert s["total_tok_s"] == pytest.approx((500 + 1000) / 10.0)
    good = sum(r.ttft <= 0.3 and t <= 0.04 for r, t in zip(results[:50], tpots, strict=True))
    assert s["goodput_req_s"] == pytest.approx(good / 10.0)
    assert s["completed"] == 50 and s["failed"] == 1 and s["errors"] == ["HTTP 503"]


def test_tpot_needs_two_tokens():
    assert RequestResult(ok=True, output_tokens=1, ttft=0.1, e2e=0.1).tpot is None
    assert RequestResult(ok=True, output_tokens=3, ttft=0.1, e2e=0.5).tpot == pytest.approx(0.2)
