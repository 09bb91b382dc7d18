"""`layerskip`: self-speculation — the target's first L layers, its final norm and its LM head
draft (LayerSkip, Elhoushi et al. 2024; Draft & Verify, Zhang et al. 2023), no second model.

Drafting runs after the step is scheduled (`after_schedule`): the scheduler has allocated the
slots of the drafts' positions. Draft j of a sequence is the greedy token of one decode row —
its last token (j = 0) or its draft j − 1 at position computed + j — through the first L
layers (the fused native decode when the model has one, else op by op), which write those
layers' KV of the position; the verifying step then computes every layer of every position
and rewrites them. All drafting sequences go together, one row each, k passes for k drafts.

The drafts are greedy whatever the request samples: deterministic drafts, verified against
the target's own draw (spec/speculator.py). What a draft costs — L / layers of a decode step
per token — is in the step times the cost model measures (spec/cost.py), so `auto` turns
this proposer off where its acceptance does not pay for it. Models with recurrent layers are
refused: the draft passes would advance their states.

`draft_layers` (the option) is L; by default half the layers.
"""

from __future__ import annotations

from collections.abc import Sequence

from infergen.engine.request import Sequence as Seq
from infergen.engine.runner import ModelRunner
from infergen.engine.spec.proposer import PROPOSERS, DraftContext, ModelProposer
from infergen.errors import ConfigError


class LayerSkipProposer(ModelProposer):
    name = "layerskip"

    def __init__(self, runner: ModelRunner, num_layers: int):
        self.runner, self.num_layers = runner, num_layers

    @classmethod
    def from_context(cls, context: DraftContext) -> LayerSkipProposer:
        model = context.model
        layers = len(model.layers)
        if model.state_layers:
            raise ConfigError(
                "layerskip drafts with the target's first layers, which would advance the "
                "states of its recurrent layers",
                where="speculative",
                found="layerskip",
                expected=f"ngram or suffix for {model.config.architecture}",
            )
        num_layers = context.draft_layers or max(1, layers // 2)
        if not 1 <= num_layers < layers:
            raise ConfigError(
                "draft_layers out of range",
                where="draft_layers",
                found=num_layers,
                expected=f"1 to {layers - 1} (the model has {layers} layers)",
            )
        return cls(ModelRunner(model, context.kv_cache), num_layers)

    def draft(self, seqs: Sequence[Seq], counts: Sequence[int]) -> list[list[int]]:
        """counts[i] greedy drafts for each decoding sequence (module docstring)."""
        return greedy_drafts(self.runner, seqs, counts, self.num_layers)


def greedy_drafts(
    runner: ModelRunner,
    seqs: Sequence[Seq],
    counts: Sequence[int],
    num_layers: int | None = None,
    write_last: bool = False,
) -> list[list[int]]:
    """counts[i] greedy drafts of each sequence from `runner`'s model (its first `num_layers`
    layers): pass j feeds each sequence still drafting its last token (j = 0) or its draft
    j − 1 at position computed + j, one decode row each, and takes the argmax. With
    `write_last`, one more pass feeds the last draft, only to write its KV (a draft model
    keeps its own cache of every position: spec/draft.py)."""
    drafts: list[list[int]] = [[] for _ in seqs]
    tokens = [seq.token_ids[-1] for seq in seqs]  # its last token: position computed
    passes = max(counts, default=0) + (1 if write_last else 0)
    for j in range(passes):
        rows = [i for i, n in enumerate(counts) if n > j or (write_last and n == j and n)]
        if not rows:
            break
        logits = runner.run_prefix(
            [seqs[i] for i in rows],
            [tokens[i] for i in rows],
            [seqs[i].num_computed_tokens + j for i in rows],
            num_layers,
        )
        for i, token in zip(rows, logits.argmax(dim=-1).tolist(), strict=True):
            if len(drafts[i]) < counts[i]:
                drafts[i].append(token)
                tokens[i] = token
    return drafts


PROPOSERS.register("layerskip", LayerSkipProposer.from_context)
