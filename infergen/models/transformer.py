"""The generic decoder-only transformer every architecture in arch.py is assembled into.

    h = embed(tokens)
    for each layer:  h += attn(norm(h));  h += mlp(norm(h))
    logits = lm_head(norm(h))        (lm_head = embed when embeddings are tied)

The residual add is fused into the next norm: each sublayer returns its output as a pending
`delta` and the following RMSNorm does h += delta; y = norm(h) in one op. Architectures with
sandwich norms (Gemma) normalise each sublayer's output before it becomes the delta.
Only the rows in `ForwardBatch.logits_indices` go through the final norm and the LM head:
a 512-token prefill computes one row of logits, not 512.
"""

from __future__ import annotations

import math
import re
import weakref
from collections.abc import Mapping

import torch
from torch import nn

from infergen import profiling
from infergen.config import ModelConfig
from infergen.errors import ConfigError
from infergen.kvcache.groups import cache_groups
from infergen.kvcache.paged_cache import PagedKVCache
from infergen.layers.attention import Attention
from infergen.layers.forward_batch import ForwardBatch
from infergen.layers.linear import Linear
from infergen.layers.mla import MLAttention
from infergen.layers.mlp import GatedMLP
from infergen.layers.moe import MoE
from infergen.layers.norm import RMSNorm
from infergen.layers.state_mixer import STATE_MIXERS, ParallelMixer, StateMixer
from infergen.layers.tensor_parallel import TPGroup
from infergen.models import fused_decode  # noqa: F401  (registers the "fused" fast path)
from infergen.models.fast_paths import FAST_PATHS, FastPathRunner
from infergen.models.sharding import plan
from infergen.ops.rope import RopeInputs, cos_sin_cache
from infergen.ops.stored_weights import dense


def _attention(config: ModelConfig, dtype, kernels: str, group: int, rope_index: int):
    attention = MLAttention if config.mla is not None else Attention
    return attention(config, dtype, kernels, group, rope_index)


def _recurrent(kind: str):
    def build(config: ModelConfig, dtype, kernels: str, group: int, rope_index: int):
        return StateMixer(kind, config, dtype, kernels)  # a per-sequence state, no KV

    return build


def _attention_beside_ssm(config: ModelConfig, dtype, kernels: str, group, rope_index):
    attention = _attention(config, dtype, kernels, group, rope_index)
    return ParallelMixer(attention, config, dtype, kernels)  # Falcon-H1


# layer type (ModelConfig.layer_types) → the module in the layer's mixer seat
MIXERS = {
    "full_attention": _attention,
    "sliding_attention": _attention,
    **{kind: _recurrent(kind) for kind in STATE_MIXERS},
    "attention_mamba": _attention_beside_ssm,
}


