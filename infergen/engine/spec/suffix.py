"""`suffix`: SuffixDecoding-style drafting (Oliaro et al., 2024) — the most frequent
continuation of the longest earlier occurrence of the sequence's ending, in the request's own
prompt and output or in recent requests' outputs (spec/occurrences.py: the drafts a
frequency-counted suffix trie of depth `depth` over them would give, without its depth nodes a
token).

Drafting k tokens starts from an ending of at most depth - k tokens (a trie path that long
leaves room below it for k more: a match of depth - 1 tokens could draft one token at most —
it did, and suffix drafts then averaged 1.5 tokens a verifying step where n-gram's took 6.7
on the same copied class).

Per request: its prompt and output, appended token by token. Across requests: the outputs of
the last `max_outputs` finished requests (agentic loops repeat their own earlier answers); the
oldest leaves as a new one enters. The draft from either with more tokens wins (the request's
own on a tie).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from infergen.engine.spec.occurrences import Occurrences
from infergen.engine.spec.proposer import PROPOSERS

OWN = 0  # a request's own Occurrences holds one sequence, its prompt and output


class SuffixProposer:
    name = "suffix"
    after_schedule = False
    own_cache = False

    def __init__(self, depth: int = 24, max_outputs: int = 256, min_probability: float = 0.1):
        if depth < 2:
            raise ValueError(f"suffix proposer: depth must be >= 2, got {depth}")
        self.depth, self.min_probability = depth, min_probability
        self.max_outputs = max_outputs
        self.recent = Occurrences(depth)  # the outputs of the last max_outputs requests
        self._outputs: deque[int] = deque()  # their ids in `recent`, oldest first
        self._requests: dict[str, tuple[Occurrences, int]] = {}  # (its tokens, prompt length)

    def start(self, request_id: str, prompt: Sequence[int]) -> None:
        own = Occurrences(self.depth)
        own.add(prompt)
        self._requests[request_id] = (own, len(prompt))

    def extend(self, request_id: str, tokens: Sequence[int]) -> None:
        self._requests[request_id][0].extend(OWN, tokens)

    def propose(self, request_id: str, k: int) -> list[int]:
        own = self._requests[request_id][0]
        tokens = own.tokens(OWN)
        drafted = own.draft(tokens, k, self.min_probability)
        other = self.recent.draft(tokens, k, self.min_probability)
        return other if len(other) > len(drafted) else drafted

    def forget(self) -> None:
        """Drop the recent requests' outputs (the requests in flight keep their own)."""
        self.recent = Occurrences(self.depth)
        self._outputs.clear()

    def finish(self, request_id: str) -> None:
        entry = self._requests.pop(request_id, None)
        if entry is None:
            return
        own, prompt_len = entry
        output = own.tokens(OWN)[prompt_len:]
        if not output or self.max_outputs <= 0:
            return
        self._outputs.append(self.recent.add(output))
        if len(self._outputs) > self.max_outputs:
            self.recent.remove(self._outputs.popleft())


PROPOSERS.register("suffix", lambda context: SuffixProposer())
