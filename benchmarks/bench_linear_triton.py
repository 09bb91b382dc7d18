"""GPU weight-only quantized linear (ops/linear_triton.py) against torch F.linear on the same
GPU with the weight in the activations' dtype (bf16 by default), for the default model's
projection shapes (out x in: 576x576 q/o, 1536x576 gate/up, 576x1536 down, 192x576 k/v) at
decode (1, 16 tokens) and prefill (512 tokens) sizes.

One JSON line per format / shape / token count: microseconds (median GPU time of
triton.testing.do_bench_cudagraph, both sides: kernel time without Python launch cost),
TFLOP/s (2·tokens·in·out), GB/s (the prepared weight's bytes plus x and y; the peer's bf16
weight plus x and y), and `value` = peer time / our time (> 1: faster than torch).
`max_rel_err` is the largest |y − reference| / max |reference| against the float64
reference on the same layout, a sanity check (tests/ops/test_linear_triton.py asserts it).
Run by benchmarks/device_check.sh on a lent GPU machine; needs torch, triton and numpy. The
GGUF formats quantize through the gguf package; where it is missing (the GPU machine's image)
their codes and scales are random (`weights: "synthetic"`: the speed does not depend on them).
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import torch
import torch.nn.functional as F

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpu_run import run_base  # noqa: E402
from results_file import write_lines  # noqa: E402

SHAPES = [(576, 576), (1536, 576), (576, 1536), (192, 576)]  # (out N, in K)
TOKENS = [1, 16, 512]
GGUF_FORMATS = ("q4_0", "q4_1", "q8_0")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def synthetic(n: int, k: int, fmt: str) -> dict[str, torch.Tensor]:
    """Random codes and fp16 scales in a GGUF format's layout (no gguf package here)."""
    from infergen.ops.linear_triton import TRITON_FORMATS

    layout = TRITON_FORMATS.get(fmt)
    gen = torch.Generator().manual_seed(n * k)
    codes = torch.randint(0, 256, (n, k // 2 if layout.packed else k), generator=gen)
    codes = codes.to(torch.uint8)
    groups = (n, k // 32)
    prepared = {
        "codes": codes.view(torch.int8) if layout.code == "int8" else codes,
        "scales": (torch.rand(groups, generator=gen) * 0.01).half(),
    }
    if layout.offset == "min":
        prepared["mins"] = (-torch.rand(groups, generator=gen) * 0.1).half()
    return prepared


def weights(n: int, k: int, fmt: str) -> tuple[dict[str, torch.Tensor], str]:
    from infergen.ops.linear_triton import prepare_triton

    if fmt in GGUF_FORMATS:
        try:
            import gguf  # noqa: F401
        except ImportError:
            return synthetic(n, k, fmt), "synthetic"
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(n + k)) * 0.05
    return prepare_triton(w, fmt), "quantized N(0, 0.05)"


def microseconds(fn, rep_ms: int) -> tuple[float, str]:
    """Median GPU time of fn in µs, replayed from a CUDA graph (kernel time, as a decode step
    captured in a graph runs it; no Python launch cost), or eagerly if capture fails."""
    import triton

    fn()  # compile
    torch.cuda.synchronize()
    try:
        t = triton.testing.do_bench_cudagraph(fn, rep=rep_ms, return_mode="median")
        return t * 1e3, "cuda graph"
    except RuntimeError:
        t = triton.testing.do_bench(fn, warmup=10, rep=rep_ms, return_mode="median")
        return t * 1e3, "eager"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out", type=pathlib.Path, default=ROOT / "benchmarks/results/linear_triton.jsonl"
    )
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--formats", default="all", help="comma-separated, or all")
    parser.add_argument("--rep-ms", type=int, default=20, help="graph replay time per measurement")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("bench_linear_triton: no CUDA device here; run it on a GPU machine. Nothing done.")
        return

    from infergen.ops.linear_triton import TRITON_FORMATS, linear_triton, reference

    dtype = DTYPES[args.dtype]
    formats = list(TRITON_FORMATS) if args.formats == "all" else args.formats.split(",")
    name = torch.cuda.get_device_name()
    base = run_base(
        "linear_triton", name, torch.cuda.get_device_properties(0).multi_processor_count
    )
    print(f"{name}: y = x·dequant(W)ᵀ, x {args.dtype}; peer torch F.linear with a {args.dtype} W")
    head = f"{'format':<10} {'out x in':>10} {'tokens':>6} {'us':>8} {'TFLOP/s':>8} {'GB/s':>7}"
    print(f"{head} {'torch us':>9} {'ratio':>6} {'rel err':>8}")
    lines = []
    for n, k in SHAPES:
        gen = torch.Generator().manual_seed(k)
        xs = {m: torch.randn(m, k, generator=gen).to("cuda", dtype) for m in TOKENS}
        peer_weight = (torch.randn(n, k, generator=gen) * 0.05).to("cuda", dtype)
        peers = {}  # tokens -> (µs, timing) of F.linear(x, peer_weight)
        for fmt in formats:
            prepared_cpu, origin = weights(n, k, fmt)
            prepared = {key: t.cuda() for key, t in prepared_cpu.items()}
            weight_bytes = sum(t.numel() * t.element_size() for t in prepared.values())
            for m, x in xs.items():
                if m not in peers:
                    peers[m] = microseconds(lambda x=x, w=peer_weight: F.linear(x, w), args.rep_ms)
                ours, timing = microseconds(
                    lambda x=x, p=prepared, f=fmt: linear_triton(x, p, None, f), args.rep_ms
                )
                y = linear_triton(x, prepared, None, fmt).float().cpu()
                want = reference(x.float().cpu(), prepared_cpu, None, fmt)
                rel_err = float((y - want).abs().max() / want.abs().max().clamp_min(1e-30))
                flops = 2.0 * m * n * k
                io_bytes = (m * k + m * n) * x.element_size()
                peer_us, peer_timing = peers[m]
                peer_bytes = n * k * peer_weight.element_size() + io_bytes
                line = {
                    **base,
                    "kind": "ratio",
                    "metric": f"linear_us_{fmt}_{n}x{k}_t{m}",
                    "engine": "infergen",
                    "peer": f"torch F.linear {args.dtype}",
                    "format": fmt,
                    "weights": origin,
                    "params": {"out": n, "in": k, "tokens": m, "dtype": args.dtype},
                    "tokens": m,
                    "us": ours,
                    "tflops": flops / ours / 1e6,
                    "gb_s": (weight_bytes + io_bytes) / ours / 1e3,
                    "weight_bytes": weight_bytes,
                    "timing": timing,
                    "peer_us": peer_us,
                    "peer_timing": peer_timing,
                    "peer_tflops": flops / peer_us / 1e6,
                    "peer_gb_s": peer_bytes / peer_us / 1e3,
                    "value": peer_us / ours,
                    "unit": "x",
                    "definition": "torch F.linear time / Triton quantized linear time, same GPU",
                    "max_rel_err": rel_err,
                }
                lines.append(line)
                print(
                    f"{fmt:<10} {f'{n}x{k}':>10} {m:>6} {ours:8.1f} {line['tflops']:8.2f} "
                    f"{line['gb_s']:7.0f} {peer_us:9.1f} {line['value']:6.2f} {rel_err:8.1e}"
                )
    write_lines(args.out, lines)


if __name__ == "__main__":
    main()
