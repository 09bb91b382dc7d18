"""How a model splits over the ranks of a tensor-parallel group (issue 26): which query heads,
KV heads, MLP features, experts and vocabulary rows each rank holds, the rank's own
`ModelConfig`, and the slice of each checkpoint tensor (by Hugging Face name) it loads.

- **Heads by KV group.** With at least as many KV heads as ranks, each rank takes a run of
  whole KV heads with their query heads (the default model's 9 query / 3 KV heads on 2
  ranks: 3 + 6 query heads, 1 + 2 KV heads; the smaller share to rank 0, which also
  schedules and samples). With fewer, the ranks sharing a KV head each
  hold a copy of it and split its query heads (one KV head on 2 ranks: 5 + 4 of 9 query
  heads, the KV head on both). Each rank's KV cache holds its own heads only.
- **Latent attention (MLA)** splits its query heads (unevenly where they do not divide, the
  smaller share to rank 0): q_proj / q_b_proj and kv_b_proj rows per head, o_proj columns per
  head. The latent path (q_a_proj, q_a_layernorm, kv_a_proj_with_mqa, kv_a_layernorm) is
  replicated, and so is the KV cache: every head reads the whole latent, which cannot be
  split, so each rank's cache holds every token's full latent + RoPE key (the same entries).
- **MLP** gate/up rows and down_proj columns split evenly; **vocabulary** rows of the
  embedding and LM head split evenly (logits gathered, embeddings all-reduced).
- **Experts (MoE).** The router is replicated: every rank routes every token (tokens are
  replicated under tensor parallelism). Without expert parallelism each routed expert splits
  like a dense MLP (its gate/up rows and down columns; GPT-OSS's fused `gate_up_proj`
  [experts, hidden, 2·inter] keeps its interleaved gate/up column pairs whole). With
  `expert_parallel_size` equal to the group's size, rank r holds a contiguous run of whole
  experts instead (`experts`), computes only their contributions (zeros for the others'
  tokens), and the layer's one all-reduce after the feed-forward combines them: dispatch is
  implicit (every rank already has every token) and the combine is that all-reduce. Shared
  experts split like a dense MLP either way.
- A row-parallel layer's bias (o_proj, down_proj, an expert's down bias) is added once: the
  rank holding it whole loads it (rank 0 when the features are split), the others zeros.
- **Quantized weights** split as stored (ops/stored_weights.py `cut`): GGUF blocks and
  compressed-tensors codes keep their encoding — rows always (each row's blocks and scales
  are its own), columns where the cut falls between blocks of 32 inputs (per-row int8 / FP8
  codes: anywhere), so each rank computes on the same values one process does; a cut inside
  a block dequantizes that tensor on the rank. A weight scheme that quantizes at load
  quantizes each rank's slice: group formats give one process's codes when the cut is
  between groups; per-row (int8) and per-projection (fp8_e4m3, nvfp4) scales of a
  row-parallel slice are the rank's own. The fused expert tensors (GPT-OSS) are dequantized
  before slicing.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import torch

from infergen.config import ModelConfig
from infergen.errors import ConfigError
from infergen.ops.stored_weights import cut, dense


def _span(n: int, parts: int, index: int) -> tuple[int, int]:
    """The index-th of `parts` near-equal runs of range(n)."""
    return index * n // parts, (index + 1) * n // parts


def blockers(config: ModelConfig) -> list[str]:
    """What in this model tensor parallelism cannot split yet (empty: it can)."""
    kinds = {config.layer_type(i) for i in range(config.num_hidden_layers)}
    recurrent = bool(kinds - {"full_attention", "sliding_attention"})
    return ["recurrent layers"] if recurrent else []


@dataclass(frozen=True)
class Shard:
    """Rank `rank` of `size`: [first, end) of the query heads, KV heads, MLP features, routed
    experts, each routed expert's features, shared-expert features and vocabulary rows it
    holds; `vocab_widths`: every rank's vocabulary rows (gather order)."""

    rank: int
    size: int
    q_heads: tuple[int, int]
    kv_heads: tuple[int, int]
    intermediate: tuple[int, int]
    vocab_widths: tuple[int, ...]
    head_dim: int
    q_rows_per_head: int  # head_dim, 2 · head_dim with an output gate; MLA: nope + rope dims
    o_columns_per_head: int  # head_dim; MLA: v_head_dim
    kv_b_rows_per_head: int = 0  # MLA: nope + v dims (kv_b_proj)
    experts: tuple[int, int] = (0, 0)  # routed experts held (all without expert parallelism)
    expert_features: tuple[int, int] = (0, 0)  # of each held expert (all with it)
    shared_features: tuple[int, int] = (0, 0)  # of the shared experts
    expert_parallel: bool = False

    @property
    def vocab(self) -> tuple[int, int]:
        """[first, end) of this rank's vocabulary rows."""
        first = sum(self.vocab_widths[: self.rank])
        return first, first + self.vocab_widths[self.rank]

    def local_config(self, config: ModelConfig) -> ModelConfig:
        """The rank's model: its heads, MLP and expert features (the vocabulary stays whole:
        logits are gathered before anything reads them; the router keeps every expert: which
        of them this rank holds is `experts`)."""
        changes = {}
        if config.moe is not None:
            changes["moe"] = dataclasses.replace(
                config.moe,
                intermediate_size=_width(self.expert_features),
                shared_intermediate_size=_width(self.shared_features),
            )
        return config.replace(
            num_attention_heads=_width(self.q_heads),
            num_key_value_heads=_width(self.kv_heads),
            intermediate_size=_width(self.intermediate),
            **changes,
        )

    def tensor(self, name: str, tensor):
        """The rank's part of checkpoint tensor `name` (replicated tensors as they are)."""
        for pattern, rule in _RULES:
            if pattern.search(name):
                return rule(self, tensor)
        return tensor


