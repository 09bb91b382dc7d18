"""The KV format protocol: what every way of holding K and V in the paged cache implements.

One protocol for the whole family of alternatives: the engine dtype's own values
(`ENGINE_DTYPE`, what an engine without a KV format stores, defined here), the per-head scaled
element formats (kv_format.py: "fp8_e4m3") and the block-quantized formats (kv_blocked.py:
"int4_kivi", "int2_kivi", "nvfp4"). Call sites — the cache manager, sizing, the KV store,
paged / sparse decode attention, the fused decode step, the compiler — call these methods
and never ask which family a format belongs to.

A format row is stateless data; a cache's tensors live in what `allocate` returns (a
`KVPool`), and each attention layer's share of them in a `KVLayer`, which the per-layer
methods take. Shapes: a cache slot s = block · block_size + offset; K / V of tokens are
[tokens, kv_heads, head_dim]; reads return [slots, kv_heads, head_dim] in the dtype asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, runtime_checkable

import torch

from infergen.config import ModelConfig
from infergen.errors import ConfigError
from infergen.kvcache.block_summary import BlockSummary
from infergen.kvcache.zeroed import zeroed


@dataclass(frozen=True)
class CacheLayout:
    """What a format allocates: the attention layers' K / V pages of one cache."""

    layers: int  # decoder layers (KV layers are the keys of `page_slot`)
    page_slot: dict[int, int]  # attention layer → its slot in its cache group's page
    group_size: int  # layers one page holds (kvcache/groups.py)
    planes: int  # 2: K and V; 1: MLA's latent entry, read as both
    num_blocks: int
    block_size: int
    heads: int  # KV heads of one entry (1 for MLA)
    dim: int  # elements per head of one entry
    dtype: torch.dtype  # the engine dtype (what readers compute in)
    tail_slots: int  # blocks filled at once (formats keeping open blocks in full precision)
    device: torch.device = torch.device("cpu")  # where the pages live


class NativeCache(NamedTuple):
    """How the native decode kernel (kernels/paged_decode_attention_f32.c) reads a layer:
    `code` "f32" (fp32 values) or "e4m3" (FP8 E4M3 codes), and the data pointers of the
    per-head fp32 scales that follow the caches in its arguments (K's, V's)."""

    code: str
    scales: tuple[int, ...] = ()


@runtime_checkable
class KVPool(Protocol):
    """A cache's K / V tensors for every attention layer, as a format allocated them."""

    storage: torch.Tensor | None  # the one paged tensor [group_size, planes, num_blocks,
    #   block_size, heads, dim] of values or codes; None: the format keeps its own stores
    scales: torch.Tensor | None  # [layers, 2, kv_heads] per-head scales (NaN: uncalibrated)
    k_shift: torch.Tensor | None  # [layers, kv_heads, head_dim] the keys' stored shift

    @property
    def nbytes(self) -> int: ...

    def layer(self, index: int) -> KVLayer:
        """Attention layer `index`'s KVLayer (made once: the same object every step)."""
        ...

    def begin_step(self, slot_mapping: torch.Tensor) -> None:
        """Before a forward writing the cache slots `slot_mapping` [tokens] int64."""
        ...

    def block_freed(self, block: int) -> None:
        """The block pool let `block` go (its partial contents are dropped)."""
        ...


