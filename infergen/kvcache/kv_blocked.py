"""Block-quantized KV cache formats: a cache block's K and V as codes with their own scales,
quantized when the block is complete; the block still being written stays in full precision.

KIVI (Liu et al. 2024) quantizes keys per channel and values per token: key outliers live in a
few channels, so a channel's values over a group of tokens share a range, while values have no
channel structure. Here the group of tokens is the cache block (`block_size` tokens), so:
  keys   per (block, KV head, channel): min-max over the block's tokens → `bits`-bit codes with
         an fp16 scale and minimum (x ≈ q · scale + min);
  values per (token, KV head): min-max over head_dim, the same rule.
The recent window KIVI keeps in full precision is the query's own block: K and V of a block
being written are held in fp32 in a per-block "tail" slot, quantized into the block when its
last token arrives, and the tail is kept until the step after. A query at position p reads the
keys and values of its own block (positions ⌊p/B⌋·B … p) from the tail and every earlier block
from its codes — a rule of positions only, so a one-shot prefill, chunked prefill, prefix-cache
hits and token-by-token decoding all see the same values.

NVFP4 (`nvfp4`): K and V per token in groups of 16 along head_dim (E2M1 codes, E4M3 scale per
16) under an fp32 global scale per (block, KV head) = the block's amax / (448 · 6), computed at
completion (no calibration).

Bytes per token per KV head (head_dim d, block B): KIVI keys d·bits/8 + 4·d/B, values
d·bits/8 + 4; NVFP4 d/2 + d/16 + 4/B each — `bytes_per_token`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from infergen.config import ModelConfig
from infergen.errors import ConfigError
from infergen.formats import ELEMENT_TYPES
from infergen.formats.pack import pack_bits, unpack_bits
from infergen.kvcache.kv_protocol import CacheLayout, KVLayer, KVPool, NativeCache, check_per_head
from infergen.kvcache.zeroed import zeroed

E2M1 = ELEMENT_TYPES.get("e2m1")
E4M3 = ELEMENT_TYPES.get("e4m3")
NVFP4_GROUP = 16


def _minmax_encode(x: torch.Tensor, dim: int, bits: int) -> dict[str, torch.Tensor]:
    """Asymmetric min-max over `dim` (kept as size 1): codes uint8, fp16 scale and minimum."""
    qmax = (1 << bits) - 1
    lo, hi = x.amin(dim=dim, keepdim=True), x.amax(dim=dim, keepdim=True)
    scale, lo = ((hi - lo) / qmax).half(), lo.half()
    s = scale.float()
    q = torch.round((x - lo.float()) / torch.where(s > 0, s, torch.ones_like(s)))
    codes = q.clamp(0, qmax).to(torch.uint8)
    return {"codes": pack_bits(codes, bits), "scale": scale, "min": lo}


def _minmax_decode(p: dict[str, torch.Tensor], bits: int) -> torch.Tensor:
    return unpack_bits(p["codes"], bits).float() * p["scale"].float() + p["min"].float()


def _nvfp4_encode(x: torch.Tensor) -> dict[str, torch.Tensor]:
    """x [n, B, H, d] → E2M1 codes per 16 values of a token with E4M3 scales, under a global
    scale per (block, head)."""
    n, b, h, d = x.shape
    amax = x.abs().amax(dim=(1, 3), keepdim=True)  # [n, 1, H, 1]
    glob = amax / (448.0 * 6.0)
    glob = torch.where(glob > 0, glob, torch.ones_like(glob))
    groups = (x / glob).reshape(n, b, h, d // NVFP4_GROUP, NVFP4_GROUP)
    scale_codes = E4M3.encode(groups.abs().amax(dim=-1) / 6.0)  # [n, B, H, d/16]
    scale = E4M3.decode(scale_codes)[..., None]
    codes = E2M1.encode(groups / torch.where(scale > 0, scale, torch.ones_like(scale)))
    return {"codes": pack_bits(codes.reshape(n, b, h, d), 4), "scale": scale_codes,
            "global": glob.reshape(n, 1, h, 1)}  # fmt: skip


def _nvfp4_decode(p: dict[str, torch.Tensor]) -> torch.Tensor:
    codes = unpack_bits(p["codes"], 4)
    n, b, h, d = codes.shape
    values = E2M1.decode(codes).reshape(n, b, h, d // NVFP4_GROUP, NVFP4_GROUP)
    values = values * E4M3.decode(p["scale"])[..., None]
    return values.reshape(n, b, h, d) * p["global"]


@dataclass(frozen=True)
class MinMaxCodec:
    """KIVI: asymmetric min-max `bits`-bit codes, keys per channel over the block's tokens,
    values per token over head_dim, each with an fp16 scale and minimum."""

    bits: int

    @property
    def group(self) -> int:
        """Values per code byte (head_dim must hold whole ones)."""
        return 8 // self.bits

    def encode(self, x: torch.Tensor, keys: bool) -> dict[str, torch.Tensor]:
        return _minmax_encode(x, 1 if keys else 3, self.bits)  # keys: over the block's tokens

    def decode(self, p: dict[str, torch.Tensor], keys: bool) -> torch.Tensor:
        return _minmax_decode(p, self.bits)

    def shapes(self, block: int, heads: int, dim: int, keys: bool) -> dict[str, tuple]:
        codes = ((block, heads, dim * self.bits // 8), torch.uint8)
        params = (1, heads, dim) if keys else (block, heads, 1)
        return {"codes": codes, "scale": (params, torch.float16), "min": (params, torch.float16)}


@dataclass(frozen=True)
class NVFP4Codec:
    """NVFP4 per token: E2M1 codes, an E4M3 scale per 16 values, an fp32 global scale per
    (block, KV head); keys and values alike."""

    bits = 4
    group = NVFP4_GROUP

    def encode(self, x: torch.Tensor, keys: bool) -> dict[str, torch.Tensor]:
        return _nvfp4_encode(x)

    def decode(self, p: dict[str, torch.Tensor], keys: bool) -> torch.Tensor:
        return _nvfp4_decode(p)

    def shapes(self, block: int, heads: int, dim: int, keys: bool) -> dict[str, tuple]:
        return {"codes": ((block, heads, dim // 2), torch.uint8),
                "scale": ((block, heads, dim // NVFP4_GROUP), torch.uint8),
                "global": ((1, heads, 1), torch.float32)}  # fmt: skip


@dataclass(frozen=True)
class BlockedKVFormat:
    """A KV_FORMATS row whose blocks are quantized as a whole by its codec (see the module
    docstring); a kv_protocol.KVCacheFormat."""

    name: str
    codec: MinMaxCodec | NVFP4Codec
    description: str
    min_block_size = 2  # a block of one token would be its own tail
    calibrate = False
    supports_fast_decode = False  # the per-op path reads the codes and the tails
    supports_sparse_decode = False

    # ---- the codec ------------------------------------------------------------------------
    def encode(self, x: torch.Tensor, keys: bool) -> dict[str, torch.Tensor]:
        """A batch of complete blocks x [n, B, kv_heads, d] fp32 → their stored tensors."""
        return self.codec.encode(x, keys)

    def decode(self, p: dict[str, torch.Tensor], keys: bool) -> torch.Tensor:
        """Stored tensors of n blocks → fp32 [n, B, kv_heads, d]."""
        return self.codec.decode(p, keys)

    def shapes(self, block: int, heads: int, dim: int, keys: bool) -> dict[str, tuple]:
        """Per block: stored tensor name → (shape, dtype)."""
        return self.codec.shapes(block, heads, dim, keys)

    def bytes_per_block(self, block: int, heads: int, dim: int) -> int:
        """K and V bytes of one block of one layer."""
        total = 0
        for keys in (True, False):
            for shape, dtype in self.shapes(block, heads, dim, keys).values():
                total += torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        return total

    # ---- the KV format protocol (kvcache/kv_protocol.py) -----------------------------------
    def check(self, model: ModelConfig, windowed: bool, recurrent: bool) -> None:
        check_per_head(self.name, model, recurrent)
        group = self.codec.group  # values per code group
        if model.head_dim % group:
            raise ConfigError(
                f"head_dim {model.head_dim} is not a whole number of the format's groups",
                where="kv_format",
                found=self.name,
                expected=f"a model whose head_dim is a multiple of {group}",
            )
        if windowed:
            raise ConfigError(
                "block-quantized KV formats do not support sliding-window or recurrent layers yet",
                where="kv_format",
                found=self.name,
                expected="a per-head scaled format (e.g. fp8_e4m3) or none",
            )

    def scales_for(self, amax: torch.Tensor) -> torch.Tensor:
        raise ValueError(f"KV format {self.name!r} takes no calibrated scales")

    def bytes_per_token(self, model: ModelConfig, dtype_bytes: int, block_size: int) -> float:
        per_block = self.bytes_per_block(block_size, model.num_key_value_heads, model.head_dim)
        return model.num_hidden_layers * per_block / block_size

    def tail_bytes(self, model: ModelConfig, block_size: int, tail_blocks: int) -> int:
        return tail_blocks * model.kv_bytes_per_token(4) * block_size  # fp32 K and V

    def allocate(self, layout: CacheLayout) -> KVPool:
        return BlockedStore(
            self, layout.layers, layout.num_blocks, layout.block_size, layout.heads, layout.dim,
            max(layout.tail_slots, 1),
        )  # fmt: skip

    def store(self, kv: KVLayer, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        kv.own_store.store(k, v)  # at the slots BlockedStore.begin_step planned

    def read(self, kv: KVLayer, slots: torch.Tensor, dtype: torch.dtype):
        keys, values = kv.own_store.gather(slots)
        return keys.to(dtype), values.to(dtype)

    def read_decode(self, kv, slots, block_tables, seq_lens, dtype):
        """A query reads its own block from the fp32 tail, earlier blocks from their codes."""
        block = kv.own_store.s.block
        own = block_tables.gather(1, ((seq_lens - 1) // block)[:, None])  # [decodes, 1]
        from_tail = (slots.view(seq_lens.shape[0], -1) // block == own).flatten()
        keys, values = kv.own_store.gather(slots, from_tail)
        return keys.to(dtype), values.to(dtype)

    def read_prefill(self, kv, slots, new_slots, k_new, v_new, mask, window, dtype):
        """A query reads its own block from the fp32 tail and earlier blocks from their codes:
        the keys are the context from codes followed by the positions of the queries' blocks
        from the tails, and the mask gives each query one copy of each key."""
        slots = slots if slots is not None else new_slots  # [ctx] cache slots of the context
        block = kv.own_store.s.block
        ctx, q_len = slots.shape[0], k_new.shape[0]
        first = (ctx - q_len) // block * block  # the first position of the first query's block
        codes_k, codes_v = kv.own_store.gather(slots)
        tail = torch.ones(ctx - first, dtype=torch.bool)
        tail_k, tail_v = kv.own_store.gather(slots[first:], tail)
        keys, values = torch.cat([codes_k, tail_k]), torch.cat([codes_v, tail_v])
        q_pos = torch.arange(ctx - q_len, ctx)[:, None]
        k_pos = torch.cat([torch.arange(ctx), torch.arange(first, ctx)])[None, :]
        own = q_pos // block * block  # each query's block start
        from_tail = torch.arange(keys.shape[0])[None, :] >= ctx
        mask = torch.where(from_tail, (k_pos >= own) & (k_pos <= q_pos), k_pos < own)
        if window:
            mask &= k_pos > q_pos - window
        return keys.to(dtype), values.to(dtype), mask

    def read_blocks(self, kv: KVLayer, ids: torch.Tensor, dtype: torch.dtype):
        raise ConfigError(
            "sparse decode attention does not support block-quantized KV formats yet",
            where="kv_format",
            expected="a per-head scaled format (e.g. fp8_e4m3) or none",
        )

    def native_cache(self, kv: KVLayer) -> NativeCache | None:
        return None

    def reference(self, kv: KVLayer, k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype):
        block = kv.own_store.s.block
        out = []
        for keys, x in ((True, k), (False, v)):
            blocks = x.float().reshape(-1, block, *x.shape[1:])  # [n, B, kv_heads, d]
            out.append(self.decode(self.encode(blocks, keys), keys).reshape(x.shape).to(dtype))
        return out[0], out[1]


class BlockedStore:
    """Every layer's blocks in a BlockedKVFormat, and the fp32 tails of blocks being filled.

    Per step (`begin_step`, before the forward): blocks written this step get a tail slot if
    they have none; blocks whose last position is written this step are `completing`: each
    layer's store quantizes them from their tail after writing (`BlockedLayer.store`), and
    their tails are freed at the next step (this step's queries in them still read them).
    """

    storage = scales = k_shift = None  # (KVPool: no paged tensor, no per-head scales)

    def __init__(self, fmt: BlockedKVFormat, layers: int, num_blocks: int, block: int,
                 heads: int, dim: int, tail_slots: int):  # fmt: skip
        self.fmt, self.block, self.heads, self.dim = fmt, block, heads, dim
        self.stored = [
            [{name: zeroed((num_blocks, *shape), dtype)
              for name, (shape, dtype) in fmt.shapes(block, heads, dim, keys).items()}
             for keys in (True, False)]
            for _ in range(layers)
        ]  # fmt: skip
        self.tail = torch.zeros(layers, 2, tail_slots, block, heads, dim)
        self.tail_of = torch.full((num_blocks,), -1, dtype=torch.int64)
        self._free_tails = list(range(tail_slots))
        self._done: list[int] = []  # blocks completed last step: tails to free
        self.tail_index = torch.empty(0, dtype=torch.int64)  # this step's token → tail row
        self.completing = torch.empty(0, dtype=torch.int64)
        # the ops' KVLayer: the pages are the tails' (for their shape), reads go to the store
        self._layers = [
            KVLayer(self.tail[i, 0], self.tail[i, 1], fmt=fmt, own_store=BlockedLayer(self, i))
            for i in range(layers)
        ]

    def layer(self, index: int) -> KVLayer:
        return self._layers[index]

    @property
    def nbytes(self) -> int:
        stored = sum(t.numel() * t.element_size() for layer in self.stored for kind in layer
                     for t in kind.values())  # fmt: skip
        return stored + self.tail.numel() * 4

    def _free_tail(self, block: int) -> None:
        slot = int(self.tail_of[block])
        if slot >= 0:
            self._free_tails.append(slot)
            self.tail_of[block] = -1

    def block_freed(self, block: int) -> None:
        self._free_tail(block)

    def _grow_tails(self) -> None:
        """More blocks open at once than the engine set tails aside for (many prefill chunks
        each crossing a block boundary in one step): add tails rather than fail a request."""
        layers, _, slots = self.tail.shape[:3]
        extra = max(8, slots // 2)
        more = torch.zeros(layers, 2, extra, *self.tail.shape[3:])
        self.tail = torch.cat([self.tail, more], dim=2)
        self._free_tails.extend(range(slots, slots + extra))

    def begin_step(self, slot_mapping: torch.Tensor) -> None:
        for block in self._done:
            self._free_tail(block)
        blocks, offsets = slot_mapping // self.block, slot_mapping % self.block
        for block in blocks.unique().tolist():
            if self.tail_of[block] < 0:
                if not self._free_tails:
                    self._grow_tails()
                self.tail_of[block] = self._free_tails.pop()
        self.tail_index = self.tail_of[blocks] * self.block + offsets
        self.completing = blocks[offsets == self.block - 1].unique()
        self._done = self.completing.tolist()


class BlockedLayer:
    """One layer of a BlockedStore: `store` new K / V, `gather` positions by cache slot."""

    def __init__(self, store: BlockedStore, layer: int):
        self.s, self.layer = store, layer

    def store(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v [tokens, kv_heads, d] of this step's slots (BlockedStore.begin_step)."""
        s = self.s
        for kind, x in enumerate((k, v)):
            tail = s.tail[self.layer, kind]
            tail.view(-1, s.heads, s.dim).index_copy_(0, s.tail_index, x.float())
            if s.completing.numel():
                blocks = tail.index_select(0, s.tail_of[s.completing])  # [n, B, H, d]
                encoded = s.fmt.encode(blocks, keys=kind == 0)
                for name, t in s.stored[self.layer][kind].items():
                    t.index_copy_(0, s.completing, encoded[name].to(t.dtype))

    def gather(
        self, slots: torch.Tensor, from_tail: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V [len(slots), kv_heads, d] fp32 at cache slots: decoded from their blocks'
        codes, or (`from_tail` [len(slots)] True) from the fp32 tail of a block written this
        step. A slot whose block holds no codes yet reads what its codes decode to (zeros)."""
        s = self.s
        blocks, offsets = slots // s.block, slots % s.block
        unique, inverse = blocks.unique(return_inverse=True)
        out = []
        for kind in (0, 1):
            stored = {n: t.index_select(0, unique) for n, t in s.stored[self.layer][kind].items()}
            values = s.fmt.decode(stored, keys=kind == 0)[inverse, offsets]  # [slots, H, d]
            if from_tail is not None and bool(from_tail.any()):
                rows = s.tail_of[blocks[from_tail]] * s.block + offsets[from_tail]
                if bool((rows < 0).any()):
                    raise RuntimeError("KV read from the tail of a block not written this step")
                tail = s.tail[self.layer, kind].view(-1, s.heads, s.dim)
                values[from_tail] = tail.index_select(0, rows)
            out.append(values)
        return out[0], out[1]
