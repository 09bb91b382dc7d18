"""`Speculator`: speculative decoding inside the engine's step loop (issue 24).

Before a step, every decoding sequence that speculates gets the proposer's drafts
(`seq.drafts`, at most k; with num_speculative_tokens="auto", as many of them as the cost
model finds worth verifying this step — spec/cost.py, from the acceptance each sequence's
proposals have shown, spec/acceptance.py, and the measured step times); the scheduler
gives it 1 + len(drafts) tokens (its last token and the drafts), the runner feeds them and
returns a logits row per position. After the step the target's own choice at each position
verifies the drafts: greedy verification keeps the longest prefix of drafts equal to the
target's choices, then the target's token after it — 1 to k + 1 tokens a step, exactly the
tokens decoding one at a time would produce. The KV of the rejected drafts' positions stays
in slots past the sequence's computed tokens: never registered in the prefix cache,
overwritten by the next steps.

Sampled requests are verified the same way, against the target's own sample at each
position: the sampler draws row j as decoding would draw that token (its penalties see the
drafts before j as output, its noise is the request's next draw — the generator's next
exponentials, or the batched sampler's Philox stream at that draw count), so a draft is kept
when the target's sample equals it. Each emitted token is the target's sample, so the output
is the one decoding one token at a time gives for the same seed: lossless, and reproducible
whatever was drafted. A deterministic draft d is kept with probability p(d), what speculative
sampling's min(1, p(d) / q(d)) gives with q(d) = 1. On the generator path the rows are drawn
one at a time and the drawing stops at the first mismatch, so the generator advances once per
emitted token. Penalties and logprobs (the target's, per emitted token) work unchanged.
Models with recurrent layers speculate with their state saved before a verifying step and
restored after a rejection (spec/rollback.py).
"""

from __future__ import annotations

import collections
import copy
import functools
import time
from collections.abc import Callable, Sequence

import torch

from infergen.engine.request import Sequence as Seq
from infergen.engine.sampler import Sampler, SamplerOutput, SamplingState
from infergen.engine.spec.acceptance import Acceptance
from infergen.engine.spec.cost import (
    EXPLORE_SHARE,
    TOGETHER_SHARE,
    CatchUp,
    StepTimes,
    catch_up_pays,
    choose,
    choose_together,
)
from infergen.engine.spec.proposer import Proposer
from infergen.engine.spec.rollback import StateRollback


def accepted(drafts: Sequence[int], targets: Sequence[int]) -> int:
    """How many leading drafts equal the target's tokens at their positions."""
    a = 0
    while a < len(drafts) and drafts[a] == targets[a]:
        a += 1
    return a


def _after(state: SamplingState, drafts: list[int]) -> SamplingState:
    """`state` as it will be once `drafts` are appended: what the sampler sees at the
    position after them (its penalties count them; the batched path's draw count is its
    output length). The generator is the request's own."""
    if not drafts:
        return state
    view = copy.copy(state)
    view.output_token_ids = state.output_token_ids + list(drafts)
    return view


PENDING = -1  # a draft a model-based proposer fills in once the step is scheduled
# a model-based proposer's acceptance is measured only from drafts it made (and, for `mtp`,
# its first draft, known before scheduling): a sequence the cost model gave no drafts for
# EXPLORE decodes in a row verifies one, so that speculation can come back on; after each
# such draft the sequence waits twice as long, up to MAX_EXPLORE decodes, until the cost
# model gives it drafts again; none while the measured step times say that drafts would not
# pay even if every one were kept (a draft model too dear for this host), nor while its
# catch-up would cost more than EXPLORE_SHARE of the decoding since it last drafted
# (spec/cost.py)
EXPLORE, MAX_EXPLORE = 16, 256


