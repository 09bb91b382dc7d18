"""What the attention kernel benchmarks (bench_decode_attention.py, bench_prefill_attention.py)
share: their start (arguments, threads, the base of every line) and their lines for one shape,
the native row against the torch row (the cached keys gathered, then SDPA)."""

from __future__ import annotations

import argparse
import pathlib

import torch
from bench_generate import git_state, machine_info
from results_file import base_line, bench_arguments, ratio_line

TORCH_ATTENTION = "torch (gather + F.scaled_dot_product_attention)"


def start(doc: str, bench: str, repeats: int, out: pathlib.Path) -> tuple[argparse.Namespace, dict]:
    """Parse --repeats / --threads / --out, set torch's threads (and flush denormals, as the
    kernels do); the base of the run's lines."""
    args = bench_arguments(doc, repeats, out).parse_args()
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    base = base_line(bench, "random KV", machine_info(args.threads), git_state(), quick=False,
                     dtype="fp32")  # fmt: skip
    return args, base


def native_torch_lines(base: dict, metric: str, seconds: dict[str, float], unit: str,
                       rate: tuple[str, float], stat: str, **extra) -> list[dict]:  # fmt: skip
    """One shape's lines: a "result" line each for the native row (engine infergen) and the
    torch row, `seconds` in `unit` ("ms" / "us") and rate = (key, amount): amount / seconds /
    1e9 under key; then their ratio line. `extra` (params; other_cpu_cores, a dict by row)
    goes into every line."""
    scale = {"ms": 1e3, "us": 1e6}[unit]
    others = extra.pop("other_cpu_cores", {})
    key, amount = rate
    lines = [
        {**base, "kind": "result", "metric": metric, "engine": engine,
         "value": seconds[name] * scale, "unit": unit, key: amount / seconds[name] / 1e9,
         "stat": stat, "other_cpu_cores": others.get(name), **extra}
        for name, engine in (("native", "infergen"), ("torch", "torch"))
    ]  # fmt: skip
    ours, theirs = seconds["native"] * scale, seconds["torch"] * scale
    lines.append(ratio_line(base, metric, ours, TORCH_ATTENTION, theirs, unit,
                            other_cpu_cores=others, **extra))  # fmt: skip
    return lines
