"""`ForwardBatch`: the explicit state of one forward step (no global context).

Tokens of all scheduled sequences are packed along one axis (varlen): sequence i owns rows
query_start_loc[i]:query_start_loc[i+1].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from infergen.ops.paged_attention import AttentionPlan
from infergen.ops.rope import RopeInputs


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor  # [tokens] int64
    positions: torch.Tensor  # [tokens] int64
    slot_mapping: torch.Tensor  # [tokens] int64, KV cache slot of each token
    attn_plan: AttentionPlan  # gather indices and masks, shared by every layer
    logits_indices: torch.Tensor  # [sampled] rows whose hidden state becomes logits
    rope: RopeInputs | None = None  # positions + cos/sin cache, set by the model

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])
