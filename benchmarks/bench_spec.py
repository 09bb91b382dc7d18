"""Speculative decoding (issue 24), first cut: tokens per second with each proposer against the
same engine without speculation, same run, batch 1, greedy, the default model (fp32).

Workloads (from data/python_docs.txt, the shipped corpus):
  copy     "repeat the passage": a 1,200-character passage, then its first 200 characters
           again; the continuation copies the rest (edits and quotes look like this)
  open     a passage to continue freely (little to copy: speculation should not pay)
Each (workload, configuration) generates --tokens tokens, the configurations alternating,
best of --repeats; a fresh engine per configuration, warmed up. JSON lines to --out: a result
per configuration, a ratio per proposer against no speculation, with the acceptance rate and
tokens per verifying step. Peers still to add (issue 24): transformers' prompt-lookup and
assisted generation, llama.cpp's prompt-lookup decoding; batch 16.
"""

from __future__ import annotations

import argparse
import datetime
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from bench_generate import git_state, machine_info  # noqa: E402
from peers.cpu_contention import OtherCpu  # noqa: E402
from results_file import write_lines  # noqa: E402

CONFIGS = (None, "ngram", "suffix")


def workloads() -> dict[str, str]:
    text = (ROOT / "data" / "python_docs.txt").read_text()
    passage = text[20000:21200]
    return {
        "copy": "Repeat the following text exactly.\n\n"
        + f"{passage}\n\nRepeated text:\n{passage[:200]}",
        "open": text[40000:41200],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tokens", type=int, default=128, help="tokens generated per run")
    parser.add_argument("--repeats", type=int, default=3, help="runs per configuration")
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "benchmarks/results/spec.jsonl")
    args = parser.parse_args()
    from infergen import LLM, SamplingParams

    base = {
        "bench": "spec",
        "quick": False,
        "dtype": "fp32",
        "git": git_state(),
        "machine": machine_info(2),
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    engines = {c: LLM(num_threads=2, speculative=c, num_speculative_tokens=args.k)
               for c in CONFIGS}  # fmt: skip
    params = SamplingParams(max_tokens=args.tokens, temperature=0, ignore_eos=True)
    lines = []
    for work, prompt in workloads().items():
        for llm in engines.values():
            llm.generate([prompt], SamplingParams(max_tokens=4, temperature=0))  # warm-up
        best: dict = {}
        outputs: dict = {}
        for i in range(args.repeats):
            for config in CONFIGS if i % 2 == 0 else CONFIGS[::-1]:
                llm = engines[config]
                before = dict(llm.engine.speculator.stats) if config else {}
                with OtherCpu() as other:
                    start = time.perf_counter()
                    out = llm.generate([prompt], params)[0]
                    seconds = time.perf_counter() - start
                rate = len(out.token_ids) / seconds
                outputs[config] = out.token_ids
                if rate > best.get(config, (0,))[0]:
                    after = llm.engine.speculator.stats if config else {}
                    delta = {k: after[k] - before[k] for k in after}
                    best[config] = (rate, other.cores, delta)
        for config in CONFIGS:
            rate, cores, delta = best[config]
            name = config or "no speculation"
            extra = {}
            if config:
                drafted, steps = delta["drafted"], delta["steps"]
                extra = {
                    "acceptance_rate": delta["accepted"] / drafted if drafted else None,
                    "tokens_per_verify_step": (delta["accepted"] + steps) / steps
                    if steps
                    else None,
                    "same_tokens_as_no_speculation": outputs[config] == outputs[None],
                }
            lines.append({**base, "kind": "result", "metric": f"decode_tok_s [{work}, batch 1]",
                          "engine": "infergen", "config": name, "value": rate, "unit": "tok/s",
                          "stat": f"best of {args.repeats}", "other_cpu_cores": cores,
                          "params": {"k": args.k, "tokens": args.tokens}, **extra})  # fmt: skip
            if config:
                lines.append({**base, "kind": "ratio", "metric": f"decode_tok_s [{work}, batch 1]",
                              "engine": "infergen", "config": name, "peer": "no speculation",
                              "infergen_value": rate, "peer_value": best[None][0],
                              "value": rate / best[None][0], "unit": "x",
                              "definition": "tok/s with the proposer / without speculation",
                              **extra})  # fmt: skip
            print(f"{work:5} {name:15} {rate:6.1f} tok/s "
                  + (f"{rate / best[None][0]:5.2f}x  {extra}" if config else ""))  # fmt: skip
    write_lines(args.out, lines)


if __name__ == "__main__":
    main()
