"""`infergen bench serve` against a live infergen server: every request completes with exactly
max_tokens tokens, the client's token counts agree with the server's /metrics, agentic turns
resend the conversation (the server's prefix cache hits), and the CLI writes its JSON."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from infergen.bench.client import ClientOptions, run_load
from infergen.bench.workloads import WORKLOADS, WorkloadOptions
from infergen.cli import main

from .conftest import API_KEY, scrape_metrics


def test_random_workload_counts_agree_with_server_metrics(live, reference_llm):
    opts = WorkloadOptions(num_requests=8, input_len=40, output_len=12, spread=0.5)
    requests = WORKLOADS.get("random")(reference_llm.tokenizer, opts, random.Random(1))
    before = scrape_metrics(live.url)
    results, wall = asyncio.run(
        run_load(requests, ClientOptions(live.url, api_key=API_KEY), concurrency=4)
    )
    after = scrape_metrics(live.url)
    assert all(r.ok for r in results) and wall > 0
    # completion order is not submission order: compare the multisets
    assert sorted(r.output_tokens for r in results) == sorted(q.max_tokens for q in requests)
    generated = (
        after["infergen_generation_tokens_total"] - before["infergen_generation_tokens_total"]
    )
    assert generated == sum(r.output_tokens for r in results)
    prompt = after["infergen_prompt_tokens_total"] - before["infergen_prompt_tokens_total"]
    assert prompt == sum(r.input_tokens for r in results)
    for r in results:
        assert r.ttft is not None and r.ttft <= r.e2e
        assert len(r.itl) == r.output_tokens - 1


def test_agentic_sessions_resend_the_conversation(live, reference_llm):
    opts = WorkloadOptions(num_requests=6, input_len=48, output_len=8, turns=3)
    requests = WORKLOADS.get("agentic")(reference_llm.tokenizer, opts, random.Random(2))
    assert len(requests) == 2 and all(len(r.follow_up) == 2 for r in requests)
    before = scrape_metrics(live.url)
    results, _ = asyncio.run(
        run_load(requests, ClientOptions(live.url, api_key=API_KEY), concurrency=2)
    )
    after = scrape_metrics(live.url)
    assert len(results) == 6 and all(r.ok for r in results)
    for session in ("s0", "s1"):
        turns = sorted((r for r in results if r.session == session), key=lambda r: r.turn)
        sizes = [r.input_tokens for r in turns]
        assert sizes == sorted(sizes) and sizes[0] < sizes[-1]  # the conversation grows
    cached = (
        after["infergen_cached_prompt_tokens_total"] - before["infergen_cached_prompt_tokens_total"]
    )
    assert cached > 0  # later turns found their earlier turns in the prefix cache


def test_replay_trace_errors_name_the_line(tmp_path, reference_llm):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"prompt": "hi", "max_tokens": 4}\n{"prompt": "x"}\n')
    with pytest.raises(ValueError, match=r"t.jsonl:2: expected .*max_tokens"):
        WORKLOADS.get("replay")(reference_llm.tokenizer, WorkloadOptions(trace=str(trace)), None)


def test_cli_writes_json(live, tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        '{"prompt": "Hello there", "max_tokens": 5, "session": "a"}\n'
        '{"prompt": "And then?", "max_tokens": 5, "session": "a"}\n'
        '{"prompt": "Other", "max_tokens": 3}\n'
    )
    out = tmp_path / "r.json"
    code = main(
        [
            "bench",
            "serve",
            "--url",
            live.url,
            "--api-key",
            API_KEY,
            "--workload",
            "replay",
            "--trace",
            str(trace),
            "--rate",
            "50",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    report = json.loads(out.read_text())
    (run,) = report["runs"]
    assert run["summary"]["completed"] == 3 and run["summary"]["output_tokens"] == 13
    printed = capsys.readouterr().out
    assert "TTFT" in printed
    # the server's own prefix-cache counters over the run, from its /metrics
    cache = run["server_cache"]
    assert cache["prompt_tokens"] == sum(r["input_tokens"] for r in run["requests"])
    assert 0 <= cache["cached_prompt_tokens"] <= cache["prompt_tokens"]
    assert "server cache:" in printed
