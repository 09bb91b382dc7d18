"""`infergen predict`: the performance model's command line (parser and command).

Builds a `perf.predict.Deployment` from the flags, simulates the load and prints a report,
the JSON result (`--json`), the per-op table of a step (`--explain`), or a sweep over one
parameter as a table plus a PNG plot (`--sweep NAME=V1,V2,...`). With the engine's KV offload
options (`--kv-offload-memory`, `--kv-offload-dir`, ...: engine/options.py) the load runs
twice, with the tiers and without, and the report adds the gains (perf/offload.py).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys

from infergen.bench.workloads import add_workload_args
from infergen.config import parse_bytes
from infergen.engine.admission import ADMISSION
from infergen.engine.options import add_engine_args
from infergen.errors import ConfigError

# flags a sweep may vary: name -> the type of its values
SWEEPABLE = {
    "concurrency": int,
    "rate": float,
    "tp": int,
    "ep": int,
    "isl": int,
    "osl": int,
    "max_num_seqs": int,
    "max_num_batched_tokens": int,
    "spec_tokens": int,
    "spec_acceptance": float,
    "spec_verify_fraction": float,
    "num_requests": int,
}


def add_weight_args(p: argparse.ArgumentParser) -> None:
    """--weights and --expert-weights: default, the checkpoint's stored formats."""
    p.add_argument(
        "--weights",
        default=None,
        help="weight format: fp32, bf16 or a format (default: the checkpoint's, from its "
        "quantization_config or GGUF tensor types; bf16 when it has none)",
    )
    p.add_argument(
        "--expert-weights",
        default=None,
        help="routed experts' format (MoE; default: the checkpoint's, e.g. gpt-oss's mxfp4, "
        "else as --weights)",
    )


def weight_formats(args: argparse.Namespace, desc) -> tuple[str, float, str | None, float | None]:
    """(weights, bits, experts, bits or None): the flags where given, else the checkpoint's
    stored formats (`ModelDesc.stored_weights`), else bf16. Experts follow --weights unless
    the flag or the checkpoint names their own format."""
    from infergen.perf.hardware import bits_of

    stored = desc.stored_weights
    if args.weights is not None:
        weights, bits = args.weights, bits_of(args.weights)
    elif stored is not None:
        weights, bits = stored.weights, stored.weight_bits
    else:
        weights, bits = "bf16", bits_of("bf16")
    expert_flag = args.expert_weights
    if expert_flag is not None:
        return weights, bits, expert_flag, bits_of(expert_flag)
    if stored is not None and stored.experts is not None:
        return weights, bits, stored.experts, stored.expert_bits
    return weights, bits, None, None


def describe_model(path: str):
    """The ModelDesc of a config.json, a directory or a GGUF (no weights read)."""
    from infergen.io.model_config import read_model_config

    return read_model_config(path).describe()


def add_device_args(p: argparse.ArgumentParser) -> None:
    """Model, device and weight formats: what `predict` and `perf step` share."""
    p.add_argument("--model", "-m", default=None, help="config.json, directory or GGUF")
    p.add_argument(
        "--gpu",
        default="h200",
        help="hardware row; cpu-local = calibrated here. A row without a calibration of its "
        "own (a100, b200, gb200, l40s, a --hardware-file row without efficiencies) borrows "
        "the efficiencies measured on a calibrated GPU (h200, or the row's "
        "efficiencies_from) as fractions of its own peaks; the output says where they came "
        "from",
    )
    p.add_argument("--hardware-file", default=None, help="extra hardware rows (JSON/YAML)")
    add_weight_args(p)


