"""formats/block_weight.decode_blocks against gguf.quants.dequantize (the gguf package's
reference): bit for bit on random blocks of Q8_0 / Q4_0 / Q4_1 — quantized by gguf.quants from
random values, and raw random bytes (any scale, any nibble) with finite fp16 scales — in 1-D
and 2-D layouts, and on the default model's Q4_1 / Q8_0 tensors."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from infergen.formats.block_weight import BLOCK_TYPES, BlockWeight, decode_blocks
from infergen.io.gguf_file import GGUFFile


def _bits_equal(ours: torch.Tensor, reference: np.ndarray) -> bool:
    reference = np.ascontiguousarray(reference, dtype=np.float32)
    return ours.shape == reference.shape and np.array_equal(
        ours.numpy().view(np.uint32), reference.view(np.uint32)
    )


@pytest.mark.parametrize("ggml_type", sorted(BLOCK_TYPES))
@pytest.mark.parametrize("rows", [1, 5])
def test_quantized_blocks_equal_the_reference(ggml_type, rows):
    qtype = gguf.GGMLQuantizationType[ggml_type]
    values = np.random.default_rng(rows).standard_normal((rows, 96)).astype(np.float32) * 3
    raw = gguf.quants.quantize(values, qtype)
    assert _bits_equal(
        decode_blocks(ggml_type, torch.from_numpy(raw)), gguf.quants.dequantize(raw, qtype)
    )


@pytest.mark.parametrize("ggml_type", sorted(BLOCK_TYPES))
def test_random_bytes_equal_the_reference(ggml_type):
    """Any code and any finite scale (the bytes of d and m drawn as fp16 values)."""
    qtype = gguf.GGMLQuantizationType[ggml_type]
    size = BLOCK_TYPES[ggml_type][1]
    rng = np.random.default_rng(1)
    raw = rng.integers(0, 256, (7, 4 * size), dtype=np.uint8)
    heads = 4 if ggml_type == "Q4_1" else 2
    for block in range(4):
        scales = (rng.standard_normal((7, heads // 2)) * 100).astype(np.float16)
        raw[:, block * size : block * size + heads] = scales.view(np.uint8)
    assert _bits_equal(
        decode_blocks(ggml_type, torch.from_numpy(raw)), gguf.quants.dequantize(raw, qtype)
    )
    flat = raw.reshape(-1)  # (one row of 28 blocks)
    assert _bits_equal(
        decode_blocks(ggml_type, torch.from_numpy(flat)), gguf.quants.dequantize(flat, qtype)
    )


def test_the_default_model_tensors(default_model_path):
    checked = 0
    for tensor in GGUFFile(default_model_path).tensors[:40]:
        name = tensor.tensor_type.name
        if name in BLOCK_TYPES:
            raw = np.array(tensor.data)
            expected = gguf.quants.dequantize(raw, tensor.tensor_type)
            assert _bits_equal(decode_blocks(name, torch.from_numpy(raw)), expected), tensor.name
            shape = expected.shape
            if len(shape) == 2:
                weight = BlockWeight(name, torch.from_numpy(raw), shape)
                assert _bits_equal(weight.dequantize(), expected)
            checked += 1
    assert checked >= 10
