"""`infergen formats`: the low-precision formats as a table (bits per value, range, SQNR on
random and real weights, quantize / dequantize throughput), optionally as JSON and a plot."""

from __future__ import annotations

import argparse
import sys

from infergen.cli.common import positive_count


def add_parser(sub) -> None:
    fmts = sub.add_parser(
        "formats",
        help="table of the low-precision formats: bits/value, range, SQNR, speed",
        description="Every format of infergen.formats with its bits per value (scales "
        "included), largest and smallest subnormal element, SQNR on N(0,1) data and on a "
        "model's real weights, and quantize/dequantize throughput on this machine.",
    )
    fmts.add_argument(
        "--model",
        "-m",
        default=None,
        help="weights for the SQNR column (default: the default model)",
    )
    fmts.add_argument("--no-weights", action="store_true", help="skip the real-weights column")
    fmts.add_argument(
        "--size",
        type=_positive_int,
        default=2048,
        help="side of the square tensor timed for throughput (default 2048)",
    )
    fmts.add_argument(
        "--plot",
        metavar="FILE.png",
        default=None,
        help="draw SQNR against bits per value (needs matplotlib)",
    )
    fmts.add_argument("--json", metavar="FILE", default=None, help="also write the rows as JSON")
    fmts.set_defaults(func=cmd_formats)


def cmd_formats(args: argparse.Namespace) -> int:
    import json

    from infergen.eval import formats_report as report

    weights = None
    if not args.no_weights:
        print(f"loading weights of {args.model or 'the default model'} ...", file=sys.stderr)
        weights = report.real_weights(args.model)
    rows = report.format_table(weights, size=args.size, progress=sys.stderr.isatty())
    print(report.render(rows))
    print(
        f"\nSQNR = 10·log10(Σx² / Σ(x − dequant(quant(x)))²). Weights: the q/k/v/o/gate/up/down "
        f"projections of 3 layers, blocked along the input axis. Throughput: GB/s of fp32 "
        f"input, {args.size}x{args.size} tensor, reference codec, {_threads()} threads."
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report.as_dicts(rows), f, indent=1)
        print(f"wrote {args.json}")
    if args.plot:
        report.plot(rows, args.plot)
        print(f"wrote {args.plot}")
    return 0


def _positive_int(text: str) -> int:
    value = positive_count(text)
    if value % 128:
        raise argparse.ArgumentTypeError(f"expected a positive multiple of 128, got {value}")
    return value


def _threads() -> int:
    import torch

    return torch.get_num_threads()
