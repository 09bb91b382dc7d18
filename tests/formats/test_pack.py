"""Sub-byte packing and the 128x4 scale swizzle: layouts from the spec text, round trips."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from infergen.formats.pack import from_blocked, pack_bits, to_blocked, unpack_bits


def test_low_nibble_holds_the_even_element():
    packed = pack_bits(torch.tensor([[0x1, 0xA, 0x3, 0x4]], dtype=torch.uint8), 4)
    assert packed.tolist() == [[0xA1, 0x43]]
    two = pack_bits(torch.tensor([1, 2, 3, 0], dtype=torch.uint8), 2)
    assert two.tolist() == [1 | 2 << 2 | 3 << 4]


@settings(max_examples=50, deadline=None)
@given(st.sampled_from([2, 4]), st.integers(1, 5), st.integers(1, 12), st.integers(0, 2**31))
def test_pack_round_trips(bits, rows, groups, seed):
    n = groups * (8 // bits)
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 1 << bits, (rows, n), generator=gen, dtype=torch.uint8)
    packed = pack_bits(codes, bits)
    assert packed.shape == (rows, n * bits // 8)
    assert torch.equal(unpack_bits(packed, bits), codes)


def test_pack_rejects_partial_bytes():
    with pytest.raises(ValueError, match="multiple of 2"):
        pack_bits(torch.zeros(3, dtype=torch.uint8), 4)


def test_swizzle_offsets_follow_the_spec():
    """(r, c) of a 128x4 tile lands at (r % 32) * 16 + (r // 32) * 4 + c; tiles row-major."""
    scales = torch.arange(256 * 8, dtype=torch.int32).view(256, 8)
    flat = to_blocked(scales)
    for r, c in [(0, 0), (1, 0), (31, 3), (32, 0), (33, 2), (127, 3), (128, 0), (200, 5)]:
        tile = (r // 128) * 2 + c // 4
        offset = tile * 512 + (r % 128 % 32) * 16 + (r % 128 // 32) * 4 + c % 4
        assert flat[offset] == scales[r, c]


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 300), st.integers(1, 11))
def test_swizzle_is_a_permutation_and_round_trips(rows, cols):
    scales = torch.arange(1, rows * cols + 1, dtype=torch.int32).view(rows, cols)
    flat = to_blocked(scales)
    padded = (-(-rows // 128) * 128) * (-(-cols // 4) * 4)
    assert flat.numel() == padded
    nonzero = flat[flat != 0]
    assert torch.equal(nonzero.sort().values, scales.reshape(-1))  # each value exactly once
    assert torch.equal(from_blocked(flat, rows, cols), scales)
