"""Quantized weights against our fp32 engine, in the same run: speed and accuracy.

Default model, 2 threads. For each configuration — fp32 (the checkpoint's values), every row
of infergen.quant.WEIGHT_SCHEMES, every KV cache format of infergen.kvcache.KV_FORMATS over
fp32 weights, and the weight + activation / calibrated / FP8-attention configurations of
infergen.quant.spec.MATRIX_SPECS (`--only NAME` restricts the list; fp32 always runs) — in
--rounds alternating rounds (this machine drifts by tens of percent over minutes; each metric
keeps its best round):
  decode_tok_s_bs1       128-token prompt -> 128 new tokens, best of 3 prompts (as
                         bench_generate.py)
  throughput_tok_s_c16   16 concurrent 128 -> 128 requests, prefill included
the same tasks on llama.cpp (benchmarks/setup_peers.sh) with the same weights in its own
formats: Q8_0 (written from the checkpoint by gguf.quants, the peer of int8 and q8_0) and the
shipped Q4_1 file (the peer of the 4-bit schemes); and once per scheme, teacher-forced on
--eval-tokens tokens of held-out text (data/): perplexity, KL(fp32 || scheme) in nats per
token and top-1 agreement with fp32; weight_bytes: the bytes the projections hold in memory
(prepared weights); kv_bytes_per_token and the tokens a 1 GiB KV pool holds.
Targets (issue 6): int8 weight-only decode >= 1.8x our fp32 decode at batch 1; every 4-bit
weight-only scheme (the shipped Q4_1 blocks run as loaded; q4_1 / q4_0 / int4 / int4_asym /
mxfp4 / nvfp4 quantized from them) >= 1.0x llama.cpp's Q4_1 decode at batch 1; an FP8 KV cache holds
>= 2x the tokens of fp32 in the same memory with KL < 0.01 nats per token.
JSON lines to --out; `benchmarks/report.py` renders the ratios and targets into README.
"""

from __future__ import annotations

import argparse
import datetime
import pathlib
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks" / "peers"))

from bench_generate import (  # noqa: E402
    LLAMA_PYTHON,
    PEERS_DIR,
    InfergenRunner,
    Sizes,
    git_state,
    llama_cpp_missing,
    machine_info,
    make_tasks,
    run_peer,
)
from generate_lines import summarize  # noqa: E402
from gguf_f32 import cached_f32_gguf  # noqa: E402
from protocol import run_tasks  # noqa: E402
from results_file import write_lines  # noqa: E402

from infergen.eval.quality import (  # noqa: E402
    default_tokens,
    divergence,
    perplexity,
    probe_errors,
    weight_bytes,
)
from infergen.io.default_model import default_model_path  # noqa: E402
from infergen.kvcache.kv_format import KV_FORMATS  # noqa: E402
from infergen.kvcache.sizing import bytes_per_token  # noqa: E402
from infergen.quant import WEIGHT_SCHEMES  # noqa: E402
from infergen.quant.spec import MATRIX_SPECS, parse_spec  # noqa: E402

SIZES = Sizes(concurrency=(16,))
TARGETS = {"int8": 1.8}  # decode_tok_s_bs1 over fp32's (issue 6)
FOUR_BIT = ("gguf", "q4_1", "q4_0", "int4", "int4_asym", "mxfp4", "nvfp4")
PEER_TARGETS = {name: ("llama.cpp Q4_1", 1.0) for name in FOUR_BIT}  # bs1 over the peer's
# llama.cpp on the same weights in its own formats: name -> (GGUF type, our schemes it faces).
# "Q4_1" is the default model's file as shipped (our "gguf" scheme runs those very blocks).
PEERS = {
    "llama.cpp Q8_0": ("Q8_0", ("int8", "q8_0")),
    "llama.cpp Q4_1": ("Q4_1", FOUR_BIT),
}


