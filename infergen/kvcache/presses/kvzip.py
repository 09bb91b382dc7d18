"""KVzip-style press (Kim et al., 2025): query-agnostic — a cached token matters as much as the
model needs it to reproduce the context. After the prompt is computed, the model reads it again
behind an instruction to repeat it, teacher-forced, attending to the prompt's cache; a token's
score is the most attention any of those re-reading queries pays it (over the queries and the
query heads sharing its KV head). No question is involved, so the kept cache serves any later
question about the text. The cost: a second pass over the prompt, read in chunks of `CHUNK`
tokens (each behind the instruction) so that the scratch KV stays small
(engine/kv_reread.py runs it)."""

from __future__ import annotations

import torch

from infergen.kvcache.presses.press import PRESSES, Press

INSTRUCTION = "\n\nRepeat the previous context exactly.\n"
CHUNK = 256  # prompt tokens re-read per pass


class KVzip(Press):
    name = "kvzip"
    description = (
        "query-agnostic: the most attention a token gets while the model re-reads the prompt "
        "behind an instruction to repeat it (a second pass over the prompt)"
    )
    rereads = True
    instruction = INSTRUCTION
    chunk = CHUNK

    def reread_scores(
        self,
        keys: torch.Tensor,  # [context + m, kv_heads, head_dim]: the context's, then the m read
        queries: torch.Tensor,  # [m, heads, head_dim]: the re-reading tokens' queries
        context: int,  # the prompt's tokens (the first keys)
        scale: float,
    ) -> torch.Tensor:  # [kv_heads, context]: the most attention each prompt token got
        tokens, kv_heads, _ = keys.shape
        reads, heads, _ = queries.shape
        expanded = keys.repeat_interleave(heads // kv_heads, dim=1)
        logits = torch.einsum("mhd,thd->hmt", queries, expanded) * scale
        position = torch.arange(tokens - reads, tokens, device=keys.device)
        future = torch.arange(tokens, device=keys.device)[None, :] > position[:, None]
        weights = logits.masked_fill_(future, float("-inf")).softmax(dim=-1)[..., :context]
        return weights.amax(dim=1).view(kv_heads, heads // kv_heads, context).amax(dim=1)


PRESSES.register("kvzip", KVzip())
