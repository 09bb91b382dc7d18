"""An async OpenAI-API load generator: sends a workload's requests as streaming completions
(closed loop with N concurrent workers, or open loop with Poisson arrivals at R requests/s),
and times every request from the client's side.

Per request: TTFT (request sent → first streamed text), every inter-token gap (ITL: between
consecutive streamed text chunks; the servers stream one token per chunk), end-to-end latency,
output tokens (the server's `usage` when it sends it, else the number of text chunks) and
TPOT = (e2e − TTFT) / (output tokens − 1).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import httpx

from infergen.bench.workloads import BenchRequest


@dataclass
class RequestResult:
    ok: bool
    input_tokens: int = 0
    output_tokens: int = 0
    ttft: float | None = None
    e2e: float | None = None
    itl: list[float] = field(default_factory=list)
    error: str | None = None
    session: str | None = None
    turn: int = 0

    @property
    def tpot(self) -> float | None:
        if not self.ok or self.ttft is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    def as_dict(self) -> dict:
        return {**asdict(self), "tpot": self.tpot}


@dataclass(frozen=True)
class ClientOptions:
    url: str
    model: str | None = None
    api_key: str | None = None
    temperature: float = 0.0
    ignore_eos: bool = True  # equal work per request on every server (a vLLM-style extension)
    timeout: float = 600.0
    eos_token_ids: tuple[int, ...] = ()  # with ignore_eos, also banned by logit_bias (llama.cpp)
    # prompt tokens when the server sends no usage (llama.cpp's stream): the client's own count
    count_tokens: Callable[[str], int] | None = None


async def _one(client: httpx.AsyncClient, opts: ClientOptions, prompt: str, max_tokens: int):
    """Send one streaming completion; returns (RequestResult, generated text)."""
    body = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": opts.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if opts.model:
        body["model"] = opts.model
    if opts.ignore_eos:  # each server honours the one it knows (ours: ignore_eos)
        body["ignore_eos"] = True
        if opts.eos_token_ids:
            body["logit_bias"] = {str(t): -100 for t in opts.eos_token_ids}
    result, text, chunks = RequestResult(ok=False), [], 0
    start = time.perf_counter()
    last = None
    try:
        async with client.stream("POST", "/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                result.error = f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                return result, ""
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                payload = line[6:]
                if payload == "[DONE]":
                    result.ok = True
                    break
                data = json.loads(payload)
                if "error" in data:
                    result.error = str(data["error"].get("message"))
                    break
                if data.get("usage"):
                    result.input_tokens = data["usage"].get("prompt_tokens", 0)
                    result.output_tokens = data["usage"].get("completion_tokens", 0)
                for choice in data.get("choices", []):
                    piece = choice.get("text") or ""
                    if not piece:
                        continue
                    now = time.perf_counter()
                    if last is None:
                        result.ttft = now - start
                    else:
                        result.itl.append(now - last)
                    last = now
                    chunks += 1
                    text.append(piece)
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    result.e2e = time.perf_counter() - start
    if result.ok and not result.output_tokens:
        result.output_tokens = chunks
    if result.ok and not result.input_tokens and opts.count_tokens is not None:
        result.input_tokens = opts.count_tokens(prompt)
    return result, "".join(text)


async def _job(client, opts, request: BenchRequest, results: list, progress) -> None:
    """One request, or one agentic session (its turns in order, each resending the whole
    conversation so far)."""
    prompt = request.prompt
    for turn in range(1 + len(request.follow_up)):
        result, answer = await _one(client, opts, prompt, request.max_tokens)
        result.session, result.turn = request.session, turn
        results.append(result)
        if progress is not None:
            progress.update(1)
        if not result.ok or turn == len(request.follow_up):
            break
        prompt = f"{prompt}{answer}\n\n{request.follow_up[turn]}"


async def run_load(
    requests: list[BenchRequest],
    opts: ClientOptions,
    *,
    concurrency: int | None = None,
    rate: float | None = None,
    duration: float | None = None,
    seed: int = 0,
    progress=None,
) -> tuple[list[RequestResult], float]:
    """Run the workload; returns (per-request results, wall seconds). Exactly one of
    `concurrency` (closed loop) and `rate` (open loop, Poisson arrivals) is given; with
    `duration`, no new request or session starts after that many seconds."""
    if (concurrency is None) == (rate is None):
        raise ValueError("give exactly one of concurrency and rate")
    headers = {"Authorization": f"Bearer {opts.api_key}"} if opts.api_key else {}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    results: list[RequestResult] = []
    async with httpx.AsyncClient(
        base_url=opts.url, headers=headers, timeout=opts.timeout, limits=limits
    ) as client:
        start = time.perf_counter()

        def expired() -> bool:
            return duration is not None and time.perf_counter() - start > duration

        if concurrency is not None:
            pending = list(requests)

            async def worker():
                while pending and not expired():
                    await _job(client, opts, pending.pop(0), results, progress)

            await asyncio.gather(*(worker() for _ in range(concurrency)))
        else:
            rng = random.Random(seed)
            tasks = []
            for request in requests:
                if expired():
                    break
                tasks.append(asyncio.create_task(_job(client, opts, request, results, progress)))
                await asyncio.sleep(rng.expovariate(rate))
            await asyncio.gather(*tasks)
        wall = time.perf_counter() - start
    return results, wall