def _width(span: tuple[int, int]) -> int:
    return span[1] - span[0]


def _rows(span_of):
    def rows(shard: Shard, tensor):
        first, end = span_of(shard)
        if len(tensor.shape) == 2:  # a matrix: kept as stored (GGUF blocks, codes: any rows)
            return cut(tensor, rows=(first, end))
        return dense(tensor)[first:end]

    return rows


def _columns(span_of):
    def columns(shard: Shard, tensor):  # kept as stored when the cut falls between blocks
        return cut(tensor, columns=span_of(shard))

    return columns


def _first_rank_only(shard: Shard, tensor):
    values = dense(tensor)
    return values if shard.rank == 0 else torch.zeros_like(values)


def _q_rows(s: Shard) -> tuple[int, int]:
    return s.q_heads[0] * s.q_rows_per_head, s.q_heads[1] * s.q_rows_per_head


def _o_columns(s: Shard) -> tuple[int, int]:
    return s.q_heads[0] * s.o_columns_per_head, s.q_heads[1] * s.o_columns_per_head


def _kv_rows(s: Shard) -> tuple[int, int]:
    return s.kv_heads[0] * s.head_dim, s.kv_heads[1] * s.head_dim


def _kv_b_rows(s: Shard) -> tuple[int, int]:
    return s.q_heads[0] * s.kv_b_rows_per_head, s.q_heads[1] * s.kv_b_rows_per_head


def _expert_bias(shard: Shard, values: torch.Tensor) -> torch.Tensor:
    """An expert's down bias: whole on the rank holding the expert whole (expert
    parallelism), else on rank 0 only (added once by the all-reduce)."""
    return values if shard.expert_parallel or shard.rank == 0 else torch.zeros_like(values)


# GPT-OSS's fused experts: [experts, ...] tensors, the rank's experts, then its features
def _fused_gate_up(shard: Shard, tensor):  # [E, hidden, 2·inter], (gate, up) column pairs
    (e0, e1), (f0, f1) = shard.experts, shard.expert_features
    return dense(tensor)[e0:e1, :, 2 * f0 : 2 * f1]


def _fused_gate_up_bias(shard: Shard, tensor):  # [E, 2·inter], (gate, up) pairs
    (e0, e1), (f0, f1) = shard.experts, shard.expert_features
    return dense(tensor)[e0:e1, 2 * f0 : 2 * f1]


def _fused_down(shard: Shard, tensor):  # [E, inter, hidden]
    (e0, e1), (f0, f1) = shard.experts, shard.expert_features
    return dense(tensor)[e0:e1, f0:f1]


def _fused_down_bias(shard: Shard, tensor):  # [E, hidden]
    e0, e1 = shard.experts
    return _expert_bias(shard, dense(tensor)[e0:e1])


_SHARED = r"\.mlp\.shared_experts?\."
_EXPERT = r"\.mlp\.experts\.\d+\."  # DeepSeek / Qwen3-Next: one module per expert (the rank
# loads only the experts it holds)

# checkpoint tensor name → how it splits (the first match; none: replicated)
_RULES = (
    (re.compile(r"\.self_attn\.q_(b_)?proj\.(weight|bias)$"), _rows(_q_rows)),
    (re.compile(r"\.self_attn\.[kv]_proj\.(weight|bias)$"), _rows(_kv_rows)),
    (re.compile(r"\.self_attn\.kv_b_proj\.weight$"), _rows(_kv_b_rows)),
    (re.compile(r"\.self_attn\.o_proj\.weight$"), _columns(_o_columns)),
    (re.compile(r"\.self_attn\.o_proj\.bias$"), _first_rank_only),
    (re.compile(r"\.self_attn\.sinks$"), _rows(lambda s: s.q_heads)),
    (re.compile(r"\.mlp\.(gate|up)_proj\.(weight|bias)$"), _rows(lambda s: s.intermediate)),
    (re.compile(r"\.mlp\.down_proj\.weight$"), _columns(lambda s: s.intermediate)),
    (re.compile(r"\.mlp\.down_proj\.bias$"), _first_rank_only),
    (re.compile(_SHARED + r"(gate|up)_proj\.(weight|bias)$"), _rows(lambda s: s.shared_features)),
    (re.compile(_SHARED + r"down_proj\.weight$"), _columns(lambda s: s.shared_features)),
    (re.compile(_SHARED + r"down_proj\.bias$"), _first_rank_only),
    (re.compile(_EXPERT + r"(gate|up)_proj\.(weight|bias)$"), _rows(lambda s: s.expert_features)),
    (re.compile(_EXPERT + r"down_proj\.weight$"), _columns(lambda s: s.expert_features)),
    (re.compile(_EXPERT + r"down_proj\.bias$"), lambda s, t: _expert_bias(s, dense(t))),
    (re.compile(r"\.mlp\.experts\.gate_up_proj$"), _fused_gate_up),
    (re.compile(r"\.mlp\.experts\.gate_up_proj_bias$"), _fused_gate_up_bias),
    (re.compile(r"\.mlp\.experts\.down_proj$"), _fused_down),
    (re.compile(r"\.mlp\.experts\.down_proj_bias$"), _fused_down_bias),
    (re.compile(r"^(model\.embed_tokens|lm_head)\.weight$"), _rows(lambda s: s.vocab)),
)


