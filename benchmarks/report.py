"""Render benchmarks/results/*.jsonl as a markdown table into README.md.

Rewrites the part of README.md between `<!-- results:start -->` and `<!-- results:end -->`.
One row per ratio line (infergen against a peer, measured in the same run), then one row per
target line. Without the markers (or without a README) the table is printed and nothing is
written.

Usage: python benchmarks/report.py [--results DIR] [--readme PATH] [--print]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from infergen.perf.hardware import FITTED_ROWS  # noqa: E402

START, END = "<!-- results:start -->", "<!-- results:end -->"
CONTENDED = 0.25  # cores used by other processes during a measurement (see peers/cpu_contention)


def load_lines(results_dir: pathlib.Path) -> list[dict]:
    lines = []
    for path in sorted(results_dir.glob("*.jsonl")):
        for number, raw in enumerate(path.read_text().splitlines(), 1):
            if not raw.strip():
                continue
            try:
                lines.append(json.loads(raw))
            except json.JSONDecodeError as exc:
                sys.exit(f"{path}:{number}: not a JSON line ({exc.msg})")
    return lines


def _num(value: float | None, unit: str = "") -> str:
    if value is None:
        return "–"
    text = f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return f"{text} {unit}".strip()


def _machine(line: dict) -> str:
    m = line.get("machine") or {}
    if m.get("gpu"):
        gpu = f"{m['gpu']} ({m.get('sms', '?')} SMs)"
        return f"{gpu}, torch {m.get('torch')}, triton {m.get('triton')}"
    cpu = f"{m.get('cpu', '?')} ({m['isa']})" if m.get("isa") else m.get("cpu", "?")
    parts = [cpu, f"{m.get('cores', '?')} cores", f"{m.get('threads', '?')} thr"]
    if m.get("torch"):
        parts.append(f"torch {m['torch']}")
    return ", ".join(parts)


def _peer_version(line: dict) -> str:
    if line.get("peer_version"):  # the line's own (a peer measured with its version)
        return line["peer_version"]
    versions = line.get("peer_versions") or {}
    key = {"llama.cpp": "llama-cpp-python", "eager torch": "torch", "torch.compile": "torch"}.get(
        line.get("peer", ""), line.get("peer", "")
    )
    value = versions.get(key)
    return f"{key} {value}" if value else "–"


def render(lines: list[dict]) -> str:
    units = {
        (ln["bench"], ln["metric"], ln["engine"]): ln["unit"]
        for ln in lines
        if ln.get("kind") == "result"
    }
    rows = [
        "| metric | infergen | peer | peer value | ratio | machine | peer version |",
        "|---|---|---|---|---|---|---|",
    ]
    for ln in lines:
        if ln.get("kind") != "ratio":
            continue
        unit = units.get((ln["bench"], ln["metric"], "infergen"), "")
        quick = " (quick)" if ln.get("quick") else ""
        others = (ln.get("other_cpu_cores") or {}).values()
        noisy = " ⚠" if any(c is not None and c > CONTENDED for c in others) else ""
        config = f" {ln['config']}" if ln["bench"] == "spec" else ""  # (which proposer)
        # (engines run in turns: the median of the run-by-run ratios beside the best-of ratio)
        paired = f" (paired {_num(ln['paired_median'])}×)" if "paired_median" in ln else ""
        if ln.get("compile", "off") != "off":  # (bench_generate --compile)
            config += f" (compile={ln['compile']})"
        rows.append(
            f"| {ln['bench']}: {ln['metric']}{config}{quick} | {_num(ln['infergen_value'], unit)} "
            f"| {ln['peer']} | {_num(ln['peer_value'], unit)} "
            f"| {_num(ln['value'])}×{noisy}{paired} "
            f"| {_machine(ln)} | {_peer_version(ln)} |"
        )
    targets = [ln for ln in lines if ln.get("kind") == "target"]
    if targets:
        rows += [
            "",
            "| target | measured | most any engine could reach here (roofline) | met |",
            "|---|---|---|---|",
        ]
        for ln in targets:
            met = {True: "yes", False: "**no**", None: "not measured"}[ln.get("met")]
            value = "–" if ln.get("value") is None else f"{ln['value']:.2f}×"
            if ln.get("stat"):  # (how the value was taken: e.g. a median of paired runs)
                value += f" ({ln['stat']})"
            ceiling = f"{ln['ceiling']:.2f}×" if ln.get("ceiling") else "–"
            mode = f" (compile={ln['compile']})" if ln.get("compile", "off") != "off" else ""
            rows.append(f"| {ln['bench']}{mode}: {ln['metric']} | {value} | {ceiling} | {met} |")
    checks = [ln for ln in lines if ln.get("kind") == "crosscheck"]
    if checks:
        rows += [
            "",
            "| cross-check (same server, two load generators) | infergen bench serve "
            "| other | other/ours | agree |",
            "|---|---|---|---|---|",
        ]
        for ln in checks:
            tol = f"±{ln['tolerance']:.0%}"
            agree = "yes" if ln["agree"] else "**no**"
            rows.append(
                f"| {ln['bench']}: {ln['metric']} | {_num(ln['ours'])} "
                f"| {ln['peer']} {_peer_version(ln).split()[-1]}: {_num(ln['peer_value'])} "
                f"| {_num(ln['value'])} | {agree} ({tol}) |"
            )
    checks = [ln for ln in lines if ln.get("kind") == "validation"]
    if checks:
        rows += [
            "",
            "| performance model: predicted vs measured (steps, serving: this machine; "
            "published: REFERENCES §5; error: the median pass's, every pass's beside it) "
            "| predicted | measured / published | error | passes | met | efficiencies |",
            "|---|---|---|---|---|---|---|",
        ]
        for ln in checks:
            met = {True: "yes", False: "**no**", None: "(diagnostic)"}[ln["met"]]
            target = f" (±{ln['target']:.0%})" if ln.get("target") else ""
            if _fitted(ln):
                met, target = "fitted (not a prediction)", ""
            errors = ln.get("run_errors", [])
            passes = " / ".join(f"{100 * e:+.0f}" for e in errors) if len(errors) > 1 else ""
            rows.append(
                f"| {ln.get('part', 'steps')}: {ln['metric']} | {_num(ln['predicted'])} "
                f"| {_num(ln['measured'])} | {100 * ln['error']:+.1f} % | {passes} "
                f"| {met}{target} | {_efficiencies(ln)} |"
            )
        rows.append(
            "\nefficiencies: **fitted** - a number of the GPU's row was fitted to this very "
            "row (agreement by construction); **own** - predicted with the GPU's own "
            "calibration (factors it borrowed named); **held out** - a GPU predicted with no "
            "calibration of its own, every efficiency borrowed from another GPU, as for a GPU "
            "nobody calibrated (infergen/perf/hardware.py)."
        )
    skips = [ln for ln in lines if ln.get("kind") == "skip"]
    for ln in skips:
        rows.append(f"\n{ln['bench']}: {ln['engine']} not measured: {ln['note']}")
    stamps = sorted({ln["timestamp"] for ln in lines if ln.get("timestamp")})
    if stamps:
        rows.append(
            f"\nRatios >1 mean infergen is faster (tok/s: infergen/peer; seconds: peer/infergen), "
            f"peer measured in the same run. ⚠: other processes used more than {CONTENDED} "
            f"cores during one side's measurement (numbers contended). Runs: {', '.join(stamps)}. "
            f"Regenerate: `python benchmarks/bench_generate.py && python benchmarks/report.py`."
        )
    return "\n".join(rows)


# factor names as the validation table shows them
_FACTORS = {
    "compute_efficiency": "compute",
    "memory_efficiency": "memory",
    "launch_overhead_s": "launch",
    "link_latency_s": "link latency",
}


def _fitted(ln: dict) -> bool:
    """Lines before the field existed: the published rows of FITTED_ROWS."""
    return ln.get("fitted", ln.get("part") == "published" and ln["metric"] in FITTED_ROWS)


def _efficiencies(ln: dict) -> str:
    """Which calibration a validation line stands on (validate_perf_model.provenance)."""
    if _fitted(ln):
        return "fitted"
    gpu = ln.get("gpu") or (
        "cpu-local, measured in the run" if ln.get("part") in ("steps", "serving") else "?"
    )
    if ln.get("held_out"):
        return f"**held out**: {gpu}, all borrowed from {ln['borrowed_from']}"
    borrowed = [_FACTORS.get(name, name) for name in ln.get("borrowed") or ()]
    if borrowed:
        return f"own ({gpu}; {', '.join(borrowed)} from {ln['borrowed_from']})"
    return f"own ({gpu})"


QUANT_START, QUANT_END = "<!-- quant:start -->", "<!-- quant:end -->"


def render_quant(lines: list[dict]) -> str | None:
    """The bench_quant table: speed, accuracy and memory per configuration (None: no run)."""
    quant = [ln for ln in lines if ln.get("bench") == "quant"]
    speed: dict[str, dict[str, float]] = {}
    for ln in quant:
        if ln.get("kind") == "result":
            speed.setdefault(ln["engine"], {})[ln["metric"]] = ln["value"]
    if "fp32" not in speed:
        return None
    accuracy = {ln["engine"]: ln for ln in quant if ln.get("kind") == "accuracy"}
    base = speed["fp32"]
    rows = [
        "| configuration | decode bs1 tok/s (× fp32) | 16 concurrent tok/s (× fp32) "
        "| perplexity | KL vs fp32 (nats/token) | top-1 vs fp32 | weight MB | KV bytes/token "
        "| KV tokens in 1 GiB (× fp32) | probe error on its weights (Gaussian) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    fp32_tokens = accuracy.get("fp32", {}).get("kv_capacity_tokens")

    def capacity(a: dict) -> str:
        tokens = a.get("kv_capacity_tokens")
        if tokens is None:
            return "–"
        ratio = f" ({tokens / fp32_tokens:.1f}×)" if fp32_tokens else ""
        return f"{tokens:,}{ratio}"

    def tok_s(name: str, metric: str) -> str:
        value = speed[name].get(metric)
        if value is None:
            return "–"
        if name in accuracy and name != "fp32":
            return f"{value:.1f} ({value / base[metric]:.2f}×)"
        return f"{value:.1f}"

    for name in [*accuracy, *[n for n in speed if n not in accuracy]]:
        a = accuracy.get(name)
        cells = [
            name if a else f"{name} (peer)",
            tok_s(name, "decode_tok_s_bs1"),
            tok_s(name, "throughput_tok_s_c16"),
        ]
        if a:
            cells += [
                f"{a['perplexity']:.2f}",
                "–" if name == "fp32" else f"{a['kl_nats']:.4f}",
                "–" if name == "fp32" else f"{100 * a['top1_agreement']:.1f} %",
                f"{a['weight_bytes'] / 1e6:.0f}",
                f"{a['kv_bytes_per_token']:g}" if "kv_bytes_per_token" in a else "–",
                capacity(a),
                _probe(a, name),
            ]
        else:
            cells += [""] * 7
        rows.append("| " + " | ".join(cells) + " |")
    stamp = max(ln["timestamp"] for ln in quant)
    rows.append(
        f"\n{_machine(quant[0])}; llama.cpp: {_peer_version({**quant[0], 'peer': 'llama.cpp'})}; "
        f"run {stamp}. Regenerate: `python benchmarks/bench_quant.py && python "
        "benchmarks/report.py`."
    )
    return "\n".join(rows)


COMPILER_START, COMPILER_END = "<!-- compiler:start -->", "<!-- compiler:end -->"
_ENGINES = (
    ("eager", "eager torch"),
    ("compile", "torch.compile"),
    ("jit", "infergen jit"),
    ("infergen", "infergen default (off)"),
)


def render_compiler(lines: list[dict]) -> str | None:
    """The bench_compiler tables: step / layer times per engine and shape, the compile and
    start-up costs, and where the jit step's time goes (None: no run)."""
    ours = [ln for ln in lines if ln.get("bench") == "compiler"]
    results = {
        (ln["metric"], ln["engine"]): ln["value"] for ln in ours if ln.get("kind") == "result"
    }
    shapes = sorted({m.split("_ms_", 1)[1] for m, _ in results if "_ms_" in m})
    if not shapes:
        return None
    rows = [
        "| ms (best of 5) | "
        + " | ".join(label for _, label in _ENGINES)
        + " | jit vs eager | jit vs torch.compile |",
        "|---" * (len(_ENGINES) + 3) + "|",
    ]
    for part in ("step", "layer"):
        for shape in shapes:
            values = {e: results.get((f"{part}_ms_{shape}", e)) for e, _ in _ENGINES}
            cells = [_num(values[e]) for e, _ in _ENGINES]
            jit = values["jit"]
            ratios = [
                f"{jit / values[p]:.2f}×" if jit and values[p] else "–"
                for p in ("eager", "compile")
            ]
            rows.append(f"| {part} {shape} | " + " | ".join(cells + ratios) + " |")
    costs = results.get(("compile_costs", "infergen"), {})
    startup = results.get(("start_to_first_token_s", "infergen"), {})
    first = {
        k.removeprefix("torch_compile_first_call_s_"): v
        for k, v in costs.items()
        if k.startswith("torch_compile_first_call_s_")
    }
    rows += [
        "",
        f"Compiling: infergen jit {costs.get('jit_cold_compile_s', 0):.2f} s cold "
        f"({costs.get('jit_kernels', '?')} kernels, the layer program among them), "
        f"{costs.get('jit_warm_start_s', 0):.3f} s from a warm cache; torch.compile's first "
        "call "
        + ", ".join(f"{v:.0f} s ({k})" for k, v in first.items())
        + ". "
        + (
            "Process start to first token: "
            + ", ".join(f"{k} {v:.1f} s" for k, v in startup.items())
            + "."
            if startup
            else ""
        ),
    ]
    profiles = [ln for ln in ours if ln.get("kind") == "profile"]
    if profiles:
        rows += ["", "Where the jit step's time goes (the layer programs' call sites, their C "
                 "timers over all layers; share of the timed time):", ""]  # fmt: skip
        for ln in profiles:
            top = ", ".join(f"{k} {v:.0%}" for k, v in list(ln["shares"].items())[:6])
            # (older runs: the graph walker's profile, empty when the program ran the step)
            top = top or "the layer program, one native call (`jit::layer_program` in profile)"
            rows.append(f"- {ln['metric'].removeprefix('jit_step_')}: {top}")
    stamp = max(ln["timestamp"] for ln in ours)
    rows.append(
        f"\n{_machine(ours[0])}; run {stamp}. Regenerate: "
        "`python benchmarks/bench_compiler.py && python benchmarks/report.py`."
    )
    return "\n".join(rows)