def add_parser(sub) -> None:
    p = sub.add_parser(
        "predict",
        help="predict TTFT, ITL, throughput, memory and cost of serving a model on a GPU",
        description="Simulate continuous-batching serving of a model on a device (roofline "
        "step times at the device's peaks x its efficiencies: its own calibration, or for "
        "a GPU nobody calibrated those borrowed from one that was, named in the output; the "
        "engine's scheduler, KV "
        "capacity, prefix cache, speculative decoding, KV offload tiers) and report latency "
        "percentiles, throughput, the memory plan, the concurrency that fits and the cost per "
        "million output tokens. Metric definitions as `infergen bench serve`. With "
        "--kv-offload-memory / --kv-offload-dir the load is simulated with the tiers and "
        "without, and the TTFT and throughput gains are reported (the tiers are simulated, "
        "per device, starting empty: the directory is not read or written).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_device_args(p)
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel devices")
    p.add_argument("--ep", type=int, default=1, help="expert-parallel devices (MoE)")
    p.add_argument("--activations", default="bf16", help="activation format")
    p.add_argument("--kv", default="bf16", help="KV cache format")
    p.add_argument("--compute", default=None, help="GEMM peak class (default: from --activations)")
    add_workload_args(p, num_requests=256)
    p.add_argument("--isl", type=int, default=None, help="fixed prompt tokens (with --osl)")
    p.add_argument("--osl", type=int, default=None, help="fixed answer tokens (with --isl)")
    load = p.add_mutually_exclusive_group()
    load.add_argument("--concurrency", type=int, default=None, help="closed loop (default 32)")
    load.add_argument("--rate", type=float, default=None, help="open loop: Poisson, req/s")
    p.add_argument("--max-num-seqs", type=int, default=256, help="sequences per step")
    p.add_argument("--max-num-batched-tokens", type=int, default=8192, help="tokens per step")
    p.add_argument("--block-size", type=int, default=16, help="KV block size in tokens")
    p.add_argument("--no-prefix-caching", action="store_true", help="no KV reuse across turns")
    p.add_argument(
        "--admission",
        choices=tuple(ADMISSION),
        default="optimistic",
        help="the engine's admission policy, simulated: optimistic: KV as computed, preempt "
        "when full (infergen, vLLM); reserve: KV for prompt + max_tokens at admission "
        "(TensorRT-LLM)",
    )
    p.add_argument("--memory-util", type=float, default=0.9, help="fraction of device memory")
    p.add_argument("--kv-memory", default=None, help="KV cache size per device (e.g. 40GiB)")
    p.add_argument(
        "--spec-tokens",
        type=int,
        default=None,
        help="speculative: drafted tokens a decode step verifies (default: 4 with "
        "--speculative, else 0: off; with --acceptance-from a file holding the engine's "
        "drafts_histogram, each step's drafts are drawn from it instead)",
    )
    p.add_argument(
        "--spec-acceptance",
        type=float,
        default=0.7,
        help="speculative: the chance a draft token is kept when those before it were",
    )
    p.add_argument(
        "--spec-verify-fraction",
        type=float,
        default=1.0,
        help="speculative: the share of decodes that have drafts to verify (the others "
        "decode one token)",
    )
    p.add_argument(
        "--acceptance-from",
        default=None,
        metavar="FILE",
        help="speculative: the acceptance measured by the engine instead of "
        "--spec-acceptance and --spec-verify-fraction: a JSON object (Speculator.summary(): "
        "the tokens a verifying step emitted and the drafts it verified give the per-token "
        "acceptance, verify_fraction the share of decodes that verified, drafts_histogram "
        "the verifying steps by their drafts) or JSON lines "
        "(benchmarks/bench_spec.py's results), those of --speculative's proposer when given, "
        "averaged",
    )
    p.add_argument("--draft-model", default=None, help="draft config (default: free n-gram)")
    p.add_argument("--usd-per-gpu-hour", type=float, default=3.0, help="price of one GPU-hour")
    p.add_argument("--seed", type=int, default=0, help="workload, arrivals and acceptance")
    p.add_argument("--warmup", type=int, default=0, help="requests simulated first and not counted")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.add_argument("--explain", action="store_true", help="per-op table of a decode step")
    p.add_argument(
        "--sweep", default=None, metavar="NAME=V1,V2,..", help=f"one of {sorted(SWEEPABLE)}"
    )
    p.add_argument("--plot", default="predict-sweep.png", help="the sweep's PNG plot")
    add_engine_args(p, "predict")  # the KV offload tiers, as the engine takes them
    p.add_argument(
        "--host-bandwidth",
        default=None,
        metavar="BYTES_PER_S",
        help="KV offload: host tier <-> device copy rate, e.g. 25GB (per second; default: the "
        "hardware row's host_bandwidth, cpu-local's calibration, else 25GB, assumed)",
    )
    p.add_argument(
        "--disk-bandwidth",
        default=None,
        metavar="BYTES_PER_S",
        help="KV offload: disk tier read and write rate, e.g. 2GB (per second; default 2GB, "
        "assumed)",
    )
    p.set_defaults(func=cmd_predict)


def deployment(args: argparse.Namespace):
    from infergen.config.stored import compute_class
    from infergen.perf.hardware import bits_of, resolve
    from infergen.perf.predict import Deployment
    from infergen.perf.step_cost import Formats, Parallel

    if args.model is None:
        from infergen.io.default_model import default_model_path

        args.model = str(default_model_path())
    from infergen.config import SchedulerConfig

    try:
        par = Parallel(args.tp, args.ep)
    except ValueError as exc:
        raise ConfigError(str(exc), where="--tp/--ep") from None
    desc = describe_model(args.model)
    _, weight_bits, _, expert_bits = weight_formats(args, desc)
    fmt = Formats(
        weight_bits=weight_bits,
        kv_bits=bits_of(args.kv),
        act_bytes=bits_of(args.activations) / 8,
        expert_weight_bits=expert_bits,
    )
    return Deployment(
        desc=desc,
        hw=resolve(args.gpu, args.hardware_file),
        fmt=fmt,
        compute_format=args.compute or compute_class(args.activations),
        par=par,
        scheduler=SchedulerConfig(
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            admission=args.admission,
        ),
        block_size=args.block_size,
        prefix_caching=not args.no_prefix_caching,
        memory_utilization=args.memory_util,
        kv_capacity=parse_bytes(args.kv_memory, where="--kv-memory") if args.kv_memory else None,
        **_speculation(args),
        draft=_draft(args, desc),
        tiers=_tiers(args),
    )


def _draft(args: argparse.Namespace, desc):
    """What a draft costs: --draft-model's config; with --speculative mtp, the checkpoint's
    multi-token-prediction layer — a decoder layer (as its last) and the LM head; None: free
    (n-gram lookup)."""
    if args.draft_model:
        return describe_model(args.draft_model)
    if args.speculative != "mtp":
        return None
    import dataclasses

    from infergen.io.model_config import read_model_config

    if not read_model_config(args.model).mtp_layers:
        raise ConfigError(
            "--speculative mtp drafts with the checkpoint's multi-token-prediction layers, and "
            "this model has none",
            where="--speculative",
            found=args.model,
            expected="a config with num_nextn_predict_layers ≥ 1 (DeepSeek-V3)",
        )
    return dataclasses.replace(desc, layers=desc.layers[-1:])


def _speculation(args: argparse.Namespace) -> dict:
    """The Deployment's speculative fields: k (--spec-tokens; default 4 when speculating),
    the acceptance and verify fraction (given, or measured: --acceptance-from), and with a
    measured drafts histogram and no --spec-tokens, each step's drafts drawn from it."""
    default_k = 4 if args.speculative or args.acceptance_from else 0
    k = args.spec_tokens if args.spec_tokens is not None else default_k
    if args.acceptance_from is None:
        return dict(spec_tokens=k, spec_acceptance=args.spec_acceptance,
                    spec_verify_fraction=args.spec_verify_fraction)  # fmt: skip
    from infergen.perf.measured_acceptance import measured_acceptance

    measured = measured_acceptance(args.acceptance_from, args.speculative)
    drawn = measured.drafts if args.spec_tokens is None and measured.drafts else None
    return dict(
        spec_tokens=max(drawn) if drawn else k,
        spec_acceptance=measured.alpha,
        spec_verify_fraction=measured.verify_fraction,
        spec_drafts=drawn,
    )


def _tiers(args: argparse.Namespace):
    """The KV tiers the engine options name (None: no offload), as the engine reads them."""
    from infergen.engine.options import engine_config, options_from_args
    from infergen.perf.kv_tiers import TierSpec

    cache = engine_config(**options_from_args(args, "predict")).cache
    rates = [
        None if value is None else float(parse_bytes(value, where=flag))
        for value, flag in ((args.host_bandwidth, "--host-bandwidth"),
                            (args.disk_bandwidth, "--disk-bandwidth"))
    ]  # fmt: skip
    return TierSpec.from_cache(cache, *rates)


def _shapes(args: argparse.Namespace):
    import random

    from infergen.bench.workloads import shapes, workload_options
    from infergen.perf.predict import fixed_shapes

    if (args.isl is None) != (args.osl is None):
        raise ConfigError("give --isl and --osl together", where="--isl/--osl")
    if args.isl is not None:
        return fixed_shapes(args.isl, args.osl, args.num_requests)
    try:
        return shapes(
            args.workload,
            workload_options(args),
            random.Random(args.seed),
            count_tokens=lambda text: max(1, len(text) // 4),
        )
    except ValueError as exc:
        raise ConfigError(str(exc), where="--workload") from None


def run_one(args: argparse.Namespace) -> dict:
    """The prediction; with KV tiers, the run with them and its `kv_offload` comparison."""
    from infergen.perf.offload import compare
    from infergen.perf.predict import predict

    if args.concurrency is None and args.rate is None:
        args.concurrency = 32
    dep = deployment(args)
    return (predict if dep.tiers is None else compare)(
        dep,
        _shapes(args),
        concurrency=args.concurrency,
        rate=args.rate,
        usd_per_gpu_hour=args.usd_per_gpu_hour,
        seed=args.seed,
        warmup=args.warmup,
    )


def format_prediction(r: dict) -> str:
    from infergen.bench.report import LATENCIES, latency_table

    mem = r["memory_per_device"]
    gb = 1e9
    experts = r["expert_weights_bits"]
    lines = [
        f"{r['model']} on {r['gpus']} x {r['gpu']} (tp {r['tp']}, ep {r['ep']}), "
        f"weights {r['weights_bits']:g} bits"
        + (f" (routed experts {experts:g})" if experts is not None else "")
        + f", KV {r['kv_bits']:g} bits, compute {r['compute_format']}",
        f"params {r['params_total'] / 1e9:.2f} B total, {r['params_active'] / 1e9:.2f} B active; "
        f"weights {r['weight_bytes'] / gb:.2f} GB; KV {r['kv_bytes_per_token'] / 1024:.1f} "
        "KiB/token",
        f"memory per device: weights {mem['weights'] / gb:.2f} GB, activations "
        f"{mem['activations'] / gb:.2f} GB, KV cache {mem['kv_cache'] / gb:.2f} GB "
        f"(of {mem['usable_bytes'] / gb:.1f} GB usable)",
        f"max concurrency that fits: {r['max_concurrency']} (KV alone: {r['max_concurrency_kv']})",
        f"{r['requests'] - r['failed']}/{r['requests']} requests in {r['wall_s']:.2f} s: output "
        f"{r['output_tok_s']:.1f} tok/s, total {r['total_tok_s']:.1f} tok/s",
    ]
    eff = r["efficiencies"]
    lines.append(
        f"{eff['note']} (compute {eff['compute_efficiency']:.2f}, memory "
        f"{eff['memory_efficiency']:.2f} of peak)"
    )
    lines += latency_table({n: r[f"{n}_ms"] for n in LATENCIES}, scale=1.0, digits=2)
    if r["cost_per_mtok_usd"] is not None:
        lines.append(
            f"cost: ${r['cost_per_mtok_usd']:.3f} per million output tokens at "
            f"${r['usd_per_gpu_hour']:.2f}/GPU-hour"
        )
    if r["errors"]:
        lines.append(f"rejected: {r['errors']}")
    if r.get("kv_offload") is not None:
        from infergen.perf.offload import format_offload

        lines.append(format_offload(r["kv_offload"]))
    return "\n".join(lines)


def cmd_predict(args: argparse.Namespace) -> int:
    if args.explain:
        from infergen.perf.predict import explain

        dep = deployment(args)
        isl = args.isl or args.input_len
        osl = args.osl or args.output_len
        batch = min(args.concurrency or 32, args.max_num_seqs)
        print(explain(dep, batch, isl + osl // 2))
        print()
        print(explain(dep, 1, isl, new=min(isl, args.max_num_batched_tokens)))
        return 0
    if args.sweep:
        return _sweep(args)
    result = run_one(args)
    print(json.dumps(result) if args.json else format_prediction(result))
    return 0


def _sweep(args: argparse.Namespace) -> int:
    name, _, values = args.sweep.partition("=")
    name = name.replace("-", "_")
    if name not in SWEEPABLE or not values:
        raise ConfigError(
            "bad --sweep",
            found=args.sweep,
            expected=f"NAME=V1,V2,... with NAME in {sorted(SWEEPABLE)}",
        )
    try:
        points = [SWEEPABLE[name](v) for v in values.split(",")]
    except ValueError:
        raise ConfigError("bad --sweep values", found=values, expected="numbers") from None
    rows = []
    for value in points:
        point = copy.copy(args)
        setattr(point, name, value)
        if name == "rate":
            point.concurrency = None
        elif name == "concurrency":
            point.rate = None
        if name in ("isl", "osl"):
            point.isl = point.isl or args.input_len
            point.osl = point.osl or args.output_len
        rows.append((value, run_one(point)))
        print(f"  {name}={value} done", file=sys.stderr, flush=True)
    header = f"{name:>14} {'out tok/s':>10} {'ITL p50':>9} {'TPOT p50':>9} {'TTFT p50':>9} "
    header += f"{'TTFT p90':>9} {'$/Mtok':>8}"
    print(header + "   (ms)")
    for value, r in rows:
        cost = r["cost_per_mtok_usd"]
        print(
            f"{value:>14} {r['output_tok_s']:10.1f} {r['itl_ms']['p50']:9.2f} "
            f"{r['tpot_ms']['p50']:9.2f} {r['ttft_ms']['p50']:9.2f} {r['ttft_ms']['p90']:9.2f} "
            f"{cost if cost is not None else float('nan'):8.3f}"
        )
    if args.json:
        print(json.dumps([{name: v, **r} for v, r in rows]))
    _plot(name, rows, args.plot)
    print(f"wrote {args.plot}", file=sys.stderr)
    return 0


def _plot(name: str, rows: list, path: str) -> None:
    """Throughput against TPOT across the sweep: the latency/throughput trade-off curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.5))
    tpot = [r["tpot_ms"]["p50"] for _, r in rows]
    tput = [r["output_tok_s"] for _, r in rows]
    ax.plot(tpot, tput, marker="o")
    for (value, _), x, y in zip(rows, tpot, tput, strict=True):
        ax.annotate(
            f"{name}={value}", (x, y), fontsize=7, xytext=(4, 4), textcoords="offset points"
        )
    first = rows[0][1]
    ax.set_xlabel("TPOT p50 (ms)")
    ax.set_ylabel("output tokens/s")
    ax.set_title(f"{first['model']} on {first['gpus']} x {first['gpu']}: sweep over {name}")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
