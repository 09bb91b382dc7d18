"""A client that disconnects (mid-stream, or before a whole response) has its requests aborted
and its KV blocks freed; a
full server answers 503 instead of queueing without limit; an engine step that raises ends
only the requests in that step (HTTP 500) and the server goes on serving."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from infergen.server.limits import Limits

from .conftest import API_KEY, own_server, scrape_metrics, wait_for

HEADERS = {"Authorization": f"Bearer {API_KEY}"}


@pytest.mark.parametrize(
    "route, body",
    [
        ("completions", {"prompt": "Tell me a long story", "n": 1}),
        ("completions", {"prompt": ["Once upon a time", "Far away"], "n": 2}),
        ("chat/completions", {"messages": [{"role": "user", "content": "A story?"}], "n": 1}),
        ("chat/completions", {"messages": [{"role": "user", "content": "A story?"}], "n": 3}),
    ],
)
def test_disconnect_mid_stream_aborts_and_frees_blocks(live, served_llm, route, body):
    """A streaming client that hangs up after a few chunks: every request behind its stream
    (each prompt, n times) is aborted, every KV block is back, the aborts are counted."""
    engine = served_llm.engine
    key = 'infergen_request_aborts_total{reason="disconnect"}'
    before = scrape_metrics(live.url)[key]
    body = {**body, "max_tokens": 250, "stream": True, "temperature": 0, "ignore_eos": True}
    with httpx.stream("POST", f"{live.url}/v1/{route}", json=body, headers=HEADERS) as resp:
        assert resp.status_code == 200
        lines = resp.iter_lines()
        received = [next(lines) for _ in range(6)]  # a few chunks, then hang up
    assert any(line.startswith("data: {") for line in received)
    assert wait_for(lambda: not engine.has_unfinished())
    assert engine.pool.num_free == engine.pool.num_blocks  # every block back (free or cached)
    assert not engine._requests  # nothing left behind
    prompts = len(body["prompt"]) if isinstance(body.get("prompt"), list) else 1
    assert scrape_metrics(live.url)[key] == before + prompts * body["n"]


def test_no_cors_headers_by_default(live):
    """A browser page of another origin gets no permission to call the API."""
    origin = {"Origin": "https://elsewhere.example", "Access-Control-Request-Method": "POST"}
    preflight = httpx.options(f"{live.url}/v1/completions", headers=origin)
    assert "access-control-allow-origin" not in preflight.headers
    resp = httpx.get(f"{live.url}/v1/models", headers={**HEADERS, "Origin": origin["Origin"]})
    assert resp.status_code == 200 and "access-control-allow-origin" not in resp.headers


@pytest.mark.parametrize(
    "route, body",
    [
        ("completions", {"prompt": "Tell me a long story", "n": 1}),
        ("completions", {"prompt": ["Once upon a time", "Far away"], "n": 2}),
        ("chat/completions", {"messages": [{"role": "user", "content": "A story?"}], "n": 2}),
    ],
)
def test_disconnect_before_a_whole_response_aborts_every_request(live, served_llm, route, body):
    """A non-streaming client that hangs up (here: its read timeout) has every request behind
    its response aborted within moments — not generated to max_tokens for nobody — with
    every KV block back and the aborts counted by reason."""
    engine = served_llm.engine
    before = scrape_metrics(live.url)
    key = 'infergen_request_aborts_total{reason="disconnect"}'
    # (up to 4 requests of 250 tokens fit in the KV cache together: none is shed)
    body = {**body, "max_tokens": 250, "temperature": 0, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{live.url}/v1/{route}", json=body, headers=HEADERS, timeout=1.5)
    # a step takes tens of ms; 250 tokens per request take over 5 s here
    assert wait_for(lambda: not engine.has_unfinished(), timeout=3.0)
    assert engine.pool.num_free == engine.pool.num_blocks
    assert not engine._requests
    prompts = len(body["prompt"]) if isinstance(body.get("prompt"), list) else 1
    aborted = scrape_metrics(live.url)[key] - before[key]
    assert aborted == prompts * body["n"]


@pytest.fixture
def small_server(default_model_path):
    with own_server(default_model_path, limits=Limits(max_pending=2)) as pair:
        yield pair


def test_full_server_answers_503_then_recovers(small_server):
    server, _ = small_server

    async def run():
        async with httpx.AsyncClient(base_url=server.url, headers=HEADERS, timeout=120) as c:
            body = {"prompt": "Count:", "max_tokens": 40, "temperature": 0, "ignore_eos": True}
            return await asyncio.gather(*(c.post("/v1/completions", json=body) for _ in range(6)))

    codes = sorted(r.status_code for r in asyncio.run(run()))
    assert 200 in codes and 503 in codes, codes
    assert set(codes) <= {200, 503}
    busy = next(r for r in asyncio.run(run()) if r.status_code == 503) if 503 in codes else None
    if busy is not None:
        assert busy.json()["error"]["type"] == "server_busy"
    ok = httpx.post(
        f"{server.url}/v1/completions", json={"prompt": "Hi", "max_tokens": 3}, headers=HEADERS
    )
    assert ok.status_code == 200


@pytest.mark.parametrize("stream", [False, True])
def test_engine_failure_is_a_500_and_the_server_keeps_serving(small_server, monkeypatch, stream):
    server, llm = small_server
    engine = llm.engine
    original = engine.step
    calls = {"n": 0}

    def failing_step():
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("injected failure")
        return original()

    monkeypatch.setattr(engine, "step", failing_step)
    body = {"prompt": "Hello", "max_tokens": 5, "temperature": 0, "stream": stream}
    failed = httpx.post(f"{server.url}/v1/completions", json=body, headers=HEADERS, timeout=60)
    if stream:  # the headers were sent: the failure is an error event, then [DONE]
        assert failed.status_code == 200
        assert "injected failure" in failed.text and failed.text.endswith("data: [DONE]\n\n")
    else:
        assert failed.status_code == 500
        assert "injected failure" in failed.json()["error"]["message"]
    body["stream"] = False
    ok = httpx.post(f"{server.url}/v1/completions", json=body, headers=HEADERS, timeout=60)
    assert ok.status_code == 200 and ok.json()["choices"][0]["text"]
    assert wait_for(lambda: engine.pool.num_free == engine.pool.num_blocks)


@pytest.fixture(scope="module")
def limited_server(default_model_path):
    with own_server(default_model_path, limits=Limits(max_tokens=8, max_body_bytes=4096)) as pair:
        yield pair[0]


def test_a_body_over_the_limit_is_413(limited_server):
    url = f"{limited_server.url}/v1/completions"
    big = {"prompt": "x" * 5000, "max_tokens": 1}
    resp = httpx.post(url, json=big, headers=HEADERS)  # Content-Length over the limit
    assert resp.status_code == 413 and "4096 bytes" in resp.json()["error"]["message"]

    def chunks():  # no Content-Length: counted as it arrives
        yield b'{"prompt": "'
        for _ in range(10):
            yield b"y" * 1000
        yield b'", "max_tokens": 1}'

    resp = httpx.post(
        url, content=chunks(), headers={**HEADERS, "content-type": "application/json"}
    )
    assert resp.status_code == 413
    ok = httpx.post(url, json={"prompt": "Hi", "max_tokens": 1}, headers=HEADERS)
    assert ok.status_code == 200  # the server goes on


def test_max_tokens_limit_caps_unset_and_refuses_more(limited_server):
    url = limited_server.url
    chat = {"messages": [{"role": "user", "content": "Tell me everything"}], "ignore_eos": True}
    resp = httpx.post(f"{url}/v1/chat/completions", json=chat, headers=HEADERS, timeout=60)
    assert resp.status_code == 200
    assert resp.json()["usage"]["completion_tokens"] == 8  # unset: the server's limit, not 8k
    assert resp.json()["choices"][0]["finish_reason"] == "length"
    resp = httpx.post(
        f"{url}/v1/completions", json={"prompt": "Hi", "max_tokens": 9}, headers=HEADERS
    )
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "max_tokens"


@pytest.mark.parametrize(
    "field, value",
    [("stop", ["s"] * 17), ("stop", "s" * 257), ("prompt", ["a"] * 65)],
)
def test_request_size_limits_are_400(limited_server, field, value):
    body = {"prompt": "Hi", "max_tokens": 1, field: value}
    resp = httpx.post(f"{limited_server.url}/v1/completions", json=body, headers=HEADERS)
    assert resp.status_code == 400 and resp.json()["error"]["param"].startswith(field)


def test_several_keys_and_protected_monitoring(default_model_path, tmp_path):
    """Keys from --api-key and a key file (comments and blank lines skipped); any of them
    opens the /v1 routes and, with protect_monitoring, /metrics and /health; others are 401."""
    from infergen.cli.serve import api_keys
    from infergen.errors import ConfigError

    key_file = tmp_path / "keys"
    key_file.write_text("# ops\nkey-b\n\n  key-c  \n")
    keys = api_keys(["key-a"], str(key_file))
    assert keys == ["key-a", "key-b", "key-c"]
    (tmp_path / "empty").write_text("# none yet\n")
    for bad in (tmp_path / "empty", tmp_path / "missing"):
        with pytest.raises(ConfigError):
            api_keys(None, str(bad))
    with own_server(default_model_path, api_key=keys, protect_monitoring=True) as (server, _):
        for path in ("/v1/models", "/metrics", "/health"):
            assert httpx.get(server.url + path).status_code == 401
            wrong = {"Authorization": "Bearer key-d"}
            assert httpx.get(server.url + path, headers=wrong).status_code == 401
            for key in keys:
                auth = {"Authorization": f"Bearer {key}"}
                assert httpx.get(server.url + path, headers=auth).status_code == 200
