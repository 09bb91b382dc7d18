"""`Occurrences`: token sequences indexed by where each token and each pair of tokens occurs —
what the `suffix` proposer drafts from (spec/suffix.py): a request's own prompt and output,
and the outputs of recent requests.

A draft for a context (a request's tokens) is what a frequency-counted suffix trie of depth
`depth` over the sequences would give (SuffixDecoding, Oliaro et al., 2024): the longest
ending of the context (at most depth - k tokens) that occurs in a sequence with a token after
it; then the most frequent next token of those occurrences, step by step, while the product
of the steps' frequencies (count / all counts: the estimated chance the draft survives
verification so far) stays at or above `min_probability`. Ties go to the continuation of the
occurrence indexed first. A trie's node is the set of a substring's occurrences; here they are
the positions where the substring ends, found from the positions of the ending's last token
pair, so nothing is built per substring.

Why not the trie itself: it holds every substring up to depth tokens, depth nodes a token —
a 300-token prompt built 7,000 Python objects in 23 ms (16 such prompts added 0.43 s to a
2.6 s batch of 16), a finished 64-token answer 7 ms, and 256 recent answers of 1,000 tokens
would hold ~6 million nodes. Indexing here is O(1) a token; a draft costs the occurrences of
the ending's last pair times the length of their match. A removed sequence's index entries
are skipped, and the index is rebuilt once they outnumber the live ones.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

Entry = tuple[list[int], int]  # (a sequence's tokens, a position in it)
STRIDE = 1 << 40  # an index entry is sequence id × STRIDE + position, a pair's key a × STRIDE + b:
# ints, not tuples for the garbage collector to track (16 prompts' tuples made its passes cost
# 7 ms a prompt)


class Occurrences:
    """Token sequences, each appended to, with the positions of each token and token pair."""

    def __init__(self, depth: int):
        self.depth = depth
        self._seqs: dict[int, list[int]] = {}
        self._next_id = 0
        self._live = self._dead = 0  # index entries of held / removed sequences
        self._reindex()

    def add(self, tokens: Iterable[int] = ()) -> int:
        """A new sequence (its id), indexed."""
        sid, self._next_id = self._next_id, self._next_id + 1
        self._seqs[sid] = []
        self.extend(sid, tokens)
        return sid

    def tokens(self, sid: int) -> list[int]:
        return self._seqs[sid]

    def extend(self, sid: int, tokens: Iterable[int]) -> None:
        seq = self._seqs[sid]
        for token in tokens:
            seq.append(token)
            self._index(sid, seq, len(seq) - 1)

    def remove(self, sid: int) -> None:
        seq = self._seqs.pop(sid)
        self._live -= 2 * len(seq)
        self._dead += 2 * len(seq)
        if self._dead > self._live:
            self._reindex()

    def draft(self, context: Sequence[int], k: int, min_probability: float) -> list[int]:
        """Up to k tokens after the longest occurrence of `context`'s ending (module
        docstring)."""
        n = len(context)
        if n == 0:
            return []
        longest = min(n, max(1, self.depth - max(k, 1)))  # (a trie's room below the ending)
        ends: list[Entry] = []
        if n >= 2 and longest >= 2:
            ends = self._continued(self._pair_at.get(context[-2] * STRIDE + context[-1], ()))
        start = 2
        if not ends:  # the last pair never occurred with a token after it: one-token endings
            ends, longest, start = self._continued(self._at.get(context[-1], ())), 1, 1
        best, matched = 0, []
        for seq, end in ends:
            length = start
            while (
                length < longest and length <= end and seq[end - length] == context[n - 1 - length]
            ):
                length += 1
            if length > best:
                best, matched = length, [(seq, end)]
            elif length == best:
                matched.append((seq, end))
        return self._follow(matched, min(k, self.depth - best), min_probability)

    # ---- internals ---------------------------------------------------------------------------
    def _index(self, sid: int, seq: list[int], pos: int) -> None:
        """Index seq[pos] (and the pair ending there)."""
        entry = sid * STRIDE + pos
        if pos:
            self._pair_at[seq[pos - 1] * STRIDE + seq[pos]].append(entry)
        self._at[seq[pos]].append(entry)
        self._live += 2

    def _reindex(self) -> None:
        self._at: defaultdict[int, list[int]] = defaultdict(list)  # token -> entries
        self._pair_at: defaultdict[int, list[int]] = defaultdict(list)  # a × STRIDE + b -> b's
        self._live = self._dead = 0
        for sid, seq in self._seqs.items():
            for pos in range(len(seq)):
                self._index(sid, seq, pos)

    def _continued(self, entries: Iterable[int]) -> list[Entry]:
        """The occurrences with a token after them in a sequence still held."""
        out = []
        for entry in entries:
            sid, end = divmod(entry, STRIDE)
            seq = self._seqs.get(sid)
            if seq is not None and end + 1 < len(seq):
                out.append((seq, end))
        return out

    @staticmethod
    def _follow(ends: list[Entry], k: int, min_probability: float) -> list[int]:
        """The most frequent next token of the occurrences `ends`, step by step, while the
        product of the steps' frequencies stays at or above min_probability."""
        out: list[int] = []
        probability = 1.0
        while ends and len(out) < k:
            counts: dict[int, int] = {}
            for seq, end in ends:
                token = seq[end + 1]
                counts[token] = counts.get(token, 0) + 1
            token = max(counts, key=counts.__getitem__)  # (the first indexed among equals)
            probability *= counts[token] / len(ends)
            if probability < min_probability:
                break
            out.append(token)
            ends = [
                (seq, end + 1) for seq, end in ends if seq[end + 1] == token and end + 2 < len(seq)
            ]
        return out
