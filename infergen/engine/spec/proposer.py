"""The proposer interface of speculative decoding (issue 24) and its registry.

A proposer drafts up to k tokens that may follow a request's tokens so far; the target model
then scores them all in one step and keeps the longest prefix it agrees with (verification,
engine side). Proposers are stateful per request and fed incrementally, the engine's calls:

    start(request_id, prompt)    a request is admitted (its prompt token ids)
    extend(request_id, tokens)   tokens were accepted (appended to its sequence)
    propose(request_id, k)       up to k drafted token ids (possibly none)
    finish(request_id)           the request is done (a proposer may keep what it generated)
    forget()                     drop what finished requests left behind (`suffix`'s recent
                                 outputs; a benchmark repeating one prompt would otherwise
                                 draft each repeat from the answer of the one before)

Proposers that draft with a model (`after_schedule = True`: `layerskip`, `draft`, `mtp`)
cannot draft before the step is scheduled — their drafts' KV needs the slots the scheduler
allocates — so the engine asks them once the batch is known:

    draft(seqs, counts)          counts[i] drafted token ids for each scheduled sequence
    known(seq)                   drafts already known before scheduling (observed, verified
                                 or not: `mtp`'s first)
    lag(seq)                     positions it must compute before drafting for seq (`draft`'s
                                 catch-up of its own KV)
    after_step(seqs, num_tokens, starts)
                                 the step ran and its tokens are kept: num_tokens[i] rows of
                                 seqs[i] from position starts[i] (`mtp` reads the target's
                                 hidden states of the kept positions; `draft` notes how far
                                 its own KV is exact)
    riding_cache                 a KV cache whose block b holds the proposer's KV of the
                                 target's block b positions, exact after each after_step
                                 (`mtp`'s; None for the others): the KV tiers carry it with
                                 the target's blocks (kvcache/tiers/riders.py)

(their `propose` is not called). One PROPOSERS row per kind (`speculative` = "ngram" |
"suffix" | "layerskip" | "draft" | "mtp"), each a factory taking a `DraftContext`: what a
model-based proposer builds on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from infergen.registry import Registry


@dataclass(frozen=True)
class DraftContext:
    """The target model and its KV cache, and the options of model-based proposers."""

    model: Any = None  # models/transformer.Transformer
    kv_cache: Any = None  # kvcache/paged_cache.PagedKVCache
    draft_layers: int | None = None  # layerskip: the target's first layers that draft
    draft_model: str | None = None  # draft: a checkpoint, or "self:SCHEME"
    # draft: builds the draft model and its KV cache (blocks as the target's) from its name
    build_draft: Callable[[str], tuple[Any, Any]] | None = None


class Proposer(Protocol):
    name: str
    after_schedule: bool  # drafts with a model, once the step is scheduled (`draft`)
    # keeps a KV cache of its own that follows the target's positions (`draft`, `mtp`): a KV
    # press, which moves the target's tokens to other cache indices, cannot run beside it
    own_cache: bool

    def start(self, request_id: str, prompt: Sequence[int]) -> None: ...

    def extend(self, request_id: str, tokens: Sequence[int]) -> None: ...

    def propose(self, request_id: str, k: int) -> list[int]: ...

    def finish(self, request_id: str) -> None: ...

    def forget(self) -> None: ...


PROPOSERS: Registry[Callable[[DraftContext], Proposer]] = Registry("speculative proposer")


class ModelProposer:
    """A proposer that drafts with a model once the step is scheduled (`layerskip`, `draft`,
    `mtp`): nothing to follow per request (its drafts come from the model's KV, not the
    request's tokens)."""

    after_schedule = True
    own_cache = False
    riding_cache = None  # (mtp: its layer's KV cache, carried through the KV tiers)
    # seconds the last `draft` call spent catching up on positions computed without it, and
    # how many (a one-off cost: the step times the cost model reads leave it out, and weigh it
    # apart, spec/cost.py); before one is measured, a position is taken to cost
    # `catch_up_share` of the target's prefill cost per token
    catch_up_s = 0.0
    catch_up_positions = 0
    catch_up_share = 0.0

    def start(self, request_id: str, prompt: Sequence[int]) -> None:
        pass

    def extend(self, request_id: str, tokens: Sequence[int]) -> None:
        pass

    def propose(self, request_id: str, k: int) -> list[int]:
        return []

    def finish(self, request_id: str) -> None:
        pass

    def forget(self) -> None:
        pass  # (its drafts come from a model: nothing of finished requests is kept)

    def lag(self, seq: Any) -> int:
        """Positions of `seq` the proposer computes before it can draft for it (its
        catch-up: `draft`'s own KV; none for proposers reading the target's)."""
        return 0

    def known(self, seq: Any) -> list[int]:
        """Drafts of `seq` known before the step is scheduled (`mtp`'s first): the speculator
        compares them with the tokens that follow even when none are verified."""
        return []

    def after_step(self, seqs: Sequence[Any], num_tokens: Sequence[int],
                   starts: Sequence[int]) -> None:  # fmt: skip
        pass  # (a proposer that reads nothing of the target's step)
