"""Calibrate a GPU's hardware row from microbenchmarks (issue 5: "calibrate h200 from measured
GEMM/attention/copy microbenchmarks"). Runs on a CUDA machine (benchmarks/device_check.sh);
elsewhere it says so and exits 0.

Measured with CUDA events, best of several repeats:
  bf16 GEMM       8192^3 matmul -> peak TFLOP/s; and the efficiency curve by row count
                  (rows 1 .. 4096 against an 8192 x 8192 weight) as `gemm_efficiency`
  fp8 GEMM        torch._scaled_mm at 8192^3 when the GPU and torch have it
  copy            a 2 GiB device-to-device copy (read + write bytes / s)
  attention       decode SDPA (64 sequences x 4096 keys, 32 heads, 8 KV heads, head_dim 128, bf16):
                  bytes of K and V read / s, as a fraction of the copy bandwidth
  launch          a tiny kernel launched 1000 times (eager), and replayed from a CUDA graph
Writes the row as JSON (loadable with `--hardware-file`) and a JSON line comparing it with the
table row it calibrates (`--gpu`, default h200): measured efficiency vs the table's.

`--device cpu --small` runs the same code path on the CPU at toy sizes (tests/perf checks the
script that way; the numbers mean nothing).
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import sys
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from infergen.perf.hardware import HARDWARE  # noqa: E402
from infergen.timing import best_seconds  # noqa: E402


@dataclass(frozen=True)
class Sizes:
    gemm: int = 8192  # n of the n^3 GEMM and of the n x n weight of the curve
    copy: int = 1 << 30  # int16 elements copied (2 GiB)
    attention: tuple = (64, 4096, 32, 8, 128)  # batch, keys, heads, KV heads, head_dim
    launches: int = 1000


SMALL = Sizes(256, 1 << 20, (4, 256, 8, 2, 64), 50)


def cuda_seconds(fn, dev: torch.device, repeats: int = 10) -> float:
    """Best of `repeats` timed with CUDA events (on a CPU device: wall clock)."""
    if dev.type != "cuda":
        return best_seconds(fn, repeats)
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return best


def gemm(dev, sizes: Sizes) -> tuple[float, dict[int, float], float | None]:
    n = sizes.gemm
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    peak = 2 * n**3 / cuda_seconds(lambda: a @ b, dev)
    curve = {}
    for rows in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096):
        x = torch.randn(rows, n, device=dev, dtype=torch.bfloat16)
        curve[rows] = min(1.0, 2 * rows * n * n / cuda_seconds(lambda x=x: x @ b, dev) / peak)
    fp8 = None
    if hasattr(torch, "_scaled_mm") and hasattr(torch, "float8_e4m3fn"):
        try:
            a8 = a.to(torch.float8_e4m3fn)
            b8 = b.t().contiguous().to(torch.float8_e4m3fn).t()
            one = torch.ones((), device=dev)
            fn = lambda: torch._scaled_mm(a8, b8, one, one, out_dtype=torch.bfloat16)  # noqa: E731
            fp8 = 2 * n**3 / cuda_seconds(fn, dev)
        except (RuntimeError, TypeError) as exc:
            print(f"fp8 GEMM not measured: {exc}")
    return peak, curve, fp8


def copy_bandwidth(dev, sizes: Sizes) -> float:
    src = torch.empty(sizes.copy, dtype=torch.int16, device=dev)
    dst = torch.empty_like(src)
    return 2 * src.numel() * 2 / cuda_seconds(lambda: dst.copy_(src), dev)


def attention_bandwidth(dev, sizes: Sizes) -> float:
    batch, keys, heads, kv_heads, dim = sizes.attention
    q = torch.randn(batch, heads, 1, dim, device=dev, dtype=torch.bfloat16)
    k = torch.randn(batch, kv_heads, keys, dim, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    fn = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # noqa: E731
    return 2 * k.numel() * 2 / cuda_seconds(fn, dev)


def launch_overhead(dev, sizes: Sizes) -> tuple[float, float]:
    x = torch.zeros(1, device=dev)
    calls = sizes.launches

    def many():
        for _ in range(calls):
            x.add_(1)

    eager = cuda_seconds(many, dev, 3) / calls
    if dev.type != "cuda":
        return eager, eager
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        many()
        with torch.cuda.graph(graph):
            many()
    torch.cuda.synchronize()
    return eager, cuda_seconds(graph.replay, dev, 3) / calls


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpu", default="h200", help="the table row this calibrates")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "benchmarks/results")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu for a dry run")
    parser.add_argument("--small", action="store_true", help="toy sizes (a dry run)")
    args = parser.parse_args(argv)
    dev, sizes = torch.device(args.device), SMALL if args.small else Sizes()
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("calibrate_gpu: no CUDA device here; nothing measured")
        return
    table = HARDWARE.get(args.gpu)
    bf16, curve, fp8 = gemm(dev, sizes)
    copy = copy_bandwidth(dev, sizes)
    attention = attention_bandwidth(dev, sizes)
    eager, graphed = launch_overhead(dev, sizes)
    name = f"{args.gpu}-measured"
    if dev.type == "cuda":
        gpu_name = torch.cuda.get_device_name()
        memory = float(torch.cuda.get_device_properties(dev).total_memory)
    else:  # a dry run
        gpu_name, memory = f"{dev.type} (dry run)", table.memory_bytes
    flops = {"bf16": bf16, **({"fp8": fp8} if fp8 else {})}
    row = {
        "description": f"{gpu_name} measured by benchmarks/calibrate_gpu.py",
        "memory_bytes": memory,
        "bandwidth": table.bandwidth,
        "flops": table.flops,
        "interconnect": table.interconnect,
        "compute_efficiency": {k: min(1.0, v / table.flops[k]) for k, v in flops.items()},
        "memory_efficiency": min(1.0, copy / table.bandwidth),
        "memory_efficiency_by_kind": {"attention": min(1.0, attention / table.bandwidth)},
        "launch_overhead_s": graphed,
        "gemm_efficiency": curve,
        "calibrated": f"{datetime.date.today().isoformat()}: measured by calibrate_gpu.py",
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.json").write_text(json.dumps({name: row}, indent=1))
    line = {
        "bench": "calibrate_gpu",
        "gpu": gpu_name,
        "bf16_tflops": bf16 / 1e12,
        "fp8_tflops": fp8 / 1e12 if fp8 else None,
        "copy_tb_s": copy / 1e12,
        "attention_tb_s": attention / 1e12,
        "launch_us_eager": eager * 1e6,
        "launch_us_graph": graphed * 1e6,
        "measured": row["compute_efficiency"] | {"memory": row["memory_efficiency"]},
        "table": table.compute_efficiency | {"memory": table.memory_efficiency},
    }
    with open(args.out / "calibrate_gpu.jsonl", "a") as f:
        f.write(json.dumps(line) + "\n")
    print(json.dumps(line, indent=1))


if __name__ == "__main__":
    main()
