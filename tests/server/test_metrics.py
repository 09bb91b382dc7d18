"""GET /metrics read back with prometheus_client's own parser (independent of the exposition
code): the exposed names are the ones the hand-written exporter had, each server has its own
registry, and the histograms are cumulative and count the requests a client sent."""

from __future__ import annotations

import math
import time

import httpx
import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families

from infergen.server.metrics import ITL_BUCKETS, TTFT_BUCKETS, ServerMetrics

from .conftest import API_KEY, LiveServer

TTFT = "infergen_time_to_first_token_seconds"
ITL = "infergen_inter_token_latency_seconds"

# what the hand-written exporter exposed (and the aborts by reason, added since): (family,
# type) and the sample names of each
EXPOSED = {
    ("infergen_requests", "counter"): {"infergen_requests_total"},
    ("infergen_request_aborts", "counter"): {"infergen_request_aborts_total"},
    ("infergen_request_rejections", "counter"): {"infergen_request_rejections_total"},
    ("infergen_prompt_tokens", "counter"): {"infergen_prompt_tokens_total"},
    ("infergen_cached_prompt_tokens", "counter"): {"infergen_cached_prompt_tokens_total"},
    ("infergen_generation_tokens", "counter"): {"infergen_generation_tokens_total"},
    ("infergen_requests_waiting", "gauge"): {"infergen_requests_waiting"},
    ("infergen_requests_running", "gauge"): {"infergen_requests_running"},
    ("infergen_kv_blocks_used", "gauge"): {"infergen_kv_blocks_used"},
    ("infergen_kv_blocks_free", "gauge"): {"infergen_kv_blocks_free"},
    ("infergen_prefix_cache_hit_rate", "gauge"): {"infergen_prefix_cache_hit_rate"},
    (TTFT, "histogram"): {f"{TTFT}_bucket", f"{TTFT}_sum", f"{TTFT}_count"},
    (ITL, "histogram"): {f"{ITL}_bucket", f"{ITL}_sum", f"{ITL}_count"},
}


def parse(text: str) -> dict[str, dict]:
    """{family name: {"type", "samples": {(sample name, sorted labels): value}}}."""
    return {
        family.name: {
            "type": family.type,
            "samples": {(s.name, tuple(sorted(s.labels.items()))): s.value for s in family.samples},
        }
        for family in text_string_to_metric_families(text)
    }


def value(families: dict, name: str, **labels: str) -> float:
    for family in families.values():
        key = (name, tuple(sorted(labels.items())))
        if key in family["samples"]:
            return family["samples"][key]
    raise KeyError(name, labels)


def buckets(families: dict, name: str) -> list[tuple[float, float]]:
    """[(upper bound, cumulative count)] in the order exposed."""
    return [
        (float(dict(labels)["le"]), v)
        for (sample, labels), v in families[name]["samples"].items()
        if sample == f"{name}_bucket"
    ]


def test_exposed_names_are_the_hand_written_exporters():
    m = ServerMetrics()
    m.account("finished", 10, 4)
    m.rejected("overloaded")
    m.tokens(1, 0.03, first=True)
    m.tokens(1, 0.007, first=False)
    m.set_load(waiting=1, running=2, blocks_used=3, blocks_free=4)
    families = parse(m.render().decode())
    exposed = {
        (name, f["type"]): {sample for sample, _ in f["samples"]} for name, f in families.items()
    }
    assert exposed == EXPOSED  # no `_created` samples, no renamed ones
    outcomes = {dict(labels)["outcome"] for _, labels in families["infergen_requests"]["samples"]}
    assert outcomes == {"finished", "aborted", "failed", "rejected"}
    assert value(families, "infergen_requests_total", outcome="rejected") == 1
    reasons = {dict(ls)["reason"] for _, ls in families["infergen_request_aborts"]["samples"]}
    assert reasons == {"disconnect", "cancelled", "timeout", "shutdown"}  # all, from the start
    samples = families["infergen_request_rejections"]["samples"]
    assert {dict(ls)["reason"] for _, ls in samples} == {
        "invalid", "queue_full", "overloaded", "shutting_down", "engine_stopped"
    }  # fmt: skip
    assert value(families, "infergen_request_rejections_total", reason="overloaded") == 1
    assert value(families, "infergen_prefix_cache_hit_rate") == 0.4
    assert value(families, "infergen_kv_blocks_free") == 4
    assert [b for b, _ in buckets(families, TTFT)] == [*TTFT_BUCKETS, math.inf]
    assert [b for b, _ in buckets(families, ITL)] == [*ITL_BUCKETS, math.inf]
    assert buckets(families, TTFT)[2] == (0.05, 1)  # 0.03 s: above 0.025, within 0.05
    assert buckets(families, ITL)[1] == (0.01, 1)


