"""The native linear kernel (kernels/gemm_packed_f32.c) against torch's F.linear (MKL), same run.

One "model pass" = every projection of SmolLM2-135M (30 layers of qkv 576→960, o 576→576,
gate_up 576→3072, down 1536→576, plus the 576→49152 LM head): 540 MB of fp32 weights, larger
than the caches, so weights stream from DRAM as they do in the engine. For each token count M
the pass is timed for both backends, alternating, best of --repeats; the table gives GFLOP/s
and the ratio (>1: native faster). JSON lines go to --out (one result per backend and M, one
ratio per M); `python benchmarks/report.py` puts the ratios into the README.
"""

from __future__ import annotations

import argparse
import datetime
import pathlib
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_generate import git_state, machine_info  # noqa: E402
from peers.cpu_contention import OtherCpu  # noqa: E402
from results_file import write_lines  # noqa: E402

from infergen.ops.linear import LINEAR_BACKENDS  # noqa: E402

LAYER = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # (out, in) of one decoder layer
MODEL = LAYER * 30 + [(49152, 576)]


def time_pass(backend: str, weights: list[torch.Tensor], xs: dict[int, torch.Tensor]) -> float:
    row = LINEAR_BACKENDS.get(backend)
    start = time.perf_counter()
    for (out_features, in_features), w in zip(MODEL, weights, strict=True):
        row.apply(xs[in_features], w, None, out_features)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", default="1,4,8,16,64,512", help="token counts M (comma list)")
    parser.add_argument("--repeats", type=int, default=5, help="timed passes per backend and M")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--out", type=pathlib.Path, default=ROOT / "benchmarks/results/linear.jsonl"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    gen = torch.Generator().manual_seed(0)
    dense = [torch.randn(o, i, generator=gen) * 0.05 for o, i in MODEL]
    weights = {b: [LINEAR_BACKENDS.get(b).prepare(w) for w in dense] for b in ("native", "torch")}
    base = {
        "bench": "linear",
        "quick": False,
        "git": git_state(),
        "machine": machine_info(args.threads),
        "peer_versions": {"torch": torch.__version__},
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    lines = []
    print(f"{'M':>5} {'native GF/s':>12} {'torch GF/s':>11} {'ratio':>6}")
    for m in (int(t) for t in args.tokens.split(",")):
        xs = {i: torch.randn(m, i, generator=gen) for i in (576, 1536)}
        flops = sum(2 * m * o * i for o, i in MODEL)
        best, others = {}, {}
        for backend in ("native", "torch"):
            time_pass(backend, weights[backend], xs)  # warm-up
        for _ in range(args.repeats):
            for backend in ("native", "torch"):
                with OtherCpu() as other:
                    seconds = time_pass(backend, weights[backend], xs)
                if seconds < best.get(backend, float("inf")):
                    best[backend], others[backend] = seconds, other.cores
        rate = {b: flops / s / 1e9 for b, s in best.items()}
        metric = f"model_pass_gflops_m{m}"
        params = {"tokens": m, "weights_mb": round(sum(o * i * 4 for o, i in MODEL) / 1e6)}
        for backend, engine in (("native", "infergen"), ("torch", "torch")):
            lines.append(
                {
                    **base,
                    "kind": "result",
                    "metric": metric,
                    "engine": engine,
                    "value": rate[backend],
                    "unit": "GFLOP/s",
                    "stat": f"best of {args.repeats}",
                    "params": params,
                    "other_cpu_cores": others[backend],
                }
            )
        lines.append(
            {
                **base,
                "kind": "ratio",
                "metric": metric,
                "engine": "infergen",
                "peer": "torch",
                "infergen_value": rate["native"],
                "peer_value": rate["torch"],
                "value": rate["native"] / rate["torch"],
                "unit": "x",
                "definition": "infergen/peer (GFLOP/s)",
                "other_cpu_cores": {"infergen": others["native"], "torch": others["torch"]},
            }
        )
        print(f"{m:5d} {rate['native']:12.1f} {rate['torch']:11.1f} {lines[-1]['value']:6.2f}")
    write_lines(args.out, lines)


if __name__ == "__main__":
    main()
