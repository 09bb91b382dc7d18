"""Low-precision compute on the CPU (issue 27): W8A8 (int8 weights) and W4A8 (GGUF Q4_1 / Q4_0
weights) times int8 activations quantized per token, summed in integers; and bf16 products
(bf16 weights, inputs rounded to bf16, fp32 sums: AVX-512 BF16 where the CPU has it). Against
fp32, the weight-only product and the emulation (activations quantized and dequantized, then the
weight-only product) in the same run; and llama.cpp (`llama-bench`: Q8_0 / Q4_1 weights times
Q8 activations in integers, F32) on the same GGUF weights.

Ops: the default model's projection shapes (q/k/v 576 -> 960, o 576 -> 576, gate/up 576 -> 3072,
down 1536 -> 576), a stack of each (as a forward streams its layers' weights), at --tokens, 2
threads, best of --repeats in alternating rounds. Engine: a 512-token prefill and batch-1 decode
of the default model with fp32 weights, `--weights int8` with and without `--activations int8`,
`--weights gguf` (its Q4_1 blocks as stored) with and without `--activations int8`, `--weights
bf16`; llama.cpp's pp512 / tg32 on the F32, Q8_0 and Q4_1 GGUFs (when
benchmarks/setup_peers.sh llama-server has built llama-bench). The ISA beside every figure: the
CPU's and the kernels' build flags. Targets (issue 27, VNNI machines): W8A8 prefill >= 2x fp32,
and >= 1.5x weight-only int8 at 16 tokens. JSON lines to benchmarks/results/low_precision.jsonl.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import subprocess
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "peers"))

from bench_generate import PEERS_DIR, machine_info  # noqa: E402
from gguf_f32 import cached_f32_gguf  # noqa: E402
from results_file import write_lines  # noqa: E402

from infergen import LLM, SamplingParams  # noqa: E402
from infergen.io.default_model import default_model_path  # noqa: E402
from infergen.kernels.build import _compile_flags  # noqa: E402
from infergen.ops import linear_bf16  # noqa: E402, F401 - registers "bf16"
from infergen.ops.linear import LINEAR_BACKENDS  # noqa: E402
from infergen.ops.quantize_activation import ActivationFormat, fake_quantize  # noqa: E402

SHAPES = {"qkv": (576, 960), "o": (576, 576), "gate_up": (576, 3072), "down": (1536, 576)}
STACK = 6  # weights of a shape, run one after another (together larger than the L2 caches)
INT8_TOKEN = ActivationFormat("int8", "token", 8.0)
LLAMA_BENCH = PEERS_DIR / "llama.cpp" / "bin" / "llama-bench"
ENGINE = {  # name: LLM options
    "fp32": {},
    "int8_weight_only": {"weights": "int8"},
    "w8a8_integer": {"weights": "int8", "activations": "int8"},
    "q4_1_weight_only": {"weights": "gguf"},
    "w4a8_integer": {"weights": "gguf", "activations": "int8"},
    "bf16": {"weights": "bf16"},
}


def _ops(scheme: str, tokens: int, repeats: int) -> dict[str, float]:
    """Seconds of one pass over every shape's stack, per product (best of `repeats`): fp32 and
    the scheme's products — for "bf16" its own, else weight-only, emulated and integer."""
    native, low = LINEAR_BACKENDS.get("native"), LINEAR_BACKENDS.get(scheme)
    stacks = []
    for k, n in SHAPES.values():
        weights = [torch.randn(n, k) for _ in range(STACK)]
        stacks.append((k, n, [native.prepare(w) for w in weights],
                       [low.prepare(w) for w in weights]))  # fmt: skip
    inputs = {k: torch.randn(tokens, k) for k, _, _, _ in stacks}

    def run(apply, quantized: bool, transform=lambda x: x):
        return lambda: [apply(transform(inputs[k]), p, None, n)
                        for k, n, ps, qs in stacks for p in (qs if quantized else ps)]  # fmt: skip

    runs = {"fp32": run(native.apply, False)}
    if scheme == "bf16":
        runs["bf16"] = run(low.apply, True)
    else:
        runs["weight_only"] = run(low.apply, True)
        runs["emulated"] = run(low.apply, True, lambda x: fake_quantize(x, INT8_TOKEN))
        runs["integer"] = run(low.quantized_inputs[("int8", "token")], True)
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeats):  # alternating rounds: drift hits every product alike
        for name, go in runs.items():
            began = time.perf_counter()
            go()
            best[name] = min(best[name], time.perf_counter() - began)
    return best


