"""`mtp`: the checkpoint's multi-token-prediction layer drafts (DeepSeek-V3; models/mtp.py),
reading the target's own final hidden states — no second model, one layer's cost per draft.

The MTP layer at position i reads the target's hidden state h_i and the token at i + 1, so it
runs one position behind the target and keeps a KV cache of its own (one layer, the target's
blocks and block tables, inside the same memory budget: engine/build.py):

- `after_step`: once a step's tokens are kept, the layer computes every position the target
  computed in it (a prefill chunk's, a decode's, a verifying decode's kept ones), from the
  hidden states that step's forward kept (`Transformer.keep_hidden`) and the tokens after
  them — exact KV for every computed position; at a sequence's last computed position its
  logits give the first draft (the token after the one the next step feeds);
- `draft`, once the next step is scheduled: draft j ≥ 2 is one decode row at the position
  after the previous one, fed the previous draft and the layer's own output there in place of
  the target's hidden state (which that position does not have yet); its KV goes to the
  slot the step allocated, and is rewritten by the next `after_step` once the target has
  computed that position.

Drafts are greedy (deterministic, verified against the target's own draw). Blocks found in the
prefix cache carry the MTP KV their first sequence computed (at a block's last position with
the token that followed there); so do blocks loaded back from a KV tier: the layer's cache
rides with the target's blocks through the tiers (`riding_cache`, kvcache/tiers/riders.py).
Not carried: a partial block's tail restored from a prefix checkpoint (kvcache/
state_checkpoints.py saves it when the prompt's last chunk is committed, before this layer
has computed it) and the positions of a finished sequence's last step (not computed: nothing
drafts for it) — at most a block's positions of stale MTP KV, which make drafts worse, never
outputs wrong. Models with recurrent layers are refused (a rolled-back step's hidden states
would be read).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from infergen.engine.request import Sequence as Seq
from infergen.engine.runner import rows_batch
from infergen.engine.spec.proposer import PROPOSERS, DraftContext, ModelProposer
from infergen.errors import ConfigError
from infergen.kvcache.paged_cache import PagedKVCache
from infergen.models.mtp import MTPLayer, mtp_cache_config
from infergen.models.transformer import Transformer
from infergen.ops.rope import RopeInputs


class MTPProposer(ModelProposer):
    name = "mtp"
    own_cache = True

    def __init__(self, model: Transformer, kv_cache: PagedKVCache):
        self.model, self.kv_cache = model, kv_cache  # the target; the MTP layer's own cache
        self.layer: MTPLayer = model.mtp[0]
        model.keep_hidden = True
        # request id → (its computed tokens then, the first draft, the layer's output there)
        self.next: dict[str, tuple[int, int, torch.Tensor]] = {}

    @classmethod
    def from_context(cls, context: DraftContext) -> MTPProposer:
        model, target = context.model, context.kv_cache
        if model.mtp is None:  # (the build step attaches them for speculative="mtp")
            raise ConfigError("the model was built without its MTP layers", where="speculative")
        if model.state_layers:
            raise ConfigError(
                "mtp with recurrent layers is not supported (a rolled-back step's hidden "
                "states would be read)",
                where="speculative",
                found=model.config.architecture,
            )
        cache = PagedKVCache(mtp_cache_config(model.config), target.num_blocks,
                             target.block_size, target.dtype, device=target.device)  # fmt: skip
        return cls(model, cache)

    @property
    def riding_cache(self) -> PagedKVCache:
        """The cache whose block b holds this proposer's KV of the target's block b positions,
        exact once `after_step` ran: the KV tiers carry it with the target's blocks."""
        return self.kv_cache

    def known(self, seq: Seq) -> list[int]:
        """The first draft, computed by `after_step` (observed even when the cost model verifies
        none: this proposer's acceptance keeps being measured for free)."""
        computed, token, _ = self.next.get(seq.request_id, (-1, 0, None))
        return [token] if computed == seq.num_computed_tokens else []

    def finish(self, request_id: str) -> None:
        self.next.pop(request_id, None)

    def after_step(self, seqs: Sequence[Seq], num_tokens: Sequence[int],
                   starts: Sequence[int]) -> None:  # fmt: skip
        """The step fed num_tokens[i] rows of seqs[i] at positions starts[i] .. (in order: its
        rows of the forward's kept hidden states): the MTP layer computes the positions kept
        (module docstring)."""
        hidden = self.model.hidden
        rows, picked, tokens, first_rows, begin = [], [], [], [], []
        row = 0
        for seq, start, n in zip(seqs, starts, num_tokens, strict=True):
            kept = seq.num_computed_tokens - start  # (a verifying decode: its accepted rows)
            if not seq.finished and kept > 0:
                picked.append(seq)
                begin.append(start)
                rows.extend(range(row, row + kept))
                tokens.append(seq.token_ids[start + 1 : start + kept + 1])
                first_rows.append(len(rows) - 1 if seq.num_uncomputed == 1 else None)
            row += n
        if not picked:
            return
        batch = rows_batch(self.kv_cache, picked, tokens, begin,
                           [r for r in first_rows if r is not None])  # fmt: skip
        out = self._forward(batch, hidden[torch.tensor(rows, device=hidden.device)])
        at = [r for r in first_rows if r is not None]
        if not at:
            return
        firsts = self.layer.logits(out[at]).argmax(dim=-1).tolist()
        drafting = [seq for seq, r in zip(picked, first_rows, strict=True) if r is not None]
        for j, (seq, token) in enumerate(zip(drafting, firsts, strict=True)):
            self.next[seq.request_id] = (seq.num_computed_tokens, token, out[at[j]])

    @torch.no_grad()
    def _forward(self, batch, hidden: torch.Tensor) -> torch.Tensor:
        batch.ropes = [RopeInputs(batch.positions, table) for table in self.model.rope_tables]
        embeds = self.model.embed_rows(batch.input_ids)
        return self.layer(embeds, hidden, batch, self.kv_cache.layer(0))

    def draft(self, seqs: Sequence[Seq], counts: Sequence[int]) -> list[list[int]]:
        """counts[i] greedy drafts of each sequence: the first from `after_step`, each next one
        a decode row fed the previous draft and output (module docstring)."""
        drafts, outs = [], []
        for seq in seqs:
            computed, token, out = self.next.get(seq.request_id, (-1, 0, None))
            if computed != seq.num_computed_tokens:  # (never expected: a wasted draft)
                token, out = seq.token_ids[-1], torch.zeros_like(self.model.norm.weight)
            drafts.append([token])
            outs.append(out)
        for j in range(1, max(counts, default=0)):
            live = [i for i, n in enumerate(counts) if n > j]
            batch = rows_batch(
                self.kv_cache,
                [seqs[i] for i in live],
                [[drafts[i][-1]] for i in live],
                [seqs[i].num_computed_tokens + j - 1 for i in live],
                list(range(len(live))),
            )
            out = self._forward(batch, torch.stack([outs[i] for i in live]))
            for k, (i, token) in enumerate(zip(live, self.layer.logits(out).argmax(-1).tolist(),
                                               strict=True)):  # fmt: skip
                drafts[i].append(token)
                outs[i] = out[k]
        return [d[:n] for d, n in zip(drafts, counts, strict=True)]


PROPOSERS.register("mtp", MTPProposer.from_context)
