"""`Speculator`: speculative decoding inside the engine's step loop (issue 24).

Before a step, every decoding sequence that speculates gets the proposer's drafts
(`seq.drafts`, at most k); the scheduler gives it 1 + len(drafts) tokens (its last token and
the drafts), the runner feeds them and returns a logits row per position. After the step the
target's own choice at each position verifies the drafts: greedy verification keeps the
longest prefix of drafts equal to the target's choices, then the target's token after it —
1 to k + 1 tokens a step, exactly the tokens decoding one at a time would produce. The KV of
the rejected drafts' positions stays in slots past the sequence's computed tokens: never
registered in the prefix cache, overwritten by the next steps.

Which requests speculate: those without penalties or logprobs. Greedy ones keep the drafts
equal to the target's argmax; sampled ones are verified by speculative sampling
(spec/rejection.py: each emitted token distributed exactly as the target's sample), on the
sampler's generator path only (`sampled`: not with the batched Triton sampler, whose Philox
stream is keyed by token count).
Models with recurrent layers are refused at build (their state would need a checkpoint to
roll back a rejection).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

import torch

from infergen.engine.request import Sequence as Seq
from infergen.engine.sampler import process_logits
from infergen.engine.spec.proposer import Proposer
from infergen.engine.spec.rejection import verify_drafts


def accepted(drafts: Sequence[int], targets: Sequence[int]) -> int:
    """How many leading drafts equal the target's tokens at their positions."""
    a = 0
    while a < len(drafts) and drafts[a] == targets[a]:
        a += 1
    return a


class Speculator:
    def __init__(self, proposer: Proposer, k: int, sampled: bool = True):
        self.proposer, self.k = proposer, k
        self.sampled = sampled  # sampled requests speculate too (the generator path's sampler)
        # steps: decodes that verified drafts; drafted / accepted: tokens
        self.stats = {"steps": 0, "drafted": 0, "accepted": 0, "proposer_s": 0.0}

    def speculates(self, seq: Seq) -> bool:
        """Whether `seq` takes drafts (module docstring)."""
        params = seq.params
        plain = not params.has_penalties and params.logprobs is None
        return plain and (params.is_greedy or self.sampled)

    def start(self, seq: Seq) -> None:
        if self.speculates(seq):
            self.proposer.start(seq.request_id, seq.token_ids)

    def extend(self, seq: Seq, token: int) -> None:
        if self.speculates(seq):
            self.proposer.extend(seq.request_id, (token,))

    def finish(self, seq: Seq) -> None:
        if self.speculates(seq):
            self.proposer.finish(seq.request_id)

    def draft(self, running: Iterable[Seq]) -> None:
        """Drafts for this step's decodes (the others: none)."""
        began = time.perf_counter()
        for seq in running:
            decoding = seq.num_uncomputed == 1 and seq.num_tokens > len(seq.prompt_token_ids)
            seq.drafts = (
                self.proposer.propose(seq.request_id, self.k)
                if decoding and self.speculates(seq)
                else []
            )
        self.stats["proposer_s"] += time.perf_counter() - began

    def verified(self, seq: Seq, targets: Sequence[int]) -> list[int]:
        """The tokens a greedy `seq` keeps from a step that verified its drafts: `targets` are
        the target's tokens at its last token's and each draft's position."""
        drafts = seq.drafts[: len(targets) - 1]
        return self._count(drafts, list(targets[: accepted(drafts, targets) + 1]))

    def verified_sampled(self, seq: Seq, logits: torch.Tensor) -> list[int]:
        """The tokens a sampled `seq` keeps: `logits` [1 + drafts, vocab] the target's raw
        logits at its last token's and each draft's position, verified by speculative
        sampling (spec/rejection.py) on the sampler's processed distribution."""
        rows = logits.shape[0]
        state = seq.sampling
        probs = process_logits(logits, [state] * rows).softmax(dim=-1)
        drafts = seq.drafts[: rows - 1]
        return self._count(drafts, verify_drafts(probs, drafts, state.generator))

    def _count(self, drafts: list[int], kept: list[int]) -> list[int]:
        self.stats["steps"] += 1
        self.stats["drafted"] += len(drafts)
        self.stats["accepted"] += len(kept) - 1
        return kept

    def summary(self) -> dict:
        """Acceptance rate (accepted / drafted) and mean tokens per verifying step."""
        s = self.stats
        return {
            **s,
            "acceptance_rate": s["accepted"] / s["drafted"] if s["drafted"] else None,
            "tokens_per_step": (s["accepted"] + s["steps"]) / s["steps"] if s["steps"] else None,
        }
