"""How a model splits over the ranks of a tensor-parallel group (issue 26): which query heads,
KV heads, MLP features and vocabulary rows each rank holds, the rank's own `ModelConfig`, and
the slice of each checkpoint tensor (by Hugging Face name) it loads.

- **Heads by KV group.** With at least as many KV heads as ranks, each rank takes a run of
  whole KV heads with their query heads (the default model's 9 query / 3 KV heads on 2
  ranks: 3 + 6 query heads, 1 + 2 KV heads; the smaller share to rank 0, which also
  schedules and samples). With fewer, the ranks sharing a KV head each
  hold a copy of it and split its query heads (one KV head on 2 ranks: 5 + 4 of 9 query
  heads, the KV head on both). Each rank's KV cache holds its own heads only.
- **MLP** gate/up rows and down_proj columns split evenly; **vocabulary** rows of the
  embedding and LM head split evenly (logits gathered, embeddings all-reduced).
- A row-parallel layer's bias (o_proj, down_proj) is added once: rank 0 loads it, the others
  zeros.
- Quantized checkpoint tensors that are sliced are dequantized first (splitting GGUF blocks
  and compressed-tensors groups along their block structure is still to come).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from infergen.config import ModelConfig
from infergen.errors import ConfigError
from infergen.ops.stored_weights import dense


def _span(n: int, parts: int, index: int) -> tuple[int, int]:
    """The index-th of `parts` near-equal runs of range(n)."""
    return index * n // parts, (index + 1) * n // parts


def blockers(config: ModelConfig) -> list[str]:
    """What in this model tensor parallelism cannot split yet (empty: it can)."""
    kinds = {config.layer_type(i) for i in range(config.num_hidden_layers)}
    return [
        what
        for what, bad in (
            ("MoE layers (expert parallelism)", config.moe is not None),
            ("latent attention (MLA)", config.mla is not None),
            ("recurrent layers", bool(kinds - {"full_attention", "sliding_attention"})),
        )
        if bad
    ]


@dataclass(frozen=True)
class Shard:
    """Rank `rank` of `size`: [first, end) of the query heads, KV heads, MLP features and
    vocabulary rows it holds; `vocab_widths`: every rank's vocabulary rows (gather order)."""

    rank: int
    size: int
    q_heads: tuple[int, int]
    kv_heads: tuple[int, int]
    intermediate: tuple[int, int]
    vocab_widths: tuple[int, ...]
    head_dim: int
    q_rows_per_head: int  # head_dim, or 2 · head_dim with an output gate (query, gate)

    @property
    def vocab(self) -> tuple[int, int]:
        """[first, end) of this rank's vocabulary rows."""
        first = sum(self.vocab_widths[: self.rank])
        return first, first + self.vocab_widths[self.rank]

    def local_config(self, config: ModelConfig) -> ModelConfig:
        """The rank's model: its heads and MLP features (the vocabulary stays whole: logits
        are gathered before anything reads them)."""
        return config.replace(
            num_attention_heads=self.q_heads[1] - self.q_heads[0],
            num_key_value_heads=self.kv_heads[1] - self.kv_heads[0],
            intermediate_size=self.intermediate[1] - self.intermediate[0],
        )

    def tensor(self, name: str, tensor):
        """The rank's part of checkpoint tensor `name` (replicated tensors as they are)."""
        for pattern, rule in _RULES:
            if pattern.search(name):
                return rule(self, tensor)
        return tensor


def _rows(span_of):
    def cut(shard: Shard, tensor):
        first, end = span_of(shard)
        return dense(tensor)[first:end]

    return cut


def _columns(span_of):
    def cut(shard: Shard, tensor):
        first, end = span_of(shard)
        return dense(tensor)[:, first:end]

    return cut


def _first_rank_only(shard: Shard, tensor):
    values = dense(tensor)
    return values if shard.rank == 0 else torch.zeros_like(values)


def _q_rows(s: Shard) -> tuple[int, int]:
    return s.q_heads[0] * s.q_rows_per_head, s.q_heads[1] * s.q_rows_per_head


def _q_features(s: Shard) -> tuple[int, int]:
    return s.q_heads[0] * s.head_dim, s.q_heads[1] * s.head_dim


def _kv_rows(s: Shard) -> tuple[int, int]:
    return s.kv_heads[0] * s.head_dim, s.kv_heads[1] * s.head_dim


# checkpoint tensor name → how it splits (the first match; none: replicated)
_RULES = (
    (re.compile(r"\.self_attn\.q_proj\.(weight|bias)$"), _rows(_q_rows)),
    (re.compile(r"\.self_attn\.[kv]_proj\.(weight|bias)$"), _rows(_kv_rows)),
    (re.compile(r"\.self_attn\.o_proj\.weight$"), _columns(_q_features)),
    (re.compile(r"\.self_attn\.o_proj\.bias$"), _first_rank_only),
    (re.compile(r"\.self_attn\.sinks$"), _rows(lambda s: s.q_heads)),
    (re.compile(r"\.mlp\.(gate|up)_proj\.(weight|bias)$"), _rows(lambda s: s.intermediate)),
    (re.compile(r"\.mlp\.down_proj\.weight$"), _columns(lambda s: s.intermediate)),
    (re.compile(r"\.mlp\.down_proj\.bias$"), _first_rank_only),
    (re.compile(r"^(model\.embed_tokens|lm_head)\.weight$"), _rows(lambda s: s.vocab)),
)


def plan(config: ModelConfig, rank: int, size: int) -> Shard:
    """Rank `rank`'s part of `config` split over `size` ranks (ConfigError: it cannot be)."""
    if blocked := blockers(config):
        raise ConfigError(
            f"tensor parallelism cannot split {', '.join(blocked)} yet",
            where=f"{config.source}: tensor_parallel_size",
            found=size,
            expected="1 for this model",
        )
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    group = heads // kv_heads  # query heads per KV head
    if kv_heads >= size:  # whole KV heads per rank, with their query heads
        kv = _span(kv_heads, size, rank)
        q = (kv[0] * group, kv[1] * group)
    elif size % kv_heads == 0 and group >= size // kv_heads:  # KV heads copied
        sharing = size // kv_heads  # ranks per KV head
        head = rank // sharing
        first, end = _span(group, sharing, rank % sharing)
        kv, q = (head, head + 1), (head * group + first, head * group + end)
    else:
        raise ConfigError(
            f"{heads} query heads in {kv_heads} KV groups do not split over {size} ranks",
            where=f"{config.source}: tensor_parallel_size",
            found=size,
            expected=f"at most {kv_heads}, or a multiple of it up to {heads}",
        )
    vocab = [_span(config.vocab_size, size, r) for r in range(size)]
    return Shard(
        rank, size, q, kv, _span(config.intermediate_size, size, rank),
        tuple(end - first for first, end in vocab),
        config.head_dim, config.head_dim * (2 if config.arch.attention_output_gate else 1),
    )  # fmt: skip
