"""RoPE + KV store in one Triton kernel (ops/rope_kv_store_triton.py) against the op's
reference (ops/rope_kv_store.reference): q and k read in place from a fused QKV output
(strided views), rotated within the dtype's rounding of the fp32 rotation; the cache written
bit for bit as the layer's KV format stores the rotated k returned (engine-dtype values in
fp32 / fp16 / bf16, FP8 E4M3 codes with per-head scales and key shift, some saturating),
every other slot untouched. Grid: head_dim 24 / 64 / 80, MHA / GQA / MQA and more heads than
one program takes, blocks of 1 / 4 / 16 tokens, 1 / 7 / 33 tokens at positions with gaps.
bf16 on a GPU only (the interpreter's bf16 casts truncate). A partial-rotary table takes the
torch row."""

from __future__ import annotations

import pytest
import torch

from infergen.config import RopeScaling
from infergen.kvcache.kv_format import KV_FORMATS
from infergen.kvcache.kv_protocol import KVLayer
from infergen.ops import rope, rope_kv_store
from infergen.ops.rope_kv_store_triton import rope_kv_store_triton
from tests.triton_env import DEVICE, INTERPRETED, runnable

pytestmark = runnable
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}
MAX_POSITION = 256
# (engine dtype, KV format): values in the engine dtype, or FP8 E4M3 codes
CACHES = [(torch.float32, None), (torch.float16, None), (torch.float32, "fp8_e4m3"),
          (torch.float16, "fp8_e4m3")] + ([] if INTERPRETED else [(torch.bfloat16, None),
          (torch.bfloat16, "fp8_e4m3")])  # fmt: skip
# (tokens, heads, kv_heads, head_dim, block_size)
SHAPES = [(1, 4, 1, 64, 1), (7, 6, 2, 80, 4), (33, 4, 4, 24, 16), (7, 20, 5, 64, 4)]


def _table(dim: int) -> torch.Tensor:
    """[MAX_POSITION, dim] cos | sin, as ops/rope.cos_sin_cache builds it."""
    inv_freq = rope.inv_frequencies(dim, 10000.0, RopeScaling()).float()
    angles = torch.outer(torch.arange(MAX_POSITION, dtype=torch.float32), inv_freq)
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


def _layer(fmt_name, dtype, num_blocks, block_size, kv_heads, dim, gen) -> KVLayer:
    """A layer's cache holding garbage (to see that only the given slots change)."""
    shape = (num_blocks, block_size, kv_heads, dim)
    if fmt_name is None:
        k, v = (torch.randn(shape, generator=gen).to(dtype) for _ in range(2))
        return KVLayer(k, v)
    k, v = (torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8) for _ in range(2))
    # scales under the values' spread: some codes saturate at ±448
    k_scale, v_scale = ((0.5 + torch.rand(kv_heads, generator=gen)) / 100 for _ in range(2))
    k_shift = torch.randn(kv_heads, dim, generator=gen) * 0.5
    fmt = KV_FORMATS.get(fmt_name)
    return KVLayer(k.view(fmt.storage), v.view(fmt.storage), k_scale, v_scale, fmt, k_shift)


def _to(kv: KVLayer, device) -> KVLayer:
    """A copy of the layer's tensors on `device`."""
    fields = ("k", "v", "k_scale", "v_scale", "k_shift")
    tensors = {f: getattr(kv, f) for f in fields if getattr(kv, f) is not None}
    return kv._replace(**{f: t.clone().to(device) for f, t in tensors.items()})


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.cpu().contiguous().view(torch.uint8)


