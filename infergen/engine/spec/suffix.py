"""`suffix`: SuffixDecoding-style drafting (Oliaro et al., 2024) — frequency-counted suffix
tries over the request's own tokens and over recent requests' outputs; the draft follows the
most frequent continuation of the longest match of the sequence's ending.

A `SuffixTrie` holds every substring of length <= depth of the sequences inserted into it, as
paths from the root, each node counting the occurrences through it. Drafting k tokens: the
longest ending of the current sequence of at most depth - k tokens (a path that long leaves
room below it for k more: a match of depth - 1 tokens could draft one token at most — it did,
and suffix drafts then averaged 1.5 tokens a verifying step where n-gram's took 6.7 on the same
copied class) that is a path with a continuation, then the most frequent child step by step
while the product of the steps' frequencies (count / siblings' counts: the estimated chance
the draft survives verification so far) stays at or above `min_probability`.

Per request: its prompt and output indexed by where each token and token pair occurs
(spec/occurrences.py: the drafts this trie would give over them, without building depth nodes
a token). Across requests: a trie over the outputs of the last `max_outputs` finished requests
(agentic loops repeat their own earlier answers); the oldest output leaves it (its counts
removed) as a new one enters. The draft from either trie with more tokens wins (the request's
own on a tie).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from infergen.engine.spec.occurrences import Occurrences
from infergen.engine.spec.proposer import PROPOSERS


class _Node:
    __slots__ = ("children", "count")

    def __init__(self) -> None:
        self.children: dict[int, _Node] = {}
        self.count = 0


class SuffixTrie:
    def __init__(self, depth: int):
        self.depth = depth
        self.root = _Node()

    def add(self, tokens: Sequence[int], sign: int = 1) -> None:
        """Insert (sign 1) or remove (-1) every substring of `tokens` up to depth long."""
        for i in range(len(tokens)):
            node = self.root
            for token in tokens[i : i + self.depth]:
                child = node.children.get(token)
                if child is None:
                    child = node.children[token] = _Node()
                child.count += sign
                if child.count == 0:
                    del node.children[token]
                    break  # (its subtree counted this substring only)
                node = child

    def draft(self, context: Sequence[int], k: int, min_probability: float) -> list[int]:
        """Up to k tokens following the longest ending of `context` (at most depth - k
        tokens) that is a path here with a continuation (module docstring)."""
        if not self.root.children:
            return []
        longest = min(len(context), self._longest(k))
        for m in range(longest, 0, -1):
            node = self.root
            for token in context[len(context) - m :]:
                node = node.children.get(token)
                if node is None:
                    break
            if node is None or not node.children:
                continue
            return self._follow(node, k, min_probability)
        return []

    def _longest(self, k: int) -> int:
        """The longest ending a draft of k tokens starts from: depth - k (at least one)."""
        return max(1, self.depth - max(k, 1))

    def _follow(self, node: _Node, k: int, min_probability: float) -> list[int]:
        """The most frequent child step by step from `node` while the product of the steps'
        frequencies stays at or above min_probability (at most k)."""
        out: list[int] = []
        probability = 1.0
        while node.children and len(out) < k:
            token, child = max(node.children.items(), key=lambda item: item[1].count)
            probability *= child.count / sum(c.count for c in node.children.values())
            if probability < min_probability:
                break
            out.append(token)
            node = child
        return out


class SuffixProposer:
    name = "suffix"
    after_schedule = False
    own_cache = False

    def __init__(self, depth: int = 24, max_outputs: int = 256, min_probability: float = 0.1):
        if depth < 2:
            raise ValueError(f"suffix proposer: depth must be >= 2, got {depth}")
        self.depth, self.min_probability = depth, min_probability
        self.max_outputs = max_outputs
        self.recent = SuffixTrie(depth)  # the outputs of the last max_outputs requests
        self._outputs: deque[list[int]] = deque()
        self._requests: dict[str, tuple[Occurrences, int]] = {}  # (its tokens, prompt length)

    def start(self, request_id: str, prompt: Sequence[int]) -> None:
        self._requests[request_id] = (Occurrences(self.depth), len(prompt))
        self.extend(request_id, prompt)

    def extend(self, request_id: str, tokens: Sequence[int]) -> None:
        self._requests[request_id][0].extend(tokens)

    def propose(self, request_id: str, k: int) -> list[int]:
        own = self._requests[request_id][0]
        drafted = own.draft(k, self.min_probability)
        other = self.recent.draft(own.tokens, k, self.min_probability)
        return other if len(other) > len(drafted) else drafted

    def forget(self) -> None:
        """Drop the recent requests' outputs (the requests in flight keep their own tries)."""
        self.recent = SuffixTrie(self.depth)
        self._outputs.clear()

    def finish(self, request_id: str) -> None:
        entry = self._requests.pop(request_id, None)
        if entry is None:
            return
        own, prompt_len = entry
        output = own.tokens[prompt_len:]
        if not output or self.max_outputs <= 0:
            return
        self.recent.add(output)
        self._outputs.append(output)
        if len(self._outputs) > self.max_outputs:
            self.recent.add(self._outputs.popleft(), sign=-1)


PROPOSERS.register("suffix", lambda context: SuffixProposer())
