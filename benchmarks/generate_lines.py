"""JSON lines of bench_generate.py: per-engine results, infergen/peer ratios, greedy
agreement between engines, and the issue's targets; plus the table printed to stdout.

Engine outputs follow benchmarks/peers/protocol.py: {"results": [one per task]} with "runs".
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bench_generate import Sizes

AGREE_TOKENS = 16  # leading greedy tokens compared between engines (same-model sanity check)
# (name, (metric, engine) numerator, (metric, engine) denominator, threshold), from the issue.
TARGETS = [
    (
        "decode_bs1 >= 2x transformers",
        ("decode_tok_s_bs1", "infergen"),
        ("decode_tok_s_bs1", "transformers"),
        2.0,
    ),
    (
        "decode_bs1 >= 0.9x llama.cpp",
        ("decode_tok_s_bs1", "infergen"),
        ("decode_tok_s_bs1", "llama.cpp"),
        0.9,
    ),
    (  # issue 27 (compiler depth): at equal precision
        "decode_bs1 >= 1.2x llama.cpp",
        ("decode_tok_s_bs1", "infergen"),
        ("decode_tok_s_bs1", "llama.cpp"),
        1.2,
    ),
    (
        "prefill_{p} >= 1.0x llama.cpp F32",
        ("prefill_tok_s", "infergen"),
        ("prefill_tok_s", "llama.cpp"),
        1.0,
    ),
    (
        "throughput_c{c0} >= 5x own decode_bs1",
        ("throughput_tok_s_c{c0}", "infergen"),
        ("decode_tok_s_bs1", "infergen"),
        5.0,
    ),
]
NOTES = {
    "transformers": "torch.set_num_threads(threads) and torch.set_flush_denormal(True) for "
    "fairness; concurrency = one left-padded generate() batch",
    "llama.cpp": "F32 GGUF written from the same Q4_1 file, F32 KV cache; concurrency via the "
    "low-level llama_batch API (one seq_id per request: prefill in 512-token batches, then "
    "lockstep decode of all sequences); greedy argmax on the host",
}


def _metric(runs: list[dict], values: list[float], unit: str, params: dict) -> dict:
    """Best of the runs (highest tok/s, lowest seconds), with the contention it ran under."""
    best = (min if unit == "s" else max)(range(len(values)), key=values.__getitem__)
    others = [r.get("other_cpu_cores") for r in runs]
    return {
        "value": values[best],
        "unit": unit,
        "stat": f"best of {len(values)}",
        "runs": values,
        "params": params,
        "other_cpu_cores": others[best],
        "other_cpu_cores_runs": others,
        "attempts": sum(r.get("attempts", 1) for r in runs),
    }


def summarize(out: dict, tasks: list[dict], sizes: Sizes) -> dict[str, dict]:
    """metric -> {"value", "unit", "stat", "runs", "params", "other_cpu_cores", ...}."""
    metrics: dict[str, dict] = {}
    pairs = list(zip(tasks, out["results"], strict=True))
    decodes = [run for t, r in pairs if t["kind"] == "decode" for run in r["runs"]]
    if decodes:
        params = {"prompt_tokens": sizes.decode_prompt, "new_tokens": sizes.decode_new}
        rates = [(len(d["tokens"]) - 1) / d["decode_s"] for d in decodes]
        metrics["decode_tok_s_bs1"] = _metric(decodes, rates, "tok/s", params)
        ttfts = [d["ttft_s"] for d in decodes]
        metrics["ttft_s_bs1"] = _metric(decodes, ttfts, "s", params)
    for task, result in pairs:
        runs = result["runs"]
        if task["kind"] == "prefill":
            rates = [r["tokens"] / r["seconds"] for r in runs]
            params = {"prompt_tokens": sizes.prefill_prompt, "max_tokens": 1}
            metrics["prefill_tok_s"] = _metric(runs, rates, "tok/s", params)
        elif task["kind"] == "concurrent":
            c = len(task["prompts"])
            rates = [r["output_tokens"] / r["seconds"] for r in runs]
            params = {
                "requests": c,
                "prompt_tokens": sizes.conc_prompt,
                "new_tokens": sizes.conc_new,
                "wall_s": [r["seconds"] for r in runs],
            }
            metrics[f"throughput_tok_s_c{c}"] = _metric(runs, rates, "tok/s", params)
            if all("decode_phase_s" in r for r in runs):
                rates = [r["decode_phase_tokens"] / r["decode_phase_s"] for r in runs]
                params = {**params, "phase": "after every request's first token"}
                metrics[f"decode_tok_s_c{c}"] = _metric(runs, rates, "tok/s", params)
    return metrics


def paired(ours: dict, theirs: dict) -> dict:
    """The ratio run by run, where the two engines' runs pair up (bench_generate runs the
    engines in turns task by task: run i of each is the same prompt in the same minutes):
    {"paired_median": the median of the runs' ratios, "paired_runs": them}; {} otherwise.
    The machine's speed drifts by up to 2x over minutes (memory bandwidth most), so a best
    run of each engine can come from different minutes; the median of pairs compares each
    engine with the other in the same minutes."""
    a, b = ours["runs"], theirs["runs"]
    if len(a) != len(b) or not a:
        return {}
    ratios = [y / x if ours["unit"] == "s" else x / y for x, y in zip(a, b, strict=True)]
    return {"paired_median": statistics.median(ratios), "paired_runs": ratios}


def agreement(ours: dict, theirs: dict, tasks: list[dict]) -> dict:
    """Common greedy prefix (up to AGREE_TOKENS) of two engines on the same prompts."""
    prefixes = []
    for task, a, b in zip(tasks, ours["results"], theirs["results"], strict=True):
        if task["kind"] == "decode":
            pairs = [(a["runs"][0]["tokens"], b["runs"][0]["tokens"])]
        elif task["kind"] == "concurrent":
            pairs = list(zip(a["runs"][0]["outputs"], b["runs"][0]["outputs"], strict=True))
        else:
            continue
        for x, y in pairs:
            n = min(AGREE_TOKENS, len(x), len(y))
            prefixes.append(next((i for i in range(n) if x[i] != y[i]), n))
    full = sum(p == AGREE_TOKENS for p in prefixes)
    return {
        "value": full / max(1, len(prefixes)),
        "unit": f"fraction of prompts whose first {AGREE_TOKENS} greedy tokens agree",
        "detail": f"{full}/{len(prefixes)} prompts agree on the first {AGREE_TOKENS} tokens; "
        f"mean common prefix {sum(prefixes) / max(1, len(prefixes)):.1f}; min {min(prefixes)}",
    }


def build_lines(engines: dict[str, dict], tasks: list[dict], sizes: Sizes, base: dict):
    lines: list[dict] = []
    summaries: dict[str, dict] = {}
    for name, out in engines.items():
        if "error" in out or "skipped" in out:
            lines.append(
                {**base, "kind": "skip", "engine": name, "note": out.get("skipped") or out["error"]}
            )
            continue
        summaries[name] = summarize(out, tasks, sizes)
        for metric, m in summaries[name].items():
            note = {"note": NOTES[name]} if name in NOTES else {}
            lines.append({**base, "kind": "result", "metric": metric, "engine": name, **m, **note})
    ours = summaries.get("infergen", {})
    for peer, theirs in summaries.items():
        if peer == "infergen":
            continue
        for metric, m in theirs.items():
            if metric not in ours:
                continue
            seconds = m["unit"] == "s"
            a, b = ours[metric]["value"], m["value"]
            lines.append(
                {
                    **base,
                    "kind": "ratio",
                    "metric": metric,
                    "engine": "infergen",
                    "peer": peer,
                    "infergen_value": a,
                    "peer_value": b,
                    "value": b / a if seconds else a / b,
                    **paired(ours[metric], m),
                    "unit": "x",
                    "definition": "peer/infergen (seconds)" if seconds else "infergen/peer (tok/s)",
                    "other_cpu_cores": {
                        "infergen": ours[metric]["other_cpu_cores"],
                        peer: m["other_cpu_cores"],
                    },
                }
            )
        lines.append(
            {
                **base,
                "kind": "agreement",
                "metric": "greedy_agreement",
                "engine": "infergen",
                "peer": peer,
                **agreement(engines["infergen"], engines[peer], tasks),
            }
        )
    lines += roofline_lines(engines.get("infergen", {}), ours, base)
    for name, (m1, e1), (m2, e2), threshold in TARGETS:
        name = name.format(c0=sizes.concurrency[0], p=sizes.prefill_prompt)
        m1 = m1.format(c0=sizes.concurrency[0])
        a, b = summaries.get(e1, {}).get(m1), summaries.get(e2, {}).get(m2)
        line = {
            **base,
            "kind": "target",
            "metric": name,
            "engine": "infergen",
            "threshold": threshold,
            "numerator": f"{e1}:{m1}",
            "denominator": f"{e2}:{m2}",
        }
        pair = paired(a, b) if a is not None and b is not None and e1 != e2 else {}
        if a is None or b is None:
            line.update(value=None, met=None, note="not measured in this run")
        elif pair:  # two engines in turns: the median of paired runs (see `paired`)
            value = pair["paired_median"]
            line.update(value=value, met=value >= threshold, best_of_ratio=a["value"] / b["value"])
            line["stat"] = f"median of {len(pair['paired_runs'])} paired runs"
        else:
            line.update(value=a["value"] / b["value"], met=a["value"] / b["value"] >= threshold)
            bound = engines.get(e1, {}).get("bounds", {}).get(_concurrency(m1))
            if bound is not None and m2 == "decode_tok_s_bs1":
                ceiling = bound["value"] / b["value"]
                line["ceiling"] = ceiling
                line["note"] = (
                    f"at this machine's fp32 GEMM peak ({bound['peak_flops']['peak'] / 1e9:.0f} "
                    f"GFLOP/s) no engine can exceed {ceiling:.2f}x on this workload"
                )
        lines.append(line)
    return lines


def _concurrency(metric: str) -> int | None:
    return int(metric.rsplit("_c", 1)[1]) if "_c" in metric else None


def roofline_lines(out: dict, ours: dict[str, dict], base: dict) -> list[dict]:
    """The compute bound of each concurrent workload and the fraction infergen reached."""
    lines = []
    for c, bound in sorted(out.get("bounds", {}).items(), key=lambda kv: int(kv[0])):
        metric = f"throughput_tok_s_c{c}"
        lines.append(
            {
                **base,
                "kind": "result",
                "metric": metric,
                "engine": "roofline",
                "stat": "bound",
                "other_cpu_cores": None,
                **bound,
                "note": "output tokens / (workload FLOPs / fp32 GEMM peak measured in the run)",
            }
        )
        if metric in ours:
            a = ours[metric]["value"]
            lines.append(
                {
                    **base,
                    "kind": "ratio",
                    "metric": metric,
                    "engine": "infergen",
                    "peer": "roofline",
                    "infergen_value": a,
                    "peer_value": bound["value"],
                    "value": a / bound["value"],
                    "unit": "x",
                    "definition": "infergen / compute bound (tok/s): the fraction reached",
                    "other_cpu_cores": {"infergen": ours[metric]["other_cpu_cores"]},
                }
            )
    return lines


def print_table(lines: list[dict]) -> None:
    print(f"\n{'metric':<22}{'engine':<14}{'value':>10}  {'unit':<6}{'other cpu':>10}  stat")
    for ln in lines:
        if ln["kind"] == "result":
            other = "?" if ln["other_cpu_cores"] is None else f"{ln['other_cpu_cores']:.2f}"
            print(
                f"{ln['metric']:<22}{ln['engine']:<14}{ln['value']:>10.3f}  {ln['unit']:<6}"
                f"{other:>10}  {ln['stat']}"
            )
        elif ln["kind"] == "skip":
            print(f"{'(skipped)':<22}{ln['engine']:<14}  {ln['note'][:200]}")
    print(f"\n{'ratio (>1: infergen faster)':<30}{'peer':<14}{'value':>8}")
    for ln in lines:
        if ln["kind"] == "ratio":
            pair = f"  (paired median {ln['paired_median']:.2f}x)" if "paired_median" in ln else ""
            print(f"{ln['metric']:<30}{ln['peer']:<14}{ln['value']:>7.2f}x{pair}")
        elif ln["kind"] == "agreement":
            print(f"{'greedy agreement':<30}{ln['peer']:<14}  {ln['detail']}")
    print("\ntargets (from the issue)")
    for ln in lines:
        if ln["kind"] == "target":
            value = "n/a" if ln["value"] is None else f"{ln['value']:.2f}x"
            print(f"  {ln['metric']:<40}{value:>8}  met={ln['met']}")
            if "ceiling" in ln:
                print(f"    {ln['note']}")
    print(
        "\nother cpu = cores used by other processes during the measurement; > ~0.2 means the "
        "numbers are contended (thread barriers stall) and should be re-run."
    )
