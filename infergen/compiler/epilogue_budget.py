"""The startup budget's items for GEMM epilogues (codegen_gemm.py): which GEMM-with-tail groups
to build as fused GEMMs, with what each is expected to save beside what it saved once built.

Expected gain, per bucket: the tail's own pass over the product as the unfused path runs it
— its kernel's predicted time (budget.predicted_seconds: a call, the bytes of the rows it reads
and writes, its arithmetic) — which the fused GEMM does not make, times the layers, weighted by
the bucket's share of the traffic. Measured, once built: the unfused GEMM + tail kernel minus
the fused GEMM on the same random fp32 panels, timed in turns (MEASURE_REPEATS: at 256 tokens
the gain is a few % of the GEMM's time).
"""

from __future__ import annotations

import time

import torch

from infergen.compiler.buckets import BUCKET_TOKENS
from infergen.compiler.budget import REPEATS, Item, predicted_seconds
from infergen.compiler.codegen_c import CodegenError
from infergen.compiler.codegen_gemm import Epilogue, is_gemm_group, plan_epilogue
from infergen.compiler.ir import Graph
from infergen.compiler.jit_cache import JitCache
from infergen.compiler.kernel import (
    GemmEpilogueKernel,
    compile_gemm_epilogue,
    compile_group,
    gemm_epilogue_key,
)
from infergen.compiler.tune import random_inputs
from infergen.ops.linear import LINEAR_BACKENDS, pack_panels
from infergen.timing import best_seconds_each

# timings of the unfused pair and the fused GEMM, in turns, the best of each
MEASURE_REPEATS = 3 * REPEATS
# a fused GEMM (its tail and the template; it links against gemm_packed_f32's micro-kernels:
# 0.26 s measured on the default model's gate/up, so the prior errs on the long side)
COMPILE_SECONDS_PRIOR = 1.0


def epilogue_items(
    graph: Graph, traffic: dict[str, float], layers: int, deadline: float, cache: JitCache,
    statics: list[dict],
) -> list[Item]:  # fmt: skip
    """Build the GEMM-with-tail groups of the "jit" layer graph as fused GEMMs until
    `deadline` (time.perf_counter()); what the cache holds costs nothing. `statics`: each
    layer's bound weights (runtime.CompiledLayers.static) — a group none of whose layers
    has fp32 panels is not built (the engine would not run it)."""
    cached = {record["key"] for record in cache.entries()}
    items = []
    for node in filter(is_gemm_group, graph.nodes):
        sub = node.attrs["graph"]
        name = f"GEMM epilogue {sub.name} -> {node.outputs[0].name}"
        try:
            epilogue = plan_epilogue(sub)
        except CodegenError as error:
            items.append(Item(name, "compile", None, 0.0, status=f"not renderable ({error})"))
            continue
        if not epilogue.serves_any(statics):
            items.append(Item(name, "compile", None, 0.0, status="no layer has fp32 panels"))
            continue
        gain = (
            1e3
            * layers
            * sum(
                share * predicted_seconds(epilogue.tail, _product(epilogue, bucket))
                for bucket, share in traffic.items()
            )
        )
        prior = 0.0 if gemm_epilogue_key(epilogue, cache) in cached else COMPILE_SECONDS_PRIOR
        item = Item(name, "compile", gain, prior)
        items.append(item)
        if prior and time.perf_counter() + prior > deadline:
            continue
        started = time.perf_counter()
        kernel = compile_gemm_epilogue(epilogue, cache)
        item.spent_s = time.perf_counter() - started
        item.status = "cached" if kernel.built.cached else "built"
        item.measured_ms = _measured_ms(kernel, cache, traffic, layers)
    return items


def _product(epilogue: Epilogue, bucket: str) -> list[torch.Tensor]:
    return random_inputs(epilogue.tail, BUCKET_TOKENS[bucket])


def _measured_ms(
    kernel: GemmEpilogueKernel, cache: JitCache, traffic: dict[str, float], layers: int
) -> float:
    n, k = kernel.n, kernel.k
    panels = pack_panels(torch.randn(n, k))
    tail = compile_group(kernel.epilogue.tail, cache)
    gemm = LINEAR_BACKENDS.get("native").apply
    gain = 0.0
    for bucket, share in traffic.items():
        x = torch.randn(BUCKET_TOKENS[bucket], k)
        best = best_seconds_each(
            {
                "unfused": lambda x=x: tail(gemm(x, panels, None, n)),
                "fused": lambda x=x: kernel(x, panels, None),
            },
            MEASURE_REPEATS,
        )
        gain += share * (best["unfused"] - best["fused"])
    return 1e3 * layers * gain
