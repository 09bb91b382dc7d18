"""Tensor parallelism on this machine (issue 26): the default model on one process (2 threads)
against two ranks (gloo, 1 thread each) in the same run — decode tok/s at batch 1 and 8,
prefill of 1024 tokens, and rank 0's communication share of the decode phase (the time it
waited in all-reduces, the logits' gather and the step's broadcast). No speed target on 2
cores: the figures say what the split costs here.

And the performance model's communication term checked against it: the link measured in the
same run (perf/link.py, as `infergen perf calibrate` does: the engine's all-reduce over two
gloo processes, started together) prices each step's collectives (perf/step_cost.py: two
all-reduces a layer, the embedding's, the logits' gather, the inputs' broadcast); the engine's
steps are traced collective by collective on both ranks (`Workers.trace`), and a collective's
transfer is the shorter of the two ranks' waits (the rank that arrived last waited for the
transfer alone; the other also for it). Per step: predicted vs that measured transfer, and
rank 0's whole wait beside it. JSON lines to benchmarks/results/tp.jsonl.
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
from infergen.io.default_model import default_model_path  # noqa: E402
from infergen.io.model_config import read_model_config  # noqa: E402
from infergen.perf import link  # noqa: E402
from infergen.perf.hardware import Hardware  # noqa: E402
from infergen.perf.roofline import link_seconds  # noqa: E402
from infergen.perf.step_cost import Chunk, Formats, Parallel  # noqa: E402

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


FP32 = Formats(weight_bits=32, kv_bits=32, act_bytes=4)  # the CPU engine's widths


def _traced_steps(llm: LLM, prompts: list[list[int]], steps: int) -> list[dict]:
    """Run `prompts` (equal lengths, none cached) for `steps` engine steps — the prompts'
    prefill in the first (it fits the step's budget), then decodes in lockstep — each step's
    collectives traced on every rank: per step, its chunks, the measured transfer (sum over
    its collectives of the shorter wait) and rank 0's whole wait."""
    engine, workers = llm.engine, llm.engine.runner.workers
    params = SamplingParams(max_tokens=steps, temperature=0, ignore_eos=True)
    ids = [engine.add_request(p, params) for p in prompts]
    workers.trace(True)
    out, length = [], len(prompts[0])
    while engine.has_unfinished():
        engine.step()
        waits = workers.waits()
        new = length if not out else 1
        out.append({"chunks": [Chunk(new, length + len(out))] * len(prompts),
                    "transfer_s": sum(min(w) for w in zip(*waits, strict=True)),
                    "rank0_wait_s": sum(waits[0]), "collectives": len(waits[0])})  # fmt: skip
    workers.trace(False)
    assert len(out) == steps and not any(engine.output(i).num_cached_prompt_tokens for i in ids)
    for i in ids:
        engine.release(i)
    return out


PREFILLS = 5  # prefill steps measured per case (one step each: the median of them)


def _prompts(batch: int, prompt_len: int, seed: int) -> list[list[int]]:
    """`batch` distinct prompts no other case of the run uses (nothing cached)."""
    return [[(11 * i + 3 * j + 7 * batch + 13 * seed + prompt_len) % 30000 + 100
             for j in range(prompt_len)] for i in range(batch)]  # fmt: skip


def _comm_check(llm: LLM, wire: link.Link, batch: int, prompt_len: int, steps: int) -> dict:
    """Predicted vs measured communication per step at `batch`: the median over the decode
    steps of one run of `steps` steps, and over PREFILLS prefill steps of fresh prompts."""
    desc = read_model_config(default_model_path()).describe()
    hw = Hardware("cpu-local", "the link measured in this run", 1.0, 1.0, {"fp32": 1.0},
                  interconnect=wire.bandwidth, link_latency_s=wire.latency_s,
                  link_curve=wire.curve())  # fmt: skip
    traced = _traced_steps(llm, _prompts(batch, prompt_len, 0), steps)
    for seed in range(1, PREFILLS):
        traced += _traced_steps(llm, _prompts(batch, prompt_len, seed), 1)
    rows = []
    for step in traced:
        predicted = link_seconds(desc, hw, step["chunks"], FP32, Parallel(tp=2))
        rows.append((step, predicted))
    decode = [(s, p) for s, p in rows if all(c.new == 1 for c in s["chunks"])]
    prefill = [(s, p) for s, p in rows if any(c.new > 1 for c in s["chunks"])]

    def summary(pairs):
        if not pairs:
            return None
        mid = sorted(pairs, key=lambda sp: sp[0]["transfer_s"])[len(pairs) // 2]
        step, predicted = mid
        return {"tokens": sum(c.new for c in step["chunks"]),
                "steps": len(pairs), "collectives": step["collectives"],
                "predicted_ms": round(predicted * 1e3, 3),
                "measured_transfer_ms": round(step["transfer_s"] * 1e3, 3),
                "rank0_wait_ms": round(step["rank0_wait_s"] * 1e3, 3),
                "predicted_vs_measured": round(predicted / step["transfer_s"], 3)}  # fmt: skip

    return {
        "decode_step": summary(decode),
        "prefill_step": summary(prefill),
        "link": {
            "latency_us": round(wire.latency_s * 1e6, 1),
            "interconnect_gb_s": round(wire.bandwidth / 1e9, 3),
            "measured_us": {b: round(t * 1e6, 1) for b, t in wire.measured.items()},
        },
    }
    # fmt: skip


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
    wire = link.measure(ranks=2)
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
            if tp > 1:  # the performance model's communication term against the engine's
                for batch in (int(b) for b in args.batches.split(",")):
                    check = _comm_check(llm, wire, batch, args.prompt, args.new)
                    lines.append({**base, "kind": "comm", "tp": tp, "batch": batch,
                                  "prompt": args.prompt, **check})  # fmt: skip
                    print({k: v for k, v in lines[-1].items() if k not in ("machine", "model")},
                          flush=True)  # fmt: skip
                check = _comm_check(llm, wire, 1, args.prefill, 8)
                lines.append({**base, "kind": "comm", "tp": tp, "batch": 1,
                              "prompt": args.prefill, **check})  # fmt: skip
                print({k: v for k, v in lines[-1].items() if k not in ("machine", "model")},
                      flush=True)  # fmt: skip
    write_lines(args.out, lines)


if __name__ == "__main__":
    main()
