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
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from infergen.perf.hardware import HARDWARE  # noqa: E402


def cuda_seconds(fn, repeats: int = 10) -> float:
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


def gemm(dev) -> tuple[float, dict[int, float], float | None]:
    n = 8192
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    peak = 2 * n**3 / cuda_seconds(lambda: a @ b)
    curve = {}
    for rows in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096):
        x = torch.randn(rows, n, device=dev, dtype=torch.bfloat16)
        curve[rows] = min(1.0, 2 * rows * n * n / cuda_seconds(lambda x=x: x @ b) / peak)
    fp8 = None
    if hasattr(torch, "_scaled_mm") and hasattr(torch, "float8_e4m3fn"):
        try:
            a8 = a.to(torch.float8_e4m3fn)
            b8 = b.t().contiguous().to(torch.float8_e4m3fn).t()
            one = torch.ones((), device=dev)
            fn = lambda: torch._scaled_mm(a8, b8, one, one, out_dtype=torch.bfloat16)  # noqa: E731
            fp8 = 2 * n**3 / cuda_seconds(fn)
        except (RuntimeError, TypeError) as exc:
            print(f"fp8 GEMM not measured: {exc}")
    return peak, curve, fp8


def copy_bandwidth(dev) -> float:
    src = torch.empty(1 << 30, dtype=torch.int16, device=dev)  # 2 GiB
    dst = torch.empty_like(src)
    return 2 * src.numel() * 2 / cuda_seconds(lambda: dst.copy_(src))


def attention_bandwidth(dev) -> float:
    batch, keys, heads, kv_heads, dim = 64, 4096, 32, 8, 128
    q = torch.randn(batch, heads, 1, dim, device=dev, dtype=torch.bfloat16)
    k = torch.randn(batch, kv_heads, keys, dim, device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    fn = lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # noqa: E731
    return 2 * k.numel() * 2 / cuda_seconds(fn)


def launch_overhead(dev) -> tuple[float, float]:
    x = torch.zeros(1, device=dev)
    calls = 1000

    def many():
        for _ in range(calls):
            x.add_(1)

    eager = cuda_seconds(many, 3) / calls
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        many()
        with torch.cuda.graph(graph):
            many()
    torch.cuda.synchronize()
    return eager, cuda_seconds(graph.replay, 3) / calls


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gpu", default="h200", help="the table row this calibrates")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "benchmarks/results")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("calibrate_gpu: no CUDA device here; nothing measured")
        return
    dev = torch.device("cuda")
    table = HARDWARE.get(args.gpu)
    bf16, curve, fp8 = gemm(dev)
    copy = copy_bandwidth(dev)
    attention = attention_bandwidth(dev)
    eager, graphed = launch_overhead(dev)
    name = f"{args.gpu}-measured"
    flops = {"bf16": bf16, **({"fp8": fp8} if fp8 else {})}
    row = {
        "description": f"{torch.cuda.get_device_name()} measured by benchmarks/calibrate_gpu.py",
        "memory_bytes": float(torch.cuda.get_device_properties(dev).total_memory),
        "bandwidth": table.bandwidth,
        "flops": table.flops,
        "interconnect": table.interconnect,
        "compute_efficiency": {k: min(1.0, v / table.flops[k]) for k, v in flops.items()},
        "memory_efficiency": min(1.0, copy / table.bandwidth),
        "memory_efficiency_by_kind": {"attention": min(1.0, attention / table.bandwidth)},
        "launch_overhead_s": graphed,
        "gemm_efficiency": curve,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.json").write_text(json.dumps({name: row}, indent=1))
    line = {
        "bench": "calibrate_gpu",
        "gpu": torch.cuda.get_device_name(),
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