@pytest.mark.parametrize("dtype, fmt_name", CACHES)
@pytest.mark.parametrize("tokens, heads, kv_heads, dim, block_size", SHAPES)
def test_rope_kv_store(dtype, fmt_name, tokens, heads, kv_heads, dim, block_size):
    gen = torch.Generator().manual_seed(tokens * dim + heads)
    num_blocks = (2 * tokens + 3) // block_size + 2
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:tokens]
    positions = torch.randperm(MAX_POSITION, generator=gen)[:tokens].sort().values  # gaps
    table = _table(dim)
    # the fused projection [q | k | v | gate]: q, k and v are strided views of it
    width = (heads + 2 * kv_heads + 1) * dim
    qkv = torch.randn(tokens, width, generator=gen).to(dtype)
    q_end, k_end = heads * dim, (heads + kv_heads) * dim
    q = qkv[:, :q_end].view(tokens, heads, dim)
    k = qkv[:, q_end:k_end].view(tokens, kv_heads, dim)
    v = qkv[:, k_end : k_end + kv_heads * dim].view(tokens, kv_heads, dim)
    kv = _layer(fmt_name, dtype, num_blocks, block_size, kv_heads, dim, gen)
    want_kv = _to(kv, "cpu")
    want_q, want_k = rope_kv_store.reference(q, k, v, positions, table, want_kv, slots)

    qkv_dev, kv_dev = qkv.to(DEVICE), _to(kv, DEVICE)
    qk_dev = qkv_dev[:, :k_end].view(tokens, heads + kv_heads, dim)
    v_dev = qkv_dev[:, k_end : k_end + kv_heads * dim].view(tokens, kv_heads, dim)
    inputs = rope.RopeInputs(positions.to(DEVICE), table.to(DEVICE))
    got_q, got_k = rope_kv_store_triton(qk_dev, v_dev, heads, inputs, kv_dev, slots.to(DEVICE))
    assert got_q.shape == q.shape and got_k.shape == k.shape and got_q.dtype == dtype
    tol = TOL[dtype]
    torch.testing.assert_close(got_q.cpu(), want_q, rtol=tol, atol=tol)
    torch.testing.assert_close(got_k.cpu(), want_k, rtol=tol, atol=tol)
    # the cache: exactly what the format's own store writes for the k' returned
    stored = _to(kv, "cpu")
    stored.fmt.store(stored, got_k.cpu(), v, slots)
    assert torch.equal(_bits(kv_dev.k), _bits(stored.k)), "K cache differs"
    assert torch.equal(_bits(kv_dev.v), _bits(stored.v)), "V cache differs"
    assert not torch.equal(_bits(kv_dev.k), _bits(kv.k))  # the slots were written


def test_partial_rotary_takes_the_torch_row():
    tokens, heads, kv_heads, dim, rotary = 5, 4, 2, 64, 32
    gen = torch.Generator().manual_seed(0)
    qk = torch.randn(tokens, heads + kv_heads, dim, generator=gen)
    v = torch.randn(tokens, kv_heads, dim, generator=gen)
    positions, table = torch.tensor([0, 3, 4, 9, 70]), _table(rotary)
    slots = torch.tensor([2, 7, 0, 5, 11])

    def partial(x, inputs):  # the attention layer's rotation of the first `rotary` dims
        rotated = rope.apply_rope(x[..., :rotary].contiguous(), inputs)
        return torch.cat([rotated, x[..., rotary:]], dim=-1)

    kv = KVLayer(torch.zeros(3, 4, kv_heads, dim), torch.zeros(3, 4, kv_heads, dim))
    kv_dev = _to(kv, DEVICE)
    inputs = rope.RopeInputs(positions.to(DEVICE), table.to(DEVICE))
    got_q, got_k = rope_kv_store_triton(
        qk.to(DEVICE), v.to(DEVICE), heads, inputs, kv_dev, slots.to(DEVICE), partial
    )
    want = torch.cat([rope.reference(qk[..., :rotary], positions, table), qk[..., rotary:]], -1)
    torch.testing.assert_close(got_q.cpu(), want[:, :heads])
    torch.testing.assert_close(got_k.cpu(), want[:, heads:])
    flat_k = kv_dev.k.cpu().view(-1, kv_heads, dim)
    torch.testing.assert_close(flat_k[slots], want[:, heads:])
