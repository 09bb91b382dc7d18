"""What the KV tiers below the paged pool (issue 23) buy on agentic conversations, in process.

Default model (SmolLM2-135M) on the CPU, fp32, 2 threads; the engine's own step loop, one fresh
engine per configuration (warmed up with an unrelated prompt before timing). Workload:
`sessions` sessions of `turns` turns; every session starts with the same system prompt
(`system` tokens) plus a "tool output" (`tool` tokens); each later turn resends the whole
conversation + the model's answer (`answer` tokens, greedy, EOS ignored) + a new tool output.
All token windows are cut from data/ text (token ids, the engine's tokenizer). Sessions
interleave: every session's turn k is submitted at once (continuous batching), then turn k+1.
The pool holds `pool_share` (25 %) of the working set (the sum of every session's final
context, in blocks of 16), at least the longest request + 1 block.

Configurations (each its own engine, in this order per round):
  no tiers      recompute what the pool evicted (the peer of every ratio);
  host          kv_offload_memory = twice the working set (nothing leaves it);
  host + disk   a host tier of `pool_share` of the working set spilling to a disk tier in a
                temporary directory, kv_offload_write_through=True (whole prefixes go down
                as they are computed, so that they can outlive a restart);
  restart       a fresh engine of host + disk's options on the same directory after its run:
                every session resumes (its next turn: the whole conversation + a new tool
                output), against a cold engine (no tiers) given the same requests.
Metrics per configuration: p50 TTFT from the second turn on (submission to the step that
returns the request's first token), throughput (answer tokens / wall time of all turns), the
share of reusable prompt tokens served from cache (num_cached_prompt_tokens / the full blocks
an earlier turn of the session computed: its prompt + answer) and the share loaded from a tier
(blocks loaded x block size / the same), KVTiers.stats(). Greedy answers must be equal across
configurations (checked; the run fails after writing its lines if they differ).
Control "random prompts (no reuse)": as many requests of unrelated prompts, no tiers vs host
tier, alternated twice on the same two engines (fresh prompts each time), best of each.
Output: JSON lines to --out (result, ratio vs "no tiers", target lines of issue 23); a table.
A benchmark: it reports what it measures; the targets are reported, not asserted.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import math
import pathlib
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "peers"))

from bench_generate import git_state, machine_info  # noqa: E402
from cpu_contention import OtherCpu  # noqa: E402
from kv_tiers_lines import (  # noqa: E402
    BLOCK,
    COLD,
    DISK,
    HOST,
    NONE,
    RESTART,
    build_lines,
    print_table,  # noqa: E402
)
from kv_tiers_prediction import print_prediction  # noqa: E402  (the perf model's prediction)
from results_file import write_lines  # noqa: E402


@dataclass(frozen=True)
class Sizes:
    sessions: int = 6
    turns: int = 8
    system: int = 200
    tool: int = 100
    answer: int = 16
    random_prompt: int = 200  # control: prompt tokens of each unrelated request
    pool_share: float = 0.25


WARMUP = list(range(1000, 1040))  # unrelated token ids: every engine's first request
FULL = Sizes()
QUICK = Sizes(sessions=2, turns=3, system=48, tool=24, answer=4, random_prompt=48)


class Corpus:
    """Distinct token windows of data/ (never reused: every cut starts past the last one)."""

    def __init__(self, engine):
        self.tokens: list[int] = []
        for name in ("python_docs.txt", "shakespeare.txt"):
            self.tokens += engine.encode((ROOT / "data" / name).read_text())
        self.at = 0

    def take(self, length: int) -> list[int]:
        if self.at + length > len(self.tokens):
            raise SystemExit(f"data/ text too short for another {length}-token window")
        window = self.tokens[self.at : self.at + length]
        self.at += length + 7
        return window


def make_workload(corpus: Corpus, sizes: Sizes) -> dict:
    """The system prompt, every session's tool outputs (turns + 1: the last one resumes after
    the restart), the control's prompts (two sets) and the warm-up prompt."""
    return {
        "system": corpus.take(sizes.system),
        "tools": [
            [corpus.take(sizes.tool) for _ in range(sizes.turns + 1)] for _ in range(sizes.sessions)
        ],  # fmt: skip
        "random": [
            [corpus.take(sizes.random_prompt) for _ in range(sizes.sessions * sizes.turns)]
            for _ in range(4)
        ],  # fmt: skip
        "warmup": WARMUP,
    }


