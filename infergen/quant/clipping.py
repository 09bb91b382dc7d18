"""Clipping: the range [−c, c] a quantization scale maps onto the format's largest code.
Values beyond c saturate; a smaller c spends the codes on the bulk of the values.

CLIP_METHODS (the engine's `calibration` option):
  "max"         c = the largest |x| the calibration inputs showed (nothing seen saturates);
  "percentile"  c = the PERCENTILE-th percentile of |x| over the sampled input rows;
  "mse"         c = α·amax for the α on ACTIVATION_GRID minimising the sampled rows' squared
                quantization error ||x̂(c) − x||².
Activations (static formats): the static scale is c / the format's largest code (NVFP4: the
global scale, c / (448·6)).
Weights: "mse" also clips each scale group of a quantized weight (its scheme's scale_group) at
the α on WEIGHT_GRID minimising Σ_k E[x_k²]·(ŵ_k − w_k)², the group's expected output error
under the calibration inputs' per-channel energy (the diagonal of XᵀX), before it is quantized
(kept only if the whole weight's error goes down: NVFP4's global scale couples its groups).
"max" and "percentile" leave the weights as the checkpoint has them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from infergen.ops.quantize_activation import ActivationFormat, fake_quantize
from infergen.quant.calibrate import InputStats
from infergen.quant.schemes import WEIGHT_SCHEMES, dequantized_weight
from infergen.registry import Registry

PERCENTILE = 99.99
ACTIVATION_GRID = [0.9**k for k in range(40)]  # 1.0 down to 0.016
WEIGHT_GRID = [1.0 - 0.05 * k for k in range(11)]  # 1.0 down to 0.5


@dataclass(frozen=True)
class ClipMethod:
    description: str
    activation_clip: Callable[[InputStats, ActivationFormat], float]
    clips_weights: bool = False


def _max(stats: InputStats, act: ActivationFormat) -> float:
    return float(stats.amax.max())


def _percentile(stats: InputStats, act: ActivationFormat) -> float:
    values = stats.rows.abs().flatten()
    k = max(1, min(values.numel(), round(values.numel() * PERCENTILE / 100)))
    return float(values.kthvalue(k).values)


def _mse(stats: InputStats, act: ActivationFormat) -> float:
    rows, amax = stats.rows, float(stats.amax.max())
    if amax == 0:
        return 0.0
    errors = [
        (fake_quantize(rows, act, torch.tensor([a * amax / act.max_code])) - rows).square().sum()
        for a in ACTIVATION_GRID
    ]
    return ACTIVATION_GRID[int(torch.stack(errors).argmin())] * amax


CLIP_METHODS: Registry[ClipMethod] = Registry("calibration method")
CLIP_METHODS.register("max", ClipMethod("the largest |x| calibration showed", _max))
CLIP_METHODS.register(
    "percentile", ClipMethod(f"the {PERCENTILE}th percentile of |x| over sampled rows", _percentile)
)
CLIP_METHODS.register(
    "mse",
    ClipMethod(
        "the clip minimising the squared quantization error (activations: over sampled rows; "
        "weights: per scale group, weighted by E[x²] of each input channel)",
        _mse,
        clips_weights=True,
    ),
)


def activation_scale(method: str, stats: InputStats, act: ActivationFormat) -> torch.Tensor:
    """The static scale [1] of a projection input: clip / the format's largest code."""
    clip = CLIP_METHODS.get(method, where="calibration").activation_clip(stats, act)
    scale = clip / act.max_code
    return torch.tensor([scale if scale > 0 else 1.0], dtype=torch.float32)


def _groups(weight: torch.Tensor, scale_group: int) -> torch.Tensor:
    """[out, in] → [units, groups, values]: the weights sharing each scale along the last dim."""
    out, inp = weight.shape
    if scale_group == 0:  # one scale for the tensor
        return weight.reshape(1, 1, out * inp)
    if scale_group == -1:  # one per output channel
        return weight.reshape(out, 1, inp)
    return weight.reshape(out, inp // scale_group, scale_group)


def clip_weight(
    weight: torch.Tensor, scheme: str, channel_energy: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(the weight [out, in] with each scale group clipped at its best ratio, the ratios) for
    weight scheme `scheme`; channel_energy [in] = E[x²] of each input channel."""
    s = WEIGHT_SCHEMES.get(scheme, where="weights")
    w = _groups(weight, s.scale_group)
    energy = _groups(channel_energy.expand_as(weight), s.scale_group)
    if s.asymmetric:
        lo, hi = w.amin(dim=-1, keepdim=True), w.amax(dim=-1, keepdim=True)
    else:
        hi = w.abs().amax(dim=-1, keepdim=True)
        lo = -hi
    best = torch.full(w.shape[:2], float("inf"))
    ratio = torch.ones(w.shape[:2])
    for a in WEIGHT_GRID:
        clipped = torch.minimum(torch.maximum(w, lo * a), hi * a)
        deq = _groups(dequantized_weight(scheme, clipped.reshape(weight.shape)), s.scale_group)
        error = (energy * (deq - w).square()).sum(dim=-1)
        better = error < best
        best = torch.where(better, error, best)
        ratio = torch.where(better, torch.full_like(ratio, a), ratio)
    r = ratio[..., None]
    clipped = torch.minimum(torch.maximum(w, lo * r), hi * r).reshape(weight.shape)
    # NVFP4's global scale follows the tensor's amax, so groups are not independent there:
    # keep the clipping only if the whole weight's error went down
    deq = _groups(dequantized_weight(scheme, clipped), s.scale_group)
    unclipped = _groups(dequantized_weight(scheme, weight), s.scale_group)
    if (energy * (deq - w).square()).sum() >= (energy * (unclipped - w).square()).sum():
        return weight, torch.ones_like(ratio)
    return clipped, ratio
