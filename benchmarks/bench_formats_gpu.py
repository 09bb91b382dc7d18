"""GPU quantize / dequantize throughput of infergen.formats (the Triton kernels, through the
public quantize / dequantize API on CUDA tensors), against the same codec's torch-eager
reference on the same GPU (`native=False`), the device-to-device copy measured in the same run,
and the HBM peak (REFERENCES: H200 4.8 TB/s).

An 8192x8192 fp32 tensor (N(0,1), 256 MiB) per format; GB/s of fp32 input (the fp32 output for
dequantize), median of triton.testing.do_bench. Copy = `dst.copy_(x)` (its GB/s counts the
input bytes only, like the formats; it moves twice that). Run by benchmarks/device_check.sh on
a lent GPU machine; needs only torch, triton and numpy.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import torch
import triton

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpu_run import run_base  # noqa: E402
from results_file import write_lines  # noqa: E402

from infergen.formats import FORMATS, dequantize, quantize  # noqa: E402

HBM_GB_S = {"H200": 4800.0, "H100": 3350.0}


def gbs(fn, nbytes: int) -> float:
    if not torch.cuda.is_available():  # --device cpu: a smoke run of this script's logic
        start = time.perf_counter()
        fn()
        return nbytes / (time.perf_counter() - start) / 1e9
    return nbytes / triton.testing.do_bench(fn, return_mode="median") / 1e6


def measure(x: torch.Tensor, fmt: str) -> dict[str, tuple[float, float]]:
    """op -> (GB/s of the Triton path, GB/s of the torch-eager reference), default block."""
    nbytes = x.numel() * 4
    q, q_ref = quantize(x, fmt), quantize(x, fmt, native=False)
    return {
        "quantize": (
            gbs(lambda: quantize(x, fmt), nbytes),
            gbs(lambda: quantize(x, fmt, native=False), nbytes),
        ),
        "dequantize": (
            gbs(lambda: dequantize(q), nbytes),
            gbs(lambda: dequantize(q_ref, native=False), nbytes),
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", type=int, default=8192, help="side of the square tensor")
    parser.add_argument(
        "--out", type=pathlib.Path, default=ROOT / "benchmarks/results/formats_gpu.jsonl"
    )
    parser.add_argument("--device", default="cuda", help="cpu: smoke-test the script only")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_formats_gpu: no CUDA device (run it on a GPU machine)")
    cuda = args.device == "cuda"
    name = torch.cuda.get_device_name() if cuda else "cpu (smoke run)"
    hbm = next((v for k, v in HBM_GB_S.items() if k in name), None)
    sms = torch.cuda.get_device_properties(0).multi_processor_count if cuda else 0
    base = {**run_base("formats_gpu", name, sms),
            "params": {"shape": [args.size, args.size], "dtype": "float32"}}  # fmt: skip
    x = torch.randn(args.size, args.size, device=args.device)
    nbytes = x.numel() * 4
    dst = torch.empty_like(x)
    copy = gbs(lambda: dst.copy_(x), nbytes)
    lines = [
        {
            **base,
            "kind": "result",
            "metric": "copy_gb_s",
            "engine": "torch copy_",
            "value": copy,
            "unit": "GB/s",
            "hbm_peak_gb_s": hbm,
        }
    ]
    print(f"{name}: copy {copy:.0f} GB/s of input (HBM peak {hbm} GB/s)\n")
    print(f"{'format':<12} {'op':<10} {'triton':>8} {'eager':>8} {'ratio':>6} {'%copy':>6}", end="")
    print(f" {'%HBM':>6}")
    for fmt in FORMATS:
        for op, (ours, ref) in measure(x, fmt).items():
            metric = f"{op}_gb_s_{fmt}"
            result = {**base, "kind": "result", "metric": metric, "engine": "infergen"}
            result.update(value=ours, unit="GB/s", fraction_of_copy=ours / copy)
            result["fraction_of_hbm"] = ours / hbm if hbm else None
            ratio = {**base, "kind": "ratio", "metric": metric, "engine": "infergen"}
            ratio.update(peer="torch", infergen_value=ours, peer_value=ref, value=ours / ref)
            ratio.update(unit="x", definition="Triton / torch-eager reference codec, same GPU")
            lines += [result, ratio]
            hbm_pct = f"{100 * ours / hbm:5.0f}%" if hbm else "     –"
            print(
                f"{fmt:<12} {op:<10} {ours:8.0f} {ref:8.0f} {ours / ref:6.1f} "
                f"{100 * ours / copy:5.0f}% {hbm_pct}"
            )
    write_lines(args.out, lines)


if __name__ == "__main__":
    main()
