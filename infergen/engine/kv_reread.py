"""The second pass of a re-reading KV press (KVzip, kvcache/presses/kvzip.py): after a prompt
is computed, the model reads it again behind the press's instruction, `chunk` tokens at a time,
teacher-forced at the positions right after the prompt and attending to its cache; every
attention layer's queries of those tokens score the prompt's cached tokens
(`Press.reread_scores`), the most of any chunk kept.

The re-read tokens' KV goes to scratch: the sequence's blocks are extended for a chunk
(fresh blocks, released after it; the prompt's last, partial block is written past the
prompt, where the sequence's next tokens overwrite it), so nothing of the pass stays in the
cache. The pass is the press's cost: one more prefill of the prompt, in chunks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from infergen.engine.request import Sequence as Seq
from infergen.engine.runner import rows_batch
from infergen.kvcache.block_pool import BlockPool
from infergen.kvcache.paged_cache import PagedKVCache
from infergen.kvcache.presses import Press
from infergen.kvcache.presses.compact import cache_slots
from infergen.layers.forward_batch import ForwardBatch, QueryCapture


def reread_scores(
    seq: Seq,
    press: Press,
    instruction: list[int],
    kv_cache: PagedKVCache,
    pool: BlockPool,
    forward: Callable[[ForwardBatch], torch.Tensor],
    attention_layers: Sequence[int],
    scale: float,
) -> list[torch.Tensor] | None:
    """Per attention layer (run order) the prompt's scores [kv_heads, prompt tokens] from
    re-reading it (full-attention layers; None for a windowed one), or None when the pool
    has no room for a chunk's scratch blocks."""
    context, size = seq.num_computed_tokens, kv_cache.block_size
    group_of = {layer: g for g, group in enumerate(kv_cache.groups) for layer in group.layers}
    best: list[torch.Tensor | None] = [None] * len(attention_layers)
    held = [list(blocks) for blocks in seq.blocks]
    for start in range(0, context, press.chunk):
        tokens = instruction + seq.token_ids[start : min(context, start + press.chunk)]
        total = -(-(context + len(tokens)) // size)
        extra = sum(max(0, total - len(blocks)) for blocks in held)
        if pool.num_free < extra:
            return None
        seq.blocks = [blocks + [pool.allocate() for _ in range(total - len(blocks))]
                      for blocks in held]  # fmt: skip
        try:
            batch = rows_batch(kv_cache, [seq], [tokens], [context], [])
            batch.capture = QueryCapture(torch.arange(len(tokens)))
            forward(batch)
            for j, layer in enumerate(attention_layers):
                g = group_of[layer]
                if kv_cache.groups[g].window is not None:
                    continue
                slots = cache_slots(seq.blocks[g], context + len(tokens), size, kv_cache.device)
                kv = kv_cache.layer(layer)
                keys, _ = kv.fmt.read(kv, slots, torch.float32)
                scores = press.reread_scores(keys, batch.capture.queries[j], context, scale)
                best[j] = scores if best[j] is None else torch.maximum(best[j], scores)
        finally:
            for blocks, before in zip(seq.blocks, held, strict=True):
                pool.release(blocks[len(before) :])
            seq.blocks = [list(blocks) for blocks in held]
    return best
