"""Load-time check of quantized projections: each projection quantized at load runs a short
probe batch against its own full-precision weight, and a projection whose error is far above
its scheme's expected level falls back to full precision (or, with on_bad_layer="refuse", the
engine refuses to start and names it).

The error is the mean over output channels of |y_c − ŷ_c| / |y_c| on PROBE_TOKENS Gaussian
inputs: per channel, so that one outlier weight cannot hide the loss of a channel's others
(per-tensor FP8 with a 10^4 outlier flushes the rest of the tensor to zero, yet the outlier's
channel dominates a tensor-wide norm). Expected levels (WeightScheme.expected_error) are this
error on Gaussian weights, measured once; the threshold is FALLBACK_FACTOR times it.
"""

from __future__ import annotations

import torch

from infergen.errors import ConfigError

PROBE_TOKENS = 16
FALLBACK_FACTOR = 4.0


def probe_error(backend, prepared: torch.Tensor, weight: torch.Tensor) -> float:
    """Mean per-channel relative error of backend's product against weight's (fp32)."""
    out_features, in_features = weight.shape
    gen = torch.Generator().manual_seed(in_features)
    x = torch.randn(PROBE_TOKENS, in_features, generator=gen).to(weight.device)
    ref = x @ weight.float().t()
    got = backend.apply(x, prepared, None, out_features)
    norms = ref.norm(dim=0)
    live = norms > 0  # an all-zero channel has nothing to lose
    if not bool(live.any()):
        return 0.0
    errors = (got - ref).norm(dim=0)[live] / norms[live]
    error = errors.mean().item()
    return error if error == error else float("inf")  # NaN (non-finite product) → inf


def check_kv_scales(scales: torch.Tensor, where: str) -> None:
    """KV cache scales must be finite, positive and not all 1.0 (an uncalibrated default)."""
    bad = ~torch.isfinite(scales) | (scales <= 0)
    if bool(bad.any()):
        raise ConfigError(
            "KV cache scales are not usable",
            where=where,
            found=f"{int(bad.sum())} of {scales.numel()} non-finite or not positive",
            expected="finite positive scales (calibration text the model can run)",
        )
    if bool((scales == 1).all()):
        raise ConfigError(
            "KV cache scales are all 1.0: uncalibrated",
            where=where,
            expected="scales from calibration (amax / the format's largest code)",
        )
