"""Summaries of a serving run: latency percentiles, throughput, goodput; the printed report
(with the metric definitions of REFERENCES §6) and the optional plots."""

from __future__ import annotations

import numpy as np

from infergen.bench.client import RequestResult

DEFINITIONS = """\
TTFT: request sent -> first generated token received (client side).
ITL: time between consecutive streamed tokens of one request (every gap is a sample).
TPOT: (e2e latency - TTFT) / (output tokens - 1), per request.
Throughput: output tokens / wall time of the run (also input+output tok/s).
Goodput: requests per second that met every stated SLO."""

PERCENTILES = (50, 90, 99)


def _stats(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, **{f"p{p}": None for p in PERCENTILES}, "n": 0}
    arr = np.asarray(values, dtype=np.float64)
    out = {"mean": float(arr.mean()), "n": len(values)}
    out.update({f"p{p}": float(np.percentile(arr, p)) for p in PERCENTILES})
    return out


def summarize(
    results: list[RequestResult],
    wall: float,
    slo_ttft: float | None = None,
    slo_tpot: float | None = None,
) -> dict:
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.input_tokens for r in ok)

    def meets(r: RequestResult) -> bool:
        good_ttft = slo_ttft is None or (r.ttft is not None and r.ttft <= slo_ttft)
        good_tpot = slo_tpot is None or r.tpot is None or r.tpot <= slo_tpot
        return good_ttft and good_tpot

    return {
        "requests": len(results),
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if r.error})[:5],
        "wall_s": wall,
        "output_tokens": out_tokens,
        "input_tokens": in_tokens,
        "output_tok_s": out_tokens / wall if wall else 0.0,
        "total_tok_s": (in_tokens + out_tokens) / wall if wall else 0.0,
        "request_s": len(ok) / wall if wall else 0.0,
        "goodput_req_s": sum(meets(r) for r in ok) / wall if wall else 0.0,
        "slo": {"ttft_s": slo_ttft, "tpot_s": slo_tpot},
        "ttft_s": _stats([r.ttft for r in ok if r.ttft is not None]),
        "itl_s": _stats([gap for r in ok for gap in r.itl]),
        "tpot_s": _stats([r.tpot for r in ok if r.tpot is not None]),
        "e2e_s": _stats([r.e2e for r in ok if r.e2e is not None]),
    }


LATENCIES = ("ttft", "itl", "tpot", "e2e")


def latency_table(stats: dict[str, dict], scale: float, digits: int) -> list[str]:
    """Rows of mean / p50 / p90 / p99 in ms for each named latency (values times `scale`)."""
    lines = [f"{'metric':<8} {'mean':>9} {'p50':>9} {'p90':>9} {'p99':>9}   (ms)"]
    for name, s in stats.items():
        cells = [s["mean"], s["p50"], s["p90"], s["p99"]]
        text = " ".join(f"{c * scale:9.{digits}f}" if c is not None else f"{'-':>9}" for c in cells)
        lines.append(f"{name.upper():<8} {text}")
    return lines


def format_report(label: str, summary: dict) -> str:
    lines = [
        f"== {label}: {summary['completed']}/{summary['requests']} requests in "
        f"{summary['wall_s']:.1f} s ==",
        f"output {summary['output_tok_s']:.1f} tok/s, total {summary['total_tok_s']:.1f} tok/s, "
        f"{summary['request_s']:.2f} req/s, goodput {summary['goodput_req_s']:.2f} req/s",
    ]
    lines += latency_table({n: summary[f"{n}_s"] for n in LATENCIES}, scale=1e3, digits=1)
    if summary["errors"]:
        lines.append(f"errors: {summary['errors']}")
    return "\n".join(lines)


def plot(runs: list[tuple[str, list[RequestResult], dict]], path: str) -> None:
    """Latency CDFs (TTFT, ITL, e2e) of every run, and output throughput against p50 e2e
    latency across runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(18, 4))
    for label, results, _ in runs:
        ok = [r for r in results if r.ok]
        series = {
            "TTFT (s)": [r.ttft for r in ok if r.ttft is not None],
            "ITL (s)": [g for r in ok for g in r.itl],
            "e2e latency (s)": [r.e2e for r in ok if r.e2e is not None],
        }
        for ax, (name, values) in zip(axes[:3], series.items(), strict=False):
            if values:
                v = np.sort(values)
                ax.plot(v, np.arange(1, len(v) + 1) / len(v), label=label)
            ax.set_xlabel(name)
            ax.set_ylabel("CDF")
    xs = [s["e2e_s"]["p50"] or 0 for _, _, s in runs]
    ys = [s["output_tok_s"] for _, _, s in runs]
    axes[3].plot(xs, ys, "o-")
    for (label, _, _), x, y in zip(runs, xs, ys, strict=True):
        axes[3].annotate(label, (x, y))
    axes[3].set_xlabel("p50 e2e latency (s)")
    axes[3].set_ylabel("output tok/s")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
