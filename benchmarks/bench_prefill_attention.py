"""The native prefill attention row (ops/paged_prefill_native.py) against the torch row (the
cached keys gathered, then torch's CPU flash attention: F.scaled_dot_product_attention), same
run, fp32, on a paged pool whose blocks are scattered.

Shapes (sequence: new tokens over a context; heads / KV heads, head dim, window):
  hit        101 over 761, 9/3, 64: the agentic prefix hit of bench_kv_tiers (SmolLM2-135M)
  cold       538 over 538, 9/3, 64: its turn recomputed without a cache
  long hit   101 over 1500, 9/3, 64
  gemma hit  101 over 761, 4/1, 256, window 512 (Gemma-3-270M's local layers)
  gemma cold 512 over 512, 4/1, 256, window 512
  gqa 16/8   512 over 1024, 16/8, 128
Each row is timed per layer (three layers sharing a step's plan, as the engine does), the two
rows alternating, median of --repeats; FLOPs as the cost model counts them (4 x heads x
head_dim per attended key). JSON lines to --out: a result per row and shape, a ratio per shape
(>1: native faster).
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
from infergen.ops.paged_prefill_native import prefill_attention_native  # noqa: E402, F401
from tests.ops.scattered_pool import scattered_pool  # noqa: E402

SHAPES = {  # name: (new tokens, context, KV heads, group, head dim, window)
    "hit": (101, 761, 3, 3, 64, None),
    "cold": (538, 538, 3, 3, 64, None),
    "long hit": (101, 1500, 3, 3, 64, None),
    "gemma hit": (101, 761, 1, 4, 256, 512),
    "gemma cold": (512, 512, 1, 4, 256, 512),
    "gqa 16/8 d128": (512, 1024, 8, 2, 128, None),
}
LAYERS = 3  # layers timed per step: they share the plan (its gather indices, mask)


def operands(new: int, context: int, kv_heads: int, group: int, dim: int, window, seed=0):
    gen = torch.Generator().manual_seed(seed)
    k, v, tables = scattered_pool([context], kv_heads, dim, 16, torch.float32, gen)
    q = torch.randn(new, kv_heads * group, dim, generator=gen)
    positions = range(context - new, context)
    k_new = torch.stack([k[tables[0, p // 16], p % 16] for p in positions])
    v_new = torch.stack([v[tables[0, p // 16], p % 16] for p in positions])
    return q, k, v, tables, k_new, v_new


def time_row(name: str, ops, new: int, context: int, window) -> tuple[float, torch.Tensor]:
    q, k, v, tables, k_new, v_new = ops
    row = pa.PREFILL_BACKENDS.get(name)
    attn_plan = pa.plan([0, new], [context], tables, 16, window)
    out = torch.empty_like(q)
    start = time.perf_counter()
    for _ in range(LAYERS):
        row(q, k_new, v_new, k, v, attn_plan, q.shape[-1] ** -0.5, out)
    return (time.perf_counter() - start) / LAYERS, out


def attended(new: int, context: int, window) -> int:
    keys = 0
    for p in range(context - new, context):
        keys += p + 1 if window is None else min(p + 1, window)
    return keys


def main() -> None:
    args, base = start(
        __doc__, "prefill_attention", 21, ROOT / "benchmarks/results/prefill_attention.jsonl"
    )
    lines = []
    print(f"{'shape':>14} {'native ms':>10} {'torch ms':>9} {'native GF/s':>12} {'ratio':>6}")
    for shape, (new, context, kv_heads, group, dim, window) in SHAPES.items():
        ops = operands(new, context, kv_heads, group, dim, window)
        runs: dict[str, list[float]] = {"native": [], "torch": []}
        others: dict[str, float] = {}
        outs = {}
        for name in runs:
            outs[name] = time_row(name, ops, new, context, window)[1]  # warm-up
        err = (outs["native"] - outs["torch"]).abs().max().item()
        for i in range(args.repeats):
            for name in ("native", "torch") if i % 2 == 0 else ("torch", "native"):
                with OtherCpu() as other:
                    runs[name].append(time_row(name, ops, new, context, window)[0])
                others[name] = max(others.get(name, 0.0), other.cores)
        seconds = {name: statistics.median(r) for name, r in runs.items()}
        flops = 4 * kv_heads * group * dim * attended(new, context, window)
        params = {"new_tokens": new, "context": context, "heads": kv_heads * group,
                  "kv_heads": kv_heads, "head_dim": dim, "window": window,
                  "max_abs_diff": err}  # fmt: skip
        metric = f"prefill_attention_ms_per_layer [{shape}]"
        lines += native_torch_lines(base, metric, seconds, "ms", ("gflops", flops),
                                    f"median of {args.repeats}", params=params,
                                    other_cpu_cores=others)  # fmt: skip
        ratio = seconds["torch"] / seconds["native"]
        print(f"{shape:>14} {seconds['native'] * 1e3:10.2f} {seconds['torch'] * 1e3:9.2f} "
              f"{flops / seconds['native'] / 1e9:12.0f} {ratio:6.2f}")  # fmt: skip
    write_lines(args.out, lines)


if __name__ == "__main__":
    main()