ARCH_START, ARCH_END = "<!-- architectures:start -->", "<!-- architectures:end -->"


def render_architectures(lines: list[dict]) -> str | None:
    """The bench_architectures tables: decode tok/s against transformers per architecture and
    batch, KV / state bytes, and the window memory curve's summary (None: no run)."""
    ours = [ln for ln in lines if ln.get("bench") == "architectures"]
    memory = {ln["arch"]: ln for ln in ours if ln.get("kind") == "memory"}
    if not memory:
        return None
    size = ours[0].get("size", {})
    batch = size.get("batch", 16)
    ratios = {
        (ln["arch"], ln["metric"].split(" ", 1)[0]): ln for ln in ours if ln.get("kind") == "ratio"
    }

    def speed(arch: str, batch_size: int) -> str:
        ln = ratios.get((arch, f"decode_tok_s_bs{batch_size}"))
        if ln is None:
            return "–"
        noisy = any(c is not None and c > CONTENDED for c in ln["other_cpu_cores"].values())
        ratio = f"{ln['value']:.2f}×" if ln["value"] >= 2 else f"**{ln['value']:.2f}×**"
        return (
            f"{ln['infergen_value']:.1f} / {ln['peer_value']:.1f} ({ratio}{' ⚠' if noisy else ''})"
        )

    def groups(ln: dict) -> str:
        kinds: dict[str, int] = {}
        for g in ln.get("cache_groups", []):
            key = f"window {g['window']}" if g["window"] else "full"
            kinds[key] = kinds.get(key, 0) + len(g["layers"])
        return ", ".join(f"{n} layers {k}" for k, n in kinds.items()) or "–"

    rows = [
        "| architecture | params total / active | decode bs1 tok/s: infergen / transformers "
        f"| decode bs{batch} tok/s: infergen / transformers | KV bytes/token (all-MHA) "
        "| KV cache | state bytes/seq | greedy tokens shared (of {}) |".format(
            size.get("new_tokens", "?")
        ),
        "|---|---|---|---|---|---|---|---|",
    ]
    for arch, ln in memory.items():
        active = ln.get("params_active")
        params = f"{ln['params_total'] / 1e6:.1f}M / " + (f"{active / 1e6:.1f}M" if active else "?")
        kv = f"{ln.get('kv_bytes_per_token', 0):,} ({ln.get('mha_bytes_per_token') or 0:,})"
        state = ln.get("state_bytes_per_sequence")
        rows.append(
            f"| {arch} | {params} | {speed(arch, 1)} | {speed(arch, batch)} | {kv} "
            f"| {groups(ln)} | {'–' if state is None else f'{state:,.0f}'} "
            f"| {ln.get('greedy_agreement_bs1', '–')} |"
        )
    curves = [ln for ln in ours if ln.get("kind") == "curve"]
    if curves:
        rows += [
            "",
            "| one sequence, windowed model | KV held at 1 / 2 / 4 windows of context "
            "| if every layer were full, at 4 windows | blocks per windowed group after 2 "
            "windows: most held (planned bound) | flat after window + chunk |",
            "|---|---|---|---|---|",
        ]
        for ln in curves:
            points, window = ln["points"], ln["window"]

            def at(context: int, key: str, pts=points) -> float:
                return max((p for p in pts if p["context"] <= context), key=lambda p: p["context"])[
                    key
                ]

            held = " / ".join(f"{at(k * window, 'kv_bytes') / 2**10:,.0f}" for k in (1, 2, 4))
            full = at(4 * window, "all_full_bytes") / 2**10
            flat = ln["flat"]
            late = ", ".join(
                f"{a} ({b})"
                for a, b in zip(flat["late_max_blocks"], flat["bound_blocks"], strict=True)
            )
            met = "yes" if flat["met"] else f"**no** ({flat['ratio']:.2f}×)"
            rows.append(
                f"| {ln['arch']} (window {window}, blocks of {ln['block_size']}) "
                f"| {held} KiB | {full:,.0f} KiB | {late} | {met} |"
            )
        if not ours[0].get("quick"):
            rows.append("\n![window memory](docs/architectures-window-memory.png)")
    for ln in ours:
        if ln.get("kind") == "skip":
            rows.append(f"\n{ln['engine']}: not measured: {ln['note']}")
    stamp = max(ln["timestamp"] for ln in ours)
    quick = " (quick run: tiny sizes)" if ours[0].get("quick") else ""
    rows.append(
        f"\nTok/s after the first token, best of {ours[0].get('rounds', '?')} interleaved "
        f"rounds; bold: under the 2× target; ⚠: other processes used more than {CONTENDED} "
        f"cores during one side's run. {_machine(ours[0])}; "
        f"{_peer_version({**ours[0], 'peer': 'transformers'})}; "
        f"run {stamp}{quick}. Regenerate: `python benchmarks/bench_architectures.py && "
        "python benchmarks/report.py`."
    )
    return "\n".join(rows)


