"""`draft`: a draft model drafts (Leviathan et al. 2023; Chen et al. 2023) — another
checkpoint with the target's tokenizer (`draft_model=PATH`), or the target's own weights in a
cheaper format (`draft_model="self:int4"`: any weight scheme after "self:").

The draft model is built as an engine is (engine/build.py, through `DraftContext.build_draft`)
with a KV cache of its own whose blocks are the target's: the same number, indexed by the same
block tables, so the scheduler's allocation serves both and a prefix-cache hit is one for
the draft too. Its KV follows the positions the target computes, lazily:

- `draft`, once a step is scheduled, for the sequences that draft in it: first the positions
  the target computed since this sequence last drafted (a prefill chunk of the draft model,
  no logits: its own KV), then k passes of one decode row per drafting sequence (its last
  token, then each draft; spec/layerskip.greedy_drafts) and one more that writes the last
  draft's KV;
- `after_step`: a sequence that drafted has exact draft KV up to its computed tokens (the
  kept drafts' KV was written with the tokens kept); one the target computed without it
  drafting lags behind until it drafts again.

So a sequence whose drafts the cost model turns off costs the draft model nothing until it
drafts again — and then a catch-up of every position since, as dear per position as the
draft model's prefill (`lag`, `catch_up_s`): the cost model drafts for a lagging sequence
only when its drafts earn that back, and explores only while it is cheap (spec/cost.py).

A block's draft KV is known good for the content it was computed for: `valid` maps a block
to the prefix cache's chained hash of the tokens its draft KV holds. A sequence that starts
on prefix-cache hits (or KV tier loads) trusts the leading hit blocks whose hash matches and
catches up from the first that does not (a block a sequence filled without drafting, one
reused since, one a tier loaded into another block). The drafts are greedy (deterministic
drafts, verified against the target's own draw). Models with recurrent layers are refused as
drafts (their drafting passes would advance the state).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from infergen.engine.request import Sequence as Seq
from infergen.engine.runner import ModelRunner, rows_batch
from infergen.engine.spec.layerskip import greedy_drafts
from infergen.engine.spec.proposer import PROPOSERS, DraftContext, ModelProposer
from infergen.errors import ConfigError
from infergen.layers.linear import Linear

SELF = "self:"  # draft_model="self:SCHEME": the target's checkpoint in weight format SCHEME


class DraftModelProposer(ModelProposer):
    name = "draft"
    own_cache = True

    def __init__(self, runner: ModelRunner, catch_up_share: float = 1.0):
        self.runner = runner
        self.catch_up_share = catch_up_share  # its multiply-adds per position over the target's
        self.done: dict[str, int] = {}  # request id → positions with exact draft KV
        self.drafted: set[str] = set()  # the sequences that drafted in this step
        self.valid: dict[int, bytes] = {}  # block → the tokens' hash its draft KV is for

    @classmethod
    def from_context(cls, context: DraftContext) -> DraftModelProposer:
        if context.draft_model is None:
            raise ConfigError(
                "speculative='draft' needs a draft model",
                where="draft_model",
                expected="a checkpoint with the target's tokenizer, or 'self:int4' (the "
                "target's weights in a weight scheme)",
            )
        model, kv_cache = context.build_draft(context.draft_model)
        target = context.model
        if model.config.vocab_size != target.config.vocab_size:
            raise ConfigError(
                "the draft model's vocabulary is not the target's",
                where="draft_model",
                found=f"{model.config.vocab_size} tokens",
                expected=f"{target.config.vocab_size} (the same tokenizer)",
            )
        if model.state_layers:
            raise ConfigError(
                "a draft model with recurrent layers is not supported (its drafting passes "
                "would advance their states)",
                where="draft_model",
                found=context.draft_model,
            )
        windows = [(g.window, g.sinks) for g in kv_cache.groups]
        if windows != [(g.window, g.sinks) for g in context.kv_cache.groups]:
            raise ConfigError(
                "the draft model's KV cache groups (sliding windows) differ from the target's",
                where="draft_model",
                found=windows,
                expected="the target's groups: its blocks are indexed by the target's tables",
            )
        return cls(ModelRunner(model, kv_cache), _multiply_adds(model) / _multiply_adds(target))

    def lag(self, seq: Seq) -> int:
        return seq.num_computed_tokens - self.done.get(seq.request_id, seq.num_computed_tokens)

    def after_step(self, seqs: Sequence[Seq], num_tokens: Sequence[int],
                   starts: Sequence[int]) -> None:  # fmt: skip
        """Where each sequence's draft KV is exact: up to its computed tokens after a step it
        drafted in, else where it was (or the step's start, for a sequence met for the first
        time — its prefix-cache hit — or computed again after a preemption)."""
        size = self.runner.kv_cache.block_size
        for seq, start in zip(seqs, starts, strict=True):
            rid = seq.request_id
            if seq.finished:  # (finish() came first)
                continue
            if start < self.done.get(rid, start + 1):  # met first, or computed again
                self.done[rid] = self._valid_prefix(seq, start)
            if rid in self.drafted:
                self.done[rid] = seq.num_computed_tokens
                full = min(seq.num_computed_tokens // size, len(seq.block_hashes))
                for block, key in zip(seq.blocks[0][:full], seq.block_hashes[:full], strict=True):
                    self.valid[block] = key
        self.drafted.clear()

    def _valid_prefix(self, seq: Seq, upto: int) -> int:
        """How many of the sequence's first `upto` positions have good draft KV: its leading
        blocks whose draft KV was computed for their tokens (`valid`, module docstring)."""
        size = self.runner.kv_cache.block_size
        for i in range(-(-upto // size)):
            if (
                i >= len(seq.block_hashes)
                or self.valid.get(seq.blocks[0][i]) != seq.block_hashes[i]
            ):
                return min(upto, i * size)
        return upto

    def finish(self, request_id: str) -> None:
        self.done.pop(request_id, None)

    def draft(self, seqs: Sequence[Seq], counts: Sequence[int]) -> list[list[int]]:
        size = self.runner.kv_cache.block_size
        dones = [self.done.get(s.request_id, s.num_computed_tokens) for s in seqs]
        for seq, n, done in zip(seqs, counts, dones, strict=True):
            # the blocks written below hold no one's good draft KV until after_step marks them
            for block in seq.blocks[0][done // size : (seq.num_computed_tokens + n) // size + 1]:
                self.valid.pop(block, None)
        lagging = [(s, d) for s, d in zip(seqs, dones, strict=True) if d < s.num_computed_tokens]
        began = time.perf_counter()
        if lagging:  # the positions computed since they last drafted: the draft's own KV
            self.runner.model(rows_batch(
                self.runner.kv_cache,
                [s for s, _ in lagging],
                [s.token_ids[done : s.num_computed_tokens] for s, done in lagging],
                [done for _, done in lagging],
                [],
            ), self.runner.kv_cache)  # fmt: skip
        self.catch_up_s = time.perf_counter() - began
        self.catch_up_positions = sum(s.num_computed_tokens - d for s, d in lagging)
        self.drafted.update(s.request_id for s in seqs)
        return greedy_drafts(self.runner, seqs, counts, write_last=True)


def _multiply_adds(model) -> int:
    """A position's multiply-adds in the model's projections (the LM head's included)."""
    return sum(m.in_features * m.out_features for m in model.modules() if isinstance(m, Linear))


PROPOSERS.register("draft", DraftModelProposer.from_context)
