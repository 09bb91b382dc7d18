"""Smoothing: per-input-channel scales s moved between a projection and the op before it.

    y = W·x = (W·diag(s)) · (x / s)

The projection's columns are multiplied by s and the op that produced x divides its output
channels by s, so the fp32 model computes the same function; what changes is which of weight
and activation carries each channel's magnitude into quantization. SMOOTHINGS (the engine's
`smoothing` option):
  "smoothquant"  s_j = max|x_j|^α / max|W_:j|^(1−α), α = SMOOTHQUANT_ALPHA (SmoothQuant, Xiao
                 et al. 2023): activation outliers migrate into the weights, for W8A8;
  "awq"          s_j = mean|x_j|^α, normalised, α searched on AWQ_GRID for the least output
                 error of the quantized projection on the calibration rows (AWQ, Lin et al.
                 2024): salient input channels get finer weight resolution, for 4-bit weights.
                 α = 0 (s = 1, nothing moved) is on the grid, so a layer is never made worse
                 on the calibration rows.

Where each s is folded (`smooth_groups`), per decoder layer, in this order:
  o_proj     ← the V rows of the qkv projection (with GQA, s is shared by the query heads of a
               KV head: a V channel feeds all of them);
  down_proj  ← the up rows of the gate/up projection (silu(g)·u/s = (silu(g)·u)/s);
  qkv        ← the attention RMSNorm's weight;
  gate/up    ← the MLP RMSNorm's weight.
o and down come first: their folds change the qkv and gate/up weights that the later searches
quantize. The LM head is not smoothed (with tied embeddings its matrix is also the embedding).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch

from infergen.ops.quantize_activation import ActivationFormat, fake_quantize
from infergen.quant.calibrate import InputStats
from infergen.quant.schemes import dequantized_weight
from infergen.registry import Registry

SMOOTHQUANT_ALPHA = 0.5
AWQ_GRID = [k / 10 for k in range(10)]  # 0.0 .. 0.9


@dataclass
class SmoothGroup:
    """One projection whose input channels take scales, and how its producer absorbs them."""

    name: str  # the consumer projection's module name
    stats: InputStats  # its input over the calibration text
    tie: Callable[[torch.Tensor], torch.Tensor]  # a candidate s → an s the producer can absorb
    fold: Callable[[torch.Tensor], None]  # divide the producer's output channels by s


@dataclass
class DenseModel:
    """The fp32 weights smoothing and clipping rewrite before the scheme quantizes them."""

    weights: dict[str, torch.Tensor]  # projection name → [out, in]
    biases: dict[str, torch.Tensor | None]
    norms: dict[str, torch.Tensor]  # RMSNorm name → its weight (the model's own parameter)


def _identity(s: torch.Tensor) -> torch.Tensor:
    return s


def smooth_groups(model, dense: DenseModel, stats: dict[str, InputStats]) -> list[SmoothGroup]:
    """The SmoothGroups of a Transformer, in fold order (see the module docstring)."""
    config = model.config
    heads, kv_heads, dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    group = heads // kv_heads
    q_size, kv_size, inter = config.q_size, config.kv_size, config.intermediate_size
    groups = []
    for i in range(len(model.layers)):
        p = f"layers.{i}."
        qkv, gate_up = p + "attn.qkv", p + "mlp.gate_up"

        def tie_heads(s: torch.Tensor) -> torch.Tensor:  # one scale per V channel
            per_kv = s.view(kv_heads, group, dim).mean(dim=1, keepdim=True)
            return per_kv.expand(kv_heads, group, dim).reshape(-1)

        def fold_rows(name: str, start: int, per_channel: Callable) -> Callable:
            def fold(s: torch.Tensor) -> None:
                s = per_channel(s)
                dense.weights[name][start : start + len(s)] /= s[:, None]
                if dense.biases[name] is not None:
                    dense.biases[name][start : start + len(s)] /= s

            return fold

        def fold_norm(name: str) -> Callable:
            def fold(s: torch.Tensor) -> None:
                dense.norms[name].div_(s)

            return fold

        def v_channels(s: torch.Tensor) -> torch.Tensor:
            return s.view(kv_heads, group, dim)[:, 0].reshape(-1)

        groups += [
            SmoothGroup(p + "attn.o", stats[p + "attn.o"], tie_heads,
                        fold_rows(qkv, q_size + kv_size, v_channels)),
            SmoothGroup(p + "mlp.down", stats[p + "mlp.down"], _identity,
                        fold_rows(gate_up, inter, _identity)),
            SmoothGroup(qkv, stats[qkv], _identity, fold_norm(p + "attn_norm")),
            SmoothGroup(gate_up, stats[gate_up], _identity, fold_norm(p + "mlp_norm")),
        ]  # fmt: skip
    return groups


@dataclass(frozen=True)
class Smoothing:
    description: str
    # (consumer weight [out, in], its group, weight scheme, activation format) → (s, α)
    scales: Callable[..., tuple[torch.Tensor, float]]


def _normalised(s: torch.Tensor) -> torch.Tensor:
    s = s.clamp(min=1e-5)
    return s / (s.max() * s.min()).sqrt()


def _smoothquant(weight, group: SmoothGroup, scheme, act) -> tuple[torch.Tensor, float]:
    a = SMOOTHQUANT_ALPHA
    w_max = weight.abs().amax(dim=0).clamp(min=1e-5)
    s = group.stats.amax.clamp(min=1e-5) ** a / w_max ** (1 - a)
    return group.tie(s.clamp(min=1e-5)), a


def _awq(weight, group: SmoothGroup, scheme, act) -> tuple[torch.Tensor, float]:
    x = group.stats.rows
    reference = x @ weight.t()
    mean = group.stats.mean_abs
    best = (float("inf"), torch.ones_like(mean), 0.0)
    for a in AWQ_GRID:
        s = group.tie(_normalised(mean**a)) if a else torch.ones_like(mean)
        w_q = dequantized_weight(scheme, weight * s) if scheme else weight * s
        xs = x / s
        if act is not None:
            xs = fake_quantize(xs, act, _dynamic_static_scale(xs, act))
        error = float((xs @ w_q.t() - reference).square().mean())
        if error < best[0]:
            best = (error, s, a)
    return best[1], best[2]


def _dynamic_static_scale(x: torch.Tensor, act: ActivationFormat) -> torch.Tensor | None:
    """A static format's scale from x itself (during the search, before calibration)."""
    if not act.static:
        return None
    return torch.tensor([max(float(x.abs().max()), 1e-12) / act.max_code])


