"""Validate the performance model against our engine on this machine: predict, then measure,
the same engine steps (the first part of issue 5's validation; the serving workloads follow
with the simulator).

The model's hardware row is `cpu-local`, calibrated in this run (`infergen perf calibrate`'s
measurement: GEMM FLOP/s, read bandwidth, launch cost); the model is the default model in
fp32. Measured with the engine in process (2 threads):
  decode_step_ms_bN   mean forward time of a decode-only step with N sequences (prompt 128,
                      128 new tokens each; contexts 129..256), = the inter-token latency
                      without sampling and scheduling
  prefill_ms_512      one 512-token prompt, max_tokens 1 (one step under the default budget)
Predicted: `step_ops` + `roofline` for the same chunks (decode: averaged over the contexts
the measured steps had). Error = predicted / measured - 1; the issue's bar for ITL and
throughput is |error| <= 15 %. JSON lines to --out.
"""

from __future__ import annotations

import argparse
import datetime
import pathlib
import random
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_generate import git_state, machine_info  # noqa: E402
from profile_decode import profile  # noqa: E402
from results_file import write_lines  # noqa: E402

from infergen import LLM, SamplingParams  # noqa: E402
from infergen.perf import roofline  # noqa: E402
from infergen.perf.calibrate import measure  # noqa: E402
from infergen.perf.model_desc import from_model_config  # noqa: E402
from infergen.perf.step_cost import Chunk, Formats  # noqa: E402

FP32 = Formats(weight_bits=32, kv_bits=32, act_bytes=4)


def predict_ms(desc, hw, chunks: list[Chunk]) -> float:
    return roofline.step_seconds(roofline.predict_step(desc, hw, chunks, FP32, "fp32")) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 16])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--out", type=pathlib.Path, default=ROOT / "benchmarks/results/perf_model.jsonl"
    )
    args = parser.parse_args()
    hw = measure(args.threads)
    print(
        f"cpu-local: {hw.flops['fp32'] / 1e9:.1f} GFLOP/s, {hw.bandwidth / 1e9:.1f} GB/s, "
        f"launch {hw.launch_overhead_s * 1e6:.1f} us",
        flush=True,
    )
    llm = LLM(num_threads=args.threads, enable_prefix_caching=False)
    desc = from_model_config(llm.config)
    base = {
        "bench": "perf_model",
        "git": git_state(),
        "machine": machine_info(args.threads),
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "hardware": {"flops": hw.flops, "bandwidth": hw.bandwidth, "launch": hw.launch_overhead_s},
    }
    rows = []
    profile(llm, 2, 32, 8, seed=99)  # warm-up
    for batch in args.batch:
        measured = min(profile(llm, batch, 128, 128, seed=s)["forward_ms"] for s in range(2))
        contexts = range(129, 256)
        predicted = statistics.mean(predict_ms(desc, hw, [Chunk(1, c)] * batch) for c in contexts)
        rows.append((f"decode_step_ms_b{batch}", predicted, measured))
    rng = random.Random(0)
    prompt = [rng.randrange(100, 40000) for _ in range(512)]
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    llm.generate([prompt], params)
    times = []
    for _ in range(3):
        start = time.perf_counter()
        llm.generate([prompt], params)
        times.append((time.perf_counter() - start) * 1e3)
    rows.append(("prefill_ms_512", predict_ms(desc, hw, [Chunk(512, 512)]), min(times)))
    lines = []
    print(f"{'metric':<20} {'predicted':>10} {'measured':>10} {'error':>8}")
    for metric, predicted, measured in rows:
        error = predicted / measured - 1
        print(f"{metric:<20} {predicted:10.2f} {measured:10.2f} {100 * error:7.1f}%")
        lines.append(
            {
                **base,
                "kind": "validation",
                "metric": metric,
                "predicted": predicted,
                "measured": measured,
                "error": error,
                "target": 0.15,
                "met": abs(error) <= 0.15,
            }
        )
    write_lines(args.out, lines)


if __name__ == "__main__":
    main()
