"""A request's life inside the engine: `Sequence` (mutable state) and its outputs.

token_ids holds prompt + generated tokens. num_computed_tokens counts how many of them have
their KV in the cache; a step computes token_ids[num_computed_tokens : +n]. When the last
token has been computed the sequence samples one more. Preemption frees the blocks and sets
num_computed_tokens back to 0 (recompute; cached prefix blocks are found again).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from infergen.engine.sampling_params import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class PressChoice(NamedTuple):
    """The KV press a request runs (engine/kv_press.py): a PRESSES row, the share of its
    prompt's tokens removed, and the observation window (the prompt's last tokens whose
    queries it reads: computed even when the prefix cache holds them)."""

    name: str
    ratio: float
    window: int


@dataclass(eq=False)
class Sequence:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    sampling: Any  # engine.sampler.SamplingState
    stop_checker: Any  # engine.stopping.StopChecker
    detokenizer: Any | None  # io.tokenizer.IncrementalDetokenizer, None without a tokenizer
    arrival: int
    token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    # per KV cache group (kvcache/groups.py): the block of each block-sized span of tokens;
    # NO_BLOCK (-1) where a windowed group let a block go. Empty until first scheduled.
    blocks: list[list[int]] = field(default_factory=list)
    state_slot: int | None = None  # recurrent layers' state slot while scheduled (state_cache)
    block_hashes: list[bytes] = field(default_factory=list)  # chained hashes of full blocks
    num_registered_blocks: int = 0
    num_cached_prompt_tokens: int | None = None  # set at first admission
    reserved_blocks: int = 0  # blocks the admission policy reserved for it while running
    num_preemptions: int = 0
    status: Status = Status.WAITING
    finish_reason: str | None = None
    text: str = ""
    logprobs: list[Any] = field(default_factory=list)
    streamed_chars: int = 0
    streamed_tokens: int = 0
    # speculative decoding: the tokens a proposer drafted for this step (None: the engine drafts
    # nothing, e.g. the performance model's simulator, which schedules the full lookahead)
    drafts: list[int] | None = None
    press: PressChoice | None = None  # its KV press (None: none)
    # KV press (engine/kv_press.py): per KV cache group, the positions the press removed from
    # the cache — a position p's KV then lives at cache index p − kv_removed[g] (its RoPE
    # position unchanged). Empty: nothing removed (never pressed)
    kv_removed: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_token_ids) :]

    @property
    def num_uncomputed(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    def removed(self, group: int) -> int:
        """Positions of cache group `group` the KV press removed (0 when never pressed)."""
        return self.kv_removed[group] if self.kv_removed else 0

    @property
    def pressed(self) -> bool:
        """Its cache was compacted by a KV press: its blocks no longer follow positions (they
        are not hashed into the prefix cache, not swapped, not kept as a tail)."""
        return bool(self.kv_removed)

    def drafts_verified(self, num_new: int) -> int:
        """Drafts a step that computes `num_new` of its tokens verifies: how far it reaches
        past the sequence's last token (0: none — a prefill chunk or a plain decode)."""
        return max(0, self.num_computed_tokens + num_new - self.num_tokens)

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED


class RequestOutput(NamedTuple):
    """Final (or, when streaming, partial) result of one request."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: str | None  # "stop" | "length" | "abort" | None while running
    logprobs: list[Any] | None  # [TokenLogprobs] per generated token, when requested
    num_cached_prompt_tokens: int
    finished: bool


class StreamDelta(NamedTuple):
    """What one engine step added to one request (for streaming)."""

    request_id: str
    text: str  # new text, held back where a stop string might still match
    token_ids: list[int]  # new token ids
    finished: bool
    finish_reason: str | None
