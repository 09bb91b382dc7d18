"""Schema-driven fuzzing: schemathesis generates requests from the server's own OpenAPI document
(valid and invalid bodies, odd types, boundary values) for every operation; none may end in a
5xx, and the server must still answer a plain request afterwards.

Bounded: a fixed number of examples per operation, against an engine whose context is capped
at 48 tokens so that any generated max_tokens finishes quickly."""

from __future__ import annotations

import httpx
import pytest
import schemathesis
import torch
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from infergen import LLM

from .conftest import API_KEY, MODEL, LiveServer

EXAMPLES_PER_OPERATION = 40
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def fuzz_server(default_model_path):
    llm = LLM(default_model_path, kv_cache_memory="32MiB", max_model_len=48, max_num_seqs=16)
    server = LiveServer(llm)
    yield server
    server.stop()


def operations(url: str) -> list:
    """Every operation of the server's OpenAPI document, as schemathesis reads it."""
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    return [result.ok() for result in schema.get_all_operations()]


def has_inputs(operation) -> bool:
    return (
        operation.body is not None
        and len(operation.body) > 0
        or any(True for _ in operation.iter_parameters())
    )


def test_openapi_document_lists_every_endpoint(fuzz_server):
    labels = {op.label for op in operations(fuzz_server.url)}
    assert {"POST /v1/completions", "POST /v1/chat/completions", "GET /v1/models"} <= labels


@pytest.mark.parametrize(
    "mode", [pytest.param(GenerationMode.POSITIVE, marks=pytest.mark.slow), GenerationMode.NEGATIVE]
)
def test_no_request_gets_a_server_error(fuzz_server, mode):
    """Schema-valid (positive) and schema-violating (negative) requests for every operation:
    any status but 5xx; error statuses carry an OpenAI-style error body."""
    seen: dict[int, int] = {}
    # the engine set flush-to-zero on this thread (configure_process); hypothesis refuses to
    # draw floats without subnormals, so restore IEEE behaviour here while the fuzz runs
    torch.set_flush_denormal(False)
    for operation in operations(fuzz_server.url):
        if mode is GenerationMode.NEGATIVE and not has_inputs(operation):
            continue  # nothing to get wrong: GET /health, GET /metrics, GET /v1/models

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,  # the same examples on every run: a failure reproduces
            database=None,
        )
        def call(case):
            response = case.call(headers=AUTH, timeout=60)
            seen[response.status_code] = seen.get(response.status_code, 0) + 1
            assert response.status_code < 500, (
                f"{case.method} {case.path} answered {response.status_code}: "
                f"{response.text[:500]}\nbody: {case.body!r}"
            )
            if response.status_code >= 400:  # errors are OpenAI-style bodies, never bare text
                assert "error" in response.json(), response.text[:500]

        call()
    # valid requests reached the engine (2xx); invalid ones were refused by the validation
    if mode is GenerationMode.POSITIVE:
        assert any(200 <= code < 300 for code in seen), seen
    else:
        assert seen.get(400, 0) > 0, seen


def test_server_still_serves_after_the_fuzz(fuzz_server):
    reply = httpx.post(
        f"{fuzz_server.url}/v1/completions",
        headers=AUTH,
        json={
            "model": MODEL,
            "prompt": "Hello",
            "max_tokens": 3,
            "temperature": 0,
            "ignore_eos": True,
        },
        timeout=60,
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] == 3
