"""Model runner: turns a scheduled batch into a `ForwardBatch` and runs the model.

Owns the model weights and the KV cache tensors. Returns logits only for the sequences that
sample this step (their last prompt chunk or a decode).
"""

from __future__ import annotations

import torch

from infergen.config import ModelConfig
from infergen.engine.forward_batch import ForwardBatch
from infergen.engine.scheduler import ScheduledBatch
from infergen.kvcache.paged_cache import PagedKVCache
from infergen.models.transformer import Transformer
from infergen.ops.paged_attention import plan


class ModelRunner:
    def __init__(self, model: Transformer, kv_cache: PagedKVCache):
        self.model = model
        self.config: ModelConfig = model.config
        self.kv_cache = kv_cache
        self.block_size = kv_cache.block_size

    def prepare(self, batch: ScheduledBatch) -> tuple[ForwardBatch, list[int]]:
        """Pack the batch. Returns the ForwardBatch and the indices (into batch.seqs) of the
        sequences that sample a token after this step."""
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        query_start_loc = [0]
        seq_lens: list[int] = []
        logits_rows: list[int] = []
        sampling: list[int] = []
        bs = self.block_size
        for i, (seq, n) in enumerate(zip(batch.seqs, batch.num_tokens, strict=True)):
            start = seq.num_computed_tokens
            end = start + n
            input_ids.extend(seq.token_ids[start:end])
            positions.extend(range(start, end))
            blocks = seq.block_ids
            slots.extend(blocks[p // bs] * bs + p % bs for p in range(start, end))
            query_start_loc.append(query_start_loc[-1] + n)
            seq_lens.append(end)
            if end == seq.num_tokens:
                logits_rows.append(query_start_loc[-1] - 1)
                sampling.append(i)
        max_blocks = max(len(seq.block_ids) for seq in batch.seqs)
        block_tables = torch.zeros(len(batch.seqs), max_blocks, dtype=torch.int64)
        for i, seq in enumerate(batch.seqs):
            block_tables[i, : len(seq.block_ids)] = torch.tensor(seq.block_ids)
        attn_plan = plan(query_start_loc, seq_lens, block_tables, bs, self.config.sliding_window)
        slot_mapping = torch.tensor(slots, dtype=torch.int64)
        self.kv_cache.begin_step(slot_mapping)
        forward_batch = ForwardBatch(
            input_ids=torch.tensor(input_ids, dtype=torch.int64),
            positions=torch.tensor(positions, dtype=torch.int64),
            slot_mapping=slot_mapping,
            attn_plan=attn_plan,
            logits_indices=torch.tensor(logits_rows, dtype=torch.int64),
        )
        return forward_batch, sampling

    def run(self, batch: ScheduledBatch) -> tuple[torch.Tensor, list[int]]:
        """Forward one step; returns (logits [sampling, vocab] fp32, sampling indices)."""
        forward_batch, sampling = self.prepare(batch)
        logits = self.model(forward_batch, self.kv_cache)
        return logits, sampling
