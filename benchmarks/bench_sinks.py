"""Learned sink logits (GPT-OSS) in the native attention kernels against the torch sink path
they replace, same run.

On bench_architectures' GPT-OSS row (random weights at its one size: hidden 512, 8 layers
alternating window-128 / full, 8 query heads of 64 on 2 KV heads, 8 experts top 2), fp32,
the engine's default path (compile="off"), whole steps timed in turns (best of --repeats):

- native   every layer's attention through the native rows with the sink core: decode by
           kernels/paged_decode_attention_f32.c (the sink a term of the chunks' merge),
           prefill by kernels/paged_prefill_attention_f32.c (a term of the last normalisation);
- torch    the same layers with the torch rows and the same core (ops/attention_sinks.py:
           K / V gathered, scores, the sink an extra softmax column): what ran before.

Steps: decode of 1 and 16 sequences at 512 cached tokens, a 512-token prefill. The two
paths' logits are compared first (max difference, kept in each line).

    .venv/bin/python benchmarks/bench_sinks.py [--repeats 7] [--threads 2]
"""

from __future__ import annotations

import functools
import pathlib
import sys
import tempfile

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))

from arch_rows import ARCHS, Size, build  # noqa: E402
from bench_compiler import make_batch, step_fn  # noqa: E402
from bench_generate import git_state, machine_info  # noqa: E402
from results_file import base_line, bench_arguments, ratio_line, write_lines  # noqa: E402

from infergen import LLM  # noqa: E402
from infergen.ops import paged_attention as pa  # noqa: E402
from infergen.timing import best_seconds_each  # noqa: E402

SHAPES = {"decode_t1_ctx512": (1, 512, 1), "decode_t16_ctx512": (16, 512, 1),
          "prefill_t512": (1, 0, 512)}  # fmt: skip


def main() -> None:
    parser = bench_arguments(__doc__, 7, ROOT / "benchmarks/results/sinks.jsonl")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    arch = next(a for a in ARCHS if a.name == "gpt_oss")
    with tempfile.TemporaryDirectory() as tmp:
        build(arch, Size(), pathlib.Path(tmp))
        run(LLM(tmp, kv_cache_memory="256MiB"), args)


def run(llm: LLM, args) -> None:
    attns = [layer.attn for layer in llm.engine.runner.model.layers]
    rows = {
        "native": [(a.decode, a.prefill) for a in attns],
        "torch": [
            (functools.partial(pa.decode_attention, core=a.core), pa.PREFILL_BACKENDS.get("torch"))
            for a in attns
        ],
    }

    def use(path: str) -> None:
        for attn, (decode, prefill) in zip(attns, rows[path], strict=True):
            attn.decode, attn.prefill = decode, prefill

    base = base_line(
        "sinks", "GPT-OSS row of bench_architectures (random weights, fp32)",
        machine_info(args.threads), git_state(),
    )  # fmt: skip
    lines = []
    for shape, (sequences, context, new) in SHAPES.items():
        step = step_fn(llm, make_batch(llm, sequences, context, new))
        logits = {}
        for path in rows:
            use(path)
            logits[path] = step()
        difference = float((logits["native"] - logits["torch"]).abs().max())
        fns = {path: (lambda path=path, step=step: (use(path), step())) for path in rows}
        best = best_seconds_each(fns, args.repeats)
        use("native")
        ratio = best["torch"] / best["native"]
        print(f"[{shape}] native {best['native'] * 1e3:.2f} ms  torch {best['torch'] * 1e3:.2f} "
              f"ms  {ratio:.2f}x  max |logit difference| {difference:.1e}")  # fmt: skip
        lines.append(ratio_line(base, f"step_ms_{shape}", best["native"] * 1e3,
                                "torch sink attention", best["torch"] * 1e3, "ms",
                                stat=f"best of {args.repeats}",
                                max_logit_difference=difference))  # fmt: skip
    write_lines(args.out, lines)


if __name__ == "__main__":
    main()
