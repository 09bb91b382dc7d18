"""kernels/argmax_f32.c (the fused decode step's greedy tokens) against torch.argmax: the first
index of the largest value, a NaN as the largest (the first NaN), -inf rows, signed zeros,
rows over the threads; on this machine's ISA and on the portable build."""

from __future__ import annotations

import ctypes

import pytest
import torch

from infergen.kernels.build import I, L, P, kernel
from tests.kernel_isa import assert_ok_with_isa


def crafted_rows() -> torch.Tensor:
    rows = torch.randn(9, 49152, generator=torch.Generator().manual_seed(0))
    rows[0, [17, 30001]] = 9.0  # a tie: the first
    rows[1, [5, 40000]] = float("nan")  # NaNs beat +inf: the first NaN
    rows[1, 3] = float("inf")
    rows[2] = -float("inf")
    rows[3] = 0.0
    rows[3, 0] = -0.0  # -0.0 == 0.0: index 0
    rows[4, -1] = 50.0  # the last element
    rows[5, 0] = 50.0  # the first
    rows[6, 49151] = float("nan")
    rows[7, 16:32] = 7.0  # a run of ties inside one vector
    return rows


def native_argmax(rows: torch.Tensor, threads: int) -> list[int]:
    fn = kernel("argmax_f32", P, L, L, P, I, source="decode_layers_f32")
    assert fn is not None
    out = (ctypes.c_long * rows.shape[0])()
    fn(rows.data_ptr(), rows.shape[0], rows.shape[1], out, threads)
    return out[:]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("width", [1, 15, 49152])
def test_argmax_equals_torch(threads, width):
    rows = crafted_rows()[:, :width].contiguous()
    assert native_argmax(rows, threads) == rows.argmax(dim=-1).tolist()


def test_argmax_portable_build(tmp_path):
    code = (
        "from tests.ops.test_argmax_native import crafted_rows, native_argmax\n"
        "rows = crafted_rows()\n"
        "assert native_argmax(rows, 2) == rows.argmax(dim=-1).tolist()\n"
        "print('ok')\n"
    )
    assert_ok_with_isa("generic", code, tmp_path)
