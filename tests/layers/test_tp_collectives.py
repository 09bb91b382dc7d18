"""TPGroup's collectives over real gloo ranks (issue 26): the all-reduce — an all-gather and a
sum in rank order for small tensors, gloo's own all-reduce for large ones — equals the sum of
every rank's tensor computed here in float64, and is bitwise equal on every rank; the columns'
gather puts uneven widths side by side in rank order."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from infergen.engine.workers import free_port
from infergen.layers.tensor_parallel import SMALL_GATHER_BYTES, TPGroup

SHAPES = [(1, 576), (16, 576), (SMALL_GATHER_BYTES // 4, 2)]  # the last one: gloo's all-reduce


def _input(rank: int, shape) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(100 * rank + len(shape)))


def _rank(rank: int, size: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=size)  # fmt: skip
    try:
        tp = TPGroup(rank, size)
        result = {"gathers": [tp.gathers(torch.Size(s).numel() * 4) for s in SHAPES]}
        for i, shape in enumerate(SHAPES):
            result[f"sum{i}"] = tp.all_reduce(_input(rank, shape).contiguous())
        widths = [3 + r for r in range(size)]
        result["columns"] = tp.gather_columns(torch.full((2, widths[rank]), float(rank)), widths)
        result["stats"] = dict(tp.stats)
        torch.save(result, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("size", [2, 3])
def test_all_reduce_and_gather_match_the_sum(size, tmp_path):
    out = str(tmp_path / "rank")
    mp.start_processes(_rank, args=(size, free_port(), out), nprocs=size, start_method="spawn")
    results = [torch.load(f"{out}.{r}") for r in range(size)]
    assert results[0]["gathers"] == [True, True, False]  # both paths are exercised
    for i, shape in enumerate(SHAPES):
        want = sum(_input(r, shape).double() for r in range(size))
        for got in results:
            torch.testing.assert_close(got[f"sum{i}"].double(), want, rtol=1e-6, atol=1e-6)
            assert torch.equal(got[f"sum{i}"], results[0][f"sum{i}"])  # the same on every rank
    want = torch.cat([torch.full((2, 3 + r), float(r)) for r in range(size)], dim=1)
    for got in results:
        assert torch.equal(got["columns"], want)
        assert got["stats"]["all_reduce"][0] == len(SHAPES)
    assert not os.path.exists(f"{out}.{size}")
