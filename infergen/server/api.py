"""The FastAPI application: OpenAI-compatible /v1/completions, /v1/chat/completions,
/v1/models, plus /health and /metrics (Prometheus text), over one AsyncEngine.

Errors have the OpenAI body {"error": {"message", "type", "param", "code"}}: 400 for a bad
request (validation, a prompt longer than the context, an unknown model), 401 for a missing
or wrong API key, 413 for a body over the size limit, 503 + Retry-After when the server holds
its limit of requests in flight or the request would wait past the queue-time budget, 503
while shutting down (server/limits.py).
The response bodies and streams are responses.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import sys
import time
import uuid
from collections.abc import Sequence

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from infergen.errors import RequestError
from infergen.llm import LLM
from infergen.server import responses
from infergen.server.async_engine import AsyncEngine, EngineFailure, QueueFull
from infergen.server.limits import BodyLimit, Limits, output_budget, timeout_of
from infergen.server.metrics import CONTENT_TYPE_LATEST
from infergen.server.protocol import ChatRequest, CompletionRequest


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str, param: str | None = None):
        self.status, self.message, self.kind, self.param = status, message, kind, param


def create_app(
    llm: LLM,
    model_name: str,
    api_key: str | Sequence[str] | None = None,
    limits: Limits | None = None,
    protect_monitoring: bool = False,
):
    limits = limits or Limits()
    engine = AsyncEngine(llm.engine, limits)
    app = FastAPI(title="infergen", version="0.1.0", lifespan=_lifespan(engine))
    app.state.engine = engine
    app.add_middleware(BodyLimit, limit=limits.max_body_bytes)
    _add_error_handlers(app)
    handlers = _Handlers(llm, engine, model_name, limits)
    keys = [api_key] if isinstance(api_key, str) else list(api_key or ())
    authorized = [Depends(_authorizer(keys))]
    monitored = authorized if protect_monitoring else []

    @app.get("/health", dependencies=monitored)
    async def health():
        if engine.failed is not None:  # (the server is on its way out: exits non-zero)
            return _error(503, f"the engine stopped: {engine.failed}", "engine_unavailable")
        return {"status": "ok"}

    @app.get("/metrics", dependencies=monitored)
    async def metrics():
        return Response(engine.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models", dependencies=authorized)
    async def models():
        return handlers.models()

    @app.post("/v1/completions", dependencies=authorized)
    async def completions(body: CompletionRequest, request: Request):
        return await handlers.completions(body, request)

    @app.post("/v1/chat/completions", dependencies=authorized)
    async def chat(body: ChatRequest, request: Request):
        return await handlers.chat(body, request)

    return app


def _lifespan(engine: AsyncEngine):
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        yield
        engine.shutdown()  # the engine thread ends with the server (in-flight streams ended)
        print("infergen: server stopped", file=sys.stderr, flush=True)

    return lifespan


# ---- errors: the OpenAI body for ours and the framework's ---------------------------------------
def _error(status: int, message: str, kind: str, param: str | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": param, "code": None}}
    return JSONResponse(body, status_code=status)


def _add_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(RequestError, _bad_request)
    app.add_exception_handler(EngineFailure, _failed)  # and its subclasses
    app.add_exception_handler(QueueFull, _full)


async def _api_error(_: Request, exc: ApiError):
    return _error(exc.status, exc.message, exc.kind, exc.param)


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


async def _http(_: Request, exc: StarletteHTTPException):
    # the framework's own errors (unparseable body, unknown route, wrong method) get the
    # same OpenAI body as ours instead of {"detail": ...}
    kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
    return _error(exc.status_code, str(exc.detail), kind)


async def _bad_request(_: Request, exc: RequestError):
    param = exc.where.removeprefix("sampling_params.") if exc.where else None
    return _error(400, str(exc), "invalid_request_error", param)


async def _failed(_: Request, exc: EngineFailure):
    return _error(exc.status, str(exc), exc.kind)


async def _full(_: Request, exc: QueueFull):
    response = _error(503, f"server busy: {exc}; retry later", "server_busy")
    response.headers["Retry-After"] = str(exc.retry_after)
    return response


def _authorizer(keys: list[str]):
    """The dependency of the protected routes: `Authorization: Bearer KEY` with one of `keys`
    when any are set. Every key is compared, in constant time, whichever matches."""
    expected = [f"Bearer {key}".encode() for key in keys]

    async def authorize(request: Request) -> None:
        if not expected:
            return
        given = request.headers.get("authorization", "").encode()
        if not sum(secrets.compare_digest(given, key) for key in expected):
            raise ApiError(
                401,
                "missing or invalid API key (Authorization: Bearer KEY)",
                "authentication_error",
            )

    return authorize


async def _disconnect(request: Request) -> None:
    """Returns when the client closes its connection (the body has been read: what the
    server receives next is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


# ---- the /v1 handlers ---------------------------------------------------------------------------
def _include_usage(body: CompletionRequest | ChatRequest) -> bool:
    return bool(body.stream_options and body.stream_options.include_usage)


def _event_stream(events) -> StreamingResponse:
    return StreamingResponse(responses.guarded(events), media_type="text/event-stream")


class _Handlers:
    """The /v1 routes over one engine serving one model."""

    def __init__(self, llm: LLM, engine: AsyncEngine, model_name: str, limits: Limits):
        self.llm, self.engine, self.model_name = llm, engine, model_name
        self.tokenizer = llm.tokenizer
        self.max_len = llm.engine.max_model_len
        self.limits = limits

    def models(self) -> dict:
        card = {
            "id": self.model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "infergen",
            "max_model_len": self.max_len,
        }
        return {"object": "list", "data": [card]}

    async def completions(self, body: CompletionRequest, request: Request):
        self.check_model(body.model)
        prompts = [p for p in body.prompts() for _ in range(body.n)]
        submitted = await self.submit_all(
            prompts,
            lambda k, prompt_len: body.sampling_params(
                self.budget(body.max_tokens, prompt_len), body.logprobs, k % body.n
            ),
            body.timeout,
        )
        envelope = responses.Envelope(f"cmpl-{uuid.uuid4().hex}", int(time.time()), self.model_name)
        streams = [self.engine.stream(r, q) for r, q, _ in submitted]
        prefix = [self.prompt_text(p) if body.echo else "" for p in prompts]
        if body.stream:
            return _event_stream(
                responses.completion_events(envelope, streams, prefix, _include_usage(body))
            )
        token_text = self.token_text if body.logprobs is not None else None
        whole = responses.completion_body(envelope, streams, prefix, token_text)
        return await self.unless_disconnected(request, whole, submitted)

    async def chat(self, body: ChatRequest, request: Request):
        self.check_model(body.model)
        prompt = self.llm.chat_prompt(body.conversation())
        limit = body.max_completion_tokens or body.max_tokens

        def params_for(k: int, prompt_len: int):
            return body.sampling_params(self.budget(limit, prompt_len), body.logprobs_k(), k)

        submitted = await self.submit_all([prompt] * body.n, params_for, body.timeout)
        envelope = responses.Envelope(
            f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), self.model_name
        )
        streams = [self.engine.stream(r, q) for r, q, _ in submitted]
        if body.stream:
            return _event_stream(
                responses.chat_events(envelope, streams, body.n, _include_usage(body))
            )
        token_text = self.token_text if body.logprobs else None
        whole = responses.chat_body(envelope, streams, token_text)
        return await self.unless_disconnected(request, whole, submitted)

    async def unless_disconnected(self, request: Request, whole, submitted) -> dict | Response:
        """A whole (non-streaming) response, unless the client hangs up first: then every
        request behind it is aborted now (its KV blocks back to the pool) instead of running
        to max_tokens for nobody. (A stream is aborted when its consumer stops.)"""
        work = asyncio.ensure_future(whole)
        gone = asyncio.ensure_future(_disconnect(request))
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        if work.done():
            gone.cancel()
            return work.result()
        work.cancel()
        for request_id, _, _ in submitted:
            self.engine.abort(request_id, reason="disconnect")
        with contextlib.suppress(asyncio.CancelledError):
            await work
        return Response(status_code=499)  # nobody is there to read it

    def budget(self, max_tokens: int | None, prompt_len: int) -> int:
        try:
            return output_budget(max_tokens, prompt_len, self.max_len, self.limits.max_tokens)
        except ValueError as exc:
            raise ApiError(400, str(exc), "invalid_request_error", "max_tokens") from None

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.model_name:
            raise ApiError(
                400,
                f"model {name!r} does not exist; this server serves {self.model_name!r}",
                "invalid_request_error",
                "model",
            )

    async def submit_all(
        self, prompts, params_for, timeout: float | None
    ) -> list[tuple[str, asyncio.Queue, list[int]]]:
        """Submit every prompt, or none: the ones already in are aborted if one fails."""
        timeout = timeout_of(timeout, self.limits.request_timeout)
        submitted = []
        try:
            for k, prompt in enumerate(prompts):
                ids = self.llm.engine.encode(prompt) if isinstance(prompt, str) else list(prompt)
                params = params_for(k, len(ids))
                rid, queue = await self.engine.submit(ids, params, timeout)
                submitted.append((rid, queue, ids))
        except BaseException:
            for rid, _, _ in submitted:
                self.engine.abort(rid)
            raise
        return submitted

    def token_text(self, token_id: int) -> str:
        tokenizer = self.tokenizer
        return tokenizer.decode([token_id], skip_special_tokens=False) if tokenizer else ""

    def prompt_text(self, prompt) -> str:
        if isinstance(prompt, str):
            return prompt
        return self.tokenizer.decode(list(prompt)) if self.tokenizer else ""
