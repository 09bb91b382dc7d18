"""OpenAI API request bodies (the fields infergen honours) and their mapping to SamplingParams.

Unknown fields are ignored, as the OpenAI API does for forward compatibility; a known field
with a wrong type or value is a 400 with an OpenAI-style error body naming it.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from infergen.engine.sampling_params import MAX_LOGPROBS, SamplingParams

MAX_STOP = 16  # stop strings per request, each of at most MAX_STOP_CHARS characters
MAX_STOP_CHARS = 256
MAX_PROMPTS = 64  # prompts in one completions request (each then n times)

StopString = Annotated[str, Field(max_length=MAX_STOP_CHARS)]


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=16)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOP)] | None = None
    seed: int | None = None
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    # infergen extensions (vLLM names)
    top_k: int = Field(default=0, ge=-1)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0)
    ignore_eos: bool = False
    # this request's KV press and the share of its prompt's cached tokens removed (None: the
    # server's --kv-press / --kv-press-ratio)
    kv_press: str | None = None
    kv_press_ratio: float | None = Field(default=None, ge=0.0, lt=1.0)
    # seconds from submission to the last token; the server's --request-timeout caps it
    timeout: float | None = Field(default=None, gt=0.0)

    def sampling_params(self, max_tokens: int, logprobs: int | None, index: int) -> SamplingParams:
        """Parameters of choice `index` (choices of one request draw different samples: the
        seed, when given, is offset by the index)."""
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            repetition_penalty=self.repetition_penalty,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            seed=None if self.seed is None else self.seed + index,
            stop=stop,
            ignore_eos=self.ignore_eos,
            logprobs=logprobs,
            kv_press=self.kv_press,
            kv_press_ratio=self.kv_press_ratio,
        )


class CompletionRequest(_Common):
    prompt: (
        str
        | Annotated[list[str], Field(max_length=MAX_PROMPTS)]
        | list[int]
        | Annotated[list[list[int]], Field(max_length=MAX_PROMPTS)]
    )
    max_tokens: int | None = Field(default=16, ge=1)
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)

    def prompts(self) -> list[str | list[int]]:
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if p and all(isinstance(t, int) for t in p):
            return [list(p)]
        return list(p)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):  # content parts: the text ones, joined
            return "".join(p.get("text", "") for p in self.content if p.get("type") == "text")
        return self.content or ""


class ChatRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)

    def conversation(self) -> list[dict[str, str]]:
        return [{"role": m.role, "content": m.text()} for m in self.messages]

    def logprobs_k(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None