SMOOTHINGS: Registry[Smoothing] = Registry("smoothing")
SMOOTHINGS.register(
    "smoothquant",
    Smoothing(f"SmoothQuant: s = max|x|^{SMOOTHQUANT_ALPHA} / max|W|^{1 - SMOOTHQUANT_ALPHA}",
              _smoothquant),
)  # fmt: skip
SMOOTHINGS.register(
    "awq", Smoothing("AWQ: s = mean|x|^α, α searched for the least quantized output error", _awq)
)


def smooth(
    model,
    dense: DenseModel,
    stats: dict[str, InputStats],
    method: str,
    scheme: str | None,
    act: ActivationFormat | None,
    progress: bool = True,
) -> dict[str, tuple[torch.Tensor, float]]:
    """Apply `method` to every SmoothGroup of `model`, rewriting `dense` in place; returns each
    consumer's (s [in], α)."""
    from tqdm import tqdm

    smoothing = SMOOTHINGS.get(method, where="smoothing")
    chosen = {}
    groups = smooth_groups(model, dense, stats)
    for group in tqdm(groups, desc=f"smoothing ({method})", unit="proj", file=sys.stderr,
                      disable=not progress):  # fmt: skip
        weight = dense.weights[group.name]
        s, a = smoothing.scales(weight, group, scheme, act)
        if a:
            weight.mul_(s)
            group.fold(s)
        chosen[group.name] = (s, a)
    return chosen