def test_each_server_has_its_own_registry():
    a, b = ServerMetrics(), ServerMetrics()
    a.account("finished", 5, 0)
    assert value(parse(a.render().decode()), "infergen_prompt_tokens_total") == 5
    assert value(parse(b.render().decode()), "infergen_prompt_tokens_total") == 0
    default = prometheus_client.generate_latest(prometheus_client.REGISTRY).decode()
    assert "infergen_" not in default


def test_live_histograms_are_cumulative_and_count_the_requests_sent(live, served_llm):
    engine = served_llm.engine
    deadline = time.time() + 60
    while engine.has_unfinished() and time.time() < deadline:  # earlier tests' leftovers
        time.sleep(0.05)
    lengths = [1, 3, 6, 9]
    with httpx.Client(
        base_url=live.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120
    ) as client:
        resp = client.get("/metrics")
        assert resp.headers["content-type"] == prometheus_client.CONTENT_TYPE_LATEST
        before = parse(resp.text)
        usage = []
        for i, n in enumerate(lengths):
            body = {
                "prompt": f"Metrics probe {i}:",
                "max_tokens": n,
                "temperature": 0,
                "ignore_eos": True,
            }
            r = client.post("/v1/completions", json=body)
            assert r.status_code == 200, r.text
            usage.append(r.json()["usage"])
        after = parse(client.get("/metrics").text)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert [u["completion_tokens"] for u in usage] == lengths
    assert delta("infergen_requests_total", outcome="finished") == len(lengths)
    assert delta("infergen_prompt_tokens_total") == sum(u["prompt_tokens"] for u in usage)
    assert delta("infergen_generation_tokens_total") == sum(lengths)
    # one first token per request; every later token is one inter-token gap
    assert delta(f"{TTFT}_count") == len(lengths)
    assert delta(f"{ITL}_count") == sum(lengths) - len(lengths)
    assert delta(f"{TTFT}_sum") > 0 and delta(f"{ITL}_sum") > 0
    for name, bounds in ((TTFT, TTFT_BUCKETS), (ITL, ITL_BUCKETS)):
        for families in (before, after):
            rows = buckets(families, name)
            assert [b for b, _ in rows] == [*bounds, math.inf]
            counts = [c for _, c in rows]
            assert counts == sorted(counts), (name, counts)  # cumulative
            assert counts[-1] == value(families, f"{name}_count")
        # and no bucket ever goes down between two scrapes
        pairs = zip(buckets(after, name), buckets(before, name), strict=True)
        grew = [a - b for (_, a), (_, b) in pairs]
        assert min(grew) >= 0 and grew[-1] == delta(f"{name}_count")
    assert value(after, "infergen_requests_running") == 0
    assert value(after, "infergen_requests_waiting") == 0


def test_speculation_counters_by_proposer(default_model_path):
    """A server speculating with the ngram proposer: /metrics' speculation families carry the
    engine's own counts (Speculator.summary), the streamed answer is the one the engine gives
    without speculation, and a copy-heavy prompt gets drafts accepted."""
    import openai

    from infergen import LLM, SamplingParams

    text = "The quick brown fox jumps over the lazy dog near the river bank. " * 6
    llm = LLM(default_model_path, kv_cache_memory="32MiB", speculative="ngram")
    want = (
        LLM(default_model_path, kv_cache_memory="32MiB")
        .generate([text], SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))[0]
        .text
    )
    server = LiveServer(llm)
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)
        stream = client.completions.create(
            model="tiny", prompt=text, max_tokens=24, temperature=0, stream=True,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        got = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
        families = parse(httpx.get(f"{server.url}/metrics").text)
    finally:
        server.stop()
    assert got == want
    summary = llm.engine.speculator.summary()
    assert summary["accepted"] > 0
    for kind, key in (("proposed", "proposed"), ("verified", "drafted"), ("accepted", "accepted")):
        name = "infergen_spec_draft_tokens_total"
        assert value(families, name, proposer="ngram", kind=kind) == summary[key]
    assert value(families, "infergen_spec_verify_steps_total", proposer="ngram") == summary["steps"]
    rate = value(families, "infergen_spec_acceptance_rate", proposer="ngram")
    assert rate == pytest.approx(summary["accepted"] / summary["drafted"])
    per_step = value(families, "infergen_spec_tokens_per_verify_step", proposer="ngram")
    assert per_step == pytest.approx(summary["tokens_per_step"]) and per_step > 1