@runtime_checkable
class KVCacheFormat(Protocol):
    """One way of holding K and V: a KV_FORMATS row, or ENGINE_DTYPE (no format)."""

    name: str | None  # the KV_FORMATS row's name (None: ENGINE_DTYPE)
    description: str

    # ---- what the engine plans around, once at build ----------------------------------------
    @property
    def min_block_size(self) -> int:
        """The fewest tokens per cache block the format can hold."""
        ...

    @property
    def calibrate(self) -> bool:
        """The layers carry per-head scales and a key shift (KVPool.scales / k_shift) that
        the engine calibrates at start (kvcache/calibrate.py with `scales_for`)."""
        ...

    @property
    def supports_fast_decode(self) -> bool:
        """The fast decode paths can read it: the fused native decode step
        (models/fused_decode.py) and the compiler's layer graph (compiler/decoder.py) take a
        layer as KVLayer.k / .v pages (values or per-head scaled codes) and, when set,
        k_scale / v_scale / k_shift — nothing else."""
        ...

    @property
    def supports_sparse_decode(self) -> bool:
        """Sparse decode (ops/sparse_decode.py) can read it block by block (`read_blocks`)."""
        ...

    def check(self, model: ModelConfig, windowed: bool, recurrent: bool) -> None:
        """Raise ConfigError (naming kv_format) when the format cannot hold this model's
        cache: `windowed` (a sliding-window cache group), `recurrent` (recurrent layers),
        or a latent MLA cache (model.cache_shape's one plane)."""
        ...

    def scales_for(self, amax: torch.Tensor) -> torch.Tensor:
        """Calibrated largest |K − shift| / |V| per (layer, K/V, KV head) → the per-head
        scales the layers take (formats with `calibrate` only)."""
        ...

    def bytes_per_token(self, model: ModelConfig, dtype_bytes: int, block_size: int) -> float:
        """Cache bytes one token takes over all layers (codes and the scales that grow with
        the tokens; per-layer constants are not counted), with the engine dtype's
        `dtype_bytes` and blocks of `block_size` tokens."""
        ...

    def tail_bytes(self, model: ModelConfig, block_size: int, tail_blocks: int) -> int:
        """Bytes set aside besides the blocks for `tail_blocks` blocks being filled (kept in
        full precision until complete; 0: every token is stored as it comes)."""
        ...

    def allocate(self, layout: CacheLayout) -> KVPool:
        """The zero-filled tensors of one cache (NaN scales until calibrated)."""
        ...

    # ---- per layer, per step -----------------------------------------------------------------
    def store(self, kv: KVLayer, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        """Write k, v [tokens, kv_heads, head_dim] (engine dtype) at cache slots [tokens]
        int64 (the slots the step planned: KVPool.begin_step)."""
        ...

    def read(
        self, kv: KVLayer, slots: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V [len(slots), kv_heads, head_dim] in `dtype` at cache slots [n] int64, as a
        query in a later block reads them (the stored codes decoded)."""
        ...

    def read_decode(
        self,
        kv: KVLayer,
        slots: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        dtype: torch.dtype,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """What decode attention reads: K, V [decodes · span, kv_heads, head_dim] in `dtype`
        at `slots` [decodes · span] (each sequence's span of positions, padding → slot 0),
        for the one-token queries of sequences with `block_tables` [decodes, max_blocks] and
        `seq_lens` [decodes] (their own token included, already stored)."""
        ...

    def read_prefill(
        self,
        kv: KVLayer,
        slots: torch.Tensor | None,
        new_slots: torch.Tensor | None,
        k_new: torch.Tensor,
        v_new: torch.Tensor,
        mask: torch.Tensor | None,
        window: int,
        dtype: torch.dtype,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """What prefill attention reads for one sequence's q_len queries (the last q_len
        positions of its context): (keys, values [keys, kv_heads, head_dim] in `dtype`, the
        attention mask [q_len, keys] bool, or None for plain causal).

        slots: [n] cache slots of the context positions the queries may read (None: the
            context is all new: k_new / v_new [q_len, kv_heads, head_dim], stored at
            new_slots [q_len], which may be None when the format does not need them);
        mask: the plan's [q_len, n] mask for those positions (None: plain causal);
        window: the plan's sliding window (0: none)."""
        ...

    def read_blocks(
        self, kv: KVLayer, ids: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sparse decode's read: ids [decodes, kv_heads, width] block ids → K, V [decodes,
        kv_heads, width, block_size, head_dim] in `dtype` (each KV head its own blocks)."""
        ...

    def native_cache(self, kv: KVLayer) -> NativeCache | None:
        """How the native decode kernel reads this layer (None: it cannot)."""
        ...

    def reference(
        self, kv: KVLayer, k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The oracle of `store` then `read`: k, v [n · block_size, kv_heads, head_dim], the
        consecutive positions of n whole blocks → what `read` returns for them, by the
        format's plain encode / decode."""
        ...


def check_per_head(name: str, model: ModelConfig, recurrent: bool) -> None:
    """The quantized formats keep K and V of each KV head: not a recurrent model's state
    slots, not MLA's latent entry."""
    if recurrent:
        raise ConfigError(
            "KV formats do not support models with recurrent layers yet",
            where="kv_format",
            found=name,
            expected=f"none for {model.architecture}",
        )
    if model.cache_shape[0] == 1:
        raise ConfigError(
            "KV formats do not support latent (MLA) caches yet",
            where="kv_format",
            found=name,
            expected=f"none for {model.architecture}",
        )


# ---- the paged pool: one tensor of values or codes (ENGINE_DTYPE and the scaled formats) ----


def gather_slots(flat: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """flat[slots] (one-byte codes are gathered as bytes: no fp8 index_select on the CPU)."""
    if flat.element_size() == 1 and flat.dtype != torch.uint8:
        return flat.view(torch.uint8).index_select(0, slots).view(flat.dtype)
    return flat.index_select(0, slots)


def gather_head_blocks(cache: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """cache [num_blocks, block_size, kv_heads, d], ids [decodes, kv_heads, width] block ids
    → [decodes, kv_heads, width, block_size, d] (each KV head's own blocks)."""
    head = torch.arange(cache.shape[2], device=ids.device)[None, :, None]
    if cache.element_size() == 1 and cache.dtype != torch.uint8:  # one-byte codes as bytes
        return cache.view(torch.uint8)[ids, :, head].view(cache.dtype)
    return cache[ids, :, head]


def write_slots(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slots: torch.Tensor,
) -> None:
    """k_cache / v_cache [num_blocks, block_size, heads, d] at slots [tokens] ← k, v."""
    flat_shape = (-1, *k_cache.shape[2:])
    if k_cache.element_size() == 1:  # one-byte codes are copied as bytes (no fp8 index_copy)
        k, v = k.to(k_cache.dtype), v.to(v_cache.dtype)
        k_cache, v_cache, k, v = (t.view(torch.uint8) for t in (k_cache, v_cache, k, v))
    k_cache.view(flat_shape).index_copy_(0, slots, k.to(k_cache.dtype))
    v_cache.view(flat_shape).index_copy_(0, slots, v.to(v_cache.dtype))


def _flat(cache: torch.Tensor) -> torch.Tensor:
    return cache.view(-1, *cache.shape[2:])  # [slots, heads, d]


class PagedPool:
    """Every attention layer's K and V in one tensor [group_size, planes, num_blocks,
    block_size, heads, dim] of `storage` elements; with `scaled`, per-head scales [layers, 2,
    kv_heads] (NaN until calibrated) and the keys' shift [layers, kv_heads, dim]."""

    def __init__(self, fmt: KVCacheFormat, layout: CacheLayout, storage: torch.dtype,
                 scaled: bool = False):  # fmt: skip
        planes, slot = layout.planes, layout.page_slot
        self.storage = zeroed(
            (layout.group_size, planes, layout.num_blocks, layout.block_size, layout.heads,
             layout.dim), storage, layout.device,
        )  # fmt: skip
        self.scales = self.k_shift = None
        if scaled:
            self.scales = torch.full(
                (layout.layers, 2, layout.heads), float("nan"), device=layout.device
            )
            self.k_shift = torch.zeros(layout.layers, layout.heads, layout.dim,
                                       device=layout.device)  # fmt: skip
        # per-layer views made once: slicing costs ~15 µs per layer per step otherwise
        self._layers = {
            i: KVLayer(self.storage[j, 0], self.storage[j, planes - 1], fmt=fmt)
            if not scaled
            else KVLayer(
                self.storage[j, 0], self.storage[j, 1], self.scales[i, 0], self.scales[i, 1],
                fmt, self.k_shift[i],
            )
            for i, j in slot.items()
        }  # fmt: skip

    @property
    def nbytes(self) -> int:
        scales = 0 if self.scales is None else (self.scales.numel() + self.k_shift.numel()) * 4
        return self.storage.numel() * self.storage.element_size() + scales

    def layer(self, index: int) -> KVLayer:
        return self._layers[index]

    def begin_step(self, slot_mapping: torch.Tensor) -> None:
        pass

    def block_freed(self, block: int) -> None:
        pass


class EngineDtype:
    """No KV format: the pool holds K and V as the model computed them, in the engine dtype.
    The null row of the protocol (`ENGINE_DTYPE`), and the base of the scaled formats, which
    override the encoding (kv_format.py)."""

    min_block_size = 1
    calibrate = False
    supports_fast_decode = True
    supports_sparse_decode = True

    def __init__(self) -> None:  # (instance attributes: the scaled formats' are fields)
        self.name: str | None = None
        self.description = "K and V in the engine dtype, as computed"

    def check(self, model: ModelConfig, windowed: bool, recurrent: bool) -> None:
        return None

    def scales_for(self, amax: torch.Tensor) -> torch.Tensor:
        raise ValueError(f"KV format {self.name!r} takes no calibrated scales")

    def bytes_per_token(self, model: ModelConfig, dtype_bytes: int, block_size: int) -> float:
        return model.kv_bytes_per_token(dtype_bytes)

    def tail_bytes(self, model: ModelConfig, block_size: int, tail_blocks: int) -> int:
        return 0

    def allocate(self, layout: CacheLayout) -> KVPool:
        return PagedPool(self, layout, layout.dtype)

    def store(self, kv: KVLayer, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        write_slots(kv.k, kv.v, k, v, slots)

    def read(self, kv: KVLayer, slots: torch.Tensor, dtype: torch.dtype):
        keys, values = gather_slots(_flat(kv.k), slots), gather_slots(_flat(kv.v), slots)
        return keys.to(dtype), values.to(dtype)

    def read_new(self, kv: KVLayer, k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype):
        """New K / V as the cache now holds them (an all-new prefill reads these)."""
        return k.to(dtype), v.to(dtype)

    def read_decode(self, kv, slots, block_tables, seq_lens, dtype):
        return self.read(kv, slots, dtype)

    def read_prefill(self, kv, slots, new_slots, k_new, v_new, mask, window, dtype):
        if slots is None:  # all new: the values the cache now holds for them
            keys, values = self.read_new(kv, k_new, v_new, dtype)
        else:
            keys, values = self.read(kv, slots, dtype)
        return keys, values, mask

    def read_blocks(self, kv: KVLayer, ids: torch.Tensor, dtype: torch.dtype):
        return gather_head_blocks(kv.k, ids).to(dtype), gather_head_blocks(kv.v, ids).to(dtype)

    def native_cache(self, kv: KVLayer) -> NativeCache | None:
        return NativeCache("f32") if kv.k.dtype == torch.float32 else None

    def reference(self, kv: KVLayer, k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype):
        return k.to(dtype), v.to(dtype)


ENGINE_DTYPE = EngineDtype()


class KVLayer(NamedTuple):
    """One attention layer's cache as the ops take it: K and V pages [num_blocks, block_size,
    kv_heads, head_dim] (codes, values, or a format's placeholder pages that only give the
    shape), the `fmt` that wrote them, and what that format keeps besides: per-head scales
    [kv_heads] and the keys' stored shift [kv_heads, head_dim] (scaled formats), its own
    per-layer store (block-quantized formats), and sparse decode's key summaries."""

    k: torch.Tensor
    v: torch.Tensor
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None
    fmt: KVCacheFormat = ENGINE_DTYPE
    k_shift: torch.Tensor | None = None  # [kv_heads, head_dim]: keys are stored minus this
    own_store: Any = None  # a format's own per-layer store (kv_blocked.BlockedLayer)
    summary: BlockSummary | None = None  # per-block key min / max (sparse decode)


def layer_of(kv: KVLayer | None, k_cache: torch.Tensor, v_cache: torch.Tensor) -> KVLayer:
    """The KVLayer an op reads through: `kv` with its format, or the bare pages k_cache /
    v_cache as ENGINE_DTYPE values (an op called without a KVLayer: MLA, tests, kernels)."""
    return kv if kv is not None else KVLayer(k_cache, v_cache)


def attention_part(cache) -> KVLayer | None:
    """The attention cache of one layer's cache (PagedKVCache.layer): the KVLayer itself, the
    KVLayer of a (KV, states) pair (an attention beside a recurrent mixer: Falcon-H1), or None
    (a recurrent layer's states)."""
    if isinstance(cache, KVLayer):
        return cache
    if isinstance(cache, tuple):
        return next((part for part in cache if isinstance(part, KVLayer)), None)
    return None
