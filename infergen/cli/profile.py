"""`infergen profile`: run engine steps on a model and report where the time goes, per kernel
(bench/profile.py runs and records them, bench/profile_table.py tabulates), against the
roofline of this machine's calibration or the device's hardware row (perf/hardware.py); a
Chrome / Perfetto trace, a roofline plot, `--json`."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from infergen.cli.common import load_llm, non_negative_count, positive_count
from infergen.engine.options import add_engine_args, options_from_args

TOP_ROWS = 30  # rows printed per phase without --all


def add_parser(sub) -> None:
    p = sub.add_parser(
        "profile",
        help="run engine steps and report where the time goes, per kernel: calls, time, "
        "FLOPs, bytes, achieved rates against the roofline; a trace and a roofline plot",
        description="Run prefill and decode steps of a workload (random prompts) on the "
        "engine, timed plainly and then under torch.profiler, and print per phase a table "
        "with a row per (op, kernel): calls, time per step, share, FLOPs and bytes per step, "
        "achieved GFLOP/s and GB/s, the share of the roofline and what bounds the row "
        "(compute, memory, or overhead: more than 3x the roofline's time). The header gives "
        "the measured step time and how much of it the per-kernel times cover.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_engine_args(p, "profile")
    work = p.add_argument_group("workload")
    work.add_argument(
        "--prompt-tokens", type=positive_count, default=512, help="tokens per prompt (random ids)"
    )
    work.add_argument(
        "--cached-tokens",
        type=non_negative_count,
        default=0,
        help="a shared prefix of this many tokens that every prompt starts with, computed "
        "once before the runs: each prefill then computes its --prompt-tokens after a prefix "
        "hit (a conversation's next turn)",
    )
    work.add_argument("--batch", type=positive_count, default=1, help="sequences per step")
    work.add_argument(
        "--decode-steps",
        type=positive_count,
        default=32,
        help="decode steps measured (and profiled)",
    )
    work.add_argument(
        "--warmup",
        type=positive_count,
        default=2,
        help="decode steps before the measured ones (prefill: one warm-up run)",
    )
    work.add_argument(
        "--prefill-runs",
        type=positive_count,
        default=2,
        help="prefills of the batch measured (and profiled)",
    )
    work.add_argument("--phase", choices=("both", "prefill", "decode"), default="both")
    work.add_argument("--seed", type=int, default=0, help="the prompts' random seed")
    out = p.add_argument_group("roofline and outputs")
    out.add_argument(
        "--gpu",
        default=None,
        metavar="ROW",
        help="hardware row of the roofline (as `infergen predict --gpu`); default: "
        "cpu-local (`infergen perf calibrate`) on the CPU, the GPU's table row on "
        "a GPU",
    )
    out.add_argument("--hardware-file", default=None, help="extra hardware rows (JSON/YAML)")
    out.add_argument(
        "--trace",
        default=None,
        metavar="FILE.json",
        help="write the profiled steps as a Chrome / Perfetto trace",
    )
    out.add_argument("--plot", default=None, metavar="FILE.png", help="write the roofline plot")
    out.add_argument(
        "--json",
        action="store_true",
        help="print one JSON document (rows and totals) instead of the tables",
    )
    out.add_argument("--all", action="store_true", help=f"every row (default: {TOP_ROWS})")
    p.set_defaults(func=cmd_profile)


def cmd_profile(args: argparse.Namespace) -> int:
    from infergen.bench.profile import PHASES, ProfileWorkload, profile_engine, write_trace
    from infergen.bench.profile_table import format_phase

    workload = ProfileWorkload(
        prompt_tokens=args.prompt_tokens,
        batch=args.batch,
        decode_steps=args.decode_steps,
        warmup=args.warmup,
        prefill_runs=args.prefill_runs,
        phases=PHASES if args.phase == "both" else (args.phase,),
        seed=args.seed,
        cached_tokens=args.cached_tokens,
    )
    llm = load_llm(args)
    try:
        roofline, note = roofline_of(llm.engine, args.gpu, args.hardware_file)
        if note:
            print(note, file=sys.stderr)
        result = profile_engine(llm.engine, workload, roofline)
    finally:
        llm.close()
    if args.trace:
        write_trace(result, args.trace)
        print(
            f"wrote {args.trace} (open in https://ui.perfetto.dev or chrome://tracing)",
            file=sys.stderr,
        )
    if args.plot:
        from infergen.bench.profile_plot import plot_roofline

        plot_roofline(result.phases, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    if args.json:
        document = {
            "model": str(llm.engine.checkpoint_path),
            "options": {k: _jsonable(v) for k, v in options_from_args(args, "profile").items()},
            "workload": asdict(workload),
            "roofline": None if roofline is None else asdict(roofline),
            "phases": {name: phase.as_dict() for name, phase in result.phases.items()},
        }
        print(json.dumps(document, indent=1))
        return 0
    for phase in result.phases.values():
        print(format_phase(phase, None if args.all else TOP_ROWS))
        print()
    return 0


def roofline_of(engine, name: str | None, hardware_file: str | None):
    """(Roofline or None, a note for stderr): the row `name` (default: cpu-local on the CPU,
    the GPU's table row on a GPU) at its peaks times its calibrated efficiencies."""
    import torch

    from infergen.bench.profile_table import Roofline
    from infergen.errors import ConfigError
    from infergen.perf.hardware import CPU_LOCAL, HARDWARE, resolve

    device = engine.kv_cache.device
    if name is None and device.type == "cuda":
        gpu = torch.cuda.get_device_name(device).lower()
        found = sorted((n for n in HARDWARE if n in gpu.replace(" ", "")), key=len)
        if not found:
            return None, f"no hardware row for {gpu!r}: no roofline (pass --gpu ROW)"
        name = found[-1]
    name = name or CPU_LOCAL
    try:  # (a file's rows are registered once per process)
        hw = resolve(name, hardware_file if name not in HARDWARE else None)
    except ConfigError as exc:
        return None, f"no roofline: {exc}"
    # the engine's compute dtype (fp16 at the bf16 peak: a row's 16-bit peaks are one number)
    compute = "fp32" if engine.runner.model.dtype == torch.float32 else "bf16"
    compute_share, memory_share = hw.compute_efficiency_for(compute), hw.memory_efficiency
    flops = hw.peak_flops(compute) * compute_share
    source = f"{hw.name}, {hw.description}: "
    if compute_share == memory_share == 1.0:  # (cpu-local: the peaks are what was measured)
        source += f"{hw.runs_as(compute)} GEMM and read bandwidth as measured"
    else:
        source += (f"{hw.runs_as(compute)} peak x {compute_share:g}, bandwidth x "
                   f"{memory_share:g}")  # fmt: skip
    source += f"; {hw.efficiency_note()}"
    # the other compute classes the row has peaks for (a table row's formats; a calibration's
    # measured bf16 / W8A8 products, e.g. AMX tiles'): a product is measured against its own
    by_compute = {c: hw.peak_flops(c) * hw.compute_efficiency_for(c) for c in hw.flops}
    by_compute |= hw.product_flops
    if len(by_compute) > 1:
        source += (
            "; "
            + ", ".join(
                f"{c} {v / 1e9:.0f}" for c, v in by_compute.items() if c != hw.runs_as(compute)
            )
            + " GFLOP/s for their products"
        )
    return Roofline(flops, hw.bandwidth * memory_share, source, by_compute), None


def _jsonable(value):
    return value if isinstance(value, (str, int, float, bool, type(None), list)) else str(value)
