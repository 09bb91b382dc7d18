"""`infergen perf calibrate`: measure this machine's peaks for the `cpu-local` hardware row.

Measured, in fp32 on the engine's own kernels and thread count: GEMM FLOP/s (the native
packed GEMM at a compute-bound shape, or torch's matmul if faster), memory read bandwidth (a
sum over a buffer far larger than the caches) and the fixed cost of one parallel op launch
(a native op on a tiny tensor). Best of several repeats: the peaks a careful kernel reaches,
which is what a roofline divides by. Written as a hardware JSON row (`load_file` reads it).
"""

from __future__ import annotations

import json
import os
import pathlib

import torch

from infergen.kernels.build import cache_dir
from infergen.perf.hardware import Hardware
from infergen.timing import best_seconds

CPU_LOCAL = "cpu-local"


def default_path() -> pathlib.Path:
    return cache_dir() / "perf" / f"{CPU_LOCAL}.json"


def measure(threads: int | None = None, quick: bool = False) -> Hardware:
    from infergen.ops import linear
    from infergen.process import configure_process

    configure_process(threads)
    repeats = 3 if quick else 7
    m, k, n = (64, 576, 1536) if quick else (128, 576, 3072)
    row = linear.LINEAR_BACKENDS.get("native")
    w = torch.randn(n, k)
    packed, x = row.prepare(w), torch.randn(m, k)
    native = 2 * m * k * n / best_seconds(lambda: row.apply(x, packed, None, n), repeats)
    a, b = torch.randn(512, 512), torch.randn(512, 512)
    torch_mm = 2 * 512**3 / best_seconds(lambda: a @ b, repeats)
    buf = torch.ones((64 if quick else 256) << 18)  # 64 / 256 MiB of fp32
    bandwidth = buf.numel() * 4 / best_seconds(lambda: buf.sum(), repeats)
    # one parallel region on almost no data: the launch cost (from Python, so an upper bound)
    small_w = row.prepare(torch.randn(512, 64))
    small_x, calls = torch.randn(1, 64), 200
    overhead = (
        best_seconds(
            lambda: [row.apply(small_x, small_w, None, 512) for _ in range(calls)], repeats
        )
        / calls
    )
    peak = max(native, torch_mm)
    # the curve: a weight larger than the caches (as a model's), rows 1 .. 512
    big_n = 8192 if quick else 24576
    big = row.prepare(torch.randn(big_n, k))
    curve = {}
    for rows in (1, 2, 4, 8, 16, 32, 64, 128, 512):
        xr = torch.randn(rows, k)
        seconds = best_seconds(lambda xr=xr: row.apply(xr, big, None, big_n), repeats)
        curve[rows] = min(1.0, 2 * rows * k * big_n / seconds / peak)
    total_ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return Hardware(
        name=CPU_LOCAL,
        description=f"this machine, measured ({torch.get_num_threads()} threads, fp32)",
        memory_bytes=float(total_ram),
        bandwidth=bandwidth,
        flops={"fp32": peak},
        launch_overhead_s=overhead,
        gemm_efficiency=curve,
    )


def save(hw: Hardware, path: pathlib.Path) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    row = {
        "description": hw.description,
        "memory_bytes": hw.memory_bytes,
        "bandwidth": hw.bandwidth,
        "flops": hw.flops,
        "launch_overhead_s": hw.launch_overhead_s,
        "gemm_efficiency": hw.gemm_efficiency,
    }
    path.write_text(json.dumps({hw.name: row}, indent=1))
    return path
