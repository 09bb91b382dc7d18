"""32 concurrent streaming requests with a mix of lengths, a few clients hanging up early:
every completed stream is intact (equal to the oracle engine's greedy text), the aborted ones
free their blocks, and the /metrics counters add up."""

from __future__ import annotations

import asyncio
import json
import time

import httpx

from infergen import SamplingParams

from .conftest import API_KEY, scrape_metrics

HEADERS = {"Authorization": f"Bearer {API_KEY}"}


def test_32_concurrent_streams_with_disconnects(live, served_llm, reference_llm):
    prompts = [f"Story {i}: once upon a time" for i in range(32)]
    lengths = [4 + (i * 7) % 29 for i in range(32)]
    hang_up = {3, 11, 19, 27}  # these read two chunks, then disconnect
    before = scrape_metrics(live.url)

    async def one(client: httpx.AsyncClient, i: int):
        body = {
            "prompt": prompts[i],
            "max_tokens": 200 if i in hang_up else lengths[i],
            "temperature": 0,
            "stream": True,
            "ignore_eos": True,
        }
        async with client.stream("POST", "/v1/completions", json=body) as resp:
            assert resp.status_code == 200
            text, chunks = "", 0
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    return i, text, True
                text += json.loads(line[6:])["choices"][0]["text"]
                chunks += 1
                if i in hang_up and chunks == 2:
                    return i, text, False
        return i, text, False

    async def run():
        async with httpx.AsyncClient(base_url=live.url, headers=HEADERS, timeout=300) as client:
            return await asyncio.gather(*(one(client, i) for i in range(32)))

    results = asyncio.run(run())
    completed = {i: text for i, text, done in results if done}
    assert set(completed) == set(range(32)) - hang_up
    for i, text in completed.items():
        want = reference_llm.generate(
            prompts[i], SamplingParams(max_tokens=lengths[i], temperature=0, ignore_eos=True)
        )[0]
        assert text == want.text, i

    engine = served_llm.engine
    deadline = time.time() + 60
    while engine.has_unfinished() and time.time() < deadline:
        time.sleep(0.05)
    assert engine.pool.num_free == engine.pool.num_blocks
    after = scrape_metrics(live.url)

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    assert delta('infergen_requests_total{outcome="finished"}') == 32 - len(hang_up)
    assert delta('infergen_requests_total{outcome="aborted"}') == len(hang_up)
    prompt_tokens = sum(len(reference_llm.tokenizer.encode(p)) for p in prompts)
    assert delta("infergen_prompt_tokens_total") == prompt_tokens
    assert delta("infergen_generation_tokens_total") >= sum(lengths[i] for i in completed)
    assert delta("infergen_time_to_first_token_seconds_count") == 32
    assert after["infergen_requests_running"] == 0 and after["infergen_requests_waiting"] == 0
    assert after["infergen_kv_blocks_free"] == engine.pool.num_blocks
