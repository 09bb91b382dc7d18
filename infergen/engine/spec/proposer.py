"""The proposer interface of speculative decoding (issue 24) and its registry.

A proposer drafts up to k tokens that may follow a request's tokens so far; the target model
then scores them all in one step and keeps the longest prefix it agrees with (verification,
engine side). Proposers are stateful per request and fed incrementally, the engine's calls:

    start(request_id, prompt)    a request is admitted (its prompt token ids)
    extend(request_id, tokens)   tokens were accepted (appended to its sequence)
    propose(request_id, k)       up to k drafted token ids (possibly none)
    finish(request_id)           the request is done (a proposer may keep what it generated)

One PROPOSERS row per kind (`speculative` = "ngram" | "suffix" | ...), each a factory taking
the proposer's keyword options.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from infergen.registry import Registry


class Proposer(Protocol):
    name: str

    def start(self, request_id: str, prompt: Sequence[int]) -> None: ...

    def extend(self, request_id: str, tokens: Sequence[int]) -> None: ...

    def propose(self, request_id: str, k: int) -> list[int]: ...

    def finish(self, request_id: str) -> None: ...


PROPOSERS: Registry[Callable[..., Proposer]] = Registry("speculative proposer")
