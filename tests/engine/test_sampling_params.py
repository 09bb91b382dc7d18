"""SamplingParams: defaults, normalisation, and a RequestError naming the field for bad values."""

from __future__ import annotations

import math

import pytest

from infergen.engine.sampling_params import MAX_LOGPROBS, SamplingParams
from infergen.errors import RequestError


def test_defaults_match_vllm():
    p = SamplingParams()
    assert p.max_tokens == 16 and p.temperature == 1.0 and p.top_k == 0 and p.top_p == 1.0
    assert p.min_p == 0.0 and p.repetition_penalty == 1.0
    assert p.presence_penalty == 0.0 and p.frequency_penalty == 0.0
    assert p.seed is None and p.stop == () and p.stop_token_ids == ()
    assert not p.ignore_eos and p.logprobs is None and p.skip_special_tokens
    assert not p.include_stop_str_in_output
    assert not p.is_greedy and not p.has_penalties


def test_is_greedy():
    assert SamplingParams(temperature=0).is_greedy
    assert SamplingParams(temperature=0.0, top_k=5, top_p=0.5).is_greedy
    assert not SamplingParams(temperature=0.1).is_greedy


def test_stop_normalised_to_tuple():
    assert SamplingParams(stop="###").stop == ("###",)
    assert SamplingParams(stop=["a", "bc"]).stop == ("a", "bc")
    assert SamplingParams(stop_token_ids=[1, 2]).stop_token_ids == (1, 2)


def test_ints_accepted_for_floats_and_frozen():
    p = SamplingParams(temperature=1, top_p=1, repetition_penalty=2)
    assert isinstance(p.temperature, float) and p.repetition_penalty == 2.0
    with pytest.raises(AttributeError):
        p.temperature = 0.5  # type: ignore[misc]


def test_valid_edges():
    SamplingParams(
        max_tokens=1,
        top_k=-1,
        top_p=1e-6,
        min_p=1.0,
        presence_penalty=-2,
        frequency_penalty=2,
        logprobs=0,
        seed=-5,
    )
    SamplingParams(top_k=1, min_p=0.0, logprobs=MAX_LOGPROBS, seed=2**64 - 1)


INVALID = [
    ("max_tokens", 0),
    ("max_tokens", -3),
    ("max_tokens", 2.0),
    ("max_tokens", True),
    ("temperature", -0.1),
    ("temperature", math.nan),
    ("temperature", math.inf),
    ("temperature", "1"),
    ("top_k", -2),
    ("top_k", 1.5),
    ("top_p", 0.0),
    ("top_p", 1.01),
    ("top_p", math.nan),
    ("min_p", -0.01),
    ("min_p", 1.5),
    ("repetition_penalty", 0.0),
    ("repetition_penalty", -1.0),
    ("presence_penalty", 2.5),
    ("presence_penalty", -2.01),
    ("frequency_penalty", 3.0),
    ("frequency_penalty", -2.5),
    ("seed", 1.5),
    ("seed", "7"),
    ("stop", ""),
    ("stop", ["ok", ""]),
    ("stop", ["ok", 3]),
    ("stop", 5),
    ("stop_token_ids", [1, -1]),
    ("stop_token_ids", [1.0]),
    ("stop_token_ids", 7),
    ("ignore_eos", 1),
    ("logprobs", -1),
    ("logprobs", MAX_LOGPROBS + 1),
    ("logprobs", 2.0),
    ("skip_special_tokens", "yes"),
    ("include_stop_str_in_output", None),
]


@pytest.mark.parametrize(("field", "value"), INVALID)
def test_invalid_field_raises_request_error_naming_it(field, value):
    with pytest.raises(RequestError) as info:
        SamplingParams(**{field: value})
    message = str(info.value)
    assert field in message
    assert repr(value) in message
    assert "expected" in message
