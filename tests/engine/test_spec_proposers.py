"""Speculative decoding's proposers (engine/spec/, issue 24) against brute-force oracles:
`ngram` (prompt lookup) against a scan for the latest earlier occurrence of the sequence's
ending; `suffix` drafts (engine/spec/occurrences.py) against a scan of every position, draft
for draft, and against a suffix trie's greedy walk over a Counter of every substring; fed at
once or token by token alike; removed sequences (the recent outputs) never drafted from."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from infergen.engine.spec.ngram import NgramProposer
from infergen.engine.spec.occurrences import Occurrences
from infergen.engine.spec.proposer import PROPOSERS, DraftContext
from infergen.engine.spec.suffix import SuffixProposer


def _ngram_oracle(seq: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    for n in range(min(max_n, len(seq)), min_n - 1, -1):
        ending = seq[len(seq) - n :]
        for i in range(len(seq) - n - 1, -1, -1):  # occurrences with a token after them
            if seq[i : i + n] == ending:
                return seq[i + n : i + n + k]
    return []


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("min_n, max_n", [(1, 4), (2, 3), (3, 3)])
def test_ngram_drafts_what_followed_the_latest_occurrence(seed, min_n, max_n):
    rng = random.Random(seed)
    vocab = rng.choice([3, 5, 12])
    seq = [rng.randrange(vocab) for _ in range(rng.randrange(1, 120))]
    proposer = NgramProposer(min_n, max_n)
    proposer.start("a", seq[:7])
    for i in range(7, len(seq), 5):  # fed in pieces, as tokens are accepted
        proposer.extend("a", seq[i : i + 5])
    for k in (1, 4, 9):
        assert proposer.propose("a", k) == _ngram_oracle(seq, k, min_n, max_n)
    proposer.finish("a")


def test_ngram_copies_a_quoted_span():
    text = list(range(100, 140))
    proposer = NgramProposer()
    proposer.start("r", [1, 2] + text + [3, 4] + text[:10])
    assert proposer.propose("r", 5) == text[10:15]


def _substrings(seqs: list[list[int]], depth: int) -> Counter:
    counts: Counter = Counter()
    for seq in seqs:
        for i in range(len(seq)):
            for j in range(i + 1, min(i + depth, len(seq)) + 1):
                counts[tuple(seq[i:j])] += 1
    return counts


def _reference_draft(seqs: list[list[int]], context: list[int], k: int, depth: int,
                     min_p: float) -> list[int]:  # fmt: skip
    """A scan of every position of every sequence: the longest ending of `context` (at most
    depth - k tokens, at least one) occurring with a token after it; then, step by step, the
    most frequent next token of those occurrences (ties: the occurrence scanned first), while
    the product of the frequencies stays >= min_p, at most depth - (the ending's length)
    tokens (a trie of depth `depth` holds no longer path)."""
    for m in range(min(len(context), max(1, depth - max(k, 1))), 0, -1):
        ending = context[len(context) - m :]
        ends = [(seq, i) for seq in seqs for i in range(m - 1, len(seq) - 1)
                if seq[i - m + 1 : i + 1] == ending]  # fmt: skip
        if not ends:
            continue
        out, probability = [], 1.0
        while ends and len(out) < min(k, depth - m):
            counts = Counter(seq[i + 1] for seq, i in ends)
            token = max(counts, key=counts.__getitem__)
            probability *= counts[token] / len(ends)
            if probability < min_p:
                break
            out.append(token)
            ends = [(seq, i + 1) for seq, i in ends if seq[i + 1] == token and i + 2 < len(seq)]
        return out
    return []


def _continuations(counts: Counter, path: tuple) -> dict[int, int]:
    return {p[-1]: c for p, c in counts.items() if len(p) == len(path) + 1 and p[:-1] == path}


def _check_draft(got: list[int], counts: Counter, context: list[int], k: int, depth: int,
                 min_p: float) -> None:  # fmt: skip
    """`got` is the greedy walk over the substring counts (a suffix trie's) from the longest
    ending of `context` (at most depth - k tokens, at least one) that has a continuation: each
    token a most frequent continuation (ties: any), the product of the steps' frequencies >=
    min_p, stopping only at k tokens, without a continuation, or where the next step would fall
    below min_p."""
    endings = [
        tuple(context[len(context) - m :])
        for m in range(min(len(context), max(1, depth - k)), 0, -1)
    ]
    matched = next((e for e in endings if counts.get(e) and _continuations(counts, e)), None)
    if matched is None:
        assert got == []
        return
    path, probability = matched, 1.0
    for token in got:
        nexts = _continuations(counts, path)
        assert nexts.get(token) == max(nexts.values())
        probability *= nexts[token] / sum(nexts.values())
        assert probability >= min_p
        path = (*path, token)
    nexts = _continuations(counts, path)
    assert (len(got) == k or not nexts
            or probability * max(nexts.values()) / sum(nexts.values()) < min_p)  # fmt: skip


@pytest.mark.parametrize("seed", range(8))
def test_suffix_drafts_follow_the_most_frequent_continuation(seed):
    """Drafts over several sequences: the reference scan's, and the suffix trie's walk over
    every substring's count."""
    rng = random.Random(seed)
    depth, min_p = rng.choice([(4, 0.0), (8, 0.1), (12, 0.3)])
    pattern = [rng.randrange(50) for _ in range(6)]
    seqs = [[*pattern, *[rng.randrange(3) for _ in range(5)], *pattern] for _ in range(3)]
    index = Occurrences(depth)
    for seq in seqs:
        index.add(seq)
    counts = _substrings(seqs, depth)
    drafted = 0
    for context in ([*pattern[:3]], [7, 7, *pattern[:4]], [1], [99, 98], seqs[0][:9]):
        got = index.draft(context, 6, min_p)
        assert got == _reference_draft(seqs, context, 6, depth, min_p)
        _check_draft(got, counts, context, 6, depth, min_p)
        drafted += len(got)
    assert drafted > 0


@pytest.mark.parametrize("seed", range(8))
def test_occurrences_of_a_growing_sequence_draft_what_a_scan_drafts(seed):
    """A request's own drafts (its sequence appended token by token) against the reference
    scan and the substring counts, draft for draft, ties included, after every token of
    sequences with repeats and noise."""
    rng = random.Random(seed)
    depth, min_p = rng.choice([(2, 0.0), (4, 0.0), (8, 0.1), (24, 0.3), (24, 0.0)])
    vocab = rng.choice([3, 20])
    pattern = [rng.randrange(vocab) for _ in range(rng.randrange(3, 12))]
    seq: list[int] = []
    index = Occurrences(depth)
    own = index.add()
    drafted = 0
    for _ in range(100):
        token = pattern[len(seq) % len(pattern)] if rng.random() < 0.8 else rng.randrange(vocab)
        index.extend(own, [token])
        seq.append(token)
        counts = _substrings([seq], depth) if len(seq) % 10 == 0 else None
        for k in (1, 5, depth + 1):
            got = index.draft(seq, k, min_p)
            assert got == _reference_draft([seq], seq, k, depth, min_p)
            if counts is not None:
                _check_draft(got, counts, seq, k, depth, min_p)
            drafted += len(got)
    assert index.tokens(own) == seq
    assert drafted > 0


@pytest.mark.parametrize("seed", range(4))
def test_removed_sequences_are_not_drafted_from(seed):
    """Sequences added and removed in turn (the recent outputs): drafts are the scan's over
    the sequences still held, before and after the index is rebuilt (removed entries
    outnumbering the live ones)."""
    rng = random.Random(seed)
    index = Occurrences(8)
    held: dict[int, list[int]] = {}
    for _ in range(30):
        seq = [rng.randrange(6) for _ in range(rng.randrange(1, 30))]
        held[index.add(seq)] = seq
        if len(held) > 3:
            index.remove(min(held))
            del held[min(held)]
        for _ in range(5):
            context = [rng.randrange(6) for _ in range(rng.randrange(1, 6))]
            for k in (1, 4):
                got = index.draft(context, k, 0.0)
                assert got == _reference_draft(list(held.values()), context, k, 8, 0.0)
    assert all(index.tokens(sid) == seq for sid, seq in held.items())


def test_suffix_drafts_k_tokens_of_a_long_copied_span():
    """A span copied from earlier in the sequence drafts k tokens, not the one a match of
    depth - 1 tokens has room for below it."""
    span = list(range(100, 160))
    proposer = SuffixProposer(depth=24)
    proposer.start("r", [1, 2, *span, 3, 4, *span[:30]])
    assert proposer.propose("r", 8) == span[30:38]


def test_suffix_drafts_an_earlier_requests_answer_and_forgets_the_oldest():
    proposer = SuffixProposer(depth=8, max_outputs=1)
    answer = [500, 501, 502, 503, 504, 505]
    proposer.start("first", [1, 2, 3])
    proposer.extend("first", answer)
    proposer.finish("first")
    proposer.start("second", [9, 9, 500, 501])  # the same answer starts again
    assert proposer.propose("second", 3) == [502, 503, 504]
    proposer.finish("second")  # its output ([]) adds nothing: the first answer stays
    proposer.start("third", [7])
    proposer.extend("third", [600, 601, 602])
    proposer.finish("third")  # max_outputs=1: the first answer leaves the recent trie
    proposer.start("fourth", [500, 501])
    assert proposer.propose("fourth", 3) == []
    proposer.start("fifth", [600])  # the third's answer is held
    assert proposer.propose("fifth", 2) == [601, 602]


def test_suffix_forgets_finished_answers_not_the_requests_in_flight():
    proposer = SuffixProposer(depth=8)
    answer = [500, 501, 502, 503, 504, 505]
    proposer.start("first", [1, 2, 3])
    proposer.extend("first", answer)
    proposer.finish("first")
    proposer.start("second", [9, 9, 500, 501])
    proposer.extend("second", [700, 701, 702, 9, 700])
    assert proposer.propose("second", 2) == [701, 702]  # its own tokens
    proposer.start("third", [500, 501])
    assert proposer.propose("third", 2) == [502, 503]  # the first's answer
    proposer.forget()
    assert proposer.propose("third", 2) == []
    assert proposer.propose("second", 2) == [701, 702]


def test_proposer_rows_and_bad_options():
    assert isinstance(PROPOSERS.get("ngram")(DraftContext()), NgramProposer)
    assert isinstance(PROPOSERS.get("suffix")(DraftContext()), SuffixProposer)
    with pytest.raises(ValueError, match="min_n <= max_n"):
        NgramProposer(3, 2)
    with pytest.raises(ValueError, match="depth must be >= 2"):
        SuffixProposer(depth=1)
