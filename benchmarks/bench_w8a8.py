"""W8A8 int8 with integer compute (issue 27) against fp32, weight-only int8 and the emulated W8A8
(activations quantized to int8 and dequantized, then the weight-only product), in the same run.

Projections of the default model's shapes (q/k/v 576 -> 960, o 576 -> 576, gate/up 576 -> 3072,
down 1536 -> 576), a stack of each (as a forward streams its layers' weights), at 1, 16, 128
and 512 tokens, 2 threads, best of --repeats in alternating rounds; and the engine: a 512-token
prefill and batch-1 decode of the default model with fp32 weights, `--weights int8`, and
`--weights int8 --activations int8` (the integer product). The ISA beside every figure: the
CPU's and the kernel's build flags (VNNI, VBMI). Targets (issue 27, VNNI machines): W8A8
prefill >= 2x fp32, and >= 1.5x weight-only int8 at 16 tokens. JSON lines to
benchmarks/results/w8a8.jsonl.
"""

from __future__ import annotations

import argparse
import datetime
import pathlib
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_generate import machine_info  # noqa: E402
from results_file import write_lines  # noqa: E402

from infergen import LLM, SamplingParams  # noqa: E402
from infergen.kernels.build import _compile_flags  # noqa: E402
from infergen.ops.linear import LINEAR_BACKENDS  # noqa: E402
from infergen.ops.quantize_activation import ActivationFormat, fake_quantize  # noqa: E402

SHAPES = {"qkv": (576, 960), "o": (576, 576), "gate_up": (576, 3072), "down": (1536, 576)}
STACK = 6  # weights of a shape, run one after another (together larger than the L2 caches)
INT8_TOKEN = ActivationFormat("int8", "token", 8.0)


def _ops(tokens: int, repeats: int) -> dict[str, float]:
    """Seconds of one pass over every shape's stack, per product (best of `repeats`)."""
    native, int8 = LINEAR_BACKENDS.get("native"), LINEAR_BACKENDS.get("int8")
    integer = int8.quantized_inputs[("int8", "token")]
    stacks = []
    for k, n in SHAPES.values():
        weights = [torch.randn(n, k) for _ in range(STACK)]
        stacks.append((k, n, [native.prepare(w) for w in weights],
                       [int8.prepare(w) for w in weights]))  # fmt: skip
    inputs = {k: torch.randn(tokens, k) for k, _, _, _ in stacks}
    runs = {
        "fp32": lambda: [native.apply(inputs[k], p, None, n) for k, n, ps, _ in stacks for p in ps],
        "int8_weight_only": lambda: [int8.apply(inputs[k], p, None, n)
                                     for k, n, _, qs in stacks for p in qs],
        "w8a8_emulated": lambda: [int8.apply(fake_quantize(inputs[k], INT8_TOKEN), p, None, n)
                                  for k, n, _, qs in stacks for p in qs],
        "w8a8_integer": lambda: [integer(inputs[k], p, None, n)
                                 for k, n, _, qs in stacks for p in qs],
    }  # fmt: skip
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeats):  # alternating rounds: drift hits every product alike
        for name, run in runs.items():
            began = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - began)
    return best


def _engine(options: dict, prompt_len: int, new: int, repeats: int) -> dict:
    llm = LLM(num_threads=2, **options)
    prompts = [
        [(7 * j + 13 * r) % 30000 + 100 for j in range(prompt_len)] for r in range(repeats + 1)
    ]
    prefill, decode = float("inf"), 0.0
    llm.generate([prompts[0][:32]], SamplingParams(max_tokens=2, temperature=0))  # warm
    for prompt in prompts[1:]:
        began = time.perf_counter()
        llm.generate([prompt], SamplingParams(max_tokens=1, temperature=0))
        prefill = min(prefill, time.perf_counter() - began)
        params = SamplingParams(max_tokens=new, temperature=0, ignore_eos=True)
        began = time.perf_counter()
        llm.generate([prompt[:64]], params)
        decode = max(decode, new / (time.perf_counter() - began))
    return {"prefill_s": round(prefill, 4), "prefill_tok_s": round(prompt_len / prefill, 1),
            "decode_tok_s": round(decode, 2)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", default="1,16,128,512")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prefill", type=int, default=512)
    parser.add_argument("--skip-engine", action="store_true")
    parser.add_argument("--out", type=pathlib.Path,
                        default=ROOT / "benchmarks/results/w8a8.jsonl")  # fmt: skip
    args = parser.parse_args()
    torch.set_num_threads(2)
    kernel_isa = [f for f in _compile_flags("gemm_w8a8_i8") if f.startswith("-mavx512")]
    base = {"bench": "w8a8", "machine": machine_info(2), "kernel_flags": kernel_isa,
            "date": datetime.date.today().isoformat()}  # fmt: skip
    lines = []
    for tokens in (int(t) for t in args.tokens.split(",")):
        best = _ops(tokens, args.repeats)
        integer = best["w8a8_integer"]
        line = {**base, "kind": "ops", "tokens": tokens,
                **{f"{name}_ms": round(s * 1e3, 3) for name, s in best.items()},
                "integer_vs_fp32": round(best["fp32"] / integer, 3),
                "integer_vs_weight_only": round(best["int8_weight_only"] / integer, 3),
                "integer_vs_emulated": round(best["w8a8_emulated"] / integer, 3)}  # fmt: skip
        print({k: v for k, v in line.items() if k not in ("machine",)}, flush=True)
        lines.append(line)
    if not args.skip_engine:
        configs = {"fp32": {}, "int8_weight_only": {"weights": "int8"},
                   "w8a8_integer": {"weights": "int8", "activations": "int8"}}  # fmt: skip
        got = {name: _engine(options, args.prefill, 32, 3) for name, options in configs.items()}
        for name, result in got.items():
            speedup = got["fp32"]["prefill_s"] / result["prefill_s"]
            line = {**base, "kind": "engine", "config": name, "prefill_tokens": args.prefill,
                    **result, "prefill_vs_fp32": round(speedup, 3)}  # fmt: skip
            print({k: v for k, v in line.items() if k not in ("machine",)}, flush=True)
            lines.append(line)
    write_lines(args.out, lines)


if __name__ == "__main__":
    main()