class Speculator:
    """`max_drafts` drafts a step at most; with `auto`, as many per sequence as the cost
    model finds worth verifying (spec/cost.py), else all the proposer gives."""

    def __init__(self, proposer: Proposer, max_drafts: int, auto: bool = False,
                 rollback: StateRollback | None = None):  # fmt: skip
        self.proposer, self.max_drafts, self.auto = proposer, max_drafts, auto
        self.rollback = rollback  # recurrent states: restored after a rejection (rollback.py)
        self.acceptance = Acceptance()  # of the proposer's drafts, per sequence
        self._starts: list[int] = []  # the scheduled step's first positions (before_step)
        self._one_off = 0.0  # the step's proposer catch-up seconds (ModelProposer.catch_up_s)
        # model-based proposers: decodes without drafts in a row, and the decodes a sequence
        # waits before its next exploring draft (EXPLORE)
        self._idle: dict[str, int] = {}
        self._every: dict[str, int] = {}
        self.times = StepTimes()  # t(n) of decode-only steps (the engine's measurements)
        self.catch_up = CatchUp()  # a draft model's catch-up per position (spec/cost.py)
        # steps: decodes that verified drafts; proposed / drafted / accepted: tokens (drafted:
        # those verified, after the cost model's choice); observed_kept / _rejected: draft
        # tokens compared with the tokens that followed, verified or not (spec/acceptance.py);
        # rollbacks: recurrent states restored after a rejection (spec/rollback.py)
        # decodes: decoding sequences met before a step (verifying or not)
        self.stats = {"steps": 0, "proposed": 0, "drafted": 0, "accepted": 0, "proposer_s": 0.0,
                      "observed_kept": 0, "observed_rejected": 0, "rollbacks": 0,
                      "decodes": 0}  # fmt: skip
        # verifying steps by the drafts they verified: a step's cost depends on its rows,
        # not linearly (the GEMM micro-kernels' row tiles), so the performance model draws
        # each simulated step's drafts from this (perf/measured_acceptance.py)
        self.drafts_histogram: collections.Counter[int] = collections.Counter()

    def start(self, seq: Seq) -> None:
        self.proposer.start(seq.request_id, seq.token_ids)

    def extend(self, seq: Seq, token: int) -> None:
        self.proposer.extend(seq.request_id, (token,))
        kept = self.acceptance.appended(seq.request_id, token)
        if kept is not None:
            self.stats["observed_kept" if kept else "observed_rejected"] += 1

    def finish(self, seq: Seq) -> None:
        self.proposer.finish(seq.request_id)
        self.acceptance.finish(seq.request_id)
        for waits in (self._idle, self._every):
            waits.pop(seq.request_id, None)

    def draft(self, running: Sequence[Seq], slope: float | None = None, budget: int = 0,
              remaining: Callable[[Seq], int] | None = None,
              draining: bool = False) -> None:  # fmt: skip
        """Drafts for this step's decodes (the others: none). With `auto`, trimmed by the cost
        model: `slope` the seconds a token adds to a step beyond those measured (the engine's
        prefill cost per token), `budget` the step's token budget, `remaining` the most
        tokens a sequence may still generate (a draft model's catch-up must be earned back
        over them); when `draining` (no request waits), a step whose tokens are not nearly
        free drafts only for the sequences that would finish last, together (spec/cost.py)."""
        began = time.perf_counter()
        decoding: list[Seq] = []
        prefill = 0
        for seq in running:
            seq.drafts = []
            if seq.num_uncomputed == 1 and seq.num_tokens > len(seq.prompt_token_ids):
                decoding.append(seq)
            else:
                prefill += seq.num_uncomputed
        decodes = len(decoding)
        self.stats["decodes"] += decodes
        base = decodes + min(prefill, max(0, budget - decodes)) if budget else decodes
        if slope is None:  # (no prefill measured yet: this step's cost per token)
            slope = (self.times.seconds(base, 0.0) or 0.0) / max(1, base)
        together = (self.auto and draining and remaining is not None and bool(decoding)
                    and not prefill
                    and self.times.token_share(base, slope) >= TOGETHER_SHARE)  # fmt: skip
        lead = None  # how many more tokens the last may generate than the next (choose_together)
        if together:  # the last to finish, which end the batch together
            left = [remaining(seq) for seq in decoding]
            last = max(left)
            lead = last - max((n for n in left if n < last), default=0)
            decoding = [seq for seq, n in zip(decoding, left, strict=True) if n == last]
        drafting: list[Seq] = []
        for seq in decoding:
            if self.proposer.after_schedule:  # placeholders: drafted once scheduled
                seq.drafts = [PENDING] * self.max_drafts
                known = self.proposer.known(seq)
                if known:  # compared with what follows, verified or not
                    self.acceptance.proposed(seq.request_id, known)
            else:
                seq.drafts = self.proposer.propose(seq.request_id, self.max_drafts)
                self._proposed(seq)
            if seq.drafts:
                drafting.append(seq)
        if self.auto and drafting:
            recompute = self.rollback is not None
            rates = {seq.request_id: self.acceptance.rate(seq.request_id) for seq in drafting}
            catch_up = {seq.request_id: self._catch_up(seq, slope) for seq in drafting}
            choosing = drafting
            while True:  # (again without the sequences whose catch-up their drafts don't earn)
                proposed = [len(seq.drafts) for seq in choosing]
                chosen_rates = [rates[seq.request_id] for seq in choosing]
                if not together:
                    counts = choose(proposed, chosen_rates, decodes, base, self.times, slope,
                                    recompute)  # fmt: skip
                elif len(choosing) == len(decoding):  # (one without drafts ends it: none)
                    counts = choose_together(proposed, chosen_rates, base, self.times, slope,
                                             recompute, lead)  # fmt: skip
                else:
                    counts = [0] * len(choosing)
                unearned = {seq.request_id for seq, n in zip(choosing, counts, strict=True)
                            if n and not self._earned(seq, n, sum(counts), base, slope,
                                                      remaining, rates, catch_up)}  # fmt: skip
                if not unearned:
                    break
                choosing = [seq for seq in choosing if seq.request_id not in unearned]
            chosen = dict(zip([seq.request_id for seq in choosing], counts, strict=True))
            # whether drafts could pay at all — every one kept — this step (else exploring
            # cannot turn speculation back on: drafts too dear whatever their acceptance)
            could_pay = functools.cache(lambda: choose(
                [self.max_drafts], [1.0], decodes, base, self.times, slope, recompute)[0] > 0
            )  # fmt: skip
            plain = self.times.seconds(base, slope) or 0.0
            for seq in drafting:
                rid = seq.request_id
                n = chosen.get(rid, 0)
                cheap = catch_up[rid] <= EXPLORE_SHARE * self._idle.get(rid, 0) * plain
                seq.drafts = seq.drafts[: self._explore(seq, n, lambda c=cheap: c and could_pay())]
        self.stats["proposer_s"] += time.perf_counter() - began

    def _catch_up(self, seq: Seq, slope: float) -> float:
        """Seconds the proposer would spend catching up before drafting for `seq` (a draft
        model's own KV; before one was measured, `slope` × its share of the target's cost)."""
        if not self.proposer.after_schedule:
            return 0.0
        prior = slope * self.proposer.catch_up_share
        return self.catch_up.seconds(self.proposer.lag(seq), prior)

    def _earned(self, seq: Seq, n: int, m: int, base: int, slope: float,
                remaining: Callable[[Seq], int] | None, rates: dict[str, float],
                catch_up: dict[str, float]) -> bool:  # fmt: skip
        """Whether `seq`'s catch-up (a draft model's, spec/cost.py) is earned back by `n`
        drafts a step, the step verifying `m` in all, over the tokens it may still generate."""
        cost = catch_up[seq.request_id]
        if not cost or remaining is None:
            return True
        step = self.times.above(base, slope)
        rate = rates[seq.request_id]
        return catch_up_pays(rate, n, remaining(seq), step(0), step(m), cost)

    def _explore(self, seq: Seq, n: int, could_pay: Callable[[], bool]) -> int:
        """The cost model's n drafts, or one for a model-based proposer's sequence that had
        none for as many decodes as it waits (EXPLORE above), if drafts kept could pay."""
        rid = seq.request_id
        if n or not self.proposer.after_schedule:
            self._idle.pop(rid, None)
            self._every.pop(rid, None)  # (drafting pays again: waits start over)
            return n
        idle, every = self._idle.get(rid, 0) + 1, self._every.get(rid, EXPLORE)
        if idle < every or not could_pay():
            self._idle[rid] = idle
            return 0
        self._idle[rid], self._every[rid] = 0, min(2 * every, MAX_EXPLORE)
        return 1

    def _proposed(self, seq: Seq) -> None:
        self.acceptance.proposed(seq.request_id, seq.drafts)
        self.stats["proposed"] += len(seq.drafts)

    def before_step(self, seqs: Sequence[Seq], num_tokens: Sequence[int]) -> None:
        """The scheduled batch, before it runs: a model-based proposer drafts for every
        sequence scheduled past its last token (as many drafts as it was scheduled); with
        recurrent layers, their states are saved (spec/rollback.py)."""
        self._starts = [seq.num_computed_tokens for seq in seqs]  # (for after_step)
        self._one_off = 0.0
        counts = [(s, s.drafts_verified(n)) for s, n in zip(seqs, num_tokens, strict=True)]
        verifying = [(seq, c) for seq, c in counts if c > 0]
        if self.proposer.after_schedule:
            began = time.perf_counter()
            if verifying:
                drafted = self.proposer.draft([s for s, _ in verifying], [c for _, c in verifying])
                for (seq, _), drafts in zip(verifying, drafted, strict=True):
                    seq.drafts = drafts
                    self._proposed(seq)
                self._one_off, self.proposer.catch_up_s = self.proposer.catch_up_s, 0.0
                self.catch_up.observe(self.proposer.catch_up_positions, self._one_off)
            self.stats["proposer_s"] += time.perf_counter() - began
        if self.rollback is not None:
            for seq, _ in verifying:
                self.rollback.save(seq.request_id, seq.state_slot)

    def after_step(self, seqs: Sequence[Seq], num_tokens: Sequence[int]) -> None:
        """The step `before_step` saw ran and its kept tokens are committed: a model-based
        proposer reads what it computed (`mtp`: the target's hidden states)."""
        if self.proposer.after_schedule:
            began = time.perf_counter()
            self.proposer.after_step(seqs, num_tokens, self._starts)
            self.stats["proposer_s"] += time.perf_counter() - began

    def settle(self, seq: Seq, kept: int, verified: int) -> bool:
        """After `seq` kept `kept` tokens of a step that verified `verified` drafts: whether
        the step's computed tokens stand — False when a recurrent state was rolled back
        (some draft rejected), the kept tokens then to be computed again."""
        if self.rollback is None:
            return True
        if kept - 1 < verified and not seq.finished:
            self.rollback.restore(seq.request_id, seq.state_slot)
            self.stats["rollbacks"] += 1
            return False
        self.rollback.drop(seq.request_id)
        return True

    def observe_step(self, tokens: int, seconds: float) -> None:
        """A decode-only step (verifying drafts or not) computed `tokens` in `seconds` (less
        its proposer's one-off catch-up: t(n) is what drafting every step costs)."""
        self.times.observe(tokens, seconds - self._one_off)
        self._one_off = 0.0

    def verify(self, sampler: Sampler, seq: Seq, logits: torch.Tensor) -> SamplerOutput:
        """The tokens `seq` keeps from a step that verified its drafts, with their logprobs:
        `logits` [1 + drafts, vocab] the target's raw logits at its last token's position and
        each draft's (module docstring)."""
        drafts = seq.drafts[: logits.shape[0] - 1]
        states = [_after(seq.sampling, drafts[:j]) for j in range(len(drafts) + 1)]
        if seq.params.is_greedy or sampler.batched is not None:  # all rows in one call
            drawn = sampler(logits, states)
            kept = accepted(drafts, drawn.token_ids) + 1
            return self._count(drafts, drawn.token_ids[:kept], drawn.logprobs[:kept])
        tokens, logprobs = [], []  # the generator path: a draw per row until a mismatch
        for j, state in enumerate(states):
            drawn = sampler(logits[j : j + 1], [state])
            tokens.append(drawn.token_ids[0])
            logprobs.append(drawn.logprobs[0])
            if j == len(drafts) or tokens[-1] != drafts[j]:
                break
        return self._count(drafts, tokens, logprobs)

    def _count(self, drafts: list[int], tokens: list[int], logprobs: list) -> SamplerOutput:
        self.stats["steps"] += 1
        self.stats["drafted"] += len(drafts)
        self.drafts_histogram[len(drafts)] += 1
        self.stats["accepted"] += len(tokens) - 1
        return SamplerOutput(tokens, logprobs)

    def summary(self) -> dict:
        """The counts, with the acceptance rate (accepted / drafted), the mean tokens a
        verifying step emits (the accepted drafts + the target's own) and drafts it verifies,
        the share of decodes that verified drafts, the per-token acceptance α (kept /
        compared: the chance a draft token is kept when those before it were), the
        verifying steps by their drafts ({"drafts": steps}) and the proposer's name — what
        the performance model reads (perf/measured_acceptance.py)."""
        s = self.stats
        compared = s["observed_kept"] + s["observed_rejected"]
        steps = s["steps"]
        return {
            "proposer": self.proposer.name,
            **s,
            "acceptance_rate": s["accepted"] / s["drafted"] if s["drafted"] else None,
            "tokens_per_step": (s["accepted"] + steps) / steps if steps else None,
            "drafts_per_verify_step": s["drafted"] / steps if steps else None,
            "verify_fraction": steps / s["decodes"] if s["decodes"] else None,
            "per_token_acceptance": s["observed_kept"] / compared if compared else None,
            "drafts_histogram": {str(k): n for k, n in sorted(self.drafts_histogram.items())},
        }
