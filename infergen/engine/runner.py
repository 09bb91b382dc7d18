"""Model runner: turns a scheduled batch into a `ForwardBatch` and runs the model.

Owns the model weights and the KV cache tensors. Returns logits only for the sequences that
sample this step (their last prompt chunk or a decode). The step's inputs are built on the
host from the scheduler's lists and moved to the cache's device once per step.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, NamedTuple

import torch

from infergen.config import ModelConfig
from infergen.engine.request import Sequence
from infergen.engine.sampler import argmax_only
from infergen.engine.scheduler import ScheduledBatch
from infergen.kvcache.paged_cache import PagedKVCache
from infergen.layers.forward_batch import ForwardBatch, QueryCapture
from infergen.models.transformer import Transformer
from infergen.ops.paged_attention import plan
from infergen.ops.to_device import to_device

if TYPE_CHECKING:  # (workers.py builds engines: it imports this module's importers)
    from infergen.engine.workers import Workers


class ModelRunner:
    def __init__(self, model: Transformer, kv_cache: PagedKVCache):
        self.model = model
        self.config: ModelConfig = model.config
        self.kv_cache = kv_cache
        self.block_size = kv_cache.block_size
        self.device = kv_cache.device  # the step's inputs are built on the host, moved here
        # tensor parallelism (engine/workers.py): the other ranks, sent each forward first
        self.workers: Workers | None = None

    def forward(self, batch: ForwardBatch, num_layers: int | None = None) -> torch.Tensor:
        """The model on `batch` (every rank of a tensor-parallel group: the workers get it
        first); logits [len(batch.logits_indices), vocab] fp32."""

        def run() -> torch.Tensor:  # (all layers: the model called as it always was)
            if num_layers is None:
                return self.model(batch, self.kv_cache)
            return self.model(batch, self.kv_cache, num_layers=num_layers)

        return run() if self.workers is None else self.workers.forward(batch, num_layers, run)

    def prepare(self, batch: ScheduledBatch) -> tuple[ForwardBatch, list[int]]:
        """Pack the batch. Returns the ForwardBatch and the indices (into batch.seqs) of the
        sequences that sample a token after this step. A decode verifying drafts (scheduled
        past its last token: the first n - 1 of `seq.drafts`) feeds them as its next inputs and
        gets a logits row per position: its last token's and each draft's; its tokens attend as
        decode rows (ops/paged_attention.plan), so a verifying step is still a decode step."""
        tokens: list[list[int]] = []
        logits_rows: list[int] = []
        sampling: list[int] = []
        verifying: set[int] = set()  # decodes verifying drafts: a decode row per token
        row = 0
        for i, (seq, n) in enumerate(zip(batch.seqs, batch.num_tokens, strict=True)):
            start = seq.num_computed_tokens
            end = start + n
            drafted = seq.drafts_verified(n)  # > 0: a decode verifying that many drafts
            tokens.append(seq.token_ids[start:end] + seq.drafts[:drafted] if drafted
                          else seq.token_ids[start:end])  # fmt: skip
            if drafted:
                verifying.add(i)
            row += n
            if end >= seq.num_tokens:  # its last token's logits (and each draft's)
                logits_rows.extend(range(row - 1 - drafted, row))
                sampling.append(i)
        states = None
        if self.kv_cache.states is not None:
            states = dict(
                state_slots=torch.tensor([seq.state_slot for seq in batch.seqs]),
                fresh=torch.tensor([seq.num_computed_tokens == 0 for seq in batch.seqs]),
            )
        starts = [seq.num_computed_tokens for seq in batch.seqs]
        forward_batch = rows_batch(self.kv_cache, batch.seqs, tokens, starts, logits_rows,
                                   verifying, states)  # fmt: skip
        return forward_batch, sampling

    @torch.no_grad()
    def run_prefix(
        self,
        seqs: list[Sequence],
        tokens: list[int],
        positions: list[int],
        num_layers: int | None = None,
    ) -> torch.Tensor:
        """Logits [seqs, vocab] fp32 of one token per sequence — `tokens[i]` at
        `positions[i]`, a decode row over its prefix — through the model's first
        `num_layers` layers (None: all), its final norm and LM head (the drafts of
        engine/spec/layerskip.py and draft.py). Those layers' KV of the positions is written to the
        sequences' slots, which must be allocated (the verifying step rewrites them)."""
        forward_batch = rows_batch(
            self.kv_cache, seqs, [[t] for t in tokens], positions, list(range(len(seqs)))
        )
        return self.forward(forward_batch, num_layers)

    def run(self, batch: ScheduledBatch, capture: QueryCapture | None = None) -> StepLogits:
        """Forward one step: its logits rows, the sequences that sample from them and, for a
        batch whose every sampled row is greedy (`argmax_only`), the rows' argmax where the
        model's head computed it. `capture`: the rows whose queries the attention layers keep
        (engine/kv_press.py)."""
        forward_batch, sampling = self.prepare(batch)
        forward_batch.capture = capture
        seqs = [batch.seqs[i] for i in sampling]
        forward_batch.greedy = (
            bool(seqs)
            and forward_batch.logits_all
            and len(seqs) == len(batch.seqs)
            and argmax_only([seq.sampling for seq in seqs])
        )
        logits = self.forward(forward_batch)
        return StepLogits(logits, sampling, forward_batch.argmax)


