"""The official `openai` client (sync and async) against a live server: completions, chat,
streaming, logprobs, n > 1, stop strings; greedy output equals LLM.generate for the same
request. Bad requests get the documented status and OpenAI error body, and the server keeps
serving afterwards. Every test runs against the server in one process and against one whose
engine is split over two tensor-parallel ranks (engine/workers.py)."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from infergen import LLM, SamplingParams

from .conftest import API_KEY, MODEL, LiveServer

PROMPT = "The capital of France is"


@pytest.fixture(scope="module", params=["one process", "two ranks"])
def live(request, live, default_model_path):
    """The session's server, then a server over the default model on two ranks."""
    if request.param == "one process":
        yield live
        return
    llm = LLM(default_model_path, kv_cache_memory="64MiB", max_num_seqs=32,
              tensor_parallel_size=2)  # fmt: skip
    server = LiveServer(llm)
    server.ranks = 2
    yield server
    server.stop()
    llm.close()


def _ranks(live) -> int:
    return getattr(live, "ranks", 1)


@pytest.fixture
def client(live):
    return openai.OpenAI(base_url=f"{live.url}/v1", api_key=API_KEY, max_retries=0)


def _greedy(llm, prompt, **kwargs):
    params = SamplingParams(temperature=0, **kwargs)
    return llm.generate(prompt, params)[0]


def test_models_and_health(client, live):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(f"{live.url}/health").json() == {"status": "ok"}


def test_completion_equals_llm_generate(client, reference_llm):
    resp = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0)
    want = _greedy(reference_llm, PROMPT, max_tokens=12)
    assert resp.choices[0].text == want.text
    assert resp.choices[0].finish_reason == want.finish_reason == "length"
    assert resp.usage.completion_tokens == 12
    assert resp.usage.prompt_tokens == len(want.prompt_token_ids)


def test_completion_token_ids_echo_and_several_prompts(client, reference_llm):
    ids = reference_llm.tokenizer.encode(PROMPT)
    resp = client.completions.create(
        model=MODEL, prompt=[PROMPT, "Once upon a time"], max_tokens=6, temperature=0, echo=True
    )
    assert [c.index for c in resp.choices] == [0, 1]
    assert resp.choices[0].text == PROMPT + _greedy(reference_llm, PROMPT, max_tokens=6).text
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=6, temperature=0)
    assert by_ids.choices[0].text == _greedy(reference_llm, ids, max_tokens=6).text


def test_completion_logprobs_and_stop(client, reference_llm, live):
    resp = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=10, temperature=0, logprobs=3
    )
    lp = resp.choices[0].logprobs
    want = _greedy(reference_llm, PROMPT, max_tokens=10, logprobs=3)
    tolerance = 1e-5 if _ranks(live) == 1 else 1e-4  # (two ranks sum partials in another order)
    assert lp.token_logprobs == pytest.approx([x.logprob for x in want.logprobs], abs=tolerance)
    assert all(len(top) <= 4 for top in lp.top_logprobs)
    assert "".join(lp.tokens) == resp.choices[0].text
    # stop on a string the greedy text contains: it is cut there
    cut = want.text[len(want.text) // 2 :].strip()[:3]
    stopped = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=10, temperature=0, stop=[cut]
    )
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].text == want.text[: want.text.index(cut)]


def test_a_kv_press_per_request(client, reference_llm, live):
    """The extension fields kv_press / kv_press_ratio press this request's prompt: the answer
    equals LLM.generate with the same press (two ranks: refused, 400 naming why)."""
    prompt = "Here is a long list of facts. " + " ".join(
        f"Fact {i}: the number {i} is {'even' if i % 2 == 0 else 'odd'}." for i in range(60)
    ) + " Question: is the number 7 even or odd? Answer:"  # fmt: skip
    request = dict(model=MODEL, prompt=prompt, max_tokens=8, temperature=0,
                   extra_body={"kv_press": "snapkv", "kv_press_ratio": 0.5})  # fmt: skip
    if _ranks(live) > 1:
        with pytest.raises(openai.BadRequestError, match="tensor parallelism"):
            client.completions.create(**request)
        return
    resp = client.completions.create(**request)
    want = _greedy(reference_llm, prompt, max_tokens=8, kv_press="snapkv", kv_press_ratio=0.5)
    assert resp.choices[0].text == want.text
    assert reference_llm.engine.kv_press.stats["pressed"] >= 1