class DecoderLayer(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        dtype: torch.dtype,
        kernels: str,
        index: int = 0,
        group: int = 0,
        rope_index: int = 0,
        tp: TPGroup | None = None,  # a tensor-parallel rank: its sublayers' sums all-reduced
        experts: tuple[int, int] | None = None,  # the routed experts held (None: all)
    ):
        super().__init__()
        self.tp = tp
        eps, hidden = config.rms_norm_eps, config.hidden_size
        self.attn_norm = RMSNorm(hidden, eps, dtype, kernels)
        mixer = MIXERS[config.layer_type(index)]
        self.attn = mixer(config, dtype, kernels, group, rope_index)
        self.mlp_norm = self.mlp = None  # Mamba2's layers are the mixer alone
        if config.arch.mlp != "none":
            self.mlp_norm = RMSNorm(hidden, eps, dtype, kernels)
            moe = config.moe is not None and config.moe.is_moe_layer(index)
            self.mlp = (
                MoE(config, dtype, kernels, experts) if moe else GatedMLP(config, dtype, kernels)
            )
        sandwich = config.arch.sandwich_norms
        self.post_attn_norm = RMSNorm(hidden, eps, dtype, kernels) if sandwich else None
        self.post_mlp_norm = RMSNorm(hidden, eps, dtype, kernels) if sandwich else None

    def forward(
        self,
        h: torch.Tensor,  # [tokens, hidden] residual stream, updated in place
        delta: torch.Tensor | None,  # previous layer's MLP output, not yet added to h
        batch: ForwardBatch,
        kv: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        attn_out = self.attn(self.attn_norm(h, delta), batch, kv)
        if self.tp is not None:  # (each rank's o_proj summed its own heads)
            self.tp.all_reduce(attn_out)
        if self.post_attn_norm is not None:
            attn_out = self.post_attn_norm(attn_out)
        if self.mlp is None:
            return attn_out
        out = self.mlp(self.mlp_norm(h, attn_out))
        if self.tp is not None:  # (each rank's down_proj summed its own features; with
            self.tp.all_reduce(out)  # expert parallelism, its own experts' tokens)
        if self.post_mlp_norm is not None:
            out = self.post_mlp_norm(out)
        return out  # the new pending delta

    def queries(
        self, h: torch.Tensor, delta: torch.Tensor | None, rows: torch.Tensor, rope: RopeInputs
    ) -> torch.Tensor:
        """The attention's queries [rows, heads, head_dim] of token rows `rows` of the
        residual stream h (+ its pending delta; neither is changed), before the layer runs."""
        pending = None if delta is None else delta.index_select(0, rows)
        x = self.attn_norm(h.index_select(0, rows), pending)  # (on copies: h stays as it is)
        return self.attn.queries(x, RopeInputs(rope.positions.index_select(0, rows), rope.cache))

    def load(self, get: callable, prefix: str, norm_offset: float, mlp_norm: str) -> None:
        """Checkpoint tensors by Hugging Face name; norm weights plus `norm_offset`."""
        norms = [(self.attn_norm, "input_layernorm")]
        if self.mlp_norm is not None:
            norms.append((self.mlp_norm, mlp_norm))
        if self.post_attn_norm is not None:
            norms += [
                (self.post_attn_norm, "post_attention_layernorm"),
                (self.post_mlp_norm, "post_feedforward_layernorm"),
            ]
        for norm, name in norms:
            norm.weight.copy_(get(f"{prefix}{name}.weight") + norm_offset)
        self.attn.load(get, prefix + self.attn.prefix, norm_offset)
        if self.mlp is not None:
            self.mlp.load(get, prefix + "mlp.")


class Transformer(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        dtype: torch.dtype = torch.float32,
        kernels: str = "torch",
        max_group_layers: int | None = None,  # cache groups of at most this many layers
        tp: TPGroup | None = None,  # a tensor-parallel rank: it holds its shard (sharding.py)
        expert_parallel_size: int = 1,  # with tp: 1, or tp.size (whole experts per rank)
    ):
        super().__init__()
        # a rank's model is the whole model's with its own heads, MLP and expert features (or
        # experts); its embedding and LM head hold its vocabulary rows
        self.tp = tp
        self.shard = None if tp is None else plan(config, tp.rank, tp.size, expert_parallel_size)
        if self.shard is not None:
            config = self.shard.local_config(config)
        vocab = config.vocab_size if self.shard is None else self.shard.vocab_widths[tp.rank]
        self.config = config
        self.dtype = dtype
        self.kernels = kernels  # the kernel set of its op rows (the compiler's target follows)
        # The LM head is a Linear; with tied embeddings it also serves the embedding lookup
        # (`rows`), so the [vocab, hidden] matrix is stored once, in the head's layout.
        self.lm_head = Linear(config.hidden_size, vocab, False, dtype, kernels)
        self.embed = (
            None
            if config.tie_word_embeddings
            else nn.Parameter(torch.empty(vocab, config.hidden_size, dtype=dtype), False)
        )
        # one RoPE table, and a second one when the sliding layers have their own base
        self.register_buffer("rope_cache", cos_sin_cache(config), persistent=False)
        local = [
            config.rope_theta_of(i) != config.rope_theta for i in range(config.num_hidden_layers)
        ]
        if any(local):
            self.register_buffer("rope_local_cache", cos_sin_cache(config, local=True), False)
        # the KV cache groups every cache of this model has (kvcache/groups.py)
        groups = self.cache_groups = cache_groups(config, max_group_layers)
        group_of = {layer: g for g, group in enumerate(groups) for layer in group.layers}
        self.num_cache_groups = len(groups)
        experts = None if self.shard is None else self.shard.experts
        self.layers = nn.ModuleList(
            DecoderLayer(config, dtype, kernels, i, group_of.get(i, 0), int(local[i]), tp, experts)
            for i in range(config.num_hidden_layers)
        )
        # layer → {state name: (shape, dtype)} of the recurrent layers (kvcache/state_cache.py)
        self.state_layers = {
            i: layer.attn.state_layout()
            for i, layer in enumerate(self.layers)
            if isinstance(layer.attn, StateMixer | ParallelMixer)
        }
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype, kernels)
        scale = math.sqrt(config.hidden_size) if config.arch.embed_scale else 1.0
        scale *= config.embedding_multiplier  # Falcon-H1
        self.embed_scale = scale if scale != 1.0 else None
        # the FAST_PATHS row (models/fast_paths.py) that runs all layers of a step at once
        # where it can: the native fused decode step by default, the compiled layers with
        # the engine option `compile`; None: every step op by op (tests compare the two)
        self.fast_path: str | None = "fused" if tp is None else None  # (no all-reduce in it)
        self._runner: FastPathRunner | None = None  # the path built for one KV cache
        self._supported: tuple[str, bool] | None = None  # (fast_path, whether it runs us)
        # multi-token-prediction layers (models/mtp.py), attached by the build step when the
        # `mtp` proposer drafts with them; loaded with the weights
        self.mtp: nn.ModuleList | None = None
        # with `keep_hidden`, each forward keeps `hidden`: the final hidden state (after the
        # final norm) of every token of the step — what the `mtp` proposer's layers read
        self.keep_hidden = False
        self.hidden: torch.Tensor | None = None

    @torch.no_grad()
    def load_weights(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Copy checkpoint tensors (Hugging Face names, validated shapes) into the layers."""

        multipliers = [(re.compile(p), f) for p, f in self.config.weight_multipliers]

        def get(name: str) -> torch.Tensor:
            """The tensor (this rank's part of it), times the config's constant multipliers
            that match its name."""
            factor = math.prod(f for pattern, f in multipliers if pattern.search(name))
            tensor = tensors[name] if self.shard is None else self.shard.tensor(name, tensors[name])
            return tensor if factor == 1 else dense(tensor) * factor

        embed = get("model.embed_tokens.weight")
        if self.config.embedding_multiplier != 1.0 and self.embed is None:
            raise ConfigError(
                "an embedding multiplier with tied embeddings is not supported",
                where=f"{self.config.source}: embedding_multiplier",
                found=self.config.embedding_multiplier,
                expected="1.0, or untied embeddings",
            )
        if self.embed is None:
            self.lm_head.load(embed)
        else:
            self.embed.copy_(dense(embed))  # GGUF blocks kept by the loader: dequantized
            self.lm_head.load(get("lm_head.weight"))
        spec = self.config.arch
        for i, layer in enumerate(self.layers):
            layer.load(get, f"model.layers.{i}.", spec.norm_offset, spec.mlp_norm_name)
        self.norm.weight.copy_(get("model.norm.weight") + spec.norm_offset)
        for j, layer in enumerate(self.mtp or ()):
            prefix = f"model.layers.{len(self.layers) + j}."
            if prefix + "eh_proj.weight" not in tensors:
                raise ConfigError(
                    "the checkpoint declares multi-token-prediction layers but does not carry "
                    "their tensors (many conversions drop them)",
                    where=f"{self.config.source}: {prefix}*",
                    expected="a checkpoint with its MTP layers, or another proposer",
                )
            layer.load(get, prefix, spec.norm_offset, spec.mlp_norm_name)

    @property
    def rope_tables(self) -> list[torch.Tensor]:
        """The RoPE cos/sin tables (the buffers themselves: they move with the model)."""
        local = getattr(self, "rope_local_cache", None)
        return [self.rope_cache] if local is None else [self.rope_cache, local]

    def layer_features(self) -> dict[str, str]:
        """What makes these layers other than that Llama-shaped layer: feature → its
        description (none: plain). A fast path names the features it runs (FastPath)."""
        spec, config = self.config.arch, self.config
        present = (
            ("cache_groups", "sliding-window and full-attention cache groups",
             self.num_cache_groups != 1),
            ("recurrent", "recurrent state layers", bool(self.state_layers)),
            ("rope_tables", "per-layer RoPE tables", len(self.rope_tables) != 1),
            ("gelu_mlp", f"a {config.hidden_act} MLP", config.hidden_act != "silu"),
            ("partial_rotary", "partial rotary dimensions", config.rotary_dim != config.head_dim),
            ("sink_tokens", "sink tokens", bool(config.sink_tokens)),
            ("output_gate", "a gated attention output", bool(spec.attention_output_gate)),
            ("sandwich_norms", "sandwich norms", bool(spec.sandwich_norms)),
            ("attention_sinks", "attention sinks", bool(spec.attention_sinks)),
            ("mla", "latent attention (MLA)", bool(spec.mla)),
            ("moe", "mixture-of-experts MLPs", bool(config.moe)),
        )  # fmt: skip
        return {key: name for key, name, there in present if there}

    def fast_path_for(self, kv_cache: PagedKVCache) -> FastPathRunner | None:
        """This model's fast path built for `kv_cache` (once per cache), or None when it has
        none or its layers are not ones the path runs."""
        if self.fast_path is None:
            return None
        # whether the path runs these layers, asked once per path (a step asks every time:
        # the features' check is ~20 us after a decode step's weight streams)
        if self._supported is None or self._supported[0] != self.fast_path:
            path = FAST_PATHS.get(self.fast_path, where="fast_path")
            self._supported = (self.fast_path, path.supports(self))
        if not self._supported[1]:
            return None
        if self._runner is None or self._runner.kv_cache is not kv_cache:
            # the runner sees this model through a weak proxy: it is the model's, and a
            # strong reference back would keep the model and its cache in a reference cycle
            # (their memory freed only when the cyclic collector ran)
            path = FAST_PATHS.get(self.fast_path, where="fast_path")
            self._runner = path.build(weakref.proxy(self), kv_cache)
        return self._runner

    @torch.no_grad()
    def forward(
        self, batch: ForwardBatch, kv_cache: PagedKVCache, num_layers: int | None = None
    ) -> torch.Tensor:
        """Returns logits [len(batch.logits_indices), vocab] in fp32; with `num_layers`, of
        the first that many layers only (then the final norm and head: self-speculation)."""
        if profiling.enabled():  # (the forward's work outside its ops: the region "model")
            with profiling.region("model", "", profiling.Cost()):
                return self._forward(batch, kv_cache, num_layers)
        return self._forward(batch, kv_cache, num_layers)

    def _forward(
        self, batch: ForwardBatch, kv_cache: PagedKVCache, num_layers: int | None
    ) -> torch.Tensor:
        if batch.ropes is None:
            batch.ropes = [RopeInputs(batch.positions, table) for table in self.rope_tables]
        # (a KV press's observation window is captured by the per-op layers)
        runner = self.fast_path_for(kv_cache) if batch.capture is None else None
        # a path that runs the whole step, embedding to logits (the fused decode step, the
        # layer programs with their C head), returns the logits of a step whose rows are all
        # sampled; None: the steps below
        run_logits = getattr(runner, "run_logits", None) if num_layers is None else None
        if run_logits is not None and batch.logits_all and not self.keep_hidden:
            logits = run_logits(batch)
            if logits is not None:
                return logits
        if profiling.enabled():
            with self._embedding_region(batch.input_ids.shape[0]):
                h = self.embed_rows(batch.input_ids)
        else:
            h = self.embed_rows(batch.input_ids)  # a fresh tensor: the layers update it in place
        done = None
        if runner is not None and num_layers is None:
            done = runner.run(h, batch)
        elif runner is not None and hasattr(runner, "run_prefix"):  # a fast path's first layers
            done = runner.run_prefix(h, batch, num_layers)
        if done is not None:
            h, delta = done
        else:  # the per-op path: every step the fast path does not cover
            h, delta = self.run_layers(h, batch, kv_cache, num_layers)
        rows = batch.logits_indices
        if self.keep_hidden:  # every token's final hidden state (models/mtp.py reads them)
            self.hidden = self.norm(h, delta)
        if rows.numel() == 0:  # only unfinished prefill chunks this step: nothing to sample
            return torch.empty(0, self.config.vocab_size, device=h.device)
        if self.keep_hidden:
            return self.logits(self.hidden.index_select(0, rows))
        if batch.logits_all:  # every row, in order (a decode step): no gather
            return self.head(h, delta)
        return self.head(h.index_select(0, rows), delta.index_select(0, rows))

    def _embedding_region(self, tokens: int):
        """The profiler's region of the embedding lookup: rows read and written, no FLOPs."""
        work = profiling.Cost(0, 2 * tokens * self.config.hidden_size * self.dtype.itemsize)
        return profiling.region("embedding", str(self.config.hidden_size), work)

    def embed_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The embeddings [len(ids), hidden] of token ids (scaled as the architecture does), a
        fresh tensor."""
        if self.shard is not None:  # this rank's rows: the others' ids read as zeros
            first, end = self.shard.vocab
            local = ids - first
            inside = (local >= 0) & (local < end - first)
            ids = local.clamp(0, end - first - 1)
        h = self.lm_head.rows(ids) if self.embed is None else self.embed.index_select(0, ids)
        if self.shard is not None:
            self.tp.all_reduce(h.mul_(inside[:, None].to(h.dtype)))
        return h if self.embed_scale is None else h.mul_(self.embed_scale)

    def run_layers(
        self,
        h: torch.Tensor,
        batch: ForwardBatch,
        kv_cache: PagedKVCache,
        num_layers: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Every decoder layer (or the first `num_layers`) op by op on h [tokens, hidden]
        (updated in place): the residual stream and the last layer's pending delta (what the
        head adds before its norm)."""
        delta = None
        capture = batch.capture  # a KV press's observation window (engine/kv_press.py)
        for i, layer in enumerate(self.layers[:num_layers]):
            view = batch.view(layer.attn.group, layer.attn.rope_index)
            if capture is not None and isinstance(layer.attn, Attention):
                capture.keep(layer.queries(h, delta, capture.rows, view.rope))
            delta = layer(h, delta, view, kv_cache.layer(i))
        return h, delta

    def head(self, h: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """Logits [rows, vocab] in fp32 of the rows h [rows, hidden] (+ their pending delta)."""
        return self.logits(self.norm(h, delta))

    def logits(self, normed: torch.Tensor) -> torch.Tensor:
        """Logits [rows, vocab] in fp32 of final hidden states (after the final norm)."""
        logits = self.lm_head(normed).float()
        if self.shard is not None:  # [rows, this rank's vocabulary] → every rank's
            logits = self.tp.gather_columns(logits, list(self.shard.vocab_widths))
        multiplier = self.config.logits_multiplier  # Falcon-H1
        return logits if multiplier == 1.0 else logits.mul_(multiplier)
