"""The Python API on the default model: generate, chat, streaming, logprobs, stop strings."""

from __future__ import annotations

import pytest
import torch

from infergen import LLM, SamplingParams
from infergen.errors import RequestError


@pytest.fixture(scope="module")
def llm():
    return LLM(kv_cache_memory="128MiB")


def test_stream_concatenation_equals_generate(llm):
    params = SamplingParams(max_tokens=40, temperature=0)
    prompt = "def fibonacci(n):"
    whole = llm.generate(prompt, params)[0]
    deltas = list(llm.stream(prompt, params))
    assert "".join(d.text for d in deltas) == whole.text
    assert [t for d in deltas for t in d.token_ids] == whole.token_ids
    assert deltas[-1].finished and deltas[-1].finish_reason == whole.finish_reason


def test_stop_string_truncates_and_stream_never_leaks_it(llm):
    prompt = "List: one, two, three, four, five, six"
    free = llm.generate(prompt, SamplingParams(max_tokens=30, temperature=0))[0]
    stop = free.text[5:8]
    assert stop and stop in free.text
    params = SamplingParams(max_tokens=30, temperature=0, stop=[stop])
    out = llm.generate(prompt, params)[0]
    assert out.finish_reason == "stop"
    assert out.text == free.text[: free.text.index(stop)]
    streamed = "".join(d.text for d in llm.stream(prompt, params))
    assert streamed == out.text


def test_chat_uses_template_and_stops_at_end_of_turn(llm):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    out = llm.chat(messages, SamplingParams(max_tokens=64, temperature=0))[0]
    assert "Paris" in out.text
    assert out.finish_reason == "stop"  # <|im_end|> ends the turn
    rendered = llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert out.prompt_token_ids == llm.tokenizer.encode(rendered, add_special_tokens=False)
    assert rendered.endswith("<|im_start|>assistant\n")


def test_logprobs_match_teacher_forced_logits(llm):
    prompt = llm.tokenizer.encode("The quick brown fox jumps over the")
    out = llm.generate(prompt, SamplingParams(max_tokens=6, temperature=0, logprobs=3))[0]
    logits = llm.engine.prompt_logits(prompt + out.token_ids[:-1])
    expected = torch.log_softmax(logits[len(prompt) - 1 :], dim=-1)
    for i, entry in enumerate(out.logprobs):
        assert entry.token_id == out.token_ids[i]
        assert abs(entry.logprob - expected[i, entry.token_id].item()) < 1e-3
        assert len(entry.top) == 3 and entry.top[0][0] == out.token_ids[i]  # greedy = best


def test_prefix_cache_reported_for_shared_system_prompt(llm):
    system = {"role": "system", "content": "You are a terse assistant. " * 8}
    a = llm.chat([system, {"role": "user", "content": "Hi"}], SamplingParams(max_tokens=2))[0]
    b = llm.chat([system, {"role": "user", "content": "Bye"}], SamplingParams(max_tokens=2))[0]
    assert b.num_cached_prompt_tokens >= 16 * ((len(a.prompt_token_ids) - 8) // 16)
    assert b.num_cached_prompt_tokens % 16 == 0 and b.num_cached_prompt_tokens > 0


def test_bad_requests_are_rejected_and_engine_keeps_serving(llm):
    with pytest.raises(RequestError, match="token ids outside the vocabulary"):
        llm.generate([1, 2, 10**6], SamplingParams(max_tokens=2))
    with pytest.raises(RequestError, match="empty"):
        llm.generate([[]], SamplingParams(max_tokens=2))
    with pytest.raises(RequestError, match="too long"):
        llm.generate([1] * 9000, SamplingParams(max_tokens=2))
    with pytest.raises(RequestError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    assert llm.generate("Hello", SamplingParams(max_tokens=3))[0].finished


def test_request_that_can_never_fit_the_kv_pool():
    small = LLM(num_kv_blocks=4, block_size=16)
    with pytest.raises(RequestError, match="never fit"):
        small.generate([1] * 60, SamplingParams(max_tokens=10))


def test_max_model_len_caps_the_context():
    capped = LLM(kv_cache_memory="16MiB", max_model_len=24)
    assert capped.engine.max_model_len == 24
    with pytest.raises(RequestError, match="fewer than 24 tokens"):
        capped.generate([1] * 24, SamplingParams(max_tokens=1))
    out = capped.generate([1] * 20, SamplingParams(max_tokens=100, ignore_eos=True))[0]
    assert (len(out.token_ids), out.finish_reason) == (4, "length")  # 20 + 4 = the cap
