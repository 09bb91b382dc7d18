"""What one server accepts: `Limits` (the `infergen serve` flags of the same names);
`BodyLimit`, an ASGI middleware that answers 413 to a body over the server's limit (by its
Content-Length up front, or a chunked body as its bytes arrive), with the OpenAI error body;
`output_budget`, the most tokens a request may generate; `timeout_of`, how long it may take."""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    """The defaults here are the serve flags' defaults (cli/serve.py reads them)."""

    max_pending: int = 256  # requests in flight; one more is a 503
    max_tokens: int = 4096  # per choice (--max-tokens-limit)
    max_body_bytes: int = 4 << 20  # larger bodies are a 413
    # admission by cost: a request whose estimated wait before it starts (engine/backlog.py,
    # times the measured step time) is longer is shed with 503 + Retry-After; None: never
    max_queue_time: float | None = 30.0
    # seconds a request may take from submission to its last token, when it sets no shorter
    # `timeout` of its own; then it stops with finish_reason "timeout"; None: no limit
    request_timeout: float | None = None


class BodyLimit:
    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None:  # the size is known up front
            if length.isdigit() and int(length) > self.limit:
                await self._refuse(send)
                return
            await self.app(scope, receive, send)
            return
        # a chunked body: read it here (the framework would turn an error raised while it
        # reads into a 400), then hand it over, then the live channel (disconnects)
        messages, seen = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left before the end
                return
            seen += len(message.get("body", b""))
            if seen > self.limit:
                await self._refuse(send)
                return
            messages.append(message)
            if not message.get("more_body"):
                break

        async def replay():
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send) -> None:
        message = f"request body is larger than this server's limit of {self.limit} bytes"
        body = {"error": {"message": message, "type": "invalid_request_error",
                          "param": None, "code": None}}  # fmt: skip
        payload = json.dumps(body).encode()
        headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(payload)).encode())]  # fmt: skip
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": payload})


def output_budget(given: int | None, prompt_len: int, max_len: int, limit: int) -> int:
    """max_tokens of a request: as given (up to `limit`, the server's --max-tokens-limit: more
    is a ValueError naming it), or when unset what the context leaves, at most `limit`."""
    if given is not None:
        if given > limit:
            raise ValueError(f"max_tokens {given} is above this server's limit of {limit}")
        return given
    return max(1, min(limit, max_len - prompt_len - 1))


def timeout_of(given: float | None, server: float | None) -> float | None:
    """A request's time limit: the shorter of its own `timeout` field and the server's."""
    limits = [t for t in (given, server) if t is not None]
    return min(limits) if limits else None
