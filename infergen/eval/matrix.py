"""`infergen eval --matrix`: every scheme's row as a markdown table and a PNG of quality
against memory (KL to the unquantized model over bits per weight, and over KV bytes per
token for the KV cache formats)."""

from __future__ import annotations

from collections.abc import Sequence


def _cell(row: dict, key: str, fmt: str) -> str:
    return format(row[key], fmt) if key in row else "–"


def markdown(rows: Sequence[dict]) -> str:
    lengths = sorted({int(k) for r in rows for k in r.get("passkey", {})})
    head = ["config", "bits/weight", "KV bytes/token", "perplexity", "KL nats", "top-1"]
    head += [f"passkey {n // 1024}k" if n % 1024 == 0 else f"passkey {n}" for n in lengths]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if "error" in r:  # a scheme the model cannot take
            cells = [r["scheme"], f"not applicable: {r['error']}"] + [""] * (len(head) - 2)
            lines.append("| " + " | ".join(cells) + " |")
            continue
        cells = [
            r["scheme"],
            f"{r['bits_per_weight']:.2f}",
            str(r["kv_bytes_per_token"]),
            _cell(r, "perplexity", ".3f"),
            _cell(r, "kl_nats", ".4f"),
            f"{100 * r['top1_agreement']:.1f} %" if "top1_agreement" in r else "–",
        ]
        passkey = r.get("passkey", {})
        cells += [f"{100 * passkey[str(n)]:.0f} %" if str(n) in passkey else "–" for n in lengths]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: Sequence[dict], path: str) -> None:
    """KL (log scale) against bits per weight (weight schemes) and KV bytes per token (KV
    formats); the reference sits at KL 0 and is drawn at the axis floor."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scored = [r for r in rows if "kl_nats" in r and "error" not in r]
    if not scored:
        raise ValueError("the matrix plot needs KL rows (--task kl)")
    floor = min([r["kl_nats"] for r in scored if r["kl_nats"] > 0] or [1e-4]) / 3
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    panels = (
        (left, "weights", "bits_per_weight", "bits per weight (projections)"),
        (right, "kv_format", "kv_bytes_per_token", "KV cache bytes per token"),
    )
    for ax, key, x, label in panels:
        for r in scored:
            if r[key] == "none" and r["scheme"] != "none":
                continue  # a row of the other panel
            y = max(r["kl_nats"], floor)
            ax.scatter(r[x], y, color="black" if r["scheme"] == "none" else "tab:blue")
            ax.annotate(r["scheme"], (r[x], y), textcoords="offset points", xytext=(4, 4),
                        fontsize=8)  # fmt: skip
        ax.set_xlabel(label)
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
    left.set_ylabel("KL to the unquantized model (nats/token)")
    fig.suptitle("infergen eval --matrix: quality against memory")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