def test_n_choices_sampled_with_seed(client):
    resp = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=8, temperature=1.0, n=3, seed=7
    )
    assert [c.index for c in resp.choices] == [0, 1, 2]
    again = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=8, temperature=1.0, n=3, seed=7
    )
    assert [c.text for c in resp.choices] == [c.text for c in again.choices]


def test_chat_and_streaming_chat_equal_llm_chat(client, reference_llm):
    messages = [{"role": "user", "content": "Name three colours."}]
    want = reference_llm.chat(messages, SamplingParams(max_tokens=16, temperature=0))[0]
    resp = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=16, temperature=0
    )
    assert resp.choices[0].message.content == want.text
    assert resp.choices[0].message.role == "assistant"
    assert resp.usage.prompt_tokens_details.cached_tokens >= 0
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want.text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == want.finish_reason and finishes.count(None) == len(finishes) - 1
    assert chunks[-1].usage.completion_tokens == len(want.token_ids)
    assert chunks[0].choices[0].delta.role == "assistant"


def test_chat_logprobs(client, reference_llm):
    messages = [{"role": "user", "content": "Hi"}]
    resp = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=5, temperature=0, logprobs=True, top_logprobs=2
    )
    content = resp.choices[0].logprobs.content
    assert len(content) == resp.usage.completion_tokens
    assert all(len(c.top_logprobs) == 2 for c in content)
    assert "".join(c.token for c in content) == resp.choices[0].message.content


def test_async_client_concurrent_streams_equal_sequential(live, reference_llm):
    prompts = [f"{PROMPT} number {i}" for i in range(8)]

    async def run():
        client = openai.AsyncOpenAI(base_url=f"{live.url}/v1", api_key=API_KEY, max_retries=0)

        async def one(prompt):
            stream = await client.completions.create(
                model=MODEL, prompt=prompt, max_tokens=10, temperature=0, stream=True
            )
            return "".join([c.choices[0].text async for c in stream])

        return await asyncio.gather(*(one(p) for p in prompts))

    texts = asyncio.run(run())
    assert texts == [_greedy(reference_llm, p, max_tokens=10).text for p in prompts]


@pytest.mark.parametrize(
    "body,param",
    [
        ({"prompt": "x", "max_tokens": -1}, "max_tokens"),
        ({"prompt": "x", "temperature": "hot"}, "temperature"),
        ({"prompt": "x", "model": "no-such-model"}, "model"),
        ({"prompt": 5}, "prompt"),
        ({"prompt": [999999999]}, "prompt"),
        ({"prompt": "x", "logprobs": 50}, "logprobs"),
        ({"prompt": "x", "kv_press": "nope"}, "kv_press"),
        ({"prompt": "x", "kv_press": "snapkv", "kv_press_ratio": 1.5}, "kv_press_ratio"),
    ],
)
def test_bad_requests_get_400_with_openai_error_body(live, body, param):
    resp = httpx.post(
        f"{live.url}/v1/completions", json=body, headers={"Authorization": f"Bearer {API_KEY}"}
    )
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert param in (error["param"] or "") + error["message"]


def test_too_long_prompt_malformed_json_and_auth(live, client, reference_llm):
    headers = {"Authorization": f"Bearer {API_KEY}"}
    long_prompt = [1] * (reference_llm.engine.max_model_len + 5)
    resp = httpx.post(f"{live.url}/v1/completions", json={"prompt": long_prompt}, headers=headers)
    assert resp.status_code == 400 and "too long" in resp.json()["error"]["message"]
    resp = httpx.post(
        f"{live.url}/v1/completions",
        content=b"{not json",
        headers={**headers, "Content-Type": "application/json"},
    )
    assert resp.status_code == 400 and "JSON" in resp.json()["error"]["message"]
    for auth in ({}, {"Authorization": "Bearer wrong"}):
        resp = httpx.post(f"{live.url}/v1/completions", json={"prompt": "x"}, headers=auth)
        assert resp.status_code == 401
        assert resp.json()["error"]["type"] == "authentication_error"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{live.url}/v1", api_key="nope", max_retries=0).models.list()
    # and the server still serves
    ok = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, temperature=0)
    assert len(ok.choices[0].text) > 0
