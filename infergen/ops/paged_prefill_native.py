"""Prefill attention in C through the block tables (kernels/paged_prefill_attention_f32.c):
the `native` row of ops/paged_attention.PREFILL_BACKENDS, the CPU's.

Every prefill sequence of the step in one call: its queries against its cached and new keys,
read in place from the pool's pages (no gather), the GQA group's heads in one tile, the online
softmax; learned sink logits (GPT-OSS, a SinkCore) are one more softmax term per head. Where
the kernel cannot serve — a KV format that encodes its values, another attention core (FP8
operands), StreamingLLM sink positions, a dtype other than fp32 or a head dim the build's
vector width does not divide — the torch row runs instead.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from infergen.kernels.build import F as CF
from infergen.kernels.build import I, L, P, kernel
from infergen.kvcache.kv_protocol import ENGINE_DTYPE, KVLayer, layer_of
from infergen.ops.attention_sinks import native_core, sinks_of
from infergen.ops.paged_attention import PREFILL_BACKENDS, AttentionPlan, prefill_attention

VECTOR_FLOATS = 16  # the widest build's vector (AVX-512): head dims it divides run natively


def _kernel() -> Callable[..., None] | None:
    return kernel(
        "paged_prefill_attention_f32", P, L, P, P, P, P, P, P, L, L, P, L, L, L, L, CF, L, P, I,
        source="paged_prefill_attention_f32",
    )  # fmt: skip


def native_prefill_serves(
    q: torch.Tensor, kv: KVLayer, core: Callable, plan: AttentionPlan
) -> bool:
    """Whether the kernel computes what the torch row would for this layer and step."""
    return (
        kv.fmt is ENGINE_DTYPE
        and native_core(core)  # (a sink core: the kernel adds the sink logits itself)
        and q.dtype == torch.float32
        and kv.k.dtype == torch.float32
        and q.device.type == "cpu"
        and not plan.sinks
        and q.shape[-1] % VECTOR_FLOATS == 0
        and q.stride(-1) == 1
        and q.stride(-2) == q.shape[-1]
        and kv.k.is_contiguous()
        and kv.v.is_contiguous()
    )


@PREFILL_BACKENDS.decorator("native")
def prefill_attention_native(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    attn_plan: AttentionPlan,
    scale: float,
    out: torch.Tensor,
    kv: KVLayer | None = None,
    core: Callable[..., torch.Tensor] = F.scaled_dot_product_attention,
    new_slots: torch.Tensor | None = None,
) -> None:
    """The PREFILL_BACKENDS row: the kernel over the plan's PrefillBatch, writing the prefill
    rows of `out` [tokens, heads, d] (contiguous); the arguments are paged_attention's."""
    kv = layer_of(kv, k_cache, v_cache)
    fn = _kernel()
    if fn is None or not native_prefill_serves(q, kv, core, attn_plan) or not out.is_contiguous():
        prefill_attention(q, k_new, v_new, k_cache, v_cache, attn_plan, scale, out, kv, core,
                          new_slots)  # fmt: skip
        return
    batch = attn_plan.prefill_batch()
    tables = batch.block_tables
    fn(
        q.data_ptr(),
        q.stride(0),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        batch.query_start.data_ptr(),
        batch.query_lens.data_ptr(),
        batch.seq_lens.data_ptr(),
        tables.data_ptr(),
        tables.shape[1],
        tables.shape[0],
        out.data_ptr(),
        q.shape[1],
        k_cache.shape[2],
        q.shape[2],
        k_cache.shape[1],
        scale,
        attn_plan.window,
        sinks.data_ptr() if (sinks := sinks_of(core)) is not None else None,
        torch.get_num_threads(),
    )
