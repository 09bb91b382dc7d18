"""Step times of compile="jit" (and compile="off" beside it) on the default model at the shapes
of bench_compiler.py — decode T=1, decode T=16 (128 tokens of context each) and a 512-token
prefill — and two short prefills (a 16-token prompt, a 16-token chunk after 256 cached
tokens), timed in turns, best of --repeats. Small on purpose: ab_commits.py runs it against
an older commit (`--head-benchmarks`: this script on both sides) for issue 27's targets
(decode T=1 / T=16 >= 1.15x, prefill 512 >= 1.25x faster than the jit the issue measured):

    .venv/bin/python benchmarks/ab_commits.py --base 17503f0~1 --rounds 2 --head-benchmarks \\
        --bench "bench_jit_steps.py" --out benchmarks/results/ab_issue27.jsonl

`--model gemma3-270m` runs Gemma-3-270M (the packaged Q4_K_M GGUF, dequantized to fp32:
sliding-window and full-attention layers, sandwich norms, GeGLU). Its compile="off" is the
per-op path (the hand-written fused decode takes Llama-shaped layers only), so the pair is
the layer programs against running each op from Python. `--model gpt-oss-row` runs
bench_architectures' GPT-OSS row (learned sinks, 8 experts top 2, random weights), likewise;
`--model deepseek-v2-row | deepseek-v3-row | mamba2-row | qwen3-next-row | falcon-h1-row` the
rows whose mixers the compiler runs as their modules (the per-layer fallback: the layer
programs, one per kind of layer, call the module back from C):

    .venv/bin/python benchmarks/bench_jit_steps.py --model gemma3-270m \\
        --out benchmarks/results/jit_steps_gemma3.jsonl
    .venv/bin/python benchmarks/bench_jit_steps.py --model gpt-oss-row \\
        --out benchmarks/results/jit_steps_gpt_oss.jsonl
    .venv/bin/python benchmarks/bench_jit_steps.py --model deepseek-v2-row \\
        --out benchmarks/results/jit_steps_deepseek_v2.jsonl
"""

from __future__ import annotations

import atexit
import pathlib
import shutil
import sys
import tempfile

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))  # (arch_rows builds tests/hf_models.py variants)

from arch_rows import ARCHS, Size, build  # noqa: E402
from bench_compiler import CONTEXT_TOKENS, SHAPES, make_batch, step_fn  # noqa: E402
from bench_generate import git_state, machine_info  # noqa: E402
from results_file import base_line, bench_arguments, ratio_line, write_lines  # noqa: E402

from infergen import LLM  # noqa: E402
from infergen.io.packaged_models import gemma3_270m_path  # noqa: E402
from infergen.timing import best_seconds_each  # noqa: E402


def arch_row(arch) -> tuple[pathlib.Path, int]:
    """bench_architectures' row of `arch` (random weights at its one size), built into a
    temporary directory (removed at exit); and its KV bytes a token if every layer cached
    full multi-head K and V (an upper bound: sizes the cache)."""
    directory = pathlib.Path(tempfile.mkdtemp(prefix=f"infergen-{arch.name}-row-"))
    atexit.register(shutil.rmtree, directory, True)
    info = build(arch, Size(), directory)
    return directory, info["mha_bytes_per_token"]


# --model → (checkpoint path, its label in the results; KV cache bytes a token, all layers)
MODELS = {
    "smollm2-135m": (lambda: None, "SmolLM2-135M-Instruct (fp32)", 46080),
    "gemma3-270m": (gemma3_270m_path, "Gemma-3-270M (Q4_K_M GGUF dequantized, fp32)", 36864),
}
# the architecture rows the compiler runs beyond Llama's shape: GPT-OSS (sinks, experts), and
# those whose mixers it runs as their modules (DeepSeek's MLA, Mamba2, Qwen3-Next's DeltaNet
# and gated attention, Falcon-H1's attention beside Mamba2)
ROWS = {
    f"{arch.name.replace('_', '-')}-row": arch
    for arch in ARCHS
    if arch.name in ("gpt_oss", "deepseek_v2", "deepseek_v3", "mamba2", "qwen3_next", "falcon_h1")
}


def main() -> None:
    parser = bench_arguments(__doc__, 10, ROOT / "benchmarks/results/jit_steps.jsonl")
    parser.add_argument("--model", choices=sorted({**MODELS, **ROWS}), default="smollm2-135m")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.model in ROWS:
        arch = ROWS[args.model]
        path, token_bytes = arch_row(arch)
        label = f"{arch.name} row of bench_architectures (random weights, fp32)"
    else:
        make_path, label, token_bytes = MODELS[args.model]
        path = make_path()
    model = {} if path is None else {"model": str(path)}
    memory = f"{CONTEXT_TOKENS * token_bytes * 2 // 2**20 + 64}MiB"
    engines = {
        "jit": LLM(**model, kv_cache_memory=memory, compile="jit"),
        "off": LLM(**model, kv_cache_memory=memory),
    }
    # the two compute the same: logits of one prompt (prefilled in chunks of 16), jit vs off
    prompt = [100 + (7 * j) % 4000 for j in range(48)]
    logits = {mode: llm.engine.prompt_logits(prompt, chunk=16) for mode, llm in engines.items()}
    deviation = float((logits["jit"] - logits["off"]).abs().max() / logits["off"].abs().max())
    print(f"max |logit jit - off| / max |logit off| over {len(prompt)} tokens: {deviation:.2e}")
    base = base_line(
        "jit_steps",
        label,
        machine_info(args.threads),
        git_state(),
        logits_deviation_jit_vs_off=deviation,
    )
    lines = []
    shapes = {**SHAPES, "prefill_t16": (1, 0, 16), "chunk_t16_ctx256": (1, 256, 16)}
    for shape, (sequences, context, new) in shapes.items():
        fns = {
            mode: step_fn(llm, make_batch(llm, sequences, context, new))
            for mode, llm in engines.items()
        }
        best = best_seconds_each(fns, args.repeats)
        print(f"[{shape}] " + "  ".join(f"{k} {v * 1e3:.2f} ms" for k, v in best.items()))
        for mode, seconds in best.items():
            lines.append(
                {
                    **base,
                    "kind": "result",
                    "metric": f"step_ms_{shape}",
                    "engine": "infergen",
                    "mode": f"compile={mode}",
                    "value": seconds * 1e3,
                    "unit": "ms",
                    "stat": f"best of {args.repeats}",
                }
            )
        shape_text = f"{sequences} x ({context} cached + {new} new)"
        lines.append(ratio_line(base, f"step_ms_{shape}", best["jit"] * 1e3, "compile=off",
                                best["off"] * 1e3, "ms", shape=shape_text))  # fmt: skip
    write_lines(args.out, lines)


if __name__ == "__main__":
    main()
