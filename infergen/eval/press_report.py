"""`infergen eval --task longctx`: the long-context tasks (eval/longctx.py) with the full KV
cache and under each KV press at each removal ratio — one row per configuration (accuracy per
task and prompt length, its mean, the share of prompt blocks the press gave back), a markdown
table and a PNG of mean accuracy against the ratio, one line per press."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from infergen.eval.longctx import score
from infergen.llm import LLM

RATIOS = (0.25, 0.5, 0.75)


def parse_press(text: str) -> tuple[str, float]:
    """'snapkv:0.5' → ("snapkv", 0.5); a bare name takes 0.5."""
    name, _, ratio = text.partition(":")
    try:
        return name, float(ratio) if ratio else 0.5
    except ValueError:
        raise ValueError(f"expected NAME:RATIO such as snapkv:0.5, got {text!r}") from None


def press_rows(
    model: str | None,
    presses: Sequence[tuple[str, float]],
    tasks: Sequence[str],
    lengths: Sequence[int],
    samples: int = 3,
    progress: Callable[[str], None] | None = None,
    **llm_args,
) -> list[dict]:
    """The full cache's row first, then one per (press, ratio)."""
    rows = []
    for press, ratio in [(None, 0.0), *presses]:
        label = "full" if press is None else f"{press}:{ratio:g}"
        if progress is not None:
            progress(label)
        options = {} if press is None else dict(kv_press=press, kv_press_ratio=ratio)
        llm = LLM(model, **options, **llm_args)
        accuracy = score(llm, tasks, lengths, samples)
        cells = [a for per_length in accuracy.values() for a in per_length.values()]
        row = {"config": label, "press": press or "none", "ratio": ratio, "samples": samples,
               "accuracy": {t: {str(n): a for n, a in v.items()} for t, v in accuracy.items()},
               "mean": sum(cells) / len(cells)}  # fmt: skip
        if press is not None:
            stats = llm.engine.kv_press.stats
            held = stats["blocks_pressed"]
            row["blocks_freed_share"] = round(stats["blocks_freed"] / held, 3) if held else 0.0
        rows.append(row)
    return rows


def markdown(rows: Sequence[dict]) -> str:
    columns = [(t, n) for t, per in rows[0]["accuracy"].items() for n in per]
    head = ["config", *(f"{t} {int(n) // 1024}k" if int(n) % 1024 == 0 else f"{t} {n}"
                        for t, n in columns), "mean", "blocks freed"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["config"], *(f"{100 * r['accuracy'][t][n]:.0f} %" for t, n in columns)]
        cells += [f"{100 * r['mean']:.0f} %",
                  f"{100 * r['blocks_freed_share']:.0f} %" if "blocks_freed_share" in r
                  else "–"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: Sequence[dict], path: str, title: str = "") -> None:
    """Mean accuracy against the removal ratio, a line per press; the full cache at 0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    full = next(r["mean"] for r in rows if r["press"] == "none")
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for press in dict.fromkeys(r["press"] for r in rows if r["press"] != "none"):
        points = sorted((r["ratio"], r["mean"]) for r in rows if r["press"] == press)
        xs, ys = zip(*[(0.0, full), *points], strict=True)
        ax.plot(xs, [100 * y for y in ys], marker="o", label=press)
    ax.set_xlabel("share of each prompt's KV removed")
    ax.set_ylabel("mean accuracy over tasks and lengths (%)")
    ax.set_ylim(-5, 105)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(title or "long-context tasks under KV presses")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
