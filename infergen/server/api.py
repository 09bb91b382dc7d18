"""The FastAPI application: OpenAI-compatible /v1/completions, /v1/chat/completions,
/v1/models, plus /health and /metrics (Prometheus text), over one AsyncEngine.

Errors have the OpenAI body {"error": {"message", "type", "param", "code"}}: 400 for a bad
request (validation, a prompt longer than the context, an unknown model), 401 for a missing
or wrong API key, 503 when the server holds its limit of requests in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import sys
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from infergen.errors import RequestError
from infergen.llm import LLM
from infergen.server.async_engine import AsyncEngine, EngineFailure, QueueFull, Update
from infergen.server.metrics import CONTENT_TYPE_LATEST
from infergen.server.protocol import ChatRequest, CompletionRequest


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str, param: str | None = None):
        self.status, self.message, self.kind, self.param = status, message, kind, param


def _error(status: int, message: str, kind: str, param: str | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": param, "code": None}}
    return JSONResponse(body, status_code=status)


def _sse(payload: dict | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


async def _merge(streams: list[AsyncIterator[Update]]) -> AsyncIterator[tuple[int, Update]]:
    """Updates of several requests as they come: (index of the stream, update)."""
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(index: int, stream: AsyncIterator[Update]) -> None:
        try:
            async for update in stream:
                await queue.put((index, update))
        except Exception as exc:  # noqa: BLE001 - re-raised by the consumer below
            await queue.put((index, exc))
        finally:
            await queue.put((index, done))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    remaining = len(tasks)
    try:
        while remaining:
            index, item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        # a stream may be closed only once its pump has stopped iterating it
        await asyncio.gather(*tasks, return_exceptions=True)
        for stream in streams:
            await stream.aclose()


def create_app(llm: LLM, model_name: str, api_key: str | None = None, max_pending: int = 256):
    engine = AsyncEngine(llm.engine, max_pending=max_pending)
    tokenizer = llm.tokenizer
    max_len = llm.engine.max_model_len

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        yield
        engine.shutdown()  # the engine thread ends with the server (in-flight streams ended)
        print("infergen: server stopped", file=sys.stderr, flush=True)

    app = FastAPI(title="infergen", version="0.1.0", lifespan=lifespan)
    app.state.engine = engine

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError):
        return _error(exc.status, exc.message, exc.kind, exc.param)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        message = first.get("msg", "invalid request")
        if first.get("type") == "json_invalid":
            message = "request body is not valid JSON"
        return _error(
            400,
            f"{'.'.join(loc) or 'body'}: {message}",
            "invalid_request_error",
            ".".join(loc) or None,
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException):
        # the framework's own errors (unparseable body, unknown route, wrong method) get the
        # same OpenAI body as ours instead of {"detail": ...}
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return _error(exc.status_code, str(exc.detail), kind)

    @app.exception_handler(RequestError)
    async def _bad_request(_: Request, exc: RequestError):
        param = exc.where.removeprefix("sampling_params.") if exc.where else None
        return _error(400, str(exc), "invalid_request_error", param)

    @app.exception_handler(EngineFailure)
    async def _failed(_: Request, exc: EngineFailure):
        return _error(500, str(exc), "server_error")

    @app.exception_handler(QueueFull)
    async def _full(_: Request, exc: QueueFull):
        return _error(503, f"server busy: {exc}; retry later", "server_busy")

    async def authorize(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not secrets.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
            raise ApiError(
                401,
                "missing or invalid API key (Authorization: Bearer KEY)",
                "authentication_error",
            )

    def check_model(name: str | None) -> None:
        if name is not None and name != model_name:
            raise ApiError(
                400,
                f"model {name!r} does not exist; this server serves {model_name!r}",
                "invalid_request_error",
                "model",
            )

    def token_text(token_id: int) -> str:
        return tokenizer.decode([token_id], skip_special_tokens=False) if tokenizer else ""

    async def submit_all(prompts, params_for) -> list[tuple[str, asyncio.Queue, list[int]]]:
        submitted = []
        try:
            for k, prompt in enumerate(prompts):
                ids = llm.engine.encode(prompt) if isinstance(prompt, str) else list(prompt)
                params = params_for(k, len(ids))
                rid, queue = await engine.submit(ids, params)
                submitted.append((rid, queue, ids))
        except BaseException:
            for rid, _, _ in submitted:
                engine.abort(rid)
            raise
        return submitted

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        return Response(engine.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models", dependencies=[Depends(authorize)])
    async def models():
        created = int(time.time())
        card = {
            "id": model_name,
            "object": "model",
            "created": created,
            "owned_by": "infergen",
            "max_model_len": max_len,
        }
        return {"object": "list", "data": [card]}

    # ---- completions ------------------------------------------------------------------------
    @app.post("/v1/completions", dependencies=[Depends(authorize)])
    async def completions(body: CompletionRequest):
        check_model(body.model)
        prompts = [p for p in body.prompts() for _ in range(body.n)]
        submitted = await submit_all(
            prompts, lambda k, _: body.sampling_params(body.max_tokens, body.logprobs, k % body.n)
        )
        rid = f"cmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        streams = [engine.stream(r, q) for r, q, _ in submitted]
        prefix = [_prompt_text(p) if body.echo else "" for p in prompts]

        def choice(index: int, text: str, reason: str | None, logprobs=None) -> dict:
            return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}

        if body.stream:

            async def events():
                sent_prefix = set()
                usage = _Usage()
                async for index, update in _merge(streams):
                    d = update.delta
                    text = d.text
                    if index not in sent_prefix:
                        sent_prefix.add(index)
                        text = prefix[index] + text
                    chunk = {
                        "id": rid,
                        "object": "text_completion",
                        "created": created,
                        "model": model_name,
                        "choices": [choice(index, text, d.finish_reason if d.finished else None)],
                    }
                    yield _sse(chunk)
                    if update.output is not None:
                        usage.add(update.output)
                if body.stream_options and body.stream_options.include_usage:
                    yield _sse(
                        {
                            "id": rid,
                            "object": "text_completion",
                            "created": created,
                            "model": model_name,
                            "choices": [],
                            "usage": usage.body(),
                        }
                    )
                yield _sse("[DONE]")

            return StreamingResponse(_guarded(events()), media_type="text/event-stream")

        outputs = await _collect(streams)
        usage = _Usage()
        choices = []
        for index, out in enumerate(outputs):
            usage.add(out)
            logprobs = (
                _completion_logprobs(out, token_text, prefix[index])
                if (body.logprobs is not None)
                else None
            )
            choices.append(choice(index, prefix[index] + out.text, out.finish_reason, logprobs))
        return {
            "id": rid,
            "object": "text_completion",
            "created": created,
            "model": model_name,
            "choices": choices,
            "usage": usage.body(),
        }

    def _prompt_text(prompt) -> str:
        return (
            prompt
            if isinstance(prompt, str)
            else (tokenizer.decode(list(prompt)) if tokenizer else "")
        )

    # ---- chat -------------------------------------------------------------------------------
    @app.post("/v1/chat/completions", dependencies=[Depends(authorize)])
    async def chat(body: ChatRequest):
        check_model(body.model)
        prompt = llm.chat_prompt(body.conversation())
        limit = body.max_completion_tokens or body.max_tokens

        def params_for(k: int, prompt_len: int):
            max_tokens = limit if limit is not None else max(1, max_len - prompt_len - 1)
            return body.sampling_params(max_tokens, body.logprobs_k(), k)

        submitted = await submit_all([prompt] * body.n, params_for)
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        streams = [engine.stream(r, q) for r, q, _ in submitted]

        def chunk(choices: list[dict], **extra) -> dict:
            return {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model_name,
                "choices": choices,
                **extra,
            }

        if body.stream:

            async def events():
                for index in range(body.n):
                    yield _sse(
                        chunk(
                            [
                                {
                                    "index": index,
                                    "delta": {"role": "assistant", "content": ""},
                                    "logprobs": None,
                                    "finish_reason": None,
                                }
                            ]
                        )
                    )
                usage = _Usage()
                async for index, update in _merge(streams):
                    d = update.delta
                    if d.text:
                        yield _sse(
                            chunk(
                                [
                                    {
                                        "index": index,
                                        "delta": {"content": d.text},
                                        "logprobs": None,
                                        "finish_reason": None,
                                    }
                                ]
                            )
                        )
                    if d.finished:
                        yield _sse(
                            chunk(
                                [
                                    {
                                        "index": index,
                                        "delta": {},
                                        "logprobs": None,
                                        "finish_reason": d.finish_reason,
                                    }
                                ]
                            )
                        )
                        usage.add(update.output)
                if body.stream_options and body.stream_options.include_usage:
                    yield _sse(chunk([], usage=usage.body()))
                yield _sse("[DONE]")

            return StreamingResponse(_guarded(events()), media_type="text/event-stream")

        outputs = await _collect(streams)
        usage = _Usage()
        choices = []
        for index, out in enumerate(outputs):
            usage.add(out)
            logprobs = _chat_logprobs(out, token_text) if body.logprobs else None
            choices.append(
                {
                    "index": index,
                    "message": {"role": "assistant", "content": out.text},
                    "logprobs": logprobs,
                    "finish_reason": out.finish_reason,
                }
            )
        return {
            "id": rid,
            "object": "chat.completion",
            "created": created,
            "model": model_name,
            "choices": choices,
            "usage": usage.body(),
        }

    return app


async def _guarded(events: AsyncIterator[str]) -> AsyncIterator[str]:
    """An engine failure after the stream began becomes an error event, then [DONE]."""
    try:
        async for event in events:
            yield event
    except EngineFailure as exc:
        yield _sse(
            {"error": {"message": str(exc), "type": "server_error", "param": None, "code": None}}
        )
        yield _sse("[DONE]")


async def _collect(streams: list[AsyncIterator[Update]]):
    outputs: list = [None] * len(streams)
    async for index, update in _merge(streams):
        if update.output is not None:
            outputs[index] = update.output
    return outputs


class _Usage:
    def __init__(self):
        self.prompt = self.completion = self.cached = 0

    def add(self, out) -> None:
        self.prompt += len(out.prompt_token_ids)
        self.completion += len(out.token_ids)
        self.cached += out.num_cached_prompt_tokens

    def body(self) -> dict:
        return {
            "prompt_tokens": self.prompt,
            "completion_tokens": self.completion,
            "total_tokens": self.prompt + self.completion,
            "prompt_tokens_details": {"cached_tokens": self.cached},
        }


def _completion_logprobs(out, token_text, prefix: str) -> dict:
    """The legacy completions format: tokens, token_logprobs, top_logprobs, text_offset."""
    tokens, token_logprobs, top, offsets = [], [], [], []
    offset = len(prefix)
    for lp in out.logprobs or []:
        text = token_text(lp.token_id)
        tokens.append(text)
        token_logprobs.append(lp.logprob)
        top.append({token_text(t): v for t, v in lp.top})
        offsets.append(offset)
        offset += len(text)
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top,
        "text_offset": offsets,
    }


def _chat_logprobs(out, token_text) -> dict:
    def entry(token_id: int, logprob: float) -> dict:
        text = token_text(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    content = []
    for lp in out.logprobs or []:
        item = entry(lp.token_id, lp.logprob)
        item["top_logprobs"] = [entry(t, v) for t, v in lp.top]
        content.append(item)
    return {"content": content}
