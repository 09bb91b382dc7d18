"""`infergen profile --plot`: the roofline plot of a profile — achieved GFLOP/s against
arithmetic intensity (FLOPs / byte), log-log, with the roofline's two lines (bandwidth ×
intensity, the compute peak), one point per table row that does FLOPs, its area the row's share
of its phase's time, a marker per phase, the largest rows labelled."""

from __future__ import annotations

from infergen.bench.profile_table import PhaseResult, Roofline

MARKERS = {"prefill": ("o", "tab:blue"), "decode": ("s", "tab:orange")}
LABELLED = 6  # rows labelled per phase, the largest first


def plot_roofline(phases: dict[str, PhaseResult], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise RuntimeError("--plot needs matplotlib: pip install matplotlib") from exc
    fig, ax = plt.subplots(figsize=(9, 6))
    intensities: list[float] = []
    roofline: Roofline | None = None
    for phase, result in phases.items():
        roofline = roofline or result.roofline
        marker, color = MARKERS.get(phase, ("^", "tab:green"))
        total = sum(r.seconds for r in result.rows) or 1.0
        points = [r for r in result.rows if r.flops and r.bytes and r.seconds > 0]
        for rank, row in enumerate(sorted(points, key=lambda r: -r.seconds)):
            x, y = row.flops / row.bytes, row.flops / row.seconds / 1e9
            intensities.append(x)
            ax.scatter(x, y, s=20 + 2000 * row.seconds / total, marker=marker, color=color,
                       alpha=0.6, edgecolors="black", linewidths=0.5)  # fmt: skip
            if rank < LABELLED:
                shift = (6, 4 - 11 * (rank % 2))  # (alternately above and below: clusters)
                ax.annotate(row.role or row.op, (x, y), fontsize=7, xytext=shift,
                            textcoords="offset points")  # fmt: skip
        ax.scatter([], [], marker=marker, color=color, label=phase)
    if roofline is not None:
        low = min([*intensities, roofline.flops / roofline.bandwidth]) / 10
        high = max([*intensities, roofline.flops / roofline.bandwidth]) * 10
        ridge = roofline.flops / roofline.bandwidth
        ax.plot([low, ridge, high], [low * roofline.bandwidth / 1e9, roofline.flops / 1e9,
                roofline.flops / 1e9], color="black", linewidth=1.5,
                label=f"roofline: {roofline.bandwidth / 1e9:.0f} GB/s, "
                f"{roofline.flops / 1e9:.0f} GFLOP/s")  # fmt: skip
        ax.set_title(f"infergen profile: roofline of {roofline.source.split(',')[0]}", fontsize=10)
    else:
        ax.set_title("infergen profile (no roofline: `infergen perf calibrate`)", fontsize=9)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("achieved GFLOP/s")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