def evaluate(engine, tokens: list[int], reference: torch.Tensor | None) -> dict:
    """Perplexity of the text, and KL / top-1 agreement against the fp32 logits."""
    logits = engine.prompt_logits(tokens)
    out = {"perplexity": perplexity(logits, tokens), "logits": logits}
    if reference is not None:
        out.update(divergence(reference, logits))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--eval-tokens", type=int, default=1024)
    parser.add_argument(
        "--out", type=pathlib.Path, default=ROOT / "benchmarks" / "results" / "quant.jsonl"
    )
    parser.add_argument(
        "--only",
        action="append",
        default=None,
        metavar="NAME",
        help="run only these configurations (repeatable; fp32 always runs); written as bench "
        "'quant_only' to quant_only.jsonl unless --out says otherwise",
    )
    args = parser.parse_args()
    # (name, LLM options): fp32 first (the reference), every weight scheme, the KV formats over
    # fp32 weights, then the weight + activation / calibrated / FP8-attention configurations
    configs = [("fp32", {})]
    configs += [(name, {"weights": name}) for name in WEIGHT_SCHEMES.names()]
    configs += [(f"kv {kv}", {"kv_format": kv}) for kv in KV_FORMATS.names()]
    for spec in MATRIX_SPECS:
        configs.append(
            (spec, {k: v for k, v in parse_spec(spec).items() if v not in (None, "max")})
        )
    bench = "quant"
    if args.only:  # a partial run: its own file and bench name (the full table stays whole)
        configs = [c for c in configs if c[0] == "fp32" or c[0] in args.only]
        bench = "quant_only"
        if args.out == ROOT / "benchmarks" / "results" / "quant.jsonl":
            args.out = args.out.with_name("quant_only.jsonl")
    runs: dict[str, list] = {}
    accuracy: dict[str, dict] = {}
    skipped: dict[str, str] = {}
    versions: dict[str, str] = {}
    tasks = None
    for round_ in range(1, args.rounds + 1):
        for name, options in configs:
            started = time.perf_counter()
            runner = InfergenRunner(args.threads, **options)
            warmup, tasks = make_tasks(runner.llm.tokenizer, SIZES)
            tasks = [t for t in tasks if t["kind"] != "prefill"]
            run_tasks(runner, warmup)
            results = run_tasks(runner, tasks)
            if name in runs:
                for mine, new in zip(runs[name], results, strict=True):
                    mine["runs"] += new["runs"]
            else:
                runs[name] = results
            if name not in accuracy:
                tokens = default_tokens(runner.llm.tokenizer, args.eval_tokens)  # held out
                ref = accuracy.get("fp32", {}).get("logits")
                accuracy[name] = evaluate(runner.llm.engine, tokens, ref)
                engine = runner.llm.engine
                accuracy[name]["weight_bytes"] = weight_bytes(engine.runner.model)
                accuracy[name]["probe_error"] = probe_errors(engine.runner.model)
                cache = engine.config.cache  # KV bytes per token, tokens in the 1 GiB pool
                accuracy[name]["kv_bytes_per_token"] = round(
                    bytes_per_token(cache, engine.model_config, engine.kv_cache.dtype.itemsize), 1
                )
                accuracy[name]["kv_capacity_tokens"] = engine.kv_capacity_tokens
            print(f"round {round_}: {name} done in {time.perf_counter() - started:.0f} s")
            del runner
        for name, (qtype, _) in PEERS.items():
            if llama_cpp_missing():
                skipped[name] = f"{llama_cpp_missing()}; build it with benchmarks/setup_peers.sh"
                continue
            source = default_model_path()
            path = source if qtype == "Q4_1" else cached_f32_gguf(source, PEERS_DIR, qtype)
            out = run_peer(
                LLAMA_PYTHON,
                "llama_cpp_runner.py",
                name,
                path,
                args.threads,
                warmup,
                tasks,
                kv_type="f32",
            )
            if "error" in out:
                skipped[name] = out["error"][-300:]
                continue
            versions["llama-cpp-python"] = out.get("version", "?")
            if name in runs:
                for mine, new in zip(runs[name], out["results"], strict=True):
                    mine["runs"] += new["runs"]
            else:
                runs[name] = out["results"]
            print(f"round {round_}: {name} done")
    base = {
        "bench": bench,
        "quick": False,
        "model": "SmolLM2-135M-Instruct",
        "git": git_state(),
        "machine": machine_info(args.threads),
        "peer_versions": versions,
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    lines: list[dict] = []
    metrics = {name: summarize({"results": r}, tasks, SIZES) for name, r in runs.items()}
    for name, ms in metrics.items():
        for metric, m in ms.items():
            lines.append({**base, "kind": "result", "metric": metric, "engine": name, **m})
        if name in accuracy:
            acc = {k: v for k, v in accuracy[name].items() if k != "logits"}
            lines.append(
                {**base, "kind": "accuracy", "engine": name, "eval_tokens": args.eval_tokens, **acc}
            )
    for name, note in skipped.items():
        lines.append({**base, "kind": "skip", "engine": name, "note": note})
    for peer, (_, faced) in PEERS.items():
        for scheme in faced:
            if peer not in metrics or scheme not in metrics:
                continue
            for metric in ("decode_tok_s_bs1", "throughput_tok_s_c16"):
                a, b = metrics[scheme][metric]["value"], metrics[peer][metric]["value"]
                lines.append(
                    {
                        **base,
                        "kind": "ratio",
                        "metric": f"{metric} ({scheme} weights)",
                        "engine": scheme,
                        "peer": "llama.cpp",
                        "infergen_value": a,
                        "peer_value": b,
                        "value": a / b,
                        "unit": "x",
                        "definition": f"infergen {scheme} / {peer} (tok/s)",
                        "other_cpu_cores": {},
                    }
                )
            if PEER_TARGETS.get(scheme, (None,))[0] == peer:
                threshold = PEER_TARGETS[scheme][1]
                ratio = (
                    metrics[scheme]["decode_tok_s_bs1"]["value"]
                    / metrics[peer]["decode_tok_s_bs1"]["value"]
                )
                lines.append(
                    {
                        **base,
                        "kind": "target",
                        "metric": f"{scheme} weight-only decode_bs1 >= {threshold}x {peer}",
                        "engine": scheme,
                        "threshold": threshold,
                        "value": ratio,
                        "met": ratio >= threshold,
                    }
                )
    fp32 = metrics["fp32"]
    for name, ms in metrics.items():
        if name == "fp32" or name in PEERS:
            continue
        for metric in ("decode_tok_s_bs1", "throughput_tok_s_c16"):
            a, b = ms[metric]["value"], fp32[metric]["value"]
            lines.append(
                {
                    **base,
                    "kind": "ratio",
                    "metric": f"{metric} ({name} weights)",
                    "engine": name,
                    "peer": "infergen fp32",
                    "infergen_value": a,
                    "peer_value": b,
                    "value": a / b,
                    "unit": "x",
                    "definition": f"{name} / fp32 (tok/s)",
                    "other_cpu_cores": {},
                }
            )
        if name in TARGETS:
            ratio = ms["decode_tok_s_bs1"]["value"] / fp32["decode_tok_s_bs1"]["value"]
            lines.append(
                {
                    **base,
                    "kind": "target",
                    "metric": f"{name} weight-only decode_bs1 >= {TARGETS[name]}x our fp32",
                    "engine": name,
                    "threshold": TARGETS[name],
                    "value": ratio,
                    "met": ratio >= TARGETS[name],
                }
            )
    for name, options in configs:
        kv = options.get("kv_format")
        if kv != "fp8_e4m3" or name not in accuracy or len(options) > 1:  # the target
            continue
        acc, ref = accuracy[name], accuracy["fp32"]
        capacity = acc["kv_capacity_tokens"] / ref["kv_capacity_tokens"]
        lines.append(
            {
                **base,
                "kind": "target",
                "metric": f"{kv} KV cache: >= 2x the tokens of fp32 in the same memory, "
                "KL < 0.01 nats",
                "engine": name,
                "threshold": 2.0,
                "value": capacity,
                "kl_nats": acc["kl_nats"],
                "met": capacity >= 2.0 and acc["kl_nats"] < 0.01,
            }
        )
    write_lines(args.out, lines)
    head = ("config", "bs1 tok/s", "c16 tok/s", "ppl", "KL nats", "top-1", "weights MB", "KV B/tok")
    print("\n" + "".join(f"{h:>11}" for h in head))
    for name, ms in metrics.items():
        acc = accuracy.get(name, {})
        if not acc:  # a peer: speed only
            print(
                f"{name:>11}{ms['decode_tok_s_bs1']['value']:>11.1f}"
                f"{ms['throughput_tok_s_c16']['value']:>11.1f}"
            )
            continue
        row = (
            name,
            f"{ms['decode_tok_s_bs1']['value']:.1f}",
            f"{ms['throughput_tok_s_c16']['value']:.1f}",
            f"{acc['perplexity']:.3f}",
            f"{acc.get('kl_nats', 0.0):.5f}",
            f"{acc.get('top1_agreement', 1.0):.4f}",
            f"{acc['weight_bytes'] / 1e6:.1f}",
            f"{acc['kv_bytes_per_token']}",
        )
        print("".join(f"{c:>11}" for c in row))


if __name__ == "__main__":
    main()
