"""GPU quantize / dequantize throughput of infergen.formats (the Triton kernels of
infergen/formats/triton_kernels.py, through the public quantize / dequantize API on CUDA
tensors), against a device-to-device copy of the same bytes measured in the same run, the
HBM peak (REFERENCES: H200 4.8 TB/s) and the same codec's torch-eager reference on the same
GPU (`native=False`).

Per size (default 64M and 256M fp32 values, N(0, 1): 256 MiB and 1 GiB, enough to saturate
HBM) and format (default block): GB/s of fp32 input (of the fp32 output for dequantize),
median of triton.testing.do_bench. Copy = `dst.copy_(x)` of the same fp32 tensor; its GB/s
counts the input bytes only, like the formats (it moves twice that), so `%copy` is the time of
a copy over the time of the op. Run by benchmarks/device_check.sh on a lent GPU machine (about
30 s on an H200); needs only torch, triton and numpy. `--device cpu` smoke-tests the script's
logic on toy sizes (one timed call each, the C fast path). `--tile` / `--num-warps` measure
other kernel tilings than the defaults (formats/triton_tiles.TUNING).
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
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu_run import run_base  # noqa: E402
from results_file import write_lines  # noqa: E402

from infergen.formats import FORMATS, dequantize, quantize  # noqa: E402
from infergen.formats.triton_tiles import TUNING  # noqa: E402

HBM_GB_S = {"H200": 4800.0, "H100": 3350.0}
SIZES = (64 << 20, 256 << 20)  # fp32 values
WARMUP_MS, REP_MS = 10, 40  # do_bench: enough for a stable median at these sizes


def gbs(fn, nbytes: int) -> float:
    if not torch.cuda.is_available():  # --device cpu: a smoke run of this script's logic
        start = time.perf_counter()
        fn()
        return nbytes / (time.perf_counter() - start) / 1e9
    ms = triton.testing.do_bench(fn, warmup=WARMUP_MS, rep=REP_MS, return_mode="median")
    return nbytes / ms / 1e6


def measure(x: torch.Tensor, fmt: str, peer: bool) -> dict[str, tuple[float, float | None]]:
    """op -> (GB/s of the Triton path, GB/s of the torch-eager reference or None)."""
    nbytes = x.numel() * 4
    q = quantize(x, fmt)
    out = {
        "quantize": gbs(lambda: quantize(x, fmt), nbytes),
        "dequantize": gbs(lambda: dequantize(q), nbytes),
    }
    refs = {"quantize": None, "dequantize": None}
    if peer:
        q_ref = quantize(x, fmt, native=False)
        refs["quantize"] = gbs(lambda: quantize(x, fmt, native=False), nbytes)
        refs["dequantize"] = gbs(lambda: dequantize(q_ref, native=False), nbytes)
        del q_ref
    return {op: (out[op], refs[op]) for op in out}


def _count(text: str) -> int:
    """'64M' / '1K' / '4096' → a value count."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--sizes",
        type=lambda s: [_count(p) for p in s.split(",")],
        default=list(SIZES),
        help="comma-separated fp32 value counts (K/M/G suffixes), default 64M,256M",
    )
    parser.add_argument("--formats", default=",".join(FORMATS), help="comma-separated")
    parser.add_argument(
        "--peer-size",
        type=_count,
        default=SIZES[0],
        help="the size at which the torch-eager reference is also timed (0: never)",
    )
    parser.add_argument(
        "--out", type=pathlib.Path, default=ROOT / "benchmarks/results/formats_gpu.jsonl"
    )
    parser.add_argument(
        "--tile", type=int, default=TUNING["tile"], help="values per program (a power of two)"
    )
    parser.add_argument("--num-warps", type=int, default=TUNING["num_warps"])
    parser.add_argument("--device", default="cuda", help="cpu: smoke-test the script only")
    args = parser.parse_args(argv)
    if args.tile < 64 or args.tile & (args.tile - 1):
        parser.error(f"--tile {args.tile}: a power of two >= 64")
    if any(n % 32 for n in args.sizes):
        parser.error(f"--sizes {args.sizes}: multiples of 32 (whole blocks)")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_formats_gpu: no CUDA device (run it on a GPU machine)")
    formats = [FORMATS.get(f, where="--formats").name for f in args.formats.split(",")]
    cuda = args.device == "cuda"
    name = torch.cuda.get_device_name() if cuda else "cpu (smoke run)"
    hbm = next((v for k, v in HBM_GB_S.items() if k in name), None)
    sms = torch.cuda.get_device_properties(0).multi_processor_count if cuda else 0
    base = run_base("formats_gpu", name, sms)
    TUNING.update(tile=args.tile, num_warps=args.num_warps)
    lines = []
    for numel in args.sizes:
        cols = 8192 if numel % 8192 == 0 else numel
        params = {"numel": numel, "shape": [numel // cols, cols], "dtype": "float32"}
        size_base = {**base, "params": {**params, "tile": args.tile, "num_warps": args.num_warps}}
        x = torch.randn(*params["shape"], device=args.device)
        dst = torch.empty_like(x)
        copy = gbs(lambda dst=dst, x=x: dst.copy_(x), x.numel() * 4)
        del dst
        copy_line = {**size_base, "kind": "result", "metric": "copy_gb_s"}
        copy_line.update(engine="torch copy_", value=copy, unit="GB/s", hbm_peak_gb_s=hbm)
        lines.append(copy_line)
        print(f"\n{name}, {numel / 2**20:.0f}M fp32 values: copy {copy:.0f} GB/s of input "
              f"(HBM peak {hbm} GB/s)")  # fmt: skip
        print(f"{'format':<12} {'op':<10} {'triton':>8} {'%copy':>6} {'%HBM':>6} {'eager':>8}")
        for fmt in formats:
            for op, (ours, ref) in measure(x, fmt, peer=numel == args.peer_size).items():
                metric = f"{op}_gb_s_{fmt}"
                result = {**size_base, "kind": "result", "metric": metric, "engine": "infergen"}
                result.update(value=ours, unit="GB/s", fraction_of_copy=ours / copy)
                result["fraction_of_hbm"] = ours / hbm if hbm else None
                lines.append(result)
                if ref is not None:
                    ratio = {**size_base, "kind": "ratio", "metric": metric, "engine": "infergen"}
                    ratio.update(peer="torch", infergen_value=ours, peer_value=ref)
                    ratio.update(value=ours / ref, unit="x")
                    ratio["definition"] = "Triton / torch-eager reference codec, same GPU"
                    lines.append(ratio)
                hbm_pct = f"{100 * ours / hbm:5.0f}%" if hbm else "     -"
                eager = f"{ref:8.0f}" if ref is not None else "       -"
                print(f"{fmt:<12} {op:<10} {ours:8.0f} {100 * ours / copy:5.0f}% {hbm_pct} {eager}")
        del x
    write_lines(args.out, lines)


if __name__ == "__main__":
    main()