def engine_rates(options: dict, prompt_len: int, new: int, repeats: int) -> dict:
    """An engine's prefill of `prompt_len` tokens (best) and decode of `new` after a 64-token
    prompt (best tok/s), 2 threads; `options` are LLM options (a `model` among them)."""
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


def _llama_bench(prompt_len: int, new: int, repeats: int) -> dict[str, dict]:
    """llama.cpp's pp / tg tok/s on the default model's GGUF as F32, Q8_0 and its own Q4_1
    ({} without llama-bench)."""
    if not LLAMA_BENCH.exists():
        print(f"llama-bench not built ({LLAMA_BENCH}): bash benchmarks/setup_peers.sh "
              "llama-server", file=sys.stderr)  # fmt: skip
        return {}
    source = default_model_path()
    files = {"llama.cpp F32": cached_f32_gguf(source, PEERS_DIR, "F32"),
             "llama.cpp Q8_0": cached_f32_gguf(source, PEERS_DIR, "Q8_0"),
             "llama.cpp Q4_1": source}  # fmt: skip
    return llama_bench(files, prompt_len, new, repeats)


def llama_bench(files: dict[str, pathlib.Path], prompt_len: int, new: int, repeats: int) -> dict:
    """llama-bench's pp `prompt_len` / tg `new` tok/s, 2 threads, on each named GGUF."""
    got = {}
    for name, path in files.items():
        cmd = [str(LLAMA_BENCH), "-m", str(path), "-p", str(prompt_len), "-n", str(new),
               "-t", "2", "-r", str(repeats), "-o", "json"]  # fmt: skip
        rows = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
        pp = next(r for r in rows if r["n_prompt"] == prompt_len and r["n_gen"] == 0)
        tg = next(r for r in rows if r["n_gen"] == new and r["n_prompt"] == 0)
        got[name] = {"prefill_s": round(prompt_len / pp["avg_ts"], 4),
                     "prefill_tok_s": round(pp["avg_ts"], 1),
                     "decode_tok_s": round(tg["avg_ts"], 2),
                     "peer_version": f"llama.cpp {rows[0].get('build_commit', '?')}"}  # fmt: skip
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", default="1,16,128,512")
    parser.add_argument("--schemes", default="int8,q4_1,bf16", help="weight schemes of the op rows")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prefill", type=int, default=512)
    parser.add_argument("--skip-engine", action="store_true")
    parser.add_argument("--out", type=pathlib.Path,
                        default=ROOT / "benchmarks/results/low_precision.jsonl")  # fmt: skip
    args = parser.parse_args()
    torch.set_num_threads(2)
    sources = ("gemm_w8a8_i8", "gemm_w4a8_i8", "gemm_bf16")
    flags = sorted({f for s in sources for f in _compile_flags(s) if f.startswith("-mavx512")})
    base = {"bench": "low_precision", "machine": machine_info(2), "kernel_flags": flags,
            "date": datetime.date.today().isoformat()}  # fmt: skip
    lines = []
    for scheme in args.schemes.split(","):
        for tokens in (int(t) for t in args.tokens.split(",")):
            best = _ops(scheme, tokens, args.repeats)
            low = best["bf16" if scheme == "bf16" else "integer"]
            line = {**base, "kind": "ops", "scheme": scheme, "tokens": tokens,
                    **{f"{name}_ms": round(s * 1e3, 3) for name, s in best.items()},
                    "vs_fp32": round(best["fp32"] / low, 3)}  # fmt: skip
            if scheme != "bf16":
                line["vs_weight_only"] = round(best["weight_only"] / low, 3)
                line["vs_emulated"] = round(best["emulated"] / low, 3)
            print({k: v for k, v in line.items() if k != "machine"}, flush=True)
            lines.append(line)
    if not args.skip_engine:
        got = {name: engine_rates(options, args.prefill, 32, 3) for name, options in ENGINE.items()}
        got.update(_llama_bench(args.prefill, 32, 3))
        for name, result in got.items():
            speedup = got["fp32"]["prefill_s"] / result["prefill_s"]
            line = {**base, "kind": "engine", "config": name, "prefill_tokens": args.prefill,
                    **result, "prefill_vs_fp32": round(speedup, 3)}  # fmt: skip
            print({k: v for k, v in line.items() if k != "machine"}, flush=True)
            lines.append(line)
    write_lines(args.out, lines)


if __name__ == "__main__":
    main()
