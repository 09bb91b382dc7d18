"""A latent attention (layers/mla.py, DeepSeek-V2/V3) as the decode layer program runs it
natively: the C `mla_args` (kernels/layer_kernels.h) of one layer's module — the down (and q
LoRA up) projections' panels, the norms' weights, W_uk and W_uv, o_proj's panels, its latent
cache — built once when the program binds its weights; each step sets the positions, cache
slots, block tables, context lengths and RoPE table of the layer's view of the step
(`mla_fields`, computed once a step; `mla_bind`, per layer). The decode program calls
`lk_mla_decode` (the weight-absorbed form) instead of calling the module back; so does the
prefill program for steps of a few rows (each row a one-query sequence: `rows_as_sequences`),
longer ones call the module back.

Refused (CodegenError, naming it: the module runs, called back): weights or a cache that are
not fp32, a strided cache, projections without packed panels.
"""

from __future__ import annotations

import ctypes

import torch

from infergen.compiler.codegen_c import CodegenError
from infergen.compiler.program_moe import _panels


class MLAArgs(ctypes.Structure):  # kernels/layer_kernels.h mla_args, field for field
    _fields_ = [
        *[(n, ctypes.c_long) for n in "hidden heads nope rope latent v_dim q_lora".split()],
        ("down", ctypes.c_void_p),
        ("down_format", ctypes.c_long),
        ("q_norm_w", ctypes.c_void_p),
        ("q_up", ctypes.c_void_p),
        ("q_up_format", ctypes.c_long),
        ("kv_norm_w", ctypes.c_void_p),
        ("eps", ctypes.c_float),
        ("w_uk", ctypes.c_void_p),
        ("w_uv", ctypes.c_void_p),
        ("o", ctypes.c_void_p),
        ("o_format", ctypes.c_long),
        ("scale", ctypes.c_float),
        ("cache", ctypes.c_void_p),
        ("block_size", ctypes.c_long),
        ("positions", ctypes.c_void_p),
        ("slots", ctypes.c_void_p),
        ("block_tables", ctypes.c_void_p),
        ("seq_lens", ctypes.c_void_p),
        ("max_blocks", ctypes.c_long),
        ("rope_cache", ctypes.c_void_p),
    ]


def mla_args(module, kv, where: str) -> tuple[MLAArgs, list]:
    """The C arguments of one latent attention over its cache layer (a KVLayer whose K pages
    hold the [latent | k_pe] rows), and what must stay alive while they are used."""
    f32 = torch.float32
    if module.w_uk.dtype != f32 or kv.k.dtype != f32 or kv.k_scale is not None:
        raise CodegenError(f"{where}: a latent attention that is not fp32")
    if not kv.k.is_contiguous():
        raise CodegenError(f"{where}: a strided latent cache")
    down = _panels(module.down, f"{where} down")
    q_up = _panels(module.q_up, f"{where} q_up") if module.q_up is not None else 0
    o = _panels(module.o, f"{where} o")
    keep = [module.w_uk.detach().contiguous(), module.w_uv.detach().contiguous()]
    q_norm = module.q_norm.weight.detach().contiguous() if module.q_norm is not None else None
    kv_norm = module.kv_norm.weight.detach().contiguous()
    keep += [q_norm, kv_norm]
    args = MLAArgs(
        module.down.in_features, module.num_heads, module.nope, module.rope_dim,
        module.latent, module.v_dim, module.mla.q_lora_rank or 0,
        module.down.weight.data_ptr(), down,
        q_norm.data_ptr() if q_norm is not None else None,
        module.q_up.weight.data_ptr() if module.q_up is not None else None, q_up,
        kv_norm.data_ptr(), module.kv_norm.eps,
        keep[0].data_ptr(), keep[1].data_ptr(), module.o.weight.data_ptr(), o, module.scale,
        kv.k.data_ptr(), kv.k.shape[1],
    )  # fmt: skip
    return args, keep


def mla_fields(view, batch) -> tuple[torch.Tensor, ...]:
    """A step's fields as the layers of one view read them — block tables, context lengths,
    positions, cache slots, the RoPE table — computed once a step. A step with prefills gives
    each token row its own block table and context (rows_as_sequences): the call writes every
    row's cache entry before it attends, so a row reads its own sequence's rows up to itself."""
    plan = view.attn_plan  # (no window: latent attention models have none)
    if plan.decode_only:
        tables, lens = plan.decode_block_tables.contiguous(), plan.decode_seq_lens.contiguous()
    else:
        tables, lens = rows_as_sequences(plan)
    positions, slots = view.rope.positions.contiguous(), view.slot_mapping.contiguous()
    return tables, lens, positions, slots, view.rope.cache


def mla_bind(args: MLAArgs, fields: tuple[torch.Tensor, ...]) -> None:
    """Point one layer's step fields at `fields` (mla_fields)."""
    tables, lens, positions, slots, rope_cache = fields
    args.positions, args.slots = positions.data_ptr(), slots.data_ptr()
    args.block_tables, args.seq_lens = tables.data_ptr(), lens.data_ptr()
    args.max_blocks, args.rope_cache = tables.shape[1], rope_cache.data_ptr()


def rows_as_sequences(plan) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token row of a step with prefills as a one-query sequence for the decode kernel:
    per row (in the step's token order), its sequence's block table and its context length
    (the positions it attends: those before it and its own)."""
    rows = plan.all_rows_batch()  # (prefills, then decode rows: sequences of one query)
    n = rows.query_lens.long()
    total = int(n.sum())
    seq = torch.repeat_interleave(torch.arange(n.numel()), n, output_size=total)
    offset = torch.arange(total) - torch.repeat_interleave(torch.cumsum(n, 0) - n, n)
    token = rows.query_start.long()[seq] + offset  # the row's place in the step
    tables = torch.empty(total, rows.block_tables.shape[1], dtype=torch.int64)
    tables[token] = rows.block_tables.long()[seq]
    lens = torch.empty(total, dtype=torch.int64)
    lens[token] = (rows.seq_lens.long() - n)[seq] + offset + 1
    return tables, lens
