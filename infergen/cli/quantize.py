"""`infergen quantize`: write a quantized checkpoint (compressed-tensors layout) that
LLM(model=DIR) loads, calibrating activations / smoothing / clipping / FP8 KV scales first."""

from __future__ import annotations

import argparse
import sys
import time

from infergen.engine.options import add_engine_args


def add_parser(sub) -> None:
    qz = sub.add_parser(
        "quantize",
        help="write a quantized checkpoint (compressed-tensors layout) that LLM(model=DIR) loads",
        description="Quantizes the decoder projections with a weight scheme — codes and scales "
        "exactly as --weights computes them — and writes a Hugging Face directory in the "
        "compressed-tensors layout (quantization_config in config.json, safetensors with "
        "weight_packed / weight_scale / ..., the tokenizer); --kv fp8_e4m3 adds per-head K / V "
        "scales calibrated on the shipped corpus. --activations, --smoothing and --calibration "
        "calibrate first (on --calib TEXT_FILE, or the shipped corpus): the smoothed / clipped "
        "weights and folded norms are written, with each projection's static input scale. The "
        "LM head and embedding stay full precision.",
    )
    qz.add_argument(
        "--weights",
        required=True,
        help="int8, int4, int4_asym, fp8_e4m3, nvfp4 or mxfp4",
    )
    qz.add_argument("--kv", default=None, help="also calibrate an FP8 KV cache: fp8_e4m3")
    qz.add_argument("--out", required=True, help="directory to write")
    add_engine_args(qz, "quantize")
    qz.set_defaults(func=cmd_quantize)


def cmd_quantize(args: argparse.Namespace) -> int:
    from infergen.engine.export import export

    started = time.perf_counter()
    print(f"quantizing {args.model or 'the default model'} to {args.weights} ...", file=sys.stderr)

    def progress(done: int, total: int) -> None:
        bar = "#" * (30 * done // total)
        print(f"\r  layers [{bar:<30}] {done}/{total}", end="", file=sys.stderr, flush=True)

    out = export(
        args.model,
        args.weights,
        args.out,
        kv_format=args.kv,
        progress=progress,
        activations=args.activations,
        calibration=args.calibration,
        smoothing=args.smoothing,
        calibration_stats=args.calibration_stats,
        calibration_text=args.calibration_text,
    )
    print(file=sys.stderr)
    size = sum(f.stat().st_size for f in out.iterdir()) / 2**20
    print(f"wrote {out} ({size:.0f} MiB) in {time.perf_counter() - started:.1f} s")
    return 0
