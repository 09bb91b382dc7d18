"""Quest-style sparse decode on the default model at 8k context: the share of the KV the decode
steps read, passkey retrieval against dense decode, and decode speed, in the same run.

Passkey (infergen/eval/passkey.py): a five-digit key hidden at --samples depths in ~7.9k
tokens of filler, then asked for; the prompt is prefilled densely (as in Quest) and the key's
digits after the first are produced by sparse decode steps reading `k` blocks of 16 tokens
per KV head (the last block, the first one, and the best by the block-summary bound).
Speed: 32 greedy tokens after one 7.9k-token prompt, time after the first token, best of
--rounds (dense uses the native C decode kernel; sparse runs ops/sparse_decode.py in torch).
Targets (issue 8): the KV read at 8k ≤ 25 % with passkey accuracy equal to dense.
JSON lines to benchmarks/results/sparse.jsonl.
"""

from __future__ import annotations

import argparse
import datetime
import pathlib
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_generate import decode_phase, machine_info  # noqa: E402
from results_file import write_lines  # noqa: E402

from infergen import LLM, SamplingParams  # noqa: E402
from infergen.eval.passkey import passkey_accuracy, passkey_prompt  # noqa: E402

LENGTH = 7936  # prompt tokens: the answer fits in the model's 8192


def _engine(blocks: int | None) -> LLM:
    return LLM(kv_cache_memory="2GiB", max_num_batched_tokens=512, sparse_decode_blocks=blocks)


def _decode_tok_s(llm: LLM, rounds: int) -> float:
    prompt = passkey_prompt(llm.tokenizer, LENGTH, 0.5, 12345)
    params = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
    runs = [decode_phase(llm.engine, [prompt], params) for _ in range(rounds)]
    return max(run["decode_phase_tokens"] / run["decode_phase_s"] for run in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", default="64,96", help="sparse k values (blocks of 16)")
    parser.add_argument("--samples", type=int, default=4, help="passkey depths")
    parser.add_argument("--rounds", type=int, default=2, help="speed runs, best taken")
    parser.add_argument(
        "--out", type=pathlib.Path, default=ROOT / "benchmarks/results/sparse.jsonl"
    )
    args = parser.parse_args()
    torch.set_num_threads(2)
    machine = machine_info(2)
    base = {"bench": "sparse", "model": "SmolLM2-135M-Instruct (Q4_1 GGUF, fp32)",
            "prompt_tokens": LENGTH, "machine": machine,
            "date": datetime.date.today().isoformat()}  # fmt: skip
    lines = []
    configs = [None, *(int(k) for k in args.blocks.split(","))]
    dense_accuracy = None
    for blocks in configs:
        llm = _engine(blocks)
        accuracy = passkey_accuracy(llm, [LENGTH], args.samples)[LENGTH]
        fraction = llm.engine.sparse_read_fraction()
        speed = _decode_tok_s(llm, args.rounds)
        line = {**base, "decode": "dense" if blocks is None else f"sparse k={blocks}",
                "passkey_accuracy": accuracy, "passkey_samples": args.samples,
                "kv_read_fraction": 1.0 if blocks is None else round(fraction, 4),
                "decode_tok_s_8k": round(speed, 2)}  # fmt: skip
        if blocks is None:
            dense_accuracy, dense_speed = accuracy, speed
        else:
            line["speed_vs_dense"] = round(speed / dense_speed, 3)
            line["target"] = "KV read <= 25 % at 8k with passkey accuracy equal to dense"
            line["met"] = fraction <= 0.25 and accuracy == dense_accuracy
        print({k: v for k, v in line.items() if k not in ("machine", "model")})
        lines.append(line)
        del llm
    write_lines(args.out, lines)


if __name__ == "__main__":
    main()
