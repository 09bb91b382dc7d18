"""`ForwardBatch`: the explicit state of one forward step (no global context).

Tokens of all scheduled sequences are packed along one axis (varlen): sequence i owns rows
query_start_loc[i]:query_start_loc[i+1].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from infergen.ops.paged_attention import AttentionPlan
from infergen.ops.rope import RopeInputs


@dataclass
class ForwardBatch:
    """Per KV cache group (kvcache/groups.py; one for most models): the new tokens' cache
    slots and the attention plan, shared by the group's layers."""

    input_ids: torch.Tensor  # [tokens] int64
    positions: torch.Tensor  # [tokens] int64
    slot_mappings: list[torch.Tensor]  # per group: [tokens] int64, cache slot of each token
    attn_plans: list[AttentionPlan]  # per group: gather indices and masks
    logits_indices: torch.Tensor  # [sampled] rows whose hidden state becomes logits
    # positions + cos/sin cache per RoPE table of the model (set by the model); `rope` is the
    # first (every layer's, unless some layers have their own base)
    ropes: list[RopeInputs] | None = None
    # recurrent layers (kvcache/state_cache.py): sequence i owns token rows
    # query_start_loc[i]:query_start_loc[i+1], its state lives in slot state_slots[i], and
    # fresh[i] says its state starts from zeros (the sequence's first computed token)
    query_start_loc: list[int] | None = None
    state_slots: torch.Tensor | None = None  # [seqs] int64
    fresh: torch.Tensor | None = None  # [seqs] bool
    # the KV press's observation window (engine/kv_press.py): the rows whose queries each
    # attention layer keeps, None: none
    capture: QueryCapture | None = None
    # logits_indices is every row in order (a decode step): the head reads h as it is
    logits_all: bool = False
    # every sampled row takes its logits' argmax (the greedy sampler's fast path): a head that
    # can compute the argmax beside the logits does (the fused decode step), into `argmax`
    greedy: bool = False
    argmax: list[int] | None = None  # (output) each logits row's argmax, where computed

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def slot_mapping(self) -> torch.Tensor:
        """The first cache group's slots (the only group of a uniform model)."""
        return self.slot_mappings[0]

    @property
    def attn_plan(self) -> AttentionPlan:
        return self.attn_plans[0]

    @property
    def rope(self) -> RopeInputs | None:
        return self.ropes[0] if self.ropes else None

    def view(self, group: int, rope_index: int) -> ForwardBatch | LayerView:
        """What one layer reads: its cache group's slots and plan, its RoPE table (the batch
        itself for group 0 and the first table: every layer of a uniform model)."""
        if group == 0 and rope_index == 0:
            return self
        return LayerView(
            self.input_ids,
            self.positions,
            self.slot_mappings[group],
            self.attn_plans[group],
            self.ropes[rope_index],
        )


class QueryCapture:
    """The queries (after norm and RoPE) of chosen token rows, kept for every attention layer
    as the layers run (models/transformer.run_layers), in layer order: a query-aware KV press's
    observation window."""

    def __init__(self, rows: torch.Tensor):
        self.rows = rows  # [n] int64 token rows of the step
        self.queries: list[torch.Tensor] = []  # per attention layer run: [n, heads, head_dim]

    def keep(self, q: torch.Tensor) -> None:
        """q [n, heads, head_dim]: this layer's queries of the rows."""
        self.queries.append(q.float())


class LayerView(NamedTuple):
    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    attn_plan: AttentionPlan
    rope: RopeInputs
