"""What the server sends back, in the OpenAI formats: the bodies of /v1/completions and
/v1/chat/completions (whole, or as server-sent-event chunks ending with [DONE]), usage, logprobs,
and the plumbing under them: the updates of a request's n choices merged as they come, collected,
or guarded (an engine failure after a stream began becomes an error event)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from infergen.server.async_engine import EngineFailure, Update

COMPLETION = "text_completion"
CHAT = "chat.completion"
CHAT_CHUNK = "chat.completion.chunk"


def sse(payload: dict | str) -> str:
    """One server-sent event: `data: <JSON or [DONE]>` and a blank line."""
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


async def merge(streams: list[AsyncIterator[Update]]) -> AsyncIterator[tuple[int, Update]]:
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


async def guarded(events: AsyncIterator[str]) -> AsyncIterator[str]:
    """An engine failure after the stream began becomes an error event, then [DONE]."""
    try:
        async for event in events:
            yield event
    except EngineFailure as exc:
        yield sse({"error": {"message": str(exc), "type": exc.kind, "param": None, "code": None}})
        yield sse("[DONE]")


async def collect(streams: list[AsyncIterator[Update]]):
    """The final output of each stream, in stream order."""
    outputs: list = [None] * len(streams)
    async for index, update in merge(streams):
        if update.output is not None:
            outputs[index] = update.output
    return outputs


class Usage:
    """Token counts summed over a response's choices."""

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


@dataclass(frozen=True)
class Envelope:
    """The fields every body and chunk of one response repeats."""

    id: str
    created: int
    model: str

    def body(self, kind: str, choices: list[dict], **extra) -> dict:
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }


# ---- /v1/completions ----------------------------------------------------------------------------
def completion_choice(index: int, text: str, reason: str | None, logprobs=None) -> dict:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason}


async def completion_events(
    envelope: Envelope, streams: list, prefix: list[str], include_usage: bool
) -> AsyncIterator[str]:
    """One chunk per update (the echoed prompt before a choice's first text), usage, [DONE]."""
    sent_prefix = set()
    usage = Usage()
    async for index, update in merge(streams):
        d = update.delta
        text = d.text
        if index not in sent_prefix:
            sent_prefix.add(index)
            text = prefix[index] + text
        reason = d.finish_reason if d.finished else None
        yield sse(envelope.body(COMPLETION, [completion_choice(index, text, reason)]))
        if update.output is not None:
            usage.add(update.output)
    if include_usage:
        yield sse(envelope.body(COMPLETION, [], usage=usage.body()))
    yield sse("[DONE]")


async def completion_body(
    envelope: Envelope,
    streams: list,
    prefix: list[str],
    token_text: Callable[[int], str] | None,
) -> dict:
    """The whole response; logprobs in the legacy format when token_text is given."""
    outputs = await collect(streams)
    usage = Usage()
    choices = []
    for index, out in enumerate(outputs):
        usage.add(out)
        logprobs = (
            completion_logprobs(out, token_text, prefix[index]) if token_text is not None else None
        )
        choices.append(
            completion_choice(index, prefix[index] + out.text, out.finish_reason, logprobs)
        )
    return envelope.body(COMPLETION, choices, usage=usage.body())


def completion_logprobs(out, token_text, prefix: str) -> dict:
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


# ---- /v1/chat/completions -----------------------------------------------------------------------
def chat_chunk(envelope: Envelope, index: int, delta: dict, reason: str | None) -> dict:
    choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": reason}
    return envelope.body(CHAT_CHUNK, [choice])


async def chat_events(
    envelope: Envelope, streams: list, n: int, include_usage: bool
) -> AsyncIterator[str]:
    """The assistant role for each choice, then its content deltas, its finish reason, usage,
    [DONE]."""
    for index in range(n):
        yield sse(chat_chunk(envelope, index, {"role": "assistant", "content": ""}, None))
    usage = Usage()
    async for index, update in merge(streams):
        d = update.delta
        if d.text:
            yield sse(chat_chunk(envelope, index, {"content": d.text}, None))
        if d.finished:
            yield sse(chat_chunk(envelope, index, {}, d.finish_reason))
            usage.add(update.output)
    if include_usage:
        yield sse(envelope.body(CHAT_CHUNK, [], usage=usage.body()))
    yield sse("[DONE]")


async def chat_body(
    envelope: Envelope, streams: list, token_text: Callable[[int], str] | None
) -> dict:
    """The whole response; logprobs in the chat format when token_text is given."""
    outputs = await collect(streams)
    usage = Usage()
    choices = []
    for index, out in enumerate(outputs):
        usage.add(out)
        logprobs = chat_logprobs(out, token_text) if token_text is not None else None
        choices.append(
            {
                "index": index,
                "message": {"role": "assistant", "content": out.text},
                "logprobs": logprobs,
                "finish_reason": out.finish_reason,
            }
        )
    return envelope.body(CHAT, choices, usage=usage.body())


def chat_logprobs(out, token_text) -> dict:
    def entry(token_id: int, logprob: float) -> dict:
        text = token_text(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    content = []
    for lp in out.logprobs or []:
        item = entry(lp.token_id, lp.logprob)
        item["top_logprobs"] = [entry(t, v) for t, v in lp.top]
        content.append(item)
    return {"content": content}
