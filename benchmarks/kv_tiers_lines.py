"""JSON lines of bench_kv_tiers.py for one model row: per-configuration results, ratios against
the configuration without tiers (a cold engine for the restart) and against llama-server, where
TTFT went, the tiers' stats, the greedy-agreement check and issue 23's targets; plus the table
printed to stdout.

Result lines carry the engine ("infergen", or "llama-server" for the peer), the configuration in
`config` and both in the metric's name (`smollm2-135m: ttft_p50_s_turn2on [host + disk]`), so
report.py's main table finds each ratio's unit. Over rounds: the lowest TTFT, the highest
throughput; shares, breakdowns and tier stats from the last round (the same workload: they
barely move). The random-prompt control: the median of its alternations (spread and best
beside it); its ratio is the median of the rounds' ratios (each round runs both
configurations with their steps interleaved, so the host's speed, which switches for seconds
at a time on these VMs, weighs on both alike; the ratio of the medians beside it).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

NONE, HOST, DISK, RESTART, COLD = "no tiers", "host", "host + disk", "restart", "cold start"
PEER = "llama-server"

UNITS = {
    "ttft_p50_s_turn2on": "s",
    "throughput_tok_s": "tok/s",
    "cache_served_share": "fraction",
    "tier_loaded_share": "fraction",
    "pool_resident_share": "fraction",
    "ttft_p50_s_first_turn": "s",
    "throughput_tok_s_random": "tok/s",
    "restore_s_p50": "s",
}
DEFINITIONS = {
    "ttft_p50_s_turn2on": "median over every request from the second turn on: submission to the "
    "step returning its first token (closed loop of `concurrency` turns in flight)",
    "throughput_tok_s": "answer tokens of all turns / wall time of all turns",
    "cache_served_share": "turns 2+: prompt tokens served from the cache hierarchy (pool or a "
    "tier: not recomputed; num_cached_prompt_tokens, at most the reusable ones) / reusable "
    "prompt tokens (the full blocks of the session's previous prompt + answer)",
    "tier_loaded_share": "blocks loaded from a lower tier over the run (KVTiers.stats loaded: "
    "what a load runs for is not told per request) / blocks the reusable prefixes of every "
    "request need over the cache groups (a windowed group: its window; a first turn: the "
    "system prompt once a turn has finished)",
    "pool_resident_share": "turns 2+: reusable prompt tokens of the system prompt every session "
    "shares (full blocks) / reusable prompt tokens: the hottest prefix, kept in the pool, so "
    "1 - this bounds tier_loaded_share",
    "ttft_p50_s_first_turn": "median TTFT of every session's first request to a fresh engine "
    "(each resumes: the whole conversation + a new tool output), same closed loop",
    "throughput_tok_s_random": "unrelated prompts (no reuse) through the same closed loop: "
    "answer tokens / the loop's own seconds, its steps interleaved with the other "
    "configuration's; median of the rounds (runs, spread and best beside it)",
    "restore_s_p50": "median seconds of restoring a session's slot from its file (llama-server "
    "/slots action=restore), part of that session's first-turn TTFT",
}
# (name, config, metric, at least): the ratio lines of issue 23's targets
TARGETS = [
    ("host + disk: p50 TTFT from turn 2 >= 5x lower than no tiers", DISK,
     "ttft_p50_s_turn2on", 5.0),
    ("host + disk: throughput >= 1.5x no tiers", DISK, "throughput_tok_s", 1.5),
    ("random prompts (no reuse): host tier throughput within 3 % of no tiers (median of "
     "paired rounds)", HOST,
     "throughput_tok_s_random", 0.97),
    ("restart with the disk tier: first-turn TTFT >= 3x lower than a cold start", RESTART,
     "ttft_p50_s_first_turn", 3.0),
]  # fmt: skip
# The ">= 80 % of reusable prompt tokens served from a tier" is read as its anchor's
# hit rate (SGLang HiCache's 40 % -> 80 %, device pool hits included): tokens not recomputed.
# The share loaded from a lower tier is reported beside it with its ceiling: the system prompt
# every session shares is the hottest prefix and stays in the pool (`pool_resident_share`).
SHARE_TARGETS = [
    ("host + disk: >= 80 % of reusable prompt tokens served from the cache hierarchy, pool or "
     "tier (not recomputed; value: the share, not a ratio)", "cache_served_share"),
]  # fmt: skip
PHASES = ("schedule_s", "forward_s", "after_s", "outside_s")


def _later(run: dict) -> list[dict]:
    return [r for r in run["requests"] if r["turn"] >= 1]


def summarize(run: dict) -> dict:
    later = _later(run)
    reusable = sum(r["reusable"] for r in later)
    needed = sum(r["needed_blocks"] for r in run["requests"])
    answers = sum(len(r["answer"]) for r in run["requests"])
    return {
        "ttft_p50_s_turn2on": statistics.median(r["ttft_s"] for r in later),
        "throughput_tok_s": answers / run["seconds"],
        "cache_served_share": sum(min(r["cached"], r["reusable"]) for r in later) / reusable
        if reusable else None,
        "tier_loaded_share": run["stats"]["loaded"] / needed if needed and run["stats"] else None,
        "pool_resident_share": sum(r["shared"] for r in later) / reusable if reusable else None,
    }  # fmt: skip


def flops_ratio(peer: list[dict], config: list[dict], flops: Callable[[int, int], float]) -> float:
    """The p50 TTFT gain were TTFT ∝ the FLOPs of each request's prefill: the median request
    FLOPs of `peer` over those of `config` (computed tokens = prompt − cached). A hit's
    tokens attend to the whole cached prefix, so each costs more FLOPs than a cold prefill's
    average token: on the default workload this bound is below the computed-token ratio."""

    def median(requests: list[dict]) -> float:
        return statistics.median(
            flops(max(1, r["prompt_tokens"] - r["cached"]), r["prompt_tokens"]) for r in requests
        )

    return median(peer) / median(config)


def breakdown(requests: list[dict]) -> dict:
    """Mean seconds of each part of TTFT, the mean TTFT, prompt and computed tokens."""
    n = len(requests)
    out = {k: sum(r[k] for r in requests) / n for k in ("ttft_s", *PHASES, "steps")}
    out["prompt_tokens"] = sum(r["prompt_tokens"] for r in requests) / n
    out["computed_tokens"] = sum(r["prompt_tokens"] - r["cached"] for r in requests) / n
    return out


def _answers(run: dict) -> dict[tuple[int, int], list[int]]:
    return {(r["session"], r["turn"]): r["answer"] for r in run["requests"]}


def mismatches(rounds: list[dict]) -> list[str]:
    """Where greedy answers differ: against no tiers (conversations) and against the cold
    start (after the restart), in every round."""
    bad = []
    for n, found in enumerate(rounds, 1):
        for config, peer in ((HOST, NONE), (DISK, NONE), (RESTART, COLD)):
            ours, theirs = _answers(found[config]), _answers(found[peer])
            differ = sum(ours[k] != theirs.get(k) for k in ours)
            if differ or ours.keys() != theirs.keys():
                bad.append(f"round {n}: {config} vs {peer}: {differ} of {len(ours)} answers")
    return bad


def _collect(rounds: list[dict]) -> dict[str, dict[str, dict]]:
    """{config: {metric: {"value", "runs", "other_cpu_cores", ...}}} over rounds."""
    out: dict[str, dict[str, dict]] = {}

    def add(config: str, metric: str, value, other) -> None:
        m = out.setdefault(config, {}).setdefault(metric, {"runs": [], "others": []})
        m["runs"].append(value)
        m["others"].append(other)

    for found in rounds:
        for config in (NONE, HOST, DISK):
            for metric, value in summarize(found[config]).items():
                add(config, metric, value, found[config]["other_cpu_cores"])
        for config in (RESTART, COLD):
            ttft = statistics.median(r["ttft_s"] for r in found[config]["requests"])
            add(config, "ttft_p50_s_first_turn", ttft, found[config]["other_cpu_cores"])
    for metrics in out.values():
        for metric, m in metrics.items():
            if UNITS[metric] == "fraction" or None in m["runs"]:
                best = len(m["runs"]) - 1
            else:
                pick = min if UNITS[metric] == "s" else max
                best = pick(range(len(m["runs"])), key=m["runs"].__getitem__)
            m.update(value=m["runs"][best], other_cpu_cores=m.pop("others")[best],
                     stat=f"best of {len(m['runs'])}")  # fmt: skip
    control = {config: [] for config in (NONE, HOST)}
    for found in rounds:
        for config, runs in found["control"].items():
            control[config] += runs
    for config, runs in control.items():
        values = [r["value"] for r in runs]
        out[config]["throughput_tok_s_random"] = {
            "value": statistics.median(values), "runs": values, "best": max(values),
            "spread": (max(values) - min(values)) / statistics.median(values),
            "other_cpu_cores": max((r["other_cpu_cores"] or 0) for r in runs),
            "stat": f"median of {len(values)} (alternated)", "detail": runs,
        }  # fmt: skip
    return out


def _name(row: str, metric: str, config: str) -> str:
    return f"{row}: {metric} [{config}]"


def _ratio(base: dict, metric: str, config: str, peer: str, a: dict, b: dict, **extra) -> dict:
    seconds = UNITS[metric] == "s"
    return {
        **base, "kind": "ratio", "metric": _name(base["row"], metric, config),
        "engine": "infergen", "config": config, "peer": peer, "infergen_value": a["value"],
        "peer_value": b["value"], "value": b["value"] / a["value"] if seconds
        else a["value"] / b["value"], "unit": "x",
        "definition": f"{peer}/{config} (seconds)" if seconds else f"{config}/{peer} (tok/s)",
        "other_cpu_cores": {config: a["other_cpu_cores"], peer: b["other_cpu_cores"]}, **extra,
    }  # fmt: skip


def build_lines(
    rounds: list[dict],
    base: dict,
    llama: dict | None,
    predicted: dict | None,
    flops: Callable[[int, int], float] | None = None,
) -> tuple[list[dict], list[str]]:
    """The row's lines, and the greedy mismatches (empty: every configuration agreed);
    `llama`: the peer's run (kv_tiers_llama.py) or None; `predicted`: the perf model's
    predicted TTFT gain ({"value": gain, ...: how it was predicted}) or None; `flops`:
    (computed, prompt tokens) → a prefill's FLOPs, for each TTFT gain's FLOP bound."""
    found, last, row = _collect(rounds), rounds[-1], base["row"]
    lines: list[dict] = []
    for config, metrics in found.items():
        options = (last.get(config) or {}).get("options") or last[NONE]["options"]
        for metric, m in metrics.items():
            lines.append({
                **base, "kind": "result", "metric": _name(row, metric, config),
                "engine": "infergen", "config": config, "unit": UNITS[metric],
                "definition": DEFINITIONS[metric], "options": options,
                **{k: v for k, v in m.items() if k != "detail"},
            })  # fmt: skip
    for config in (NONE, HOST, DISK, RESTART, COLD):
        later = _later(last[config]) if config in (NONE, HOST, DISK) else last[config]["requests"]
        lines.append({**base, "kind": "breakdown", "metric": _name(row, "ttft_breakdown", config),
                      "engine": "infergen", "config": config, "preemptions":
                      last[config]["preemptions"], "engine_seconds":
                      last[config]["engine_seconds"], **breakdown(later)})  # fmt: skip
    for config, runs in last["control"].items():
        lines.append({**base, "kind": "control", "metric": _name(row, "control_runs", config),
                      "engine": "infergen", "config": config, "runs": runs})  # fmt: skip
    for config, metric in [(HOST, "ttft_p50_s_turn2on"), (HOST, "throughput_tok_s"),
                           (DISK, "ttft_p50_s_turn2on"), (DISK, "throughput_tok_s"),
                           (HOST, "throughput_tok_s_random"),
                           (RESTART, "ttft_p50_s_first_turn")]:  # fmt: skip
        peer = COLD if config == RESTART else NONE
        a, b = found[config][metric], found[peer][metric]
        extra = {}
        if metric == "ttft_p50_s_turn2on":  # what the gain would be were TTFT ∝ computed tokens
            computed = [breakdown(_later(last[c]))["computed_tokens"] for c in (peer, config)]
            extra = {"computed_tokens_ratio": computed[0] / computed[1] if computed[1] else None}
            if flops is not None:
                extra["flops_ratio"] = flops_ratio(_later(last[peer]), _later(last[config]),
                                                   flops)  # fmt: skip
        if metric == "throughput_tok_s_random":  # each round ran both, interleaved
            paired = [x / y for x, y in zip(a["runs"], b["runs"], strict=True)]
            extra = {"best_ratio": a["best"] / b["best"], "spread": {config: a["spread"],
                     peer: b["spread"]}, "ratio_of_medians": a["value"] / b["value"],
                     "paired_ratios": paired, "value": statistics.median(paired),
                     "definition": f"{config}/{peer} (tok/s): the median over rounds of the "
                     "ratio within a round, whose two runs' steps were interleaved"}  # fmt: skip
        lines.append(_ratio(base, metric, config, peer, a, b, **extra))
    lines += _peer_lines(base, found, llama)
    stats = {c: last[c]["stats"] for c in (HOST, DISK, RESTART)}
    stats["host (random prompts)"] = last["control_stats"]
    for config, s in stats.items():
        lines.append({**base, "kind": "tiers", "metric": _name(row, "kv_tiers_stats", config),
                      "config": config, "engine": "infergen", **s})  # fmt: skip
    bad = mismatches(rounds)
    lines.append({**base, "kind": "agreement", "metric": _name(row, "greedy_answers_equal", "all"),
                  "engine": "infergen", "equal": not bad, "mismatches": bad})  # fmt: skip
    ratios = {ln["metric"]: ln["value"] for ln in lines
              if ln["kind"] == "ratio" and ln["peer"] in (NONE, COLD)}  # fmt: skip
    for name, config, metric, least in TARGETS:
        value = ratios[_name(row, metric, config)]
        lines.append({**base, "kind": "target", "metric": f"{row}: {name}", "engine": "infergen",
                      "threshold": least, "value": value, "met": value >= least})  # fmt: skip
    for name, metric in SHARE_TARGETS:
        share = found[DISK][metric]["value"]
        lines.append({**base, "kind": "target", "engine": "infergen", "threshold": 0.8,
                      "value": share, "metric": f"{row}: {name}",
                      "met": share is not None and share >= 0.8})  # fmt: skip
    if predicted is not None:
        measured = ratios[_name(row, "ttft_p50_s_turn2on", DISK)]
        error = abs(predicted["value"] - measured) / measured
        how = {k: v for k, v in predicted.items() if k != "value"}
        lines.append({**base, "kind": "target", "engine": "infergen", "threshold": 0.25,
                      "metric": f"{row}: predicted vs measured TTFT gain (host + disk) within "
                      "25 % (value: the relative error)", "value": error, "met": error <= 0.25,
                      "at_most": True, "predicted": predicted["value"], "measured": measured,
                      "prediction": how})  # fmt: skip
    return lines, bad


def _peer_lines(base: dict, found: dict, llama: dict | None) -> list[dict]:
    """llama-server's results and infergen's ratios against them (or why it was skipped)."""
    row = base["row"]
    if llama is None:
        return []
    if "skipped" in llama:
        return [{**base, "kind": "skipped", "metric": _name(row, "peer", PEER), "engine": PEER,
                 "reason": llama["skipped"]}]  # fmt: skip
    peer_base = {**base, "peer_versions": {PEER: llama["version"]}}
    lines = []
    for metric, config, m in llama["results"]:
        lines.append({**peer_base, "kind": "result", "metric": _name(row, metric, config),
                      "engine": PEER, "config": config, "unit": UNITS[metric], **m,
                      "definition": DEFINITIONS[metric], "setup": llama["setup"]})  # fmt: skip
    peer = {(metric, config): m for metric, config, m in llama["results"]}
    for ours, theirs, metric in (
        (DISK, f"{PEER} (prompt cache)", "ttft_p50_s_turn2on"),
        (DISK, f"{PEER} (prompt cache)", "throughput_tok_s"),
        (RESTART, f"{PEER} (slot restore)", "ttft_p50_s_first_turn"),
    ):
        if (metric, theirs) in peer:
            a, b = found[ours][metric], peer[(metric, theirs)]
            # (the metric of infergen's result: report.py finds its unit; the peer column names
            # llama-server, `peer_config` its setup)
            lines.append(_ratio(peer_base, metric, ours, PEER, a, b, peer_config=theirs))
    return lines


def _seconds(m: dict) -> str:
    return (f"schedule {m['schedule_s']:.2f} forward {m['forward_s']:.2f} after "
            f"{m['after_s']:.2f} s over {m['steps']} steps")  # fmt: skip


def print_table(lines: list[dict]) -> None:
    results = {ln["metric"]: ln for ln in lines if ln["kind"] == "result"}
    if not results:
        return
    row = next(iter(results.values()))["row"]
    configs = list(dict.fromkeys(ln["config"] for ln in results.values()))
    metrics = list(dict.fromkeys(ln["metric"].split(": ", 1)[1].split(" [")[0]
                                 for ln in results.values()))  # fmt: skip
    print(f"\n== {row} ({next(iter(results.values()))['model']})")
    print(f"{'metric':<26}" + "".join(f"{c[:22]:>24}" for c in configs))
    for metric in metrics:
        cells = []
        for c in configs:
            ln = results.get(_name(row, metric, c))
            cells.append("–" if ln is None or ln["value"] is None else f"{ln['value']:.4g}")
        print(f"{metric:<26}" + "".join(f"{v:>24}" for v in cells))
    print()
    for ln in lines:
        if ln["kind"] == "ratio":
            tokens, flops = ln.get("computed_tokens_ratio"), ln.get("flops_ratio")
            bound = f"; computed prompt tokens {tokens:.2f}x fewer" if tokens else ""
            bound += f", prefill FLOPs {flops:.2f}x fewer (p50)" if flops else ""
            name = f"{ln['metric']} vs {ln['peer_config']}" if "peer_config" in ln else ln["metric"]
            print(f"{name:<60} {ln['value']:6.2f}x  ({ln['definition']}{bound})")
        elif ln["kind"] == "breakdown":
            parts = " ".join(f"{k[:-2]} {ln[k]:.3f}" for k in PHASES)
            print(
                f"TTFT [{ln['config']}]: mean {ln['ttft_s']:.3f} s = {parts} s; "
                f"{ln['steps']:.1f} steps, prompt {ln['prompt_tokens']:.0f} computed "
                f"{ln['computed_tokens']:.0f} tokens; "
                f"preemptions {ln['preemptions']}; all steps: {_seconds(ln['engine_seconds'])}"
            )
        elif ln["kind"] == "control":
            for run in ln["runs"]:
                print(f"control [{ln['config']}]: {run['value']:.4g} tok/s, write-back "
                      f"{run['saved_blocks']} blocks; {_seconds(run)}")  # fmt: skip
        elif ln["kind"] == "tiers":
            tiers = {n: {k: t[k] for k in ("hits", "misses", "puts")} for n, t in
                     ln["tiers"].items()}  # fmt: skip
            print(f"tiers [{ln['config']}]: loaded {ln['loaded']} saved {ln['saved']} "
                  f"states {ln['states_saved']}/{ln['states_loaded']} "
                  f"decisions {ln['decisions']} {tiers}")  # fmt: skip
        elif ln["kind"] == "agreement":
            print(f"greedy answers equal across configurations: {ln['equal']} {ln['mismatches']}")
        elif ln["kind"] == "skipped":
            print(f"skipped: {ln['metric']}: {ln['reason']}")
        elif ln["kind"] == "target":
            value = "–" if ln["value"] is None else f"{ln['value']:.2f}"
            met = "yes" if ln["met"] else "NO"
            bound = "<=" if ln.get("at_most") else ">="
            print(f"target: {ln['metric']}: {value} ({bound} {ln['threshold']}) met: {met}")
    for ln in lines:
        if ln["kind"] == "result" and "spread" in ln and ln["engine"] == "infergen":
            runs = ", ".join(f"{v:.4g}" for v in ln["runs"])
            print(f"control [{ln['config']}]: {runs} tok/s (spread {ln['spread']:.1%})")
