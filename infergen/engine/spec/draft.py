"""`draft`: a draft model drafts (Leviathan et al. 2023; Chen et al. 2023) — another
checkpoint with the target's tokenizer (`draft_model=PATH`), or the target's own weights in a
cheaper format (`draft_model="self:int4"`: any weight scheme after "self:").

The draft model is built as an engine is (engine/build.py, through `DraftContext.build_draft`)
with a KV cache of its own whose blocks are the target's: the same number, indexed by the same
block tables, so the scheduler's allocation serves both and a prefix-cache hit is one for
the draft too. It keeps the KV of every position the target computes:

- `catch_up`, before each step: the draft model computes what the target computes in it for
  the sequences that verify nothing — prefill chunks and plain decodes;
- `draft`, once the step is scheduled: k passes of one decode row per drafting sequence
  (its last token, then each draft; spec/layerskip.greedy_drafts), and one more that writes
  the last draft's KV. After verification the kept drafts' draft KV is already right; the
  next pass over the rest rewrites it.

Blocks a KV tier loads back carry the target's KV only: their draft KV is stale, which makes
drafts worse (fewer kept), never outputs wrong (verification decides). The drafts are greedy
(deterministic drafts, verified against the target's own draw). Models with recurrent layers
are refused as drafts (their drafting passes would advance the state).
"""

from __future__ import annotations

from collections.abc import Sequence

from infergen.engine.request import Sequence as Seq
from infergen.engine.runner import ModelRunner
from infergen.engine.scheduler import ScheduledBatch
from infergen.engine.spec.layerskip import greedy_drafts
from infergen.engine.spec.proposer import PROPOSERS, DraftContext, ModelProposer
from infergen.errors import ConfigError

SELF = "self:"  # draft_model="self:SCHEME": the target's checkpoint in weight format SCHEME


class DraftModelProposer(ModelProposer):
    name = "draft"

    def __init__(self, runner: ModelRunner):
        self.runner = runner

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
        return cls(ModelRunner(model, kv_cache))

    def catch_up(self, seqs: Sequence[Seq], num_tokens: Sequence[int]) -> None:
        """The draft model computes the step's tokens of the sequences that verify nothing:
        their KV into its cache, no LM head (no logits are wanted)."""
        pairs = [(s, n) for s, n in zip(seqs, num_tokens, strict=True) if not s.drafts_verified(n)]
        if pairs:
            batch, _ = self.runner.prepare(
                ScheduledBatch([s for s, _ in pairs], [n for _, n in pairs])
            )
            batch.logits_indices = batch.logits_indices[:0]
            self.runner.model(batch, self.runner.kv_cache)

    def draft(self, seqs: Sequence[Seq], counts: Sequence[int]) -> list[list[int]]:
        return greedy_drafts(self.runner, seqs, counts, write_last=True)


PROPOSERS.register("draft", DraftModelProposer.from_context)