def _probe(accuracy: dict, name: str) -> str:
    """Mean load-time probe error over the projections, with the scheme's Gaussian level."""
    probe = accuracy.get("probe_error")
    if not probe:
        return "–"
    from infergen.quant import WEIGHT_SCHEMES

    expected = WEIGHT_SCHEMES.get(name).expected_error if name in WEIGHT_SCHEMES.names() else None
    level = f" ({expected:.3g})" if expected else ""
    return f"{probe['mean']:.3g}{level}"


SOAK_START, SOAK_END = "<!-- soak:start -->", "<!-- soak:end -->"


def render_soak(lines: list[dict]) -> str | None:
    """The soak_server table: one row per phase, then the verdict (None: no run)."""
    soak = [ln for ln in lines if ln.get("kind") == "soak"]
    phases = [ln for ln in soak if ln["phase"] in ("clean", "mixed")]
    if not phases:
        return None
    rows = [
        "| phase | clients (good / leaving / malformed) | answers | 5xx | 503 sheds "
        "| lost | KV blocks held after | TTFT p50 / p99 | e2e p50 / p99 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for ln in phases:
        answers = ", ".join(f"{n}× {s}" for s, n in sorted(ln["statuses"].items()))
        rows.append(
            f"| {ln['phase']} | {ln['clients']} ({ln['good']} / {ln['disconnecting']} / "
            f"{ln['malformed']}) | {answers} | {ln['server_errors']} | {ln['sheds']} "
            f"| {ln['lost']} | {ln['kv_blocks_used_after']:.0f} "
            f"| {_num(ln['ttft_p50_s'], 's')} / {_num(ln['ttft_p99_s'], 's')} "
            f"| {_num(ln['e2e_p50_s'], 's')} / {_num(ln['e2e_p99_s'], 's')} |"
        )
    for ln in soak:
        if ln["phase"] == "fuzz":
            answers = ", ".join(f"{n}× {s}" for s, n in sorted(ln["statuses"].items()))
            rows.append(
                f"| fuzz (schemathesis CLI) | {ln['requests']} requests | {answers} "
                f"| {ln['server_errors']} | – | – | {ln['kv_blocks_used_after']:.0f} | – | – |"
            )
    verdict = next((ln for ln in soak if ln["phase"] == "verdict"), None)
    if verdict is not None:
        ratio = verdict["ttft_p99_ratio_mixed_over_clean"]
        quick = " (quick)" if verdict.get("quick") else ""
        rows.append(
            f"\np99 TTFT of the well-behaved streams, mixed / clean: {_num(ratio)}× (target ≤ "
            f"2×); passed: {'yes' if verdict['passed'] else '**no**'}. {_machine(verdict)}, "
            f"run {verdict['timestamp']}{quick}. Regenerate: `python benchmarks/soak_server.py "
            "&& python benchmarks/report.py`."
        )
    return "\n".join(rows)


PRESS_START, PRESS_END = "<!-- kv-press:start -->", "<!-- kv-press:end -->"


def render_kv_press(lines: list[dict]) -> str | None:
    """bench_kv_press.py's lines (None: no run): passkey and freed blocks per press, then
    concurrency and decode speed against the full cache."""
    press = [ln for ln in lines if ln.get("bench") == "kv_press"]
    passkey = [ln for ln in press if ln["part"] == "passkey"]
    if not passkey:
        return None
    lengths = list(passkey[0]["passkey"])
    ratio = passkey[0]["ratio"]
    rows = [
        f"| press (removing {ratio:.0%}) | "
        + " | ".join(f"passkey {int(n) // 1024}k" for n in lengths)
        + " | prompt blocks back in the pool |",
        "|---|" + "---|" * (len(lengths) + 1),
    ]
    for ln in passkey:
        freed = ln.get("blocks_freed_share")
        rows.append(
            f"| {ln['press']} | "
            + " | ".join(f"{100 * ln['passkey'][n]:.0f} %" for n in lengths)
            + f" | {'–' if freed is None else f'{100 * freed:.1f} %'} |"
        )
    rows += [
        "",
        "| measure | full cache | pressed | ratio | target | met |",
        "|---|---|---|---|---|---|",
    ]
    for ln in press:
        full = next((f for f in press if f["part"] == ln["part"] and f["press"] == "full"), None)
        if ln["part"] == "concurrency" and ln["press"] != "full":
            held = "peak_held" if "peak_held" in ln else "peak_running"
            rows.append(
                f"| {ln['prompts']} prompts of {ln['prompt_tokens']} tokens, pool for "
                f"{ln.get('pool_for', 4)}: most held at once, decoding ({ln['press']}) "
                f"| {full[held]} | "
                f"{ln[held]} | {ln['concurrency_vs_full']:.2f}× | ≥ 1.8× "
                f"| {'yes' if ln['met'] else '**no**'} |"
            )
            if held == "peak_held":
                rows.append(
                    f"| the same: most running at once (admitted, prompt maybe not all in) "
                    f"| {full['peak_running']} | {ln['peak_running']} "
                    f"| {ln['peak_running'] / full['peak_running']:.2f}× | – | – |"
                )
            rows.append(
                f"| the same: throughput, tok/s ({ln['preemptions']} preemptions pressed, "
                f"{full['preemptions']} full) | {full['tok_s']:.1f} | {ln['tok_s']:.1f} "
                f"| {ln['throughput_vs_full']:.2f}× | – | – |"
            )
        if ln["part"] == "decode_4k" and ln["press"] != "full":
            rows.append(
                f"| decode at {ln['prompt_tokens']} tokens of context, tok/s ({ln['press']}) "
                f"| {full['decode_tok_s']:.1f} | {ln['decode_tok_s']:.1f} "
                f"| {ln['speed_vs_full']:.2f}× | ≥ 1.3× | {'yes' if ln['met'] else '**no**'} |"
            )
    rows.append(
        f"\n{_machine(passkey[0])}, {passkey[0]['date']}, {passkey[0]['model']}, "
        f"{passkey[0]['samples']} passkey depths per length. Regenerate: "
        "`python benchmarks/bench_kv_press.py && python benchmarks/report.py`."
    )
    return "\n".join(rows)


PEER_START, PEER_END = "<!-- kv-press-peer:start -->", "<!-- kv-press-peer:end -->"


def render_kv_press_peer(lines: list[dict]) -> str | None:
    """bench_kv_press_peer.py's lines (None: no run): each press and ratio in infergen and in
    kvpress, per task (the mean over lengths), then issue 25's SnapKV target."""
    peer = [ln for ln in lines if ln.get("bench") == "kv_press_peer"]
    if not peer:
        return None
    tasks = list(peer[0]["infergen"])

    def per_task(accuracy: dict) -> str:
        return " / ".join(f"{100 * sum(v.values()) / len(v):.0f}" for v in accuracy.values())

    def label(ln: dict) -> str:
        return "full" if ln["press"] == "full" else f"{ln['press']}:{ln['ratio']:g}"

    rows = [
        f"| config | infergen, % ({' / '.join(tasks)}) | kvpress, % | mean: infergen | "
        "mean: kvpress | same answer tokens |",
        "|---|---|---|---|---|---|",
    ]
    for ln in peer:
        rows.append(
            f"| {label(ln)} | {per_task(ln['infergen'])} | {per_task(ln['kvpress'])} "
            f"| {100 * ln['infergen_mean']:.0f} % | {100 * ln['kvpress_mean']:.0f} % "
            f"| {ln['same_answers']} / {ln['prompts']} |"
        )
    snap = next((ln for ln in peer if ln["press"] == "snapkv" and ln["ratio"] == 0.5), None)
    if snap is not None:
        ours, theirs = snap["infergen_mean"], snap["kvpress_mean"]
        rows.append(
            f"\nTarget: SnapKV at 50 % removal ≥ kvpress's SnapKV: {100 * ours:.0f} % vs "
            f"{100 * theirs:.0f} % — {'met' if ours >= theirs else '**not met**'}."
        )
    versions = ", ".join(f"{k} {v}" for k, v in peer[0]["peer_versions"].items())
    lengths = ", ".join(next(iter(peer[0]["infergen"].values())))
    rows.append(
        f"\n{_machine(peer[0])}, {peer[0]['date']}, {peer[0]['model']}, prompts of {lengths} "
        f"tokens, {peer[0]['samples']} samples per task and length; peer: {versions}. "
        "Regenerate: `bash benchmarks/setup_peers.sh kvpress && python "
        "benchmarks/bench_kv_press_peer.py && python benchmarks/report.py`."
    )
    return "\n".join(rows)


TP_START, TP_END = "<!-- tp:start -->", "<!-- tp:end -->"


def render_tp(lines: list[dict]) -> str | None:
    """bench_tp.py's lines (None: no run): decode per batch on 1 and 2 ranks, prefill, and
    rank 0's communication share."""
    tp = [ln for ln in lines if ln.get("bench") == "tp" and ln.get("kind") != "comm"]
    comm = [ln for ln in lines if ln.get("bench") == "tp" and ln.get("kind") == "comm"]
    if not tp:
        return None
    rows = [
        "| ranks × threads | batch | decode tok/s | vs 1 rank | prefill 1k, s | "
        "communication share | collectives | same tokens |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for ln in tp:
        rows.append(
            f"| {ln['tp']} × {ln['threads_per_rank']} | {ln['batch']} | {ln['decode_tok_s']:.1f} "
            f"| {ln.get('vs_tp1', 1.0):.2f}× | {ln['prefill_s']:.2f} "
            f"| {100 * ln['comm_share']:.0f} % | {ln['collectives']} "
            f"| {'yes' if ln.get('same_tokens', True) else '**no**'} |"
        )
    if comm:
        wire = comm[0]["link"]
        rows += [
            "",
            f"Communication per step, the performance model against the engine (link measured "
            f"in the same run: {wire['latency_us']:.0f} µs a collective + "
            f"{wire['interconnect_gb_s']:.2f} GB/s):",
            "",
            "| step | tokens | steps (median of) | collectives | predicted, ms | "
            "measured transfer, ms | predicted ÷ measured | rank 0 waited, ms |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for ln in comm:
            for what in ("prefill_step", "decode_step"):
                step = ln.get(what)
                if step is None:
                    continue
                name = (
                    f"decode, batch {ln['batch']}, context {ln['prompt']}"
                    if what == "decode_step"
                    else f"prefill, {ln['batch']} × {ln['prompt']}"
                )
                # fmt: skip
                rows.append(
                    f"| {name} | {step['tokens']} | {step.get('steps', 1)} | {step['collectives']} "
                    f"| {step['predicted_ms']:.1f} | {step['measured_transfer_ms']:.1f} "
                    f"| {step['predicted_vs_measured']:.2f} | {step['rank0_wait_ms']:.1f} |"
                )
    rows.append(
        f"\n{_machine(tp[0])}, {tp[0]['date']}, {tp[0]['model']}. Regenerate: "
        "`python benchmarks/bench_tp.py && python benchmarks/report.py`."
    )
    return "\n".join(rows)


LOW_START, LOW_END = "<!-- low-precision:start -->", "<!-- low-precision:end -->"


def render_low_precision(lines: list[dict]) -> str | None:
    """bench_low_precision.py's lines (None: no run): the integer W8A8 / W4A8 and the bf16
    products against fp32, weight-only and the emulation by token count, and the engine's
    prefill / decode beside llama.cpp's on the same GGUF weights — a table pair per machine
    kept (benchmarks/results/low_precision*.jsonl: one file per kind of CPU)."""
    runs = [ln for ln in lines if ln.get("bench") == "low_precision"]
    if not runs:
        return None
    machines: dict[tuple, list[dict]] = {}
    for ln in runs:
        key = (
            ln["machine"].get("cpu"),
            tuple(ln.get("kernel_flags", [])),
            ln["date"],
            ln.get("compile", "off"),
        )
        machines.setdefault(key, []).append(ln)
    return "\n\n".join(_low_precision_run(run) for run in machines.values())


def _low_precision_run(runs: list[dict]) -> str:
    """One machine's tables (render_low_precision)."""

    def ms(ln: dict, key: str) -> str:
        return f"{ln[key]:.2f}" if key in ln else "—"

    def ratio(ln: dict, key: str) -> str:
        return f"{ln[key]:.2f}×" if key in ln else "—"

    first = runs[0]
    flags = " ".join(f.removeprefix("-m") for f in first.get("kernel_flags", [])) or "generic"
    rows = [
        f"{_machine(first)}, kernels built for {flags}, compile={first.get('compile', 'off')}, "
        f"{first['date']}:"
    ]
    ops = [ln for ln in runs if ln["kind"] == "ops"]
    if ops:
        rows += ["", "| weights | tokens | fp32, ms | weight-only, ms | emulated, ms | "
                 "integer / bf16, ms | ÷ fp32 | ÷ weight-only | ÷ emulated |",
                 "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for ln in ops:
        low = "bf16_ms" if ln["scheme"] == "bf16" else "integer_ms"
        rows.append(
            f"| {ln['scheme']} | {ln['tokens']} | {ms(ln, 'fp32_ms')} | {ms(ln, 'weight_only_ms')} "
            f"| {ms(ln, 'emulated_ms')} | {ms(ln, low)} | {ratio(ln, 'vs_fp32')} "
            f"| {ratio(ln, 'vs_weight_only')} | {ratio(ln, 'vs_emulated')} |"
        )
    engine = [ln for ln in runs if ln["kind"] == "engine"]
    if engine:
        rows += ["", "| engine | prefill 512, tok/s | ÷ fp32 | decode batch 1, tok/s |",
                 "|---|---|---|---|"]  # fmt: skip
        for ln in engine:
            peer = f" ({ln['peer_version']})" if ln.get("peer_version") else ""
            rows.append(
                f"| {ln['config']}{peer} | {ln['prefill_tok_s']:.0f} "
                f"| {ln['prefill_vs_fp32']:.2f}× | {ln['decode_tok_s']:.1f} |"
            )
    rows.append(
        "\nRegenerate: `python benchmarks/bench_low_precision.py && python benchmarks/report.py` "
        "(the results file is the CPU kind's: `low_precision.jsonl`, or `low_precision_amx.jsonl` "
        "where the kernels are built with AMX; `_jit` with `--compile jit`)."
    )
    return "\n".join(rows)


GPU_START, GPU_END = "<!-- gpu-engine:start -->", "<!-- gpu-engine:end -->"
# issue 22's targets: (what, the line's case, its filter, the value, at least)
GPU_TARGETS = (
    ("batch-1 decode, % of the HBM roofline (graphs)", "decode",
     dict(batch=1, mode="graphs"), "roofline_pct", 85.0),
    ("batch-1 decode ÷ eager torch", "decode", dict(batch=1, mode="graphs"),
     "vs_torch_eager", 1.5),
    ("batch-1 decode ÷ torch.compile", "decode", dict(batch=1, mode="graphs"),
     "vs_torch_compile", 1.0),
    ("paged decode attention at 32k, % of copy", "attention", dict(context=32768, batch=8),
     "copy_pct", 80.0),
    ("FP8 W8A8 ÷ bf16 projections, 1 token", "fp8_linear", dict(tokens=1), "speedup", 1.6),
)  # fmt: skip


def render_gpu_engine(lines: list[dict]) -> str | None:
    """bench_gpu.py's lines (None: no GPU run yet): decode per batch and mode, the other cases,
    then issue 22's targets."""
    gpu = [ln for ln in lines if ln.get("bench") == "gpu_engine"]
    if not gpu:
        return None
    rows = ["| case | tok/s | % of roofline / copy / peak | ÷ eager torch | ÷ torch.compile |",
            "|---|---|---|---|---|"]  # fmt: skip
    for ln in gpu:
        eager, compiled = ln.get("vs_torch_eager"), ln.get("vs_torch_compile")
        if ln["case"] == "decode":
            rows.append(
                f"| decode, batch {ln['batch']}, {ln['mode']} | {_num(ln['tok_per_s'])} "
                f"| {_num(ln['roofline_pct'])} % | {_num(eager)} | {_num(compiled)} |"
            )
        elif ln["case"] == "prefill":
            rows.append(
                f"| prefill, {ln['tokens']} tokens | {_num(ln['tok_per_s'])} "
                f"| {_num(ln['peak_pct'])} % of bf16 peak | – | – |"
            )
        elif ln["case"] == "attention":
            rows.append(
                f"| paged decode attention, {ln['context']} context, batch {ln['batch']} "
                f"| {_num(ln['gb_per_s'])} GB/s | {_num(ln['copy_pct'])} % of copy | – | – |"
            )
        elif ln["case"] == "fp8_linear":
            rows.append(
                f"| FP8 W8A8 projections, {ln['tokens']} tokens | {_num(ln['speedup'])}× "
                "bf16 | – | – | – |"
            )
    rows += ["", "| target | measured | at least | met |", "|---|---|---|---|"]
    for what, case, match, key, least in GPU_TARGETS:
        found = next(
            (
                ln
                for ln in gpu
                if ln["case"] == case and all(ln.get(k) == v for k, v in match.items())
            ),
            None,
        )
        value = None if found is None else found.get(key)
        met = "not measured yet" if value is None else "yes" if value >= least else "**no**"
        rows.append(f"| {what} | {_num(value)} | {least:g} | {met} |")
    rate = {ln["batch"]: ln["tok_per_s"] for ln in gpu
            if ln["case"] == "decode" and ln["mode"] == "graphs"}  # fmt: skip
    scaling = rate[64] / rate[1] if 64 in rate and 1 in rate else None
    met = "not measured yet" if scaling is None else "yes" if scaling >= 20 else "**no**"
    rows.append(f"| batch-64 decode throughput ÷ batch 1 | {_num(scaling)} | 20 | {met} |")
    first = gpu[0]
    rows.append(
        f"\n{first['model']}; {first['gpu']}, torch {first['torch']}, triton "
        f"{first.get('triton', '?')}. Regenerate: `bash benchmarks/device_check.sh` on "
        "a GPU, then `python benchmarks/report.py`."
    )
    return "\n".join(rows)


def _splice(text: str, start: str, end: str, body: str) -> str:
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{body}\n{end}{tail}"


# the README's other tables: (start marker, end marker, renderer; None when nothing was run)
TUNER_START, TUNER_END = "<!-- tuner:start -->", "<!-- tuner:end -->"


def render_tuner(lines: list[dict]) -> str | None:
    """bench_tuner: the startup plan's items (expected beside measured gain) and each bucket's
    decode step, tuned variant against the default and the walk op by op (None: no run)."""
    ours = [ln for ln in lines if ln.get("bench") == "tuner"]
    if not ours:
        return None
    rows = [
        "| plan item (from an empty cache) | status | seconds | expected ms/step | "
        "measured ms/step | expected / measured |",
        "|---|---|---|---|---|---|",
    ]
    for ln in (ln for ln in ours if ln["kind"] == "item" and "group" not in ln["item"][:8]):
        if ln["item"].startswith("tune") and "layer program" not in ln["item"]:
            continue  # (the groups' tunings: µs each)
        ratio = ln.get("expected_over_measured")
        rows.append(
            f"| {ln['item']} | {ln['status']} | {ln['spent_s']:.1f} | {_num(ln['expected_ms'])} "
            f"| {_num(ln['measured_ms'])} | {'–' if ratio is None else f'{ratio:.2f}'} |"
        )
    rows += [
        "",
        "| decode step | sequences × context | winner | default ms | tuned ms | tuned speed-up "
        "| walked op by op ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for ln in (ln for ln in ours if ln["kind"] == "step"):
        rows.append(
            f"| bucket {ln['bucket']} | {ln['tokens']} × {ln['context']} | {ln['winner']} | "
            f"{ln['default_ms']:.2f} | {ln['tuned_ms']:.2f} | {ln['tuned_speedup']:.3f}× | "
            f"{ln['walk_ms']:.2f} |"
        )
    target = next((ln for ln in ours if ln["kind"] == "target"), None)
    traffic = ", ".join(f"{b} {w:.0%}" for b, w in ours[0]["traffic"].items())
    flags = " ".join(ours[0]["machine"].get("kernel_flags", []))
    rows.append(
        f"\nTraffic mix {traffic}; budget {ours[0]['budget_s']:g} s. "
        + (
            f"Expected within 25 % of measured: {target['within']} compiled items. "
            if target
            else ""
        )
        + f"{_machine(ours[0])}, kernels built with {flags}; run {ours[0]['timestamp']}. "
        "Regenerate: `python benchmarks/bench_tuner.py && python benchmarks/report.py`."
    )
    return "\n".join(rows)


EPILOGUE_START, EPILOGUE_END = "<!-- epilogue:start -->", "<!-- epilogue:end -->"


def render_epilogue(lines: list[dict]) -> str | None:
    """bench_epilogue: the fused GEMM + SwiGLU against the GEMM and tail one after the other
    and against eager torch, per token count (None: no run)."""
    ratios = [ln for ln in lines if ln.get("bench") == "epilogue" and ln["kind"] == "ratio"]
    if not ratios:
        return None
    rows = [
        "| tokens | fused µs | unfused µs | unfused / fused | torch µs | torch / fused "
        "| fused bitwise = unfused |",
        "|---|---|---|---|---|---|---|",
    ]
    by = {(ln["metric"], ln["peer"]): ln for ln in ratios}
    for metric in dict.fromkeys(ln["metric"] for ln in ratios):
        unfused, torch_ = by[(metric, "unfused")], by[(metric, "torch")]
        rows.append(
            f"| {metric.split()[0].removeprefix('us_t')} | {unfused['infergen_value']:.1f} | "
            f"{unfused['peer_value']:.1f} | {unfused['value']:.2f}× | "
            f"{torch_['peer_value']:.1f} | {torch_['value']:.2f}× | "
            f"{'yes' if unfused['bitwise_equal_to_unfused'] else 'no'} |"
        )
    first = ratios[0]
    rows.append(
        f"\n{first['shape']}, {first['model']}; {_machine(first)}; run {first['timestamp']}. "
        "Regenerate: `python benchmarks/bench_epilogue.py && python benchmarks/report.py`."
    )
    return "\n".join(rows)


ROOFLINE_START, ROOFLINE_END = "<!-- decode-roofline:start -->", "<!-- decode-roofline:end -->"


def render_decode_roofline(lines: list[dict]) -> str | None:
    """bench_decode_roofline: batch-1 decode against the read roofline of the same run."""
    ours = [ln for ln in lines if ln.get("bench") == "decode_roofline" and ln["kind"] == "ratio"]
    if not ours:
        return None
    first = ours[0]
    rows = [
        "| decode bs1 | step ms | roofline ms | fraction of the roofline | of reading its weights "
        "in place |",
        "|---|---|---|---|---|",
    ]
    for ln in ours:
        in_place = ln.get("fraction_of_in_place_read")
        rows.append(
            f"| {ln['mode']} | {ln['infergen_value']:.2f} | {ln['peer_value']:.2f} | "
            f"{ln['value']:.1%} | " + (f"{in_place:.1%} |" if in_place is not None else "– |")
        )
    rows.append(
        f"\nA step reads {first['step_bytes'] / 1e6:.1f} MB ({first['model']}, context "
        f"{first['context']}); read bandwidth {first['read_bandwidth_gb_s']:.1f} GB/s measured "
        f"in the same run (a 512 MiB buffer)"
        + (
            f", the model's weights read in place {first['weights_in_place_gb_s']:.1f} GB/s"
            if "weights_in_place_gb_s" in first
            else ""
        )  # fmt: skip
        + f"; {_machine(first)}; run {first['timestamp']}. Regenerate: "
        "`python benchmarks/bench_decode_roofline.py && python benchmarks/report.py`."
    )
    return "\n".join(rows)


JIT_STEPS_START, JIT_STEPS_END = "<!-- jit-steps:start -->", "<!-- jit-steps:end -->"


def render_jit_steps(lines: list[dict]) -> str | None:
    """bench_jit_steps: compile="jit" against compile="off" per step shape, per model (None:
    no run kept)."""
    ours = [ln for ln in lines if ln.get("bench") == "jit_steps" and ln["kind"] == "ratio"]
    if not ours:
        return None
    rows = [
        "| model | step | sequences x (cached + new) | jit ms | off ms | off / jit |",
        "|---|---|---|---|---|---|",
    ]
    for ln in ours:
        rows.append(
            f"| {ln['model']} | {ln['metric'].removeprefix('step_ms_')} | {ln['shape']} | "
            f"{ln['infergen_value']:.2f} | {ln['peer_value']:.2f} | {ln['value']:.2f}× |"
        )
    runs = {(ln["model"], ln["timestamp"]): ln for ln in ours}
    for (model, stamp), ln in runs.items():
        rows.append(f"\n{model}: {_machine(ln)}; run {stamp}.")
    rows.append(
        "Regenerate: `python benchmarks/bench_jit_steps.py --model M --out "
        "benchmarks/results/jit_steps_<m>.jsonl && python benchmarks/report.py` (M: "
        "gemma3-270m, gpt-oss-row, deepseek-v2-row, deepseek-v3-row, qwen3-next-row, mamba2-row, "
        "falcon-h1-row)."
    )
    return "\n".join(rows)


SECTIONS = (
    (QUANT_START, QUANT_END, render_quant),
    (COMPILER_START, COMPILER_END, render_compiler),
    (ARCH_START, ARCH_END, render_architectures),
    (SOAK_START, SOAK_END, render_soak),
    (GPU_START, GPU_END, render_gpu_engine),
    (PRESS_START, PRESS_END, render_kv_press),
    (PEER_START, PEER_END, render_kv_press_peer),
    (TP_START, TP_END, render_tp),
    (LOW_START, LOW_END, render_low_precision),
    (TUNER_START, TUNER_END, render_tuner),
    (EPILOGUE_START, EPILOGUE_END, render_epilogue),
    (ROOFLINE_START, ROOFLINE_END, render_decode_roofline),
    (JIT_STEPS_START, JIT_STEPS_END, render_jit_steps),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=pathlib.Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--readme", type=pathlib.Path, default=ROOT / "README.md")
    parser.add_argument("--print", action="store_true", help="print only, never write")
    args = parser.parse_args()
    # commit-against-commit comparisons (ab_commits.py) carry the bench names of the runs they
    # compare but are no README table
    lines = [ln for ln in load_lines(args.results) if ln.get("kind") != "ab"]
    if not lines:
        sys.exit(f"no results in {args.results}/*.jsonl; run a benchmark first")
    table = render(lines)
    text = args.readme.read_text() if args.readme.is_file() else None
    if args.print or text is None or START not in text or END not in text:
        print(table)
        if not args.print:
            why = "does not exist" if text is None else f"has no {START} … {END} markers"
            print(f"\n{args.readme} {why}: table printed, not written.", file=sys.stderr)
        return
    text = _splice(text, START, END, table)
    for start, end, render_section in SECTIONS:
        section = render_section(lines)
        if section is not None and start in text and end in text:
            text = _splice(text, start, end, section)
    args.readme.write_text(text)
    print(f"wrote the results tables ({len(lines)} lines read) into {args.readme}")


if __name__ == "__main__":
    main()
