"""Low-precision compute on the CPU (issue 27): W8A8 (int8 weights) and W4A8 (GGUF Q4_1 / Q4_0
weights) times int8 activations quantized per token, summed in integers; and bf16 products
(bf16 weights, inputs rounded to bf16, fp32 sums: AMX-BF16 tiles or AVX-512 BF16 where the CPU
has them; the integer products on AMX-INT8 tiles where it has those). Against
fp32, the weight-only product and the emulation (activations quantized and dequantized, then the
weight-only product) in the same run; and llama.cpp (`llama-bench`: Q8_0 / Q4_1 weights times
Q8 activations in integers, F32) on the same GGUF weights.

Ops: the default model's projection shapes (q/k/v 576 -> 960, o 576 -> 576, gate/up 576 -> 3072,
down 1536 -> 576), a stack of each (as a forward streams its layers' weights), at --tokens, 2
threads, best of --repeats in alternating rounds. Engine: a 512-token prefill and the batch-1
decode of --new tokens after a --context-token prompt (timed from the first token on: the
prompt's prefill left out) of the default model with fp32 weights, `--weights int8` with and
without `--activations int8`, `--weights gguf` (its Q4_1 blocks as stored) with and without
`--activations int8`, `--weights bf16`; llama.cpp's pp512 and tg at depth --context
(`llama-bench -d`: the same context) on the F32, Q8_0 and Q4_1 GGUFs (when
benchmarks/setup_peers.sh llama-server has built llama-bench), every engine and GGUF in turns
for --rounds rounds, best of each (the decode ratio at equal precision beside fp32 / F32,
W8A8 / Q8_0, W4A8 / Q4_1). The ISA beside every figure: the CPU's and the kernels' build flags.
Where bf16 runs on AMX-BF16 tiles, issue 27 asks for a bf16 prefill >= 3x fp32's.
Targets (issue 27, VNNI machines): W8A8 prefill >= 2x fp32, and >= 1.5x weight-only int8 at 16
tokens; decode batch 1 >= 1.2x llama.cpp at equal precision. JSON lines to
benchmarks/results/low_precision.jsonl (low_precision_amx.jsonl where the kernels are built with
AMX tiles: one file per kind of CPU, each kept).
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


# the llama.cpp GGUF at each engine's precision (its line's decode ratio)
PEER_OF = {"fp32": "llama.cpp F32", "w8a8_integer": "llama.cpp Q8_0",
           "w4a8_integer": "llama.cpp Q4_1"}  # fmt: skip


class EngineRates:
    """One engine's prefill of `prompt_len` tokens and batch-1 decode of `new` tokens after a
    `context`-token prompt, 2 threads; `options` are LLM options. Each `measure()` is one
    round (the engine stays loaded between rounds); the best of the rounds is kept."""

    def __init__(self, options: dict, prompt_len: int, context: int, new: int):
        self.llm = LLM(num_threads=2, kv_cache_memory="512MiB", enable_prefix_caching=False,
                       **options)  # fmt: skip
        self.prompt_len, self.context, self.new = prompt_len, context, new
        self.prefill, self.decode, self.prompts = float("inf"), 0.0, 0
        params = SamplingParams(max_tokens=2, temperature=0)
        self.llm.generate([self._prompt(32)], params)  # warm-up

    def _prompt(self, length: int) -> list[int]:
        """A prompt no earlier one shares a prefix with."""
        self.prompts += 1
        return [(7 * j + 13 * self.prompts) % 30000 + 100 for j in range(length)]

    def measure(self) -> None:
        began = time.perf_counter()
        self.llm.generate([self._prompt(self.prompt_len)], SamplingParams(max_tokens=1))
        self.prefill = min(self.prefill, time.perf_counter() - began)
        # decode only: from the first token on (the prompt's prefill left out), as llama-bench's
        # tg at depth `context` times its generation alone
        engine = self.llm.engine
        params = SamplingParams(max_tokens=self.new + 1, temperature=0, ignore_eos=True)
        request = engine.add_request(self._prompt(self.context), params)
        first = None
        while engine.has_unfinished():
            for delta in engine.step():
                if first is None and delta.token_ids:
                    first = time.perf_counter()
        self.decode = max(self.decode, self.new / (time.perf_counter() - first))
        engine.release(request)

    def result(self) -> dict:
        return {"prefill_s": round(self.prefill, 4),
                "prefill_tok_s": round(self.prompt_len / self.prefill, 1),
                "decode_tok_s": round(self.decode, 2), "decode_context": self.context}  # fmt: skip


def _llama_files() -> dict[str, pathlib.Path]:
    """llama.cpp's GGUFs of the default model: F32, Q8_0 and its own Q4_1 ({} without
    llama-bench)."""
    if not LLAMA_BENCH.exists():
        print(f"llama-bench not built ({LLAMA_BENCH}): bash benchmarks/setup_peers.sh "
              "llama-server", file=sys.stderr)  # fmt: skip
        return {}
    source = default_model_path()
    return {"llama.cpp F32": cached_f32_gguf(source, PEERS_DIR, "F32"),
            "llama.cpp Q8_0": cached_f32_gguf(source, PEERS_DIR, "Q8_0"),
            "llama.cpp Q4_1": source}  # fmt: skip


def llama_bench(path: pathlib.Path, prompt_len: int, context: int, new: int) -> dict:
    """llama-bench's pp `prompt_len` and tg `new` at depth `context` (the same context as the
    engine's decode), 2 threads, one repetition, on one GGUF."""
    cmd = [str(LLAMA_BENCH), "-m", str(path), "-p", str(prompt_len), "-n", str(new),
           "-d", str(context), "-t", "2", "-r", "1", "-o", "json"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    repack = done.returncode >= 0
    if not repack:  # killed by a signal: llama.cpp 0c1e57098's Q8_0 weight repacking segfaults
        # on a Xeon with AMX (2026-12-07); its plain layout runs
        done = subprocess.run([*cmd, "--repack", "0"], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"llama-bench failed ({done.returncode}): {done.stderr[-2000:]}")
    rows = json.loads(done.stdout)
    pp = next(r for r in rows if r["n_prompt"] == prompt_len and r["n_gen"] == 0)
    tg = next(r for r in rows if r["n_gen"] == new and r["n_prompt"] == 0)
    return {"prefill_s": round(prompt_len / pp["avg_ts"], 4),
            "prefill_tok_s": round(pp["avg_ts"], 1), "decode_tok_s": round(tg["avg_ts"], 2),
            "decode_context": context,
            "peer_version": f"llama.cpp {rows[0].get('build_commit', '?')}"
                            + ("" if repack else ", --repack 0")}  # fmt: skip


def engine_lines(configs: list[str], peer: bool, args) -> dict[str, dict]:
    """Every engine configuration and llama.cpp GGUF measured in turns, `args.rounds` rounds
    (the order reversed every round: this machine's bandwidth drifts by 2x within minutes),
    best of the rounds each."""
    engines = {name: EngineRates({**ENGINE[name], "compile": args.compile}, args.prefill,
                                 args.context, args.new)
               for name in configs}  # fmt: skip
    files = _llama_files() if peer else {}
    peers: dict[str, dict] = {}
    order = [*engines, *files]
    for round_ in range(args.rounds):
        for name in order if round_ % 2 == 0 else order[::-1]:
            if name in engines:
                engines[name].measure()
                continue
            got = llama_bench(files[name], args.prefill, args.context, args.new)
            best = peers.setdefault(name, got)
            best["prefill_s"] = min(best["prefill_s"], got["prefill_s"])
            best["prefill_tok_s"] = max(best["prefill_tok_s"], got["prefill_tok_s"])
            best["decode_tok_s"] = max(best["decode_tok_s"], got["decode_tok_s"])
        print(f"engine round {round_ + 1} of {args.rounds} done", flush=True)
    return {**{name: e.result() for name, e in engines.items()}, **peers}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", default="1,16,128,512")
    parser.add_argument("--schemes", default="int8,q4_1,bf16", help="weight schemes of the op rows")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prefill", type=int, default=512)
    parser.add_argument("--skip-engine", action="store_true")
    parser.add_argument(
        "--engines",
        default=",".join(ENGINE),
        help="engine configurations, comma-separated (default: all)",
    )
    parser.add_argument("--no-peer", action="store_true", help="no llama-bench runs")
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="engine rounds, every configuration and peer in turns (best of)",
    )
    parser.add_argument(
        "--context",
        type=int,
        default=64,
        help="decode after this many prompt tokens (llama-bench -d)",
    )
    parser.add_argument("--new", type=int, default=64, help="decode tokens timed")
    parser.add_argument("--compile", choices=("off", "jit"), default="off",
                        help="the engines' decoder layers: 'off' (the per-op path and the fused "
                        "decode step) or 'jit' (generated layer programs); default %(default)s; "
                        "jit results go to a file of their own (*_jit.jsonl)")  # fmt: skip
    sources = ("gemm_w8a8_i8", "gemm_w4a8_i8", "gemm_bf16")
    flags = sorted({f for s in sources for f in _compile_flags(s)
                    if f.startswith(("-mavx512", "-mamx"))})  # fmt: skip
    kind = "_amx" if any(f.startswith("-mamx") for f in flags) else ""  # (a file per CPU kind)
    parser.add_argument("--out", type=pathlib.Path, default=None,
                        help="JSON-lines output, overwritten (default: benchmarks/results/"
                        "low_precision.jsonl: _amx where the kernels are built with AMX tiles, "
                        "_jit with --compile jit)")  # fmt: skip
    args = parser.parse_args()
    if args.out is None:
        mode = "" if args.compile == "off" else f"_{args.compile}"
        args.out = ROOT / f"benchmarks/results/low_precision{kind}{mode}.jsonl"
    torch.set_num_threads(2)
    base = {"bench": "low_precision", "machine": machine_info(2), "kernel_flags": flags,
            "date": datetime.date.today().isoformat(), "compile": args.compile}  # fmt: skip
    lines = []
    for scheme in (s for s in args.schemes.split(",") if s):  # ("": no op rows)
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
        configs = [c for c in args.engines.split(",") if c]
        unknown = sorted(set(configs) - set(ENGINE))
        if unknown:
            raise SystemExit(f"--engines: unknown {unknown}; expected some of {sorted(ENGINE)}")
        got = engine_lines(configs, not args.no_peer, args)
        fp32 = got.get("fp32", {}).get("prefill_s")
        for name, result in got.items():
            line = {**base, "kind": "engine", "config": name, "prefill_tokens": args.prefill,
                    **result}  # fmt: skip
            if fp32:
                line["prefill_vs_fp32"] = round(fp32 / result["prefill_s"], 3)
            if PEER_OF.get(name) in got:
                line["decode_vs_peer"] = round(
                    result["decode_tok_s"] / got[PEER_OF[name]]["decode_tok_s"], 3
                )
                line["decode_peer"] = PEER_OF[name]
            print({k: v for k, v in line.items() if k != "machine"}, flush=True)
            lines.append(line)
            engine = "llama.cpp" if name.startswith("llama.cpp") else "infergen"
            for metric in ("prefill_tok_s", "decode_tok_s"):  # (ab_commits reads these)
                lines.append({**base, "kind": "result", "metric": metric, "engine": engine,
                              "config": name, "value": result[metric],
                              "unit": "tok/s"})  # fmt: skip
    write_lines(args.out, lines)


if __name__ == "__main__":
    main()
