"""The `infergen formats` table: per format its storage cost, range, accuracy and speed.

Columns: bits per value (scale overhead included), largest element magnitude, smallest
subnormal element, SQNR on N(0,1) data, SQNR on real weights (the default model's
projections, blocked along their input axis), and quantize / dequantize throughput in GB/s of
fp32 input on this machine (best of a few runs of the reference codec).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

import torch

from infergen.formats.codec import dequantize, quantize, sqnr_db
from infergen.formats.spec import FORMATS, FormatSpec
from infergen.io.checkpoint import load_checkpoint
from infergen.timing import best_seconds

# The projections whose weights the "real weights" SQNR uses (first, middle and last layer).
WEIGHT_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class FormatRow:
    format: str
    bits_per_value: float
    max: float
    smallest_subnormal: float | None
    sqnr_normal_db: float
    sqnr_weights_db: float | None
    quantize_gb_s: float
    dequantize_gb_s: float


def real_weights(
    model: str | None = None, layers: Iterable[int] | None = None
) -> list[torch.Tensor]:
    """2-d projection weights of a checkpoint (default model), fp32, [out, in]."""
    ckpt = load_checkpoint(model)
    n = ckpt.config.num_hidden_layers
    picked = sorted(set(layers if layers is not None else (0, n // 2, n - 1)))
    prefix = "model.layers.{}.{}.{}.weight"
    out = []
    for i in picked:
        for name in WEIGHT_NAMES:
            part = "mlp" if name in ("gate_proj", "up_proj", "down_proj") else "self_attn"
            out.append(ckpt.tensors[prefix.format(i, part, name)].float())
    return out


def _sqnr_over(tensors: list[torch.Tensor], spec: FormatSpec) -> float:
    signal = torch.cat([t.reshape(-1) for t in tensors])
    approx = torch.cat([dequantize(quantize(t, spec)).reshape(-1) for t in tensors])
    return sqnr_db(signal, approx)


def _throughput(fn, nbytes: int, repeats: int) -> float:
    return nbytes / best_seconds(fn, repeats) / 1e9


def format_row(
    spec: FormatSpec,
    normal: torch.Tensor,
    weights: list[torch.Tensor] | None,
    speed_tensor: torch.Tensor,
    repeats: int = 3,
) -> FormatRow:
    et = spec.element_type
    q = quantize(speed_tensor, spec)
    nbytes = speed_tensor.numel() * 4
    return FormatRow(
        format=spec.name,
        bits_per_value=spec.bits_per_value(),
        max=spec.max,
        smallest_subnormal=et.smallest_subnormal if et else None,
        sqnr_normal_db=sqnr_db(normal, dequantize(quantize(normal, spec))),
        sqnr_weights_db=_sqnr_over(weights, spec) if weights else None,
        quantize_gb_s=_throughput(lambda: quantize(speed_tensor, spec), nbytes, repeats),
        dequantize_gb_s=_throughput(lambda: dequantize(q), nbytes, repeats),
    )


def format_table(
    weights: list[torch.Tensor] | None, size: int = 2048, progress: bool = True
) -> list[FormatRow]:
    gen = torch.Generator().manual_seed(0)
    normal = torch.randn(1024, 1024, generator=gen)
    speed_tensor = torch.randn(size, size, generator=gen)
    specs = [FORMATS.get(name) for name in FORMATS]
    if progress:
        from tqdm import tqdm

        specs = tqdm(specs, desc="formats", unit="format", leave=False)
    return [format_row(spec, normal, weights, speed_tensor) for spec in specs]


def render(rows: list[FormatRow]) -> str:
    def num(v: float | None, fmt: str) -> str:
        return "–" if v is None else format(v, fmt)

    header = (
        f"{'format':<12} {'bits/val':>8} {'max':>9} {'min subnorm':>11} {'SQNR N(0,1)':>11} "
        f"{'SQNR weights':>12} {'quant GB/s':>10} {'dequant GB/s':>12}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r.format:<12} {r.bits_per_value:>8.3f} {r.max:>9g} "
            f"{num(r.smallest_subnormal, '.3g'):>11} {r.sqnr_normal_db:>9.2f}dB "
            f"{num(r.sqnr_weights_db, '.2f'):>10}dB {r.quantize_gb_s:>10.2f} "
            f"{r.dequantize_gb_s:>12.2f}"
        )
    return "\n".join(lines)


def plot(rows: list[FormatRow], path: str) -> None:
    """SQNR against bits per value, one point per format (N(0,1) and real weights)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise RuntimeError(
            "--plot needs matplotlib: pip install 'infergen[plot]' (or matplotlib)"
        ) from exc
    fig, ax = plt.subplots(figsize=(8, 5))
    for r in rows:
        ax.scatter(r.bits_per_value, r.sqnr_normal_db, color="tab:blue")
        ax.annotate(
            r.format,
            (r.bits_per_value, r.sqnr_normal_db),
            fontsize=8,
            xytext=(4, 2),
            textcoords="offset points",
        )
        if r.sqnr_weights_db is not None:
            ax.scatter(r.bits_per_value, r.sqnr_weights_db, color="tab:orange", marker="x")
    ax.scatter([], [], color="tab:blue", label="N(0,1)")
    ax.scatter([], [], color="tab:orange", marker="x", label="model weights")
    ax.set_xlabel("bits per value (with scales)")
    ax.set_ylabel("SQNR (dB)")
    ax.set_title("infergen formats: accuracy vs storage")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def as_dicts(rows: list[FormatRow]) -> list[dict]:
    return [asdict(r) for r in rows]
