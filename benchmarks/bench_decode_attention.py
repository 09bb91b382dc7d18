"""The native decode attention row (kernels/paged_decode_attention_f32.c) against the torch
row (the cached keys gathered, then F.scaled_dot_product_attention), same run, fp32, on paged
pools whose blocks are scattered, with the KV in cache and cold.

Shapes (sequences x positions; heads / KV heads, head dim):
  b1 ctx129    1 x 129, 9/3, 64: SmolLM2-135M decoding at batch 1 (bench_compiler's T=1)
  b1 ctx512    1 x 512, 9/3, 64
  b16 ctx138  16 x 138, 9/3, 64: its decode at T=16 (128-148 positions)
  b4 ctx2048   4 x 2048, 9/3, 64
  gemma b1     1 x 1024, 4/1, 256 (Gemma-3-270M's global layers)
A step's attention runs over LAYERS layers, each its own pool (as the engine's layers are):
"cold" times the whole stack (a layer's KV was last touched a stack ago: from DRAM once the
stack outgrows the last-level cache), "hot" one layer again and again (its KV in cache).
Rows alternate, median of --repeats; KV bytes a layer = sequences x positions x KV heads x
head dim x 8 (K and V, fp32). JSON lines to --out: a result per row, shape and cache state, a
ratio per shape and state (>1: native faster).

    .venv/bin/python benchmarks/bench_decode_attention.py [--repeats 15] [--threads 2]
"""

from __future__ import annotations

import pathlib
import statistics
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from attention_bench import native_torch_lines, start  # noqa: E402
from peers.cpu_contention import OtherCpu  # noqa: E402
from results_file import write_lines  # noqa: E402

from infergen.ops import paged_attention as pa  # noqa: E402
from tests.ops.scattered_pool import scattered_pool  # noqa: E402

SHAPES = {  # name: (sequences, positions, KV heads, group, head dim)
    "b1 ctx129": (1, 129, 3, 3, 64),
    "b1 ctx512": (1, 512, 3, 3, 64),
    "b16 ctx138": (16, 138, 3, 3, 64),
    "b4 ctx2048": (4, 2048, 3, 3, 64),
    "gemma b1": (1, 1024, 1, 4, 256),
}
LAYERS = 30  # SmolLM2-135M's; the cold stack of the b16 shape is ~100 MB, past any L3 here
BLOCK = 16


def operands(sequences, positions, kv_heads, group, dim, seed=0):
    """LAYERS pools (k, v) with the same scattered block tables (one seed: the same values,
    at other addresses), the queries and the plan."""
    lens = [positions - (i % 3) * 5 for i in range(sequences)]  # (lengths that differ)
    pools = []
    for _ in range(LAYERS):
        gen = torch.Generator().manual_seed(seed)
        k, v, tables = scattered_pool(lens, kv_heads, dim, BLOCK, torch.float32, gen)
        pools.append((k, v))
    q = torch.randn(sequences, kv_heads * group, dim, generator=gen)
    attn_plan = pa.plan(list(range(sequences + 1)), lens, tables, BLOCK, None)
    return q, pools, attn_plan, sum(lens) * kv_heads * dim * 8


def run(name: str, ops, layers) -> float:
    """Seconds a layer over `layers` (indices into the pools)."""
    q, pools, attn_plan, _ = ops
    row = pa.DECODE_BACKENDS.get(name)
    scale = q.shape[-1] ** -0.5
    start = time.perf_counter()
    for i in layers:
        row(q, *pools[i], attn_plan, scale)
    return (time.perf_counter() - start) / len(layers)


def main() -> None:
    args, base = start(
        __doc__, "decode_attention", 15, ROOT / "benchmarks/results/decode_attention.jsonl"
    )
    states = {"cold": range(LAYERS), "hot": [0] * LAYERS}
    lines = []
    print(f"{'shape':>12} {'state':>5} {'native us':>10} {'torch us':>9} {'native GB/s':>12} "
          f"{'ratio':>6}")  # fmt: skip
    for shape, (sequences, positions, kv_heads, group, dim) in SHAPES.items():
        ops = operands(sequences, positions, kv_heads, group, dim)
        q, pools, attn_plan, kv_bytes = ops
        scale = dim**-0.5
        rows = {n: pa.DECODE_BACKENDS.get(n) for n in ("native", "torch")}
        outs = {n: row(q, *pools[0], attn_plan, scale) for n, row in rows.items()}
        err = (outs["native"] - outs["torch"]).abs().max().item()
        params = {"sequences": sequences, "positions": positions, "heads": kv_heads * group,
                  "kv_heads": kv_heads, "head_dim": dim, "layers": LAYERS,
                  "kv_bytes_per_layer": kv_bytes, "max_abs_diff": err}  # fmt: skip
        for state, layers in states.items():
            runs: dict[str, list[float]] = {"native": [], "torch": []}
            with OtherCpu() as other:  # (over all the repeats: /proc/stat counts 10 ms ticks)
                for i in range(args.repeats):
                    for name in ("native", "torch") if i % 2 == 0 else ("torch", "native"):
                        runs[name].append(run(name, ops, layers))
            others = dict.fromkeys(runs, other.cores)
            seconds = {name: statistics.median(r) for name, r in runs.items()}
            metric = f"decode_attention_us_per_layer [{shape}, {state}]"
            lines += native_torch_lines(base, metric, seconds, "us", ("gb_per_s", kv_bytes),
                                        f"median of {args.repeats}", params=params,
                                        other_cpu_cores=others)  # fmt: skip
            ratio = seconds["torch"] / seconds["native"]
            print(f"{shape:>12} {state:>5} {seconds['native'] * 1e6:10.1f} "
                  f"{seconds['torch'] * 1e6:9.1f} {kv_bytes / seconds['native'] / 1e9:12.1f} "
                  f"{ratio:6.2f}")  # fmt: skip
    write_lines(args.out, lines)


if __name__ == "__main__":
    main()
