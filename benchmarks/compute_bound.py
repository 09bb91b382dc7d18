"""The roofline peer of bench_generate.py: the fastest any engine could run a concurrent
workload on this machine at fp32, from the workload's FLOPs and the machine's fp32 GEMM peak
measured in the same run.

FLOPs: infergen/perf/step_cost.py counts every op of every step (projections, attention,
the LM head of each sequence's last token, ...) of `requests` prompts of `prompt` tokens
prefilled, then `new - 1` decode steps of all of them. Peak: the best of a large square
torch.mm (MKL / oneDNN) and infergen's own packed GEMM at a prefill shape, best of several
runs. The bound is output tokens / (FLOPs / peak): it ignores memory traffic, attention's
lower arithmetic efficiency and every overhead, so no engine on this machine reaches it.
"""

from __future__ import annotations

import torch

from infergen.perf.step_cost import Chunk, step_ops
from infergen.timing import best_seconds


def workload_flops(config, requests: int, prompt: int, new: int) -> dict[str, float]:
    """FLOPs of the prefill and of the decode steps of the workload."""
    desc = config.describe()

    def flops(chunks: list[Chunk]) -> float:
        return sum(op.flops for op in step_ops(desc, chunks))

    prefill = flops([Chunk(prompt, prompt)] * requests)
    decode = sum(flops([Chunk(1, prompt + t)] * requests) for t in range(1, new))
    return {"prefill": prefill, "decode": decode}


def fp32_peak_flops(repeats: int = 5) -> dict[str, float]:
    """This machine's fp32 GEMM rate, measured now (FLOP/s): torch.mm and infergen's GEMM."""
    from infergen.ops import linear

    n = 2048
    a, b = torch.randn(n, n), torch.randn(n, n)
    mm = 2 * n**3 / best_seconds(lambda: a @ b, repeats)
    row = linear.LINEAR_BACKENDS.get("native")
    m, k, cols = 512, 576, 1536
    packed, x = row.prepare(torch.randn(cols, k)), torch.randn(m, k)
    ours = 2 * m * k * cols / best_seconds(lambda: row.apply(x, packed, None, cols), repeats)
    return {"torch_mm": mm, "infergen_gemm": ours, "peak": max(mm, ours)}


def compute_bound(config, requests: int, prompt: int, new: int) -> dict:
    """The workload's FLOPs, the peak, and the bound on output tok/s."""
    work = workload_flops(config, requests, prompt, new)
    peak = fp32_peak_flops()
    total = work["prefill"] + work["decode"]
    return {
        "value": requests * new / (total / peak["peak"]),
        "unit": "tok/s",
        "flops": work,
        "peak_flops": peak,
        "decode_only_value": requests * (new - 1) / (work["decode"] / peak["peak"]),
    }