def working_set_blocks(sizes: Sizes) -> tuple[int, int]:
    """(blocks of every session's final context summed, blocks of the longest request)."""
    final = sizes.system + sizes.turns * sizes.tool + (sizes.turns - 1) * sizes.answer
    final_with_answer = final + sizes.answer
    resume = final_with_answer + sizes.tool + sizes.answer  # the request after the restart
    return sizes.sessions * math.ceil(final_with_answer / BLOCK), math.ceil(resume / BLOCK)


def build(sizes: Sizes, config: str, directory: pathlib.Path, warmup: list[int], block_bytes: int):
    """A fresh engine of `config` (`block_bytes`: a KV block's bytes, to size the host tier),
    warmed up with an unrelated prompt; and its options."""
    from infergen import LLM, SamplingParams

    working, longest = working_set_blocks(sizes)
    blocks = max(math.ceil(sizes.pool_share * working), longest + 1)
    options: dict = dict(num_kv_blocks=blocks, block_size=BLOCK, num_threads=2)
    if config not in (NONE, COLD):
        if config == HOST:
            options["kv_offload_memory"] = 2 * working * block_bytes
        else:  # host + disk, and its restart
            options["kv_offload_memory"] = math.ceil(sizes.pool_share * working) * block_bytes
            options["kv_offload_dir"] = str(directory)
            options["kv_offload_write_through"] = True
    llm = LLM(model=None, **options)
    params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
    llm.generate([warmup], params)
    return llm, {k: v for k, v in options.items() if k != "kv_offload_dir"}


def _greedy(sizes: Sizes):
    from infergen import SamplingParams

    return SamplingParams(max_tokens=sizes.answer, temperature=0, ignore_eos=True)


def run_batch(engine, prompts: list[list[int]], params) -> list[dict]:
    """Submit `prompts` together, step until done; per request its TTFT, answer and cache."""
    starts, ids = [], []
    for prompt in prompts:
        starts.append(time.perf_counter())
        ids.append(engine.add_request(prompt, params))
    first: dict[str, float] = {}
    while engine.has_unfinished():
        deltas = engine.step()
        now = time.perf_counter()
        for d in deltas:
            if d.token_ids and d.request_id not in first:
                first[d.request_id] = now
    out = []
    for rid, start, prompt in zip(ids, starts, prompts, strict=True):
        result = engine.output(rid)
        out.append({
            "ttft_s": first[rid] - start,
            "answer": list(result.token_ids),
            "prompt_tokens": len(prompt),
            "cached": result.num_cached_prompt_tokens,
        })  # fmt: skip
        engine.release(rid)
    return out


def run_conversations(engine, work: dict, sizes: Sizes) -> dict:
    """Every session's turns, interleaved; the conversations after the last turn (to resume)."""
    params = _greedy(sizes)
    conv = [work["system"] + tools[0] for tools in work["tools"]]
    computed = [0] * sizes.sessions  # tokens whose KV an earlier turn of the session computed
    turns: list[list[dict]] = []
    start = time.perf_counter()
    with OtherCpu() as other:
        for k in range(sizes.turns):
            results = run_batch(engine, conv, params)
            for s, r in enumerate(results):
                full = min(computed[s], len(conv[s]) - 1) // BLOCK * BLOCK
                r["reusable"] = full if k else 0
                computed[s] = len(conv[s]) + len(r["answer"]) - 1
                conv[s] = conv[s] + r["answer"] + work["tools"][s][k + 1]
            turns.append(results)
    seconds = time.perf_counter() - start
    tiers = engine.kv_tiers
    return {
        "turns": turns,
        "seconds": seconds,
        "other_cpu_cores": other.cores,
        "resume": conv,
        "stats": tiers.stats() if tiers is not None else None,
    }


