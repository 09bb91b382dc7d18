"""Tensor parallelism on this machine (issue 26): the default model on one process (2 threads)
against two ranks (gloo, 1 thread each) in the same run — decode tok/s at batch 1 and 8,
prefill of 1024 tokens, and rank 0's communication share of the decode phase (the time it
waited in all-reduces, the logits' gather and the step's broadcast). No speed target on 2
cores: the figures say what the split costs here. JSON lines to benchmarks/results/tp.jsonl.
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

from bench_generate import decode_phase, machine_info  # noqa: E402
from results_file import write_lines  # noqa: E402

from infergen import LLM, SamplingParams  # noqa: E402

MODEL = "SmolLM2-135M-Instruct (Q4_1 GGUF, fp32)"


def _comm(llm: LLM) -> dict[str, list[float]]:
    tp = llm.engine.runner.model.tp
    return {} if tp is None else {k: list(v) for k, v in tp.stats.items()}


def _measure(llm: LLM, batch: int, new: int, prompt_len: int) -> dict:
    prompts = [[(13 * i + j) % 30000 + 100 for j in range(prompt_len)] for i in range(batch)]
    params = SamplingParams(max_tokens=new, temperature=0, ignore_eos=True)
    decode_phase(llm.engine, prompts[:1], SamplingParams(max_tokens=2, temperature=0))  # warm
    before = _comm(llm)
    run = decode_phase(llm.engine, prompts, params)
    after = _comm(llm)
    waited = sum(v[2] for v in after.values()) - sum(v[2] for v in before.values())
    calls = sum(v[0] for v in after.values()) - sum(v[0] for v in before.values())
    return {
        "decode_tok_s": round(run["decode_phase_tokens"] / run["decode_phase_s"], 2),
        "seconds": round(run["seconds"], 3),
        "comm_s": round(waited, 3),
        "comm_share": round(waited / run["seconds"], 3),
        "collectives": int(calls),
        "outputs": run["outputs"],
    }


def _prefill(llm: LLM, length: int) -> float:
    prompt = [(7 * j) % 30000 + 100 for j in range(length)]
    began = time.perf_counter()
    llm.generate([prompt], SamplingParams(max_tokens=1, temperature=0))
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--new", type=int, default=32, help="tokens generated per request")
    parser.add_argument("--prompt", type=int, default=64, help="prompt tokens per request")
    parser.add_argument("--prefill", type=int, default=1024)
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "benchmarks/results/tp.jsonl")
    args = parser.parse_args()
    base = {"bench": "tp", "model": MODEL, "machine": machine_info(2),
            "date": datetime.date.today().isoformat()}  # fmt: skip
    lines, outputs = [], {}
    for tp, threads in ((1, 2), (2, 1)):
        torch.set_num_threads(threads)
        with LLM(tensor_parallel_size=tp, num_threads=threads, max_num_batched_tokens=2048) as llm:
            prefill_s = _prefill(llm, args.prefill)
            for batch in (int(b) for b in args.batches.split(",")):
                got = _measure(llm, batch, args.new, args.prompt)
                outputs[(tp, batch)] = got.pop("outputs")
                line = {**base, "tp": tp, "threads_per_rank": threads, "batch": batch,
                        "prefill_tokens": args.prefill, "prefill_s": round(prefill_s, 3),
                        **got}  # fmt: skip
                if tp > 1:
                    one = next(ln for ln in lines if ln["tp"] == 1 and ln["batch"] == batch)
                    line["vs_tp1"] = round(line["decode_tok_s"] / one["decode_tok_s"], 3)
                    line["same_tokens"] = outputs[(tp, batch)] == outputs[(1, batch)]
                print({k: v for k, v in line.items() if k not in ("machine", "model")},
                      flush=True)  # fmt: skip
                lines.append(line)
    write_lines(args.out, lines)


if __name__ == "__main__":
    main()
