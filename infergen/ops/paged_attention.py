"""Causal attention over a paged KV cache (MHA / GQA / MQA, optional sliding window with
StreamingLLM-style sink tokens).

Per sequence i of a batch: queries q[query_start_loc[i]:query_start_loc[i+1]] are the last
query_len tokens of a context of seq_lens[i] tokens whose keys/values live in the cache blocks
listed by block_tables[i]. Query at position p attends keys at positions k with
p − window < k ≤ p (window = ∞ without a sliding window), or k < sinks ≤ p (the first `sinks`
positions stay visible to every query: StreamingLLM's attention sinks):
    out = softmax(q·Kᵀ · scale + mask) · V
Bytes moved per step: every sequence's K and V once (2·ctx·kv_heads·head_dim elements).

Plan/run split (as flashinfer): `plan()` turns the batch's block tables into gather indices and
masks once per step; `paged_attention()` runs per layer with that plan. One-token sequences go
to a DECODE_BACKENDS row, the others to a PREFILL_BACKENDS row: `torch` (per sequence: gather
its K/V through the KV format, then SDPA) or `triton` (ops/paged_prefill_triton.py: one varlen
launch for every prefill sequence of the step, reading K/V through the block tables).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from infergen import profiling
from infergen.kernels.build import F as CF
from infergen.kernels.build import I, L, P, kernel
from infergen.kvcache.kv_protocol import KVLayer, layer_of
from infergen.ops.attention_sinks import native_core, sinks_of
from infergen.ops.kv_store import slot_bytes
from infergen.profiling import Cost
from infergen.registry import Registry


def _window_mask(
    q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None, sinks: int = 0
) -> torch.Tensor:
    allowed = k_pos.unsqueeze(-2) <= q_pos.unsqueeze(-1)
    if window is not None:
        inside = k_pos.unsqueeze(-2) > q_pos.unsqueeze(-1) - window
        allowed &= inside | (k_pos.unsqueeze(-2) < sinks)
    return allowed


@dataclass
class PrefillItem:
    """A sequence with several query tokens this step. Its gather indices and mask (what the
    torch row reads) are built on first use: the rows that read the cache through the block
    tables never pay for them."""

    start: int
    end: int
    context_len: int
    seq: int = 0  # the sequence's row in the step's block tables
    block_table: torch.Tensor | None = None  # [1, max_blocks] this sequence's
    block_size: int = 0
    window: int | None = None
    sinks: int = 0
    _gather: tuple[torch.Tensor | None, torch.Tensor | None] | None = None

    @property
    def slots(self) -> torch.Tensor | None:
        """[keys] cache slots of the positions the queries may read (with a sliding window,
        from the first query's window start on), None when the context is all new."""
        return self.gather()[0]

    @property
    def mask(self) -> torch.Tensor | None:
        """[query_len, keys] bool, None for plain causal."""
        return self.gather()[1]

    def gather(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if self._gather is None:
            ctx, query_len, window, sinks = (self.context_len, self.end - self.start,
                                             self.window, self.sinks)  # fmt: skip
            dev = self.block_table.device
            q_pos = torch.arange(ctx - query_len, ctx, device=dev)
            first = 0 if window is None else max(0, ctx - query_len - window + 1)
            k_pos = torch.arange(first, ctx, device=dev)  # keys before `first`: outside windows
            if sinks and first:  # ... but for the sink tokens
                k_pos = torch.cat([torch.arange(min(sinks, first), device=dev), k_pos])
            cold = ctx == query_len
            slots = None if cold else _slots(self.block_table, k_pos, self.block_size)[0]
            mask = None if (cold and window is None) else _window_mask(q_pos, k_pos, window, sinks)
            self._gather = (slots, mask)
        return self._gather


@dataclass
class PrefillBatch:
    """The step's prefill sequences as tensors, for a varlen kernel (one launch for all of
    them; on the block tables' device). Sequence i's queries are q rows query_start[i] ..
    query_start[i] + query_lens[i] − 1, the last query_lens[i] positions of a context of
    seq_lens[i] tokens (the earlier ones already cached: a prefix hit, earlier chunks)."""

    query_start: torch.Tensor  # [prefills] int32 first row of each sequence in q
    query_lens: torch.Tensor  # [prefills] int32
    seq_lens: torch.Tensor  # [prefills] int32
    block_tables: torch.Tensor  # [prefills, max_blocks] int32
    host_query_lens: list[int]
    host_seq_lens: list[int]
    _tiles: dict[int, torch.Tensor] = field(default_factory=dict)

    def tiles(self, tile_q: int) -> torch.Tensor:
        """[tiles, 2] int32 (sequence, first query) of every tile of `tile_q` queries, those
        reaching furthest into their context first (the most keys to read, without a window:
        the long programs start first), built once per step and tile size."""
        if tile_q not in self._tiles:
            tiles = []  # (keys up to the tile's last query, sequence, first query)
            for i, (n, ctx) in enumerate(
                zip(self.host_query_lens, self.host_seq_lens, strict=True)
            ):
                tiles += [
                    (min(ctx - n + first + tile_q, ctx), i, first) for first in range(0, n, tile_q)
                ]
            tiles.sort(key=lambda tile: -tile[0])
            table = torch.tensor([tile[1:] for tile in tiles], dtype=torch.int32).reshape(-1, 2)
            self._tiles[tile_q] = table.to(self.block_tables.device)
        return self._tiles[tile_q]


@dataclass
class AttentionPlan:
    decode_rows: torch.Tensor | None  # [decodes] token rows of the one-token sequences
    prefills: list[PrefillItem]
    decode_only: bool = False  # every token is a decode, in row order: no gather/scatter of q
    decode_block_tables: torch.Tensor | None = None  # [decodes, max_blocks] int64
    decode_seq_lens: torch.Tensor | None = None  # [decodes] int64
    window: int = 0  # sliding window (0 = none)
    sinks: int = 0  # first positions every windowed query also reads (StreamingLLM)
    # the longest decode context, known on the host (kernels size their work by it without
    # reading decode_seq_lens back from a GPU); 0: not given
    decode_max_context: int = 0
    block_tables: torch.Tensor | None = None  # [seqs, max_blocks] the step's (prefill_batch)
    block_size: int = 0  # tokens per cache block
    _prefill_batch: PrefillBatch | None = None
    _all_rows_batch: PrefillBatch | None = None
    _decode_gather: tuple[torch.Tensor, torch.Tensor | None] | None = None

    @property
    def decode_slots(self) -> torch.Tensor | None:
        """[decodes · span] cache slots of the positions each decode reads (padding → 0);
        None without decodes."""
        return self.decode_gather()[0]

    @property
    def decode_mask(self) -> torch.Tensor | None:
        """[decodes, 1, 1, span] bool of the slots that count; None = all of them."""
        return self.decode_gather()[1]

    def decode_gather(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(decode_slots, decode_mask): what a gathering decode row (the torch row) reads,
        built on first use and kept for the step's other layers — the rows that read the
        cache through the block tables (native, Triton) never pay for it."""
        if self.decode_block_tables is None:
            return None, None
        if self._decode_gather is None:
            self._decode_gather = _decode_gather(
                self.decode_block_tables, self.decode_seq_lens, self.block_size, self.window,
                self.sinks,
            )  # fmt: skip
        return self._decode_gather

    def prefill_batch(self) -> PrefillBatch:
        """The prefills as tensors (PrefillBatch), built on first use and kept for the step's
        other layers: the torch row never pays for them."""
        if self._prefill_batch is None:
            items, tables = self.prefills, self.block_tables
            ids = torch.tensor([item.seq for item in items], dtype=torch.int64)
            host_lens = [item.end - item.start for item in items]
            host_ctx = [item.context_len for item in items]
            as_int32 = dict(dtype=torch.int32, device=tables.device)
            self._prefill_batch = PrefillBatch(
                query_start=torch.tensor([item.start for item in items], **as_int32),
                query_lens=torch.tensor(host_lens, **as_int32),
                seq_lens=torch.tensor(host_ctx, **as_int32),
                block_tables=tables[ids.to(tables.device)].to(torch.int32).contiguous(),
                host_query_lens=host_lens,
                host_seq_lens=host_ctx,
            )
        return self._prefill_batch

    def all_rows_batch(self) -> PrefillBatch:
        """Every row of the step as one varlen batch: the prefills, then each decode row as a
        sequence of one query at its context (what a single prefill-kernel call over a mixed
        step reads). Built on first use and kept for the step's other layers."""
        if self._all_rows_batch is None:
            batches = [self.prefill_batch()] if self.prefills else []
            if self.decode_rows is not None:
                rows = self.decode_rows.to(torch.int32)
                lens = self.decode_seq_lens.to(torch.int32)
                batches.append(
                    PrefillBatch(
                        query_start=rows,
                        query_lens=torch.ones_like(rows),
                        seq_lens=lens,
                        block_tables=self.decode_block_tables.to(torch.int32),
                        host_query_lens=[1] * rows.shape[0],
                        host_seq_lens=lens.tolist(),
                    )
                )
            self._all_rows_batch = _concatenated(batches)
        return self._all_rows_batch

    def decode_queries(self, q: torch.Tensor) -> torch.Tensor:
        """[decodes, heads, d]: the query rows of the one-token sequences."""
        return q if self.decode_only else q.index_select(0, self.decode_rows)


def _concatenated(batches: list[PrefillBatch]) -> PrefillBatch:
    """One varlen batch of several (block tables padded to the widest)."""
    if len(batches) == 1:
        return batches[0]
    width = max(b.block_tables.shape[1] for b in batches)
    tables = [F.pad(b.block_tables, (0, width - b.block_tables.shape[1])) for b in batches]
    return PrefillBatch(
        query_start=torch.cat([b.query_start for b in batches]),
        query_lens=torch.cat([b.query_lens for b in batches]),
        seq_lens=torch.cat([b.seq_lens for b in batches]),
        block_tables=torch.cat(tables).contiguous(),
        host_query_lens=[n for b in batches for n in b.host_query_lens],
        host_seq_lens=[n for b in batches for n in b.host_seq_lens],
    )


def plan(
    query_start_loc: list[int],
    seq_lens: list[int],
    block_tables: torch.Tensor,
    block_size: int,
    window: int | None,
    sinks: int = 0,
    as_decodes: Collection[int] = (),
) -> AttentionPlan:
    """Gather indices and masks for one step (shared by every layer); with a window, the
    first `sinks` positions stay visible too. Its tensors are on the block tables' device.

    A one-token sequence is a decode row. So is each query token of the sequences in
    `as_decodes` (speculative verification: a decode's last token and its drafts): row j of
    n reads the first seq_len − n + j + 1 positions, exactly what decoding that token alone
    reads — a verifying step stays a decode step (the decode kernels, the fused decode path)
    and each row's attention is the one decoding would compute."""
    dev = block_tables.device
    decode_ids: list[int] = []  # the sequence of each decode row
    decode_starts: list[int] = []  # its token row
    decode_lens: list[int] = []  # the positions it reads
    prefills = []
    for i, ctx in enumerate(seq_lens):
        start, end = query_start_loc[i], query_start_loc[i + 1]
        if end - start == 1 or i in as_decodes:
            decode_ids += [i] * (end - start)
            decode_starts += range(start, end)
            decode_lens += range(ctx - (end - start) + 1, ctx + 1)
        else:
            prefills.append(PrefillItem(start, end, ctx, i, block_tables[i : i + 1], block_size,
                                        window, sinks))  # fmt: skip
    windowed = dict(window=window or 0, sinks=sinks if window else 0, block_tables=block_tables,
                    block_size=block_size)  # fmt: skip
    if not decode_ids:
        return AttentionPlan(None, prefills, **windowed)
    if block_tables.is_contiguous() and decode_ids == list(range(block_tables.shape[0])):
        decode_tables = block_tables  # (a row per sequence, in order: no gather)
    else:
        decode_tables = block_tables[torch.tensor(decode_ids, device=dev)].contiguous()
    return AttentionPlan(
        decode_rows=torch.tensor(decode_starts, device=dev),
        prefills=prefills,
        decode_only=not prefills,
        decode_block_tables=decode_tables,
        decode_seq_lens=torch.tensor(decode_lens, device=dev),
        **windowed,
        decode_max_context=max(decode_lens),
    )


def _decode_gather(
    block_tables: torch.Tensor, lens: torch.Tensor, block_size: int, window: int, sinks: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per decode sequence, the cache slots of the positions it reads — [first, len): its
    window, or everything, after the sink positions before a window — padded to the longest
    span ([decodes · span], padding → slot 0) and the mask of the real ones (None: all)."""
    dev = block_tables.device
    first = (lens - window).clamp(min=0) if window else torch.zeros_like(lens)
    span = int((lens - first).max())
    k_pos = first.unsqueeze(-1) + torch.arange(span, device=dev)  # [decodes, span]
    valid = k_pos < lens.unsqueeze(-1)
    if sinks and window:  # the sink positions before each window, then the window
        sink_pos = torch.arange(sinks, device=dev).expand(lens.shape[0], -1)
        valid = torch.cat([sink_pos < first.unsqueeze(-1), valid], dim=1)
        k_pos = torch.cat([sink_pos, k_pos], dim=1)
    k_pos = torch.where(valid, k_pos, torch.zeros_like(k_pos))
    slots = _slots(block_tables, k_pos, block_size)
    mask = None if bool(valid.all()) else valid[:, None, None, :]
    slots = torch.where(valid, slots, torch.zeros_like(slots))
    return slots.reshape(-1), mask


def _slots(block_tables: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """[batch, n] flat cache slot of each position (positions [n], or [batch, n] per row)."""
    positions = positions.expand(block_tables.shape[0], -1)
    blocks = block_tables.gather(1, positions // block_size)
    return blocks * block_size + positions % block_size


DecodeFn = Callable[..., torch.Tensor]  # (q, k_cache, v_cache, plan, scale, kv=None)
DECODE_BACKENDS: Registry[DecodeFn] = Registry("decode attention backend")


@DECODE_BACKENDS.decorator("torch")
def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    attn_plan: AttentionPlan,
    scale: float,
    kv: KVLayer | None = None,
    core: Callable[..., torch.Tensor] = F.scaled_dot_product_attention,
) -> torch.Tensor:
    """One query token per sequence: gather K/V by slot, then SDPA (`core`: an
    ops/attention_operands.py row). The GQA group is folded into the query axis:
    q [decodes, heads, d] → [decodes, kv_heads, group, d], so K/V are never repeated.
    Returns [decodes, heads, d]."""
    kv = layer_of(kv, k_cache, v_cache)
    rows = attn_plan.decode_rows
    batch = rows.shape[0]
    kv_heads, dim = k_cache.shape[2], k_cache.shape[3]
    keys, values = kv.fmt.read_decode(
        kv, attn_plan.decode_slots, attn_plan.decode_block_tables, attn_plan.decode_seq_lens,
        q.dtype,
    )  # fmt: skip
    keys, values = keys.view(batch, -1, kv_heads, dim), values.view(batch, -1, kv_heads, dim)
    query = attn_plan.decode_queries(q).reshape(batch, kv_heads, -1, dim)
    o = core(
        query,
        keys.transpose(1, 2),
        values.transpose(1, 2),
        attn_mask=attn_plan.decode_mask,
        scale=scale,
    )
    return o.reshape(batch, -1, dim)  # [decodes, heads, d]


@DECODE_BACKENDS.decorator("native")
def decode_attention_native(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    attn_plan: AttentionPlan,
    scale: float,
    kv: KVLayer | None = None,
    core: Callable[..., torch.Tensor] = F.scaled_dot_product_attention,
) -> torch.Tensor:
    """kernels/paged_decode_attention_f32.c: reads K/V through the block table, no gather
    (fp32 values, or FP8 E4M3 codes with per-head scales: the format's `native_cache`); with
    a sink core (ops/attention_sinks.py SinkCore), the kernel adds the sink logits itself.
    Another core, or what the kernel cannot read: the torch path."""
    kv = layer_of(kv, k_cache, v_cache)
    native = kv.fmt.native_cache(kv)
    fn = None
    if native is not None and not attn_plan.sinks and native_core(core):
        fn = kernel(
            f"paged_decode_attention_{native.code}", P, P, P, *[P] * len(native.scales), P, L,
            P, P, L, L, L, L, L, CF, L, P, I, source="paged_decode_attention_f32",
        )  # fmt: skip
    if fn is None or q.dtype != torch.float32:  # the kernel cannot read it: the torch path
        return decode_attention(q, k_cache, v_cache, attn_plan, scale, kv, core)
    sinks = sinks_of(core)
    query = attn_plan.decode_queries(q).contiguous()
    batch, heads, dim = query.shape
    tables = attn_plan.decode_block_tables
    out = torch.empty(batch, heads, dim, dtype=torch.float32)
    fn(
        query.data_ptr(),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        *native.scales,
        tables.data_ptr(),
        tables.shape[1],
        attn_plan.decode_seq_lens.data_ptr(),
        out.data_ptr(),
        batch,
        heads,
        k_cache.shape[2],
        dim,
        k_cache.shape[1],
        scale,
        attn_plan.window,
        sinks.data_ptr() if sinks is not None else None,
        torch.get_num_threads(),
    )
    return out


# the decode rows that take an attention core (a sink core among them)
_ROWS_WITH_CORE = (decode_attention, decode_attention_native)


def decode_with(row: DecodeFn, core: Callable[..., torch.Tensor]) -> DecodeFn:
    """A decode row bound to an attention core: the row itself for SDPA's; a row that takes
    a core (torch's; the native kernel's, which reads a SinkCore's sinks itself) with it; any
    other row's step goes to torch's with it."""
    if core is F.scaled_dot_product_attention:
        return row
    return functools.partial(row if row in _ROWS_WITH_CORE else decode_attention, core=core)


PrefillFn = Callable[..., None]  # (q, k_new, v_new, k_cache, v_cache, plan, scale, out, ...)
PREFILL_BACKENDS: Registry[PrefillFn] = Registry("prefill attention backend")


@PREFILL_BACKENDS.decorator("torch")
def prefill_attention(
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
    """The sequences with several queries, one at a time: the KV format reads the keys and
    values the plan lists (`read_prefill`), then `core` (SDPA). Writes their rows of `out`
    [tokens, heads, d]; the arguments are paged_attention's."""
    kv_layer = layer_of(kv, k_cache, v_cache)
    for item in attn_plan.prefills:
        rows = slice(item.start, item.end)
        query = q[rows].transpose(0, 1)  # [heads, query_len, d]
        keys, values, mask = kv_layer.fmt.read_prefill(
            kv_layer, item.slots, None if new_slots is None else new_slots[rows], k_new[rows],
            v_new[rows], item.mask, attn_plan.window, q.dtype,
        )  # fmt: skip
        # 4-D with a batch of one: torch's CPU flash kernel then takes GQA and masks itself
        # (3-D inputs fall back to the math path: 1.5-3x slower, most of it mask building)
        o = core(
            query.unsqueeze(0),
            keys.transpose(0, 1).unsqueeze(0),
            values.transpose(0, 1).unsqueeze(0),
            attn_mask=mask,
            is_causal=mask is None,
            scale=scale,
            enable_gqa=True,
        )
        out[rows] = o[0].transpose(0, 1)


def paged_attention(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    attn_plan: AttentionPlan,
    scale: float,
    decode_fn: DecodeFn | None = None,
    kv: KVLayer | None = None,
    core: Callable[..., torch.Tensor] = F.scaled_dot_product_attention,
    new_slots: torch.Tensor | None = None,
    prefill_fn: PrefillFn | None = None,
) -> torch.Tensor:
    """q [tokens, heads, d]; k_new/v_new [tokens, kv_heads, d] (already stored in the cache,
    at `new_slots` [tokens]: a block-quantized cache reads them back from there);
    `decode_fn` (a DECODE_BACKENDS row, torch by default) handles one-token sequences,
    `prefill_fn` (a PREFILL_BACKENDS row, torch by default) the others; `kv` (the layer's
    KVLayer) says how cached values are encoded — its format reads them
    (kvcache/kv_protocol.py; None: as they are); `core` computes prefill attention
    (ops/attention_operands.py: FP8 operands).

    Returns [tokens, heads, d].
    """
    decode_fn = decode_fn or decode_attention
    if profiling.enabled():  # each part its own region (infergen/profiling.py)
        decode_fn = _profiled(decode_fn, "attention.decode", decode_cost, k_cache, v_cache)
        if attn_plan.prefills:
            prefill_fn = _profiled(prefill_fn or prefill_attention, "attention.prefill",
                                   prefill_cost, k_cache, v_cache)  # fmt: skip
    if attn_plan.decode_only:
        return decode_fn(q, k_cache, v_cache, attn_plan, scale, kv)
    out = torch.empty_like(q)
    if attn_plan.decode_rows is not None:
        decoded = decode_fn(q, k_cache, v_cache, attn_plan, scale, kv)
        out.index_copy_(0, attn_plan.decode_rows, decoded)
    if attn_plan.prefills:
        prefill_fn = prefill_fn or prefill_attention
        prefill_fn(q, k_new, v_new, k_cache, v_cache, attn_plan, scale, out, kv, core, new_slots)
    return out


def decode_cost(
    heads: int, dim: int, element_bytes: int, plan: AttentionPlan, position_bytes: float
) -> Cost:
    """The step's decode rows: FLOPs 4·heads·head_dim per (query, key) pair (q·k and p·v; the
    softmax not counted); bytes: each row's keys and values as stored (`position_bytes` per
    position: both caches), its query read and output written. (Reads the contexts' lengths
    back from the device: only while profiling.)"""
    lens = plan.decode_seq_lens
    keys = int((lens.clamp(max=plan.window) if plan.window else lens).sum())
    own = 2 * lens.shape[0] * heads * dim * element_bytes
    return Cost(4 * heads * dim * keys, round(keys * position_bytes) + own)


def prefill_cost(
    heads: int, dim: int, element_bytes: int, plan: AttentionPlan, position_bytes: float
) -> Cost:
    """The step's prefill sequences: FLOPs 4·heads·head_dim per (query, key) pair a causal
    (or windowed) mask keeps, sink positions not counted; bytes: the keys and values the
    queries read, once, as stored, the queries read and the output written."""
    pairs = read = 0
    for item in plan.prefills:
        n, ctx = item.end - item.start, item.context_len
        first = ctx - n  # positions before the chunk's first query
        if plan.window:
            # min(window, first + j + 1) over the chunk's queries j: those under the window
            # see first + j + 1 keys, the rest `window`
            under = min(max(plan.window - first - 1, 0), n)
            pairs += under * first + under * (under + 1) // 2 + (n - under) * plan.window
            read += min(ctx, plan.window + n - 1)
        else:
            pairs += n * first + n * (n + 1) // 2
            read += ctx
    tokens = sum(item.end - item.start for item in plan.prefills)
    own = 2 * tokens * heads * dim * element_bytes
    return Cost(4 * heads * dim * pairs, round(read * position_bytes) + own)


def _profiled(fn, op: str, cost_of, k_cache: torch.Tensor, v_cache: torch.Tensor):
    """`fn` (a decode or prefill row) inside its op region: the cost of the plan's rows."""
    position_bytes = slot_bytes(k_cache, v_cache)

    def run(q, *args, **kwargs):
        plan = args[2] if op == "attention.decode" else args[4]
        cost = cost_of(q.shape[1], q.shape[2], q.element_size(), plan, position_bytes)
        kv_heads = f"/{k_cache.shape[2]}" if k_cache.dim() == 4 else ""
        key = (
            f"h{q.shape[1]}{kv_heads} d{q.shape[2]} kv {str(k_cache.dtype).removeprefix('torch.')}"
        )
        with profiling.region(op, key, cost):
            return fn(q, *args, **kwargs)

    return run


def reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    query_start_loc: list[int],
    seq_lens: list[int],
    block_tables: torch.Tensor,
    scale: float,
    window: int | None = None,
    sinks: int = 0,
    softcap: float | None = None,
) -> torch.Tensor:
    """Oracle: one sequence, one head, one query at a time, explicit softmax (with a window,
    the first `sinks` positions are read too; with `softcap`, scores become
    softcap · tanh(scores / softcap) before the softmax, as Gemma-2's logit soft-capping)."""
    block_size = k_cache.shape[1]
    heads, kv_heads = q.shape[1], k_cache.shape[2]
    group = heads // kv_heads
    out = torch.zeros_like(q, dtype=torch.float64)
    for i, ctx in enumerate(seq_lens):
        start, end = query_start_loc[i], query_start_loc[i + 1]
        keys = torch.stack(
            [k_cache[block_tables[i, p // block_size], p % block_size] for p in range(ctx)]
        ).double()  # [ctx, kv_heads, d]
        values = torch.stack(
            [v_cache[block_tables[i, p // block_size], p % block_size] for p in range(ctx)]
        ).double()
        for t in range(start, end):
            pos = ctx - (end - t)
            lo = 0 if window is None else max(0, pos - window + 1)
            seen = torch.tensor(
                [p for p in range(pos + 1) if p >= lo or (window is not None and p < sinks)]
            )
            for h in range(heads):
                kh = keys[seen, h // group]
                scores = kh @ q[t, h].double() * scale
                if softcap is not None:
                    scores = softcap * torch.tanh(scores / softcap)
                weights = torch.softmax(scores, dim=0)
                out[t, h] = weights @ values[seen, h // group]
    return out.to(q.dtype)


def default_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)
