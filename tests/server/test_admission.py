"""Admission by cost and time limits: under a burst the server sheds with 503 + Retry-After the
requests that would wait past its queue-time budget, so the ones it accepts start within it
(the same burst without shedding waits well past it); a request past its time limit (its own
`timeout` field, capped by the server's) is stopped within a step and answers what it
generated with finish_reason "timeout", its blocks back, the abort counted; the official
client sees the shed request as a 503 and reads the timed-out answer."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest

from infergen import SamplingParams
from infergen.server.limits import Limits

from .conftest import API_KEY, MODEL, own_server, scrape_metrics, wait_for

HEADERS = {"Authorization": f"Bearer {API_KEY}"}
BUDGET_S = 1.5  # the queue-time budget of the shedding test
REQUEST_TIMEOUT_S = 3.0  # the server's default time limit in the timeout tests


@pytest.fixture(scope="module")
def two_seats(default_model_path):
    """Two requests run at once: a burst queues."""
    with own_server(default_model_path, 2, limits=Limits(max_queue_time=BUDGET_S)) as pair:
        yield pair


async def _burst(url: str, n: int, max_tokens: int) -> list[tuple[int, float | None, dict]]:
    """n streams at once: (status, seconds to the first token or None, headers)."""
    body = {"prompt": "Count:", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True}  # fmt: skip

    async def one(client: httpx.AsyncClient):
        start = time.perf_counter()
        async with client.stream("POST", "/v1/completions", json=body) as resp:
            first, events = None, []
            async for line in resp.aiter_lines():
                if line.startswith("data: {") and resp.status_code == 200:
                    first = first or time.perf_counter() - start
                events += [line] if line else []
            if resp.status_code == 200:  # it ran to the end
                assert first is not None and events[-1] == "data: [DONE]"
            return resp.status_code, first, resp.headers

    async with httpx.AsyncClient(base_url=url, headers=HEADERS, timeout=120) as client:
        return await asyncio.gather(*(one(client) for _ in range(n)))


def test_a_burst_is_shed_before_the_queue_passes_the_budget(two_seats):
    server, llm = two_seats
    engine = server.app.state.engine
    warm = {"prompt": "Hi", "max_tokens": 4, "ignore_eos": True}
    assert httpx.post(f"{server.url}/v1/completions", json=warm, headers=HEADERS).status_code == 200
    assert llm.engine.step_cost.known  # measured: what the estimate runs on
    before = scrape_metrics(server.url)['infergen_request_rejections_total{reason="overloaded"}']

    results = asyncio.run(_burst(server.url, 16, 30))
    shed = [headers for status, _, headers in results if status == 503]
    waits = [first for status, first, _ in results if status == 200]
    assert shed and len(waits) >= 2, [status for status, _, _ in results]
    assert all(int(headers["retry-after"]) >= 1 for headers in shed)
    assert max(waits) <= 2 * BUDGET_S, sorted(waits)
    after = scrape_metrics(server.url)['infergen_request_rejections_total{reason="overloaded"}']
    assert after - before == len(shed)
    assert wait_for(lambda: llm.engine.pool.num_free == llm.engine.pool.num_blocks)

    # the same burst with shedding off: every request is accepted, and the last wait long
    engine.limits = Limits(max_queue_time=None)
    try:
        results = asyncio.run(_burst(server.url, 16, 30))
    finally:
        engine.limits = Limits(max_queue_time=BUDGET_S)
    assert {status for status, _, _ in results} == {200}
    assert max(first for _, first, _ in results) > 2 * BUDGET_S


def test_the_openai_client_sees_a_shed_request_as_a_503(two_seats):
    server, _ = two_seats
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)
    body = {"prompt": "Count:", "max_tokens": 200, "ignore_eos": True}

    async def fill():  # enough work ahead that the next request would wait past the budget
        async with httpx.AsyncClient(base_url=server.url, headers=HEADERS, timeout=120) as c:
            tasks = [asyncio.ensure_future(c.post("/v1/completions", json=body)) for _ in range(6)]
            await asyncio.sleep(1.0)
            with pytest.raises(openai.InternalServerError) as raised:
                await asyncio.to_thread(
                    client.completions.create, model=MODEL, prompt="Hi", max_tokens=200,
                    extra_body={"ignore_eos": True},
                )  # fmt: skip
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            return raised.value

    error = asyncio.run(fill())
    assert error.status_code == 503 and error.body["type"] == "server_busy"
    assert "queue-time budget" in error.body["message"]
    assert int(error.response.headers["retry-after"]) >= 1


@pytest.fixture(scope="module")
def timed(default_model_path):
    with own_server(default_model_path, limits=Limits(request_timeout=REQUEST_TIMEOUT_S)) as pair:
        yield pair


@pytest.mark.parametrize("asked, limit", [(0.5, 0.5), (60.0, REQUEST_TIMEOUT_S)])
def test_a_request_past_its_time_limit_stops_with_what_it_generated(
    timed, reference_llm, asked, limit
):
    """Its own `timeout`, or the server's when that is shorter: stopped within a step, its
    answer the tokens so far with finish_reason "timeout", its blocks back, counted."""
    server, llm = timed
    key = 'infergen_request_aborts_total{reason="timeout"}'
    before = scrape_metrics(server.url)[key]
    body = {"prompt": "Tell me a long story", "max_tokens": 600, "ignore_eos": True,
            "temperature": 0, "timeout": asked}  # fmt: skip
    start = time.perf_counter()
    resp = httpx.post(f"{server.url}/v1/completions", json=body, headers=HEADERS, timeout=60)
    elapsed = time.perf_counter() - start
    assert resp.status_code == 200
    answer = resp.json()
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "timeout"
    assert 0 < answer["usage"]["completion_tokens"] < 600
    assert elapsed >= limit  # never before its limit (stopped early: the tokens above)
    assert scrape_metrics(server.url)[key] == before + 1
    engine = llm.engine
    assert wait_for(lambda: engine.pool.num_free == engine.pool.num_blocks, timeout=2)
    assert not engine._requests
    # what it generated is the start of the same request's answer without a time limit
    # (from a second engine: this server would stop that one at its own limit too)
    greedy = SamplingParams(max_tokens=answer["usage"]["completion_tokens"], temperature=0,
                            ignore_eos=True)  # fmt: skip
    reference = reference_llm.generate(body["prompt"], greedy)[0]
    assert reference.finish_reason == "length" and choice["text"] == reference.text


def test_a_stream_past_its_time_limit_ends_with_finish_reason_timeout(timed):
    server, _ = timed
    # 2 s: several tokens even on a slow or contended machine (0.5 s once gave one), far
    # short of 600 tokens
    body = {"messages": [{"role": "user", "content": "Talk"}], "max_tokens": 600,
            "ignore_eos": True, "stream": True, "timeout": 2.0}  # fmt: skip
    with httpx.stream(
        "POST", f"{server.url}/v1/chat/completions", json=body, headers=HEADERS, timeout=60
    ) as resp:
        assert resp.status_code == 200
        events = [line.removeprefix("data: ") for line in resp.iter_lines() if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert not any("error" in c for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "timeout"
    assert sum(bool(c["choices"][0]["delta"].get("content")) for c in chunks) > 1


def test_the_openai_client_reads_a_timed_out_answer(timed):
    server, _ = timed
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Talk"}], max_tokens=600,
        extra_body={"ignore_eos": True, "timeout": 0.3},
    )  # fmt: skip
    assert reply.choices[0].finish_reason == "timeout"
    assert 0 < reply.usage.completion_tokens < 600


@pytest.mark.parametrize("value", [0, -1, "soon"])
def test_a_bad_timeout_field_is_a_400(timed, value):
    server, _ = timed
    body = {"prompt": "Hi", "max_tokens": 1, "timeout": value}
    resp = httpx.post(f"{server.url}/v1/completions", json=body, headers=HEADERS)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "timeout"


def test_serve_flags_become_the_limits():
    from infergen.cli.main import build_parser
    from infergen.cli.serve import limits
    from infergen.errors import ConfigError

    def parsed(*flags: str) -> Limits:
        return limits(build_parser().parse_args(["serve", *flags]))

    assert parsed() == Limits()
    assert parsed("--max-queue-time", "0", "--request-timeout", "90", "--max-body-size",
                  "1KiB") == Limits(max_queue_time=None, request_timeout=90.0,
                                    max_body_bytes=1024)  # fmt: skip
    for flag, value in (("--max-queue-time", "-1"), ("--request-timeout", "-5"),
                        ("--max-pending", "0"), ("--max-tokens-limit", "0")):  # fmt: skip
        with pytest.raises(ConfigError, match=flag):
            parsed(flag, value)
