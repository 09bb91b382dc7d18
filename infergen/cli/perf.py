"""`infergen perf calibrate | step`: measure this machine's peaks as a hardware row; the
predicted time of one engine step, op by op (the performance model, perf/)."""

from __future__ import annotations

import argparse
import sys

from infergen.cli.predict import add_device_args, describe_model, weight_formats
from infergen.errors import ConfigError


def add_parser(sub) -> None:
    perf = sub.add_parser("perf", help="performance model: `infergen perf calibrate|step`")
    perf_sub = perf.add_subparsers(dest="perf_command", required=True, metavar="COMMAND")
    cal = perf_sub.add_parser(
        "calibrate",
        help="measure this machine's peaks (GEMM FLOP/s by row count, read bandwidth, host "
        "copy bandwidth, launch cost, decode and prefill attention efficiency, the KV disk "
        "tier's per-block costs, the engine's layers run op by op, by part, and the link "
        "between tensor-parallel ranks: the engine's all-reduce over 2 gloo processes) as "
        "the `cpu-local` hardware row",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    cal.add_argument("--threads", type=int, default=None, help="threads (default: torch's)")
    cal.add_argument("--quick", action="store_true", help="smaller buffers, fewer repeats")
    cal.add_argument("--out", default=None, help="JSON file (default: the cache directory)")
    cal.add_argument("--disk-dir", default=None, help="where to time the KV disk tier: a "
                     "directory on the filesystem --kv-offload-dir will use (a temporary "
                     "directory is made inside it and removed; default: the system's "
                     "temporary directory)")  # fmt: skip
    cal.add_argument("--processes", type=int, default=1, help="calibrate in this many fresh "
                     "processes, one after another, and keep each rate's fastest (on a shared VM "
                     "the memory and GEMM rates drift by up to 1.5x from one minute to the "
                     "next: three calibrations here read 35, 35 and 56 GB/s)")  # fmt: skip
    cal.set_defaults(func=cmd_perf_calibrate)
    step = perf_sub.add_parser(
        "step",
        help="predicted time of one engine step, op by op, and what bounds each op",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_device_args(step)
    step.add_argument("--batch", type=int, default=1, help="sequences in the step")
    step.add_argument("--context", type=int, default=1024, help="tokens per sequence")
    step.add_argument("--new", type=int, default=1, help="new tokens per sequence (1 = decode)")
    step.add_argument("--kv", default="bf16", help="KV cache format")
    step.add_argument("--compute", default=None, help="compute format (default: from weights)")
    step.set_defaults(func=cmd_perf_step)


def cmd_perf_calibrate(args: argparse.Namespace) -> int:
    import pathlib

    from infergen.perf.calibrate import measure, save
    from infergen.perf.hardware import default_path

    print(
        "measuring GEMM FLOP/s, read bandwidth, launch cost, attention, layers op by op, "
        "the link between 2 ranks ...",
        file=sys.stderr,
        flush=True,
    )
    if args.processes < 1:
        raise ConfigError("--processes must be at least 1", where="--processes",
                          found=str(args.processes))  # fmt: skip
    if args.processes > 1:
        hw = _across_processes(args)
    else:
        hw = measure(args.threads, quick=args.quick, disk_dir=args.disk_dir)
    path = save(hw, pathlib.Path(args.out) if args.out else default_path())
    print(f"GEMM fp32      {hw.flops['fp32'] / 1e9:8.1f} GFLOP/s")
    for compute, flops in hw.product_flops.items():  # (bf16 products, W8A8's integers)
        print(f"GEMM {compute:<9} {flops / 1e9:8.1f} GFLOP/s")
    print(f"read bandwidth {hw.bandwidth / 1e9:8.1f} GB/s")
    for curve, size in zip((hw.gemm_efficiency, hw.gemm_efficiency_large),
                           hw.gemm_weight_bytes, strict=False):  # fmt: skip
        one = hw.flops["fp32"] * curve[1] * 2 / 1e9  # 1-row GB/s of fp32 weights
        print(f"GEMM {size / 2**20:6.1f} MiB {one:8.1f} GB/s at 1 row, "
              f"{100 * curve.get(9, 0):.0f} % of the peak at 9, {100 * curve.get(64, 0):.0f} % "
              "at 64")  # fmt: skip
    print(f"host copy      {hw.host_bandwidth / 1e9:8.1f} GB/s (KV host tier loads)")
    print(f"launch cost    {hw.launch_overhead_s * 1e6:8.1f} us")
    disk = hw.disk
    print(f"disk read      {disk.read_file_s * 1e6:8.1f} us a file + "
          f"{disk.read_bandwidth / 1e9:.2f} GB/s (KV disk tier blocks)")  # fmt: skip
    print(f"disk write     {disk.write_file_s * 1e6:8.1f} us a file + "
          f"{disk.write_bandwidth / 1e9:.2f} GB/s")  # fmt: skip
    print(f"link           {hw.link_latency_s * 1e6:8.1f} us a collective + "
          f"{hw.interconnect / 1e9:.2f} GB/s (2 tensor-parallel ranks, gloo)")  # fmt: skip
    for kind, share in hw.memory_efficiency_by_kind.items():
        print(f"{kind:<14} {100 * share:8.1f} % of the bandwidth ({_WHEN.get(kind, 'decode')})")
    for kind, share in hw.compute_efficiency_by_kind.items():
        print(f"{kind:<14} {100 * share:8.1f} % of the GEMM peak ({_WHEN.get(kind, 'prefill')})")
    for part, (decode, prefill) in hw.eager_layer_s.items():
        print(f"{part:<14} {decode * 1e6:8.1f} us a decode, {prefill * 1e6:.1f} us a prefill "
              "(op by op)")  # fmt: skip
    print(f"wrote {path} (hardware row {hw.name!r})")
    return 0


# (calibrate's other kinds: by phase)
_WHEN = {"verify_attention": "a verifying decode's rows", "scan": "an SSD scan's prefill"}


def _across_processes(args: argparse.Namespace):
    """`infergen perf calibrate` in args.processes fresh processes, their rows folded by
    calibrate.best_of (each rate the fastest: contention or a slow process only lowers one)."""
    import json
    import pathlib
    import subprocess
    import tempfile

    from infergen.perf.calibrate import best_of
    from infergen.perf.hardware import from_dict

    passed = [
        f"--{name.replace('_', '-')}={value}"
        for name, value in (("threads", args.threads), ("disk_dir", args.disk_dir))
        if value is not None
    ]
    passed += ["--quick"] if args.quick else []  # fmt: skip
    hw = None
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.processes):
            out = pathlib.Path(tmp) / f"{i}.json"
            cmd = [sys.executable, "-m", "infergen", "perf", "calibrate", f"--out={out}", *passed]
            run = subprocess.run(cmd, capture_output=True, text=True)
            if run.returncode != 0:
                raise ConfigError(f"calibration process {i + 1} failed", where="--processes",
                                  found=(run.stderr or run.stdout).strip()[-500:])  # fmt: skip
            ((name, fields),) = json.loads(out.read_text()).items()  # (save's one row)
            row = from_dict(name, fields, str(out))
            one = row.flops["fp32"] * row.gemm_efficiency_at(1) * 2 / 1e9  # 1-row GB/s of fp32
            print(f"process {i + 1}/{args.processes}: read bandwidth {row.bandwidth / 1e9:.1f} "
                  f"GB/s, 1-row GEMM {one:.1f} GB/s of weights", file=sys.stderr)  # fmt: skip
            hw = row if hw is None else best_of(hw, row)
    return hw


def cmd_perf_step(args: argparse.Namespace) -> int:
    from infergen.perf import roofline
    from infergen.perf.hardware import bits_of, resolve
    from infergen.perf.step_cost import Chunk, Formats

    hw = resolve(args.gpu, args.hardware_file)
    if args.model is None:
        from infergen.io.default_model import default_model_path

        args.model = str(default_model_path())
    desc = describe_model(args.model)
    weights, bits, _, expert_bits = weight_formats(args, desc)
    fmt = Formats(weight_bits=bits, kv_bits=bits_of(args.kv), act_bytes=2,
                  expert_weight_bits=expert_bits)  # fmt: skip
    compute = args.compute or ("fp32" if weights == "fp32" else "bf16")
    chunks = [Chunk(args.new, args.context)] * args.batch
    times = roofline.predict_step(desc, hw, chunks, fmt, compute)
    print(f"{desc.name} on {hw.description}: batch {args.batch}, {args.new} new of {args.context}")
    print(hw.efficiency_note())
    print(roofline.explain(times))
    return 0