def _refuse(config: ModelConfig, what: str, found, expected: str, option: str) -> ConfigError:
    return ConfigError(what, where=f"{config.source}: {option}", found=found, expected=expected)


def _heads(config: ModelConfig, rank: int, size: int):
    """(query heads, KV heads) of rank `rank`."""
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    if config.mla is not None:  # every head reads the one latent: split the heads alone
        if heads < size:
            raise _refuse(config, f"{heads} latent-attention heads do not split over {size} "
                          "ranks", size, f"at most {heads}", "tensor_parallel_size")  # fmt: skip
        q = _span(heads, size, rank)
        return q, q  # (the rank's model: as many "KV heads" as heads, each its own K and V)
    group = heads // kv_heads  # query heads per KV head
    if kv_heads >= size:  # whole KV heads per rank, with their query heads
        kv = _span(kv_heads, size, rank)
        return (kv[0] * group, kv[1] * group), kv
    if size % kv_heads == 0 and group >= size // kv_heads:  # KV heads copied
        sharing = size // kv_heads  # ranks per KV head
        head = rank // sharing
        first, end = _span(group, sharing, rank % sharing)
        return (head * group + first, head * group + end), (head, head + 1)
    raise _refuse(config, f"{heads} query heads in {kv_heads} KV groups do not split over "
                  f"{size} ranks", size, f"at most {kv_heads}, or a multiple of it up to "
                  f"{heads}", "tensor_parallel_size")  # fmt: skip


def _experts(config: ModelConfig, rank: int, size: int, expert_parallel_size: int):
    """(experts, features of each, shared-expert features) of rank `rank`."""
    if expert_parallel_size not in (1, size):
        raise _refuse(config, "expert parallelism splits the experts over the tensor-parallel "
                      "ranks", expert_parallel_size, f"1 or {size} (the tensor_parallel_size)",
                      "expert_parallel_size")  # fmt: skip
    moe = config.moe
    if moe is None:
        if expert_parallel_size > 1:
            raise _refuse(config, "expert parallelism needs a mixture-of-experts model",
                          expert_parallel_size, "1 for this model (it has no experts)",
                          "expert_parallel_size")  # fmt: skip
        return (0, 0), (0, 0), (0, 0)
    shared = _span(moe.shared_intermediate_size, size, rank)
    if expert_parallel_size == 1:  # every expert, a slice of each
        return (0, moe.num_experts), _span(moe.intermediate_size, size, rank), shared
    if moe.num_experts < size:
        raise _refuse(config, f"{moe.num_experts} experts do not split over {size} ranks",
                      expert_parallel_size, f"1, or at most {moe.num_experts} ranks",
                      "expert_parallel_size")  # fmt: skip
    return _span(moe.num_experts, size, rank), (0, moe.intermediate_size), shared


def plan(config: ModelConfig, rank: int, size: int, expert_parallel_size: int = 1) -> Shard:
    """Rank `rank`'s part of `config` split over `size` ranks, its routed experts whole over
    them with `expert_parallel_size` == size (ConfigError: it cannot be)."""
    if blocked := blockers(config):
        raise _refuse(config, f"tensor parallelism cannot split {', '.join(blocked)} yet",
                      size, "1 for this model", "tensor_parallel_size")  # fmt: skip
    q, kv = _heads(config, rank, size)
    experts, expert_features, shared = _experts(config, rank, size, expert_parallel_size)
    vocab = [_span(config.vocab_size, size, r) for r in range(size)]
    mla, head_dim = config.mla, config.head_dim
    if mla is not None:
        qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim
        per_head = dict(q_rows_per_head=qk, o_columns_per_head=mla.v_head_dim,
                        kv_b_rows_per_head=mla.qk_nope_head_dim + mla.v_head_dim)  # fmt: skip
    else:
        gate = 2 if config.arch.attention_output_gate else 1
        per_head = dict(q_rows_per_head=head_dim * gate, o_columns_per_head=head_dim)
    return Shard(
        rank, size, q, kv, _span(config.intermediate_size, size, rank),
        tuple(end - first for first, end in vocab), head_dim, **per_head,
        experts=experts, expert_features=expert_features, shared_features=shared,
        expert_parallel=expert_parallel_size > 1,
    )  # fmt: skip