def run_control(sizes: Sizes, work: dict, engines: dict) -> dict:
    """Unrelated prompts in groups of `sessions`: no tiers vs host (the conversations'
    engines: no prompt here shares a block with them), alternated twice."""
    params = _greedy(sizes)
    best: dict[str, dict] = {}
    for rep in range(2):
        for i, (config, llm) in enumerate(engines.items()):
            prompts = work["random"][2 * rep + i]
            start = time.perf_counter()
            with OtherCpu() as other:
                answers = 0
                for g in range(0, len(prompts), sizes.sessions):
                    group = run_batch(llm.engine, prompts[g : g + sizes.sessions], params)
                    answers += sum(len(r["answer"]) for r in group)
            rate = answers / (time.perf_counter() - start)
            if rate > best.get(config, {}).get("value", 0):
                best[config] = {"value": rate, "other_cpu_cores": other.cores}
    stats = engines[HOST].engine.kv_tiers.stats()
    return {"throughput": best, "host_stats": stats}


def run_round(sizes: Sizes, work: dict, block_bytes: int, first=None) -> dict:
    """Every configuration once, in order, each on a fresh engine (and a fresh directory);
    `first`: an engine without tiers to use (fresh, warmed up) instead of building one."""
    found: dict = {}
    kept: dict = {}  # no tiers and host: the control's engines afterwards
    with tempfile.TemporaryDirectory(prefix="bench_kv_tiers_") as tmp:
        directory = pathlib.Path(tmp) / "kv"
        for config in (NONE, HOST, DISK):
            started = time.perf_counter()
            if config == NONE and first is not None:
                llm, options = first
            else:
                llm, options = build(sizes, config, directory, work["warmup"], block_bytes)
            found[config] = run_conversations(llm.engine, work, sizes)
            found[config]["options"] = options
            print(f"[{config}] {time.perf_counter() - started:.0f} s", flush=True)
            if config in (NONE, HOST):
                kept[config] = llm
            del llm
            gc.collect()
        resume = found[DISK]["resume"]
        for config in (RESTART, COLD):
            llm, options = build(sizes, config, directory, work["warmup"], block_bytes)
            with OtherCpu() as other:
                results = run_batch(llm.engine, resume, _greedy(sizes))
            tiers = llm.engine.kv_tiers
            found[config] = {
                "results": results,
                "other_cpu_cores": other.cores,
                "stats": tiers.stats() if tiers is not None else None,
                "options": options,
            }
            print(f"[{config}] first turn after the restart done", flush=True)
            del llm
            gc.collect()
        found["control"] = run_control(sizes, work, kept)
        print("[control] done", flush=True)
        shutil.rmtree(directory, ignore_errors=True)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help=f"smoke run: {asdict(QUICK)}")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of every configuration, "
                        "in turn; each metric the best round's (default 1)")  # fmt: skip
    parser.add_argument(
        "--out",
        type=pathlib.Path,
        default=ROOT / "benchmarks" / "results" / "kv_tiers.jsonl",
        help="JSON-lines output, overwritten (default: %(default)s)",
    )
    args = parser.parse_args()
    sizes = QUICK if args.quick else FULL
    git = git_state()
    from infergen.io.default_model import default_model_path

    first = build(sizes, NONE, pathlib.Path(), WARMUP, 0)  # no tiers: its tokenizer, its block
    work = make_workload(Corpus(first[0].engine), sizes)
    block_bytes = first[0].engine.kv_cache.block_bytes
    rounds = []
    for r in range(1, args.rounds + 1):
        print(f"== round {r} of {args.rounds}", flush=True)
        rounds.append(run_round(sizes, work, block_bytes, first if r == 1 else None))
        first = None
        gc.collect()
    working, longest = working_set_blocks(sizes)
    base = {
        "bench": "kv_tiers",
        "quick": args.quick,
        "model": default_model_path().name,
        "dtype": "fp32",
        "sizes": asdict(sizes),
        "working_set_blocks": working,
        "block_bytes": block_bytes,
        "git": git,
        "machine": machine_info(2),
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    lines, mismatches = build_lines(rounds, base)
    write_lines(args.out, lines)
    print_table(lines)
    print_prediction(lines, sizes)  # predicted vs measured gains (kv_tiers_prediction.py)
    if mismatches:
        raise SystemExit(f"greedy answers differ across configurations: {mismatches}")


if __name__ == "__main__":
    main()
