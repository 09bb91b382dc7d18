"""A GEMM with its pointwise tail fused (compiler/codegen_gemm.py) against the same GEMM and
tail run one after the other, and against eager torch, same run.

On the default model's (SmolLM2-135M, fp32) gate/up projection of layer 0 with its SwiGLU
tail, the "jit" pipeline's `gemm_silu_mul` group, at T = 1, 16 and 512 tokens, timed in
turns (best of --repeats):

- fused     the generated GEMM whose tail runs on each tile in L1 (gemm_epilogue_f32.h);
- unfused   the packed GEMM (gemm_packed_f32) into a [T, 2I] product, then the tail's
            generated kernel over it: what the graph walker ran before;
- torch     F.linear on the dense weight, then F.silu(gate) * up.

    .venv/bin/python benchmarks/bench_epilogue.py [--repeats 30] [--threads 2]
"""

from __future__ import annotations

import pathlib
import sys
import tempfile

import torch
import torch.nn.functional as F

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_generate import git_state, machine_info  # noqa: E402
from results_file import base_line, bench_arguments, write_lines  # noqa: E402

from infergen import LLM  # noqa: E402
from infergen.compiler.codegen_gemm import plan_epilogue  # noqa: E402
from infergen.compiler.jit_cache import JitCache  # noqa: E402
from infergen.compiler.kernel import compile_gemm_epilogue, compile_group  # noqa: E402
from infergen.compiler.runtime import jit_graph  # noqa: E402
from infergen.timing import best_seconds_each  # noqa: E402

TOKENS = (1, 16, 512)


def main() -> None:
    parser = bench_arguments(__doc__, 30, ROOT / "benchmarks/results/epilogue.jsonl")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    llm = LLM(kv_cache_memory="64MiB")
    model, kv_cache = llm.engine.runner.model, llm.engine.kv_cache
    group = next(
        n for n in jit_graph(model, kv_cache).nodes if n.attrs.get("kernel") == "gemm_silu_mul"
    ).attrs["graph"]
    with tempfile.TemporaryDirectory() as tmp:
        cache = JitCache(pathlib.Path(tmp))
        fused = compile_gemm_epilogue(plan_epilogue(group), cache)
        tail = compile_group(group.nodes[1].attrs["graph"], cache)
    linear = model.layers[0].mlp.gate_up
    panels, bias, n = linear.weight, linear.bias, linear.out_features
    dense = linear.dense_weight()
    apply = linear.backend.apply
    half = n // 2

    def torch_eager(x):
        y = F.linear(x, dense, bias)
        return F.silu(y[:, :half]) * y[:, half:]

    base = base_line(
        "epilogue",
        "SmolLM2-135M-Instruct (fp32)",
        machine_info(args.threads),
        git_state(),
        shape=f"gate_up {linear.in_features}->{n} + SwiGLU",
    )
    lines = []
    for tokens in TOKENS:
        x = torch.randn(tokens, linear.in_features)
        fns = {
            "fused": lambda x=x: fused(x, panels, bias),
            "unfused": lambda x=x: tail(apply(x, panels, bias, n)),
            "torch": lambda x=x: torch_eager(x),
        }
        same = torch.equal(fns["fused"](), fns["unfused"]()[0])
        best = best_seconds_each(fns, args.repeats)
        print(
            f"T={tokens:4d}  "
            + "  ".join(f"{k} {v * 1e6:9.1f} us" for k, v in best.items())
            + f"  unfused/fused {best['unfused'] / best['fused']:.2f}x"
            + f"  torch/fused {best['torch'] / best['fused']:.2f}x  bitwise equal: {same}",
            flush=True,
        )
        for engine, seconds in best.items():
            lines.append(
                {
                    **base,
                    "kind": "result",
                    "metric": f"us_t{tokens}",
                    "engine": engine,
                    "value": seconds * 1e6,
                    "unit": "us",
                    "stat": f"best of {args.repeats}",
                }
            )
        for peer in ("unfused", "torch"):
            lines.append(
                {
                    **base,
                    "kind": "ratio",
                    "metric": f"us_t{tokens} fused",
                    "engine": "infergen",
                    "peer": peer,
                    "infergen_value": best["fused"] * 1e6,
                    "peer_value": best[peer] * 1e6,
                    "value": best[peer] / best["fused"],
                    "unit": "x",
                    "definition": "peer/fused (us)",
                    "bitwise_equal_to_unfused": same,
                }
            )
    write_lines(args.out, lines)


if __name__ == "__main__":
    main()