class StepLogits(NamedTuple):
    """A step's logits [rows, vocab] fp32, the indices (into the batch's sequences) of those
    that sample, and each row's argmax where the head computed it (else None)."""

    logits: torch.Tensor
    sampling: list[int]
    argmax: list[int] | None


def rows_batch(
    kv_cache: PagedKVCache,
    seqs: list[Sequence],
    tokens: list[list[int]],
    starts: list[int],
    logits_rows: list[int],
    as_decodes: set[int] = frozenset(),
    states: dict | None = None,
) -> ForwardBatch:
    """A ForwardBatch of `tokens[i]` at positions starts[i], starts[i] + 1, ... of `seqs[i]`,
    each attending over its sequence's positions up to itself through the sequences' block
    tables of `kv_cache`'s groups (their KV written to those slots, which must be allocated);
    logits for rows `logits_rows`. The sequences `as_decodes` attend as decode rows
    (ops/paged_attention.plan); `states`: the recurrent layers' state slots and fresh flags
    (ForwardBatch). On the cache's device."""
    counts = [len(t) for t in tokens]
    positions = [p for s, n in zip(starts, counts, strict=True) for p in range(s, s + n)]
    position_tensor = torch.tensor(positions, dtype=torch.int64)
    query_start_loc = list(itertools.accumulate(counts, initial=0))
    seq_lens = [start + n for start, n in zip(starts, counts, strict=True)]
    slot_mappings, plans = [], []
    for g, group in enumerate(kv_cache.groups):
        # (built as lists, one tensor each: a decode step's few rows would otherwise cost more
        # in torch's per-op overhead than the model's layers take per token)
        rows = _padded_tables(seqs, g)
        tables = torch.tensor(rows, dtype=torch.int64)
        # a pressed sequence's cache index of position p: p − removed (engine/kv_press.py)
        removed = [seq.removed(g) for seq in seqs]
        lens = [n - r for n, r in zip(seq_lens, removed, strict=True)]
        slot_mappings.append(_new_slots(rows, counts, positions, removed, kv_cache.block_size))
        plans.append(plan(query_start_loc, lens, tables, kv_cache.block_size, group.window,
                          group.sinks, as_decodes))  # fmt: skip
    if slot_mappings:  # (a model without attention layers has none)
        kv_cache.begin_step(slot_mappings[0])
    forward_batch = ForwardBatch(
        input_ids=torch.tensor([t for row in tokens for t in row], dtype=torch.int64),
        positions=position_tensor,
        slot_mappings=slot_mappings,
        attn_plans=plans,
        logits_indices=torch.tensor(logits_rows, dtype=torch.int64),
        logits_all=logits_rows == list(range(len(positions))),
        **({} if states is None else dict(query_start_loc=query_start_loc, **states)),
    )
    if kv_cache.device.type != "cpu":
        forward_batch = to_device(forward_batch, kv_cache.device)
    return forward_batch


def _padded_tables(seqs: list[Sequence], group: int) -> list[list[int]]:
    """Each sequence's block ids of cache group `group`, padded with 0 to the longest (a
    block that left a window, marked negative, reads as 0: nothing reads it)."""
    tables = [seq.blocks[group] for seq in seqs]
    width = max(map(len, tables))
    return [
        (t if not t or min(t) >= 0 else [max(b, 0) for b in t]) + [0] * (width - len(t))
        for t in tables
    ]


def _new_slots(
    tables: list[list[int]], counts: list[int], positions: list[int], removed: list[int],
    block_size: int,
) -> torch.Tensor:  # fmt: skip
    """[tokens] cache slot of each new token: sequence i's `counts[i]` tokens at their
    positions less `removed[i]` (its cache index), in its block table row `tables[i]`."""
    slots, row = [], 0
    for table, n, gone in zip(tables, counts, removed, strict=True):
        for p in positions[row : row + n]:
            index = p - gone
            slots.append(table[index // block_size] * block_size + index % block_size)
        row += n
    return torch.tensor(slots, dtype=torch.int64)
