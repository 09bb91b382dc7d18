"""Calibrated quantization of a loaded model: the engine's `activations`, `calibration` and
`smoothing` options, run once at start (and by `infergen quantize`).

1. When smoothing or weight clipping is asked for, the model is loaded in fp32 and
   calibrated (quant/calibrate.py); smoothing (quant/smoothing.py) and clipping
   (quant/clipping.py) rewrite its fp32 weights; each projection is then quantized by the
   weight scheme from the rewritten weight (the load-time check included).
   Otherwise the projections quantized as they loaded.
2. Activation quantizers go on every projection but the LM head (quant/activations.py).
3. Static activation scales: a second calibration pass over the model as quantized so far
   (inputs as the quantized model produces them, quantizers off) and the clipping method.
`CalibrationResult.chosen` holds what was chosen (smoothing scales and α, clip ratios, input
scales), saved with the statistics when `calibration_stats` names a file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from infergen.config.sections import QuantConfig
from infergen.layers.linear import Linear
from infergen.layers.norm import RMSNorm
from infergen.quant.activations import ACTIVATION_SCHEMES, apply_activation_scheme
from infergen.quant.calibrate import collect_statistics, save_statistics
from infergen.quant.clipping import CLIP_METHODS, activation_scale, clip_weight
from infergen.quant.schemes import apply_weight_scheme
from infergen.quant.smoothing import DenseModel, smooth


@dataclass
class CalibrationResult:
    chosen: dict[str, torch.Tensor] = field(default_factory=dict)
    tokens: int = 0  # calibration tokens per pass
    passes: int = 0
    dense: DenseModel | None = None  # the rewritten fp32 weights, when asked to keep them


def rewrites_weights(config: QuantConfig) -> bool:
    """Whether `config` changes fp32 weights before quantizing them (so they load in fp32)."""
    clips = config.weights is not None and CLIP_METHODS.get(config.calibration).clips_weights
    return config.smoothing is not None or clips


def _linears(model):
    return [(n, m) for n, m in model.named_modules() if isinstance(m, Linear)]


def _norms(model):
    return {n: m.weight for n, m in model.named_modules() if isinstance(m, RMSNorm)}


def quantize_calibrated(
    run: Callable[[list[int]], object],
    model,
    config: QuantConfig,
    sequences: list[list[int]],
    progress: bool = True,
    keep_dense: bool = False,
) -> CalibrationResult:
    """Steps 1–3 of the module docstring on `model` (loaded: in fp32 when `rewrites_weights`),
    calibrated on `sequences` (quant/calibrate.py: calibration_sequences); `run(tokens)` runs
    one teacher-forced pass of the model (engine/scoring.py: scratch_runner)."""
    result = CalibrationResult()
    act = ACTIVATION_SCHEMES.get(config.activations).act if config.activations else None
    result.tokens = sum(len(s) for s in sequences)
    stats = None
    if rewrites_weights(config):
        stats = collect_statistics(run, model, sequences, progress)
        result.passes += 1
        dense = _rewrite(model, config, act, stats, result.chosen, progress)
        result.dense = dense if keep_dense else None
    if act is not None:
        apply_activation_scheme(model, config.activations, keep=config.keep)
        if act.static:
            quantizers = {n: m.act for n, m in _linears(model) if m.act is not None}
            for _, m in _linears(model):
                m.act = None  # inputs as the quantized model makes them, not yet quantized
            stats = collect_statistics(run, model, sequences, progress)
            result.passes += 1
            for n, m in _linears(model):
                if n in quantizers:
                    m.act = quantizers[n]
                    m.act.scale = activation_scale(config.calibration, stats[n], act)
                    result.chosen[f"{n}.input_scale"] = m.act.scale
    if config.calibration_stats and stats is not None:
        metadata = {
            "weights": config.weights,
            "activations": config.activations,
            "calibration": config.calibration,
            "smoothing": config.smoothing,
            "passes": result.passes,
        }
        save_statistics(config.calibration_stats, stats, result.chosen, metadata)
    return result


def _rewrite(model, config, act, stats, chosen, progress) -> DenseModel:
    """Smooth and clip the fp32 weights, then quantize every projection from them."""
    linears = _linears(model)
    dense = DenseModel(
        weights={n: m.dense_weight().float().clone() for n, m in linears},
        biases={n: m.bias.float().clone() if m.bias is not None else None for n, m in linears},
        norms=_norms(model),
    )
    energy = {n: stats[n].sq_mean for n, _ in linears}
    if config.smoothing is not None:
        scales = smooth(model, dense, stats, config.smoothing, config.weights, act, progress)
        for n, (s, a) in scales.items():
            chosen[f"{n}.smooth_scale"] = s
            chosen[f"{n}.smooth_alpha"] = torch.tensor([a])
            energy[n] = energy[n] / s.square()  # the input is now x / s
    quantized = []
    if config.weights is not None:
        quantized = apply_weight_scheme(model, config.weights, keep=config.keep)
    if CLIP_METHODS.get(config.calibration).clips_weights:
        for n in quantized:
            dense.weights[n], ratio = clip_weight(dense.weights[n], config.weights, energy[n])
            chosen[f"{n}.clip_ratio"] = ratio.flatten()
    for n, m in linears:
        m.load(dense.weights[n].to(m.dtype), dense.biases[n])
    return dense
