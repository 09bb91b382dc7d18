"""KV presses on the default model (issue 25): what removing half of each prompt's cached
tokens buys — blocks back in the pool, long sequences served at once from the same pool, decode
speed at 4k context — and what it costs in passkey retrieval, each press against the full cache
in the same run.

- **Freed blocks**: the share of a pressed sequence's prompt blocks that go back to the pool.
- **Concurrency**: --concurrent-prompts requests of --concurrent-length tokens (64 new each)
  on a pool sized for --pool-for of them unpressed, prefix caching off (the prompts share
  filler; a new one is admitted while its whole prompt fits: the press needs it all first);
  the most sequences running at once and the wall-clock throughput, pressed against the
  full cache.
- **Decode at 4k**: 32 greedy tokens after one 4096-token prompt, time after the first token,
  the full cache and each of --decode-presses interleaved over --rounds rounds (the best of
  each; pyramidkv's and h2o's decodes run the per-op path, not the fused decode step).
- **Passkey** (infergen/eval/passkey.py): a five-digit key at --samples depths in filler of
  each --lengths, greedy; correct when the key's digits appear in the answer.
Targets (issue 25): >= 45 % of the blocks back at 0.5; >= 1.8x concurrent long sequences;
decode at 4k >= 1.3x the full cache; SnapKV at 0.5 >= 95 % of the full cache's passkey score.
JSON lines to benchmarks/results/kv_press.jsonl.
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
from infergen.eval.passkey import passkey_accuracy, passkey_prompt  # noqa: E402

MODEL = "SmolLM2-135M-Instruct (Q4_1 GGUF, fp32)"
DECODE_LENGTH = 4096
NEW_TOKENS = 64  # per request of the concurrency run


def _engine(press: str | None, ratio: float, **options) -> LLM:
    extra = {} if press is None else dict(kv_press=press, kv_press_ratio=ratio)
    return LLM(max_num_batched_tokens=512, **extra, **options)


def _kv_bytes_per_token(llm: LLM) -> float:
    cache = llm.engine.kv_cache
    return cache.nbytes / (cache.num_blocks * cache.block_size)


def concurrency(press: str | None, ratio: float, prompts: list[list[int]], memory: int) -> dict:
    """Peak running sequences and throughput of `prompts` on a pool of `memory` bytes."""
    # (no prefix caching: the passkey prompts share their filler, which would share blocks)
    llm = _engine(press, ratio, kv_cache_memory=str(memory), enable_prefix_caching=False)
    peak = []
    llm.engine.on_step = lambda record: peak.append(len(llm.engine.scheduler.running))
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True)
    began = time.perf_counter()
    outputs = llm.generate(prompts, params)
    seconds = time.perf_counter() - began
    stats = llm.engine.kv_press.stats if llm.engine.kv_press else {}
    return {
        "peak_running": max(peak),
        "tok_s": round(sum(len(o.token_ids) for o in outputs) / seconds, 2),
        "seconds": round(seconds, 2),
        "preemptions": llm.engine.scheduler.num_preemptions,
        **({k: stats[k] for k in ("blocks_freed", "skipped", "in_place")} if stats else {}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presses", default="snapkv,pyramidkv,h2o,knorm,streaming,random")
    parser.add_argument(
        "--decode-presses",
        default="snapkv,pyramidkv,h2o",
        help="presses whose decode speed at 4k is measured",
    )
    parser.add_argument("--ratio", type=float, default=0.5, help="share of tokens removed")
    parser.add_argument("--lengths", default="1024,2048", help="passkey prompt lengths")
    parser.add_argument("--samples", type=int, default=4, help="passkey depths per length")
    parser.add_argument("--rounds", type=int, default=2, help="decode speed rounds, best taken")
    parser.add_argument("--concurrent-prompts", type=int, default=16)
    parser.add_argument(
        "--pool-for",
        type=int,
        default=8,
        help="the concurrency run's pool holds this many requests unpressed",
    )
    parser.add_argument("--concurrent-length", type=int, default=2048)
    parser.add_argument(
        "--out", type=pathlib.Path, default=ROOT / "benchmarks/results/kv_press.jsonl"
    )
    args = parser.parse_args()
    torch.set_num_threads(2)
    presses = args.presses.split(",")
    lengths = [int(n) for n in args.lengths.split(",")]
    base = {"bench": "kv_press", "model": MODEL, "ratio": args.ratio,
            "machine": machine_info(2), "date": datetime.date.today().isoformat()}  # fmt: skip
    lines = []

    # passkey, and each press's freed share on those prompts
    for press in [None, *presses]:
        llm = _engine(press, args.ratio, kv_cache_memory="2GiB")
        accuracy = passkey_accuracy(llm, lengths, args.samples)
        line = {**base, "part": "passkey", "press": press or "full",
                "passkey": {str(n): a for n, a in accuracy.items()},
                "samples": args.samples}  # fmt: skip
        if press is not None:
            stats = llm.engine.kv_press.stats
            line["blocks_freed_share"] = round(stats["blocks_freed"] / stats["blocks_pressed"], 3)
        print({k: v for k, v in line.items() if k not in ("machine", "model")}, flush=True)
        lines.append(line)

    # concurrent long sequences in one pool sized for 4 of them unpressed
    tokenizer = _engine(None, 0.0).tokenizer
    prompts = [
        passkey_prompt(tokenizer, args.concurrent_length, (i + 0.5) / args.concurrent_prompts,
                       10000 + i)
        for i in range(args.concurrent_prompts)
    ]  # fmt: skip
    per_token = _kv_bytes_per_token(_engine(None, 0.0, kv_cache_memory="64MiB"))
    memory = int(args.pool_for * (len(prompts[0]) + NEW_TOKENS + 16) * per_token)
    full = concurrency(None, args.ratio, prompts, memory)
    lines.append({**base, "part": "concurrency", "press": "full", **full,
                  "pool_bytes": memory, "pool_for": args.pool_for, "prompts": len(prompts),
                  "prompt_tokens": len(prompts[0])})  # fmt: skip
    print({"press": "full", **full}, flush=True)
    for press in presses[:1]:
        got = concurrency(press, args.ratio, prompts, memory)
        line = {**base, "part": "concurrency", "press": press, **got, "pool_bytes": memory,
                "pool_for": args.pool_for,
                "prompts": len(prompts), "prompt_tokens": len(prompts[0]),
                "concurrency_vs_full": round(got["peak_running"] / full["peak_running"], 2),
                "throughput_vs_full": round(got["tok_s"] / full["tok_s"], 2),
                "target": "concurrent long sequences >= 1.8x"}  # fmt: skip
        line["met"] = line["concurrency_vs_full"] >= 1.8
        print({k: v for k, v in line.items() if k not in ("machine", "model")}, flush=True)
        lines.append(line)

    # decode at 4k context, interleaved
    engines = {p: _engine(p, args.ratio, kv_cache_memory="2GiB")
               for p in [None, *args.decode_presses.split(",")]}  # fmt: skip
    prompt = passkey_prompt(engines[None].tokenizer, DECODE_LENGTH, 0.5, 12345)
    params = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
    best: dict = {}
    for _ in range(args.rounds):
        for press, llm in engines.items():
            run = decode_phase(llm.engine, [prompt], params)
            speed = run["decode_phase_tokens"] / run["decode_phase_s"]
            best[press] = max(best.get(press, 0.0), speed)
    for press in engines:
        line = {**base, "part": "decode_4k", "press": press or "full",
                "prompt_tokens": len(prompt), "decode_tok_s": round(best[press], 2)}  # fmt: skip
        if press is not None:
            line["speed_vs_full"] = round(best[press] / best[None], 3)
            line["target"] = "decode step at 4k >= 1.3x the full cache"
            line["met"] = line["speed_vs_full"] >= 1.3
        print({k: v for k, v in line.items() if k not in ("machine", "model")}, flush=True)
        lines.append(line)
    write_lines(args.out, lines)


if __name__ == "__main__":
    main()
