"""The real sliding-window model against an independent reference: Gemma-3-270M (Q4_K_M
GGUF, packaged) run by infergen and by transformers on the same file.

Teacher-forced over --tokens tokens of real text (default 1536 = 3× the 512-token window,
scored in chunks of 256 so the windowed cache groups release blocks while the text is read):
top-1 agreement, perplexity of both, max |logit difference|, and infergen's KV bytes held at
the end per cache group. Target (issue 8): top-1 agreement ≥ 99.5 %. One JSON line per result
to benchmarks/results/gemma3.jsonl. Takes ~3 minutes here (transformers dequantizes the GGUF
in ~110 s). A check, not a speed benchmark: speeds are in bench_architectures.py.
"""

from __future__ import annotations

import argparse
import datetime
import math
import pathlib
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_generate import machine_info  # noqa: E402
from results_file import write_lines  # noqa: E402

from infergen import LLM  # noqa: E402
from infergen.io.packaged_models import gemma3_270m_path  # noqa: E402


def _nll(logits: torch.Tensor, tokens: list[int]) -> float:
    targets = torch.tensor(tokens[1:])
    return torch.nn.functional.cross_entropy(logits[:-1].double(), targets, reduction="sum").item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=1536, help="text tokens scored")
    parser.add_argument("--corpus", default="python_docs.txt", help="a file in data/")
    parser.add_argument(
        "--out", type=pathlib.Path, default=ROOT / "benchmarks/results/gemma3.jsonl"
    )
    args = parser.parse_args()
    torch.set_num_threads(2)
    torch.set_flush_denormal(True)
    path = gemma3_270m_path()
    start = time.perf_counter()
    llm = LLM(str(path), kv_cache_memory="256MiB", max_num_batched_tokens=256)
    load_s = time.perf_counter() - start
    text = (ROOT / "data" / args.corpus).read_text(encoding="utf-8")
    tokens = llm.tokenizer.encode(text)[: args.tokens]
    ours = llm.engine.prompt_logits(tokens, chunk=256)
    groups = [(g.window, len(g.layers)) for g in llm.engine.kv_cache.groups]
    del llm
    from transformers import AutoModelForCausalLM

    start = time.perf_counter()
    hf = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    hf_load_s = time.perf_counter() - start
    with torch.no_grad():
        ref = hf(torch.tensor([tokens])).logits[0].float()
    agreement = (ours.argmax(-1) == ref.argmax(-1)).double().mean().item()
    n = len(tokens) - 1
    import transformers

    line = {
        "bench": "gemma3",
        "model": path.name,
        "corpus": args.corpus,
        "tokens": len(tokens),
        "top1_agreement": round(agreement, 5),
        "ppl_infergen": round(math.exp(_nll(ours, tokens) / n), 4),
        "ppl_transformers": round(math.exp(_nll(ref, tokens) / n), 4),
        "max_abs_logit_diff": round((ours - ref).abs().max().item(), 5),
        "cache_groups": groups,
        "load_s": {"infergen": round(load_s, 1), "transformers": round(hf_load_s, 1)},
        "peer": f"transformers {transformers.__version__}",
        "target": "top-1 agreement >= 0.995",
        "met": agreement >= 0.995,
        "machine": machine_info(2),
        "date": datetime.date.today().isoformat(),
    }
    print({k: v for k, v in line.items() if k != "machine"})
    write_lines(args.out, [line])


if __name__ == "__main__":
    main()
