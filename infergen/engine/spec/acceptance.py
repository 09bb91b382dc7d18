"""Running acceptance estimates of speculative decoding's drafts (issue 24): per sequence,
with the proposer's estimate over all sequences as its prior.

A draft is a chain: its j-th token is kept only if the j − 1 before it were. The model is
geometric — each token is kept with probability α given the ones before it were — so
decoding with j drafts emits 1 + α + … + α^j tokens on average, and the gain of the j-th
draft is α^j (spec/cost.py chooses the drafts by these gains).

Observations come from comparing a proposal with the tokens the sequence then appends,
whether or not the drafts were verified: a verified draft is kept exactly when it equals the
token appended at its position (greedy: the target's argmax; sampled: a deterministic draft is
kept with the probability the target gives it, the chance that the target's own sample equals
it). So a sequence whose drafts the cost model drops still measures how often they would have
been kept, and speculation can come back on when they would pay. Each match counts a kept
token, the first mismatch a rejected one; counts decay by DECAY per observation, so the
estimate follows a sequence moving between copying and free text.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PRIOR = 0.5  # the proposer's acceptance before anything is observed
PRIOR_WEIGHT = 2.0  # observations the prior is worth (the proposer's, for a new sequence)
DECAY = 0.9  # of the older counts per new observation


@dataclass
class Rate:
    """A decayed count of kept and rejected draft tokens."""

    kept: float = 0.0
    rejected: float = 0.0

    def observe(self, kept: bool) -> None:
        self.kept, self.rejected = self.kept * DECAY, self.rejected * DECAY
        if kept:
            self.kept += 1.0
        else:
            self.rejected += 1.0

    def estimate(self, prior: float, weight: float = PRIOR_WEIGHT) -> float:
        return (self.kept + weight * prior) / (self.kept + self.rejected + weight)


@dataclass
class _Pending:
    """A sequence's latest proposal not yet compared with its tokens, and its own rate."""

    rate: Rate = field(default_factory=Rate)
    proposal: list[int] = field(default_factory=list)


class Acceptance:
    """Per-sequence acceptance of one proposer's drafts."""

    def __init__(self):
        self.overall = Rate()
        self._seqs: dict[str, _Pending] = {}

    def proposed(self, request_id: str, drafts: list[int]) -> None:
        """The proposer's drafts for the sequence's next tokens (replacing any earlier ones
        not yet compared)."""
        self._seqs.setdefault(request_id, _Pending()).proposal = list(drafts)

    def appended(self, request_id: str, token: int) -> bool | None:
        """The sequence appended `token`: it is compared with the pending proposal's next
        draft (a match is a kept token; a mismatch, a rejected one, ends the proposal).
        Returns whether it was kept (None: no draft was pending)."""
        pending = self._seqs.get(request_id)
        if pending is None or not pending.proposal:
            return None
        kept = pending.proposal.pop(0) == token
        pending.rate.observe(kept)
        self.overall.observe(kept)
        if not kept:
            pending.proposal.clear()
        return kept

    def rate(self, request_id: str) -> float:
        """α: the estimated chance that a draft token of this sequence is kept, given those
        before it were."""
        prior = self.overall.estimate(PRIOR)
        pending = self._seqs.get(request_id)
        return prior if pending is None else pending.rate.estimate(prior)

    def finish(self, request_id: str) -> None:
        self._seqs.pop(request_id, None)
