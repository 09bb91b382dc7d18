"""Quantized inference: weight schemes (which projections run on which quantized format)."""

from infergen.quant.schemes import WEIGHT_SCHEMES, WeightScheme, apply_weight_scheme

__all__ = ["WEIGHT_SCHEMES", "WeightScheme", "apply_weight_scheme"]
