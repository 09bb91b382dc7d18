"""`ngram`: prompt-lookup decoding — draft what followed the last earlier occurrence of the
sequence's current ending (its last n tokens, the longest n in [min_n, max_n] that occurred
before) within the request's own prompt and output. Copy-heavy requests (edits of a given
text, summaries that quote, agents echoing tool output) repeat long spans of their context.

Per request an index maps every n-gram (min_n <= n <= max_n) to the position right after its
latest occurrence that has a continuation, updated as tokens arrive: O(max_n - min_n + 1) per
token, a lookup per n per proposal — no scan of the context.
"""

from __future__ import annotations

from collections.abc import Sequence

from infergen.engine.spec.proposer import PROPOSERS


class _Request:
    __slots__ = ("tokens", "follows")

    def __init__(self) -> None:
        self.tokens: list[int] = []
        # (n-gram) -> position of the token after its latest occurrence with one
        self.follows: dict[tuple[int, ...], int] = {}


class NgramProposer:
    name = "ngram"
    after_schedule = False
    own_cache = False

    def __init__(self, min_n: int = 1, max_n: int = 4):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"ngram proposer: need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.min_n, self.max_n = min_n, max_n
        self._requests: dict[str, _Request] = {}

    def start(self, request_id: str, prompt: Sequence[int]) -> None:
        self._requests[request_id] = _Request()
        self.extend(request_id, prompt)

    def extend(self, request_id: str, tokens: Sequence[int]) -> None:
        req = self._requests[request_id]
        seq, follows = req.tokens, req.follows
        for token in tokens:
            p = len(seq)  # `token` continues every n-gram that ends at p - 1
            for n in range(self.min_n, min(self.max_n, p) + 1):
                follows[tuple(seq[p - n : p])] = p
            seq.append(token)

    def propose(self, request_id: str, k: int) -> list[int]:
        req = self._requests[request_id]
        seq = req.tokens
        for n in range(min(self.max_n, len(seq)), self.min_n - 1, -1):
            at = req.follows.get(tuple(seq[len(seq) - n :]))
            if at is not None:
                return seq[at : at + k]
        return []

    def finish(self, request_id: str) -> None:
        self._requests.pop(request_id, None)

    def forget(self) -> None:
        pass  # (nothing of a finished request is kept)


PROPOSERS.register("ngram", lambda context: NgramProposer())
