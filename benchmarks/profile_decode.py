"""Where a decode step's time goes: the fused decode layers' phases (norms, projections,
RoPE + KV store, attention, activation) and the rest of the step (embedding, final norm, LM
head, sampling, scheduling), at batch 1 and with N concurrent sequences, on the default model.

Each batch size: N distinct random-token prompts of --prompt tokens, --new greedy tokens each;
only decode-only steps are counted. Prints a table (ms per step and share) and writes JSON lines
to --out. A profile, not a comparison: no peer, no target.

    .venv/bin/python benchmarks/profile_decode.py [--batch 1 16] [--prompt 128] [--new 128]
"""

from __future__ import annotations

import argparse
import datetime
import pathlib
import random
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_generate import git_state, machine_info  # noqa: E402
from results_file import write_lines  # noqa: E402

from infergen import LLM, SamplingParams  # noqa: E402
from infergen.models.fused_decode import PhaseProfile  # noqa: E402
from infergen.models.transformer import Transformer  # noqa: E402


def profile(llm: LLM, batch: int, prompt: int, new: int, seed: int) -> dict:
    rng = random.Random(seed)
    prompts = [[rng.randrange(100, 40000) for _ in range(prompt)] for _ in range(batch)]
    params = SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True)
    decode = {"steps": 0, "seconds": 0.0}
    every = {"steps": 0, "seconds": 0.0}  # prefill steps included
    original = Transformer.forward

    def timed(self, fb, kv):
        start = time.perf_counter()
        logits = original(self, fb, kv)
        every["steps"] += 1
        every["seconds"] += time.perf_counter() - start
        if fb.attn_plan.decode_only:
            decode["steps"] += 1
            decode["seconds"] += time.perf_counter() - start
        return logits

    Transformer.forward = timed
    try:
        start = time.perf_counter()
        with PhaseProfile() as prof:
            llm.generate(prompts, params)
        wall = time.perf_counter() - start
    finally:
        Transformer.forward = original
    steps = max(decode["steps"], 1)
    phases = {k: v / steps * 1e3 for k, v in prof.seconds.items()}
    forward_ms = decode["seconds"] / steps * 1e3
    # (the driver's phases include the final norm, the LM head and a greedy argmax where it
    # runs them: decode steps whose rows are all sampled)
    phases["outside the driver (embedding, Python)"] = forward_ms - sum(phases.values())
    return {
        "decode_steps": decode["steps"],
        "forward_ms": forward_ms,
        "wall_s": wall,
        # the engine's time per step outside the model (scheduling, sampling, detokenizing)
        "host_ms_per_step": (wall - every["seconds"]) / max(every["steps"], 1) * 1e3,
        "phases_ms": phases,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--out", type=pathlib.Path, default=ROOT / "benchmarks/results/decode_profile.jsonl"
    )
    args = parser.parse_args()
    llm = LLM(  # as benchmarks/bench_generate.py configures it
        model=None,
        num_threads=args.threads,
        kv_cache_memory="1GiB",
        max_num_seqs=64,
        max_num_batched_tokens=512,
        enable_prefix_caching=False,
    )
    llm.generate([[5, 6, 7]], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    base = {
        "bench": "decode_profile",
        "git": git_state(),
        "machine": machine_info(args.threads),
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    lines = []
    for i, batch in enumerate(args.batch):
        result = profile(llm, batch, args.prompt, args.new, seed=i)
        lines.append(
            {
                **base,
                "kind": "profile",
                "params": {"batch": batch, "prompt": args.prompt, "new": args.new},
                **result,
            }
        )
        forward = result["forward_ms"]
        print(
            f"\nbatch {batch}: {result['decode_steps']} decode steps, {forward:.1f} ms each "
            f"({batch / forward * 1e3:.0f} tok/s in decode)"
        )
        for name, ms in sorted(result["phases_ms"].items(), key=lambda kv: -kv[1]):
            print(f"  {name:<44} {ms:7.2f} ms  {100 * ms / forward:5.1f}%")
    write_lines(args.out, lines)


if __name__ == "__main__":
    main()
