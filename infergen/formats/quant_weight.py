"""A checkpoint weight stored quantized (a compressed-tensors checkpoint, io/compressed_tensors.py):
codes and scales in the layout of one of our quantized backends, handed to it as they are.

`fmt` names the LINEAR_BACKENDS row: "int8" / "fp8_e4m3" (codes [out, in], one fp32 scale per
output channel in fields[0]) or a group format of ops/linear_grouped.py ("int4", "int4_asym",
"mxfp4", "nvfp4": codes [out, in] unpacked, header fields [out, in / 32], NVFP4's global
scale in `scalar`). `ops.stored_weights.dense` decodes it with that backend.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def _e4m3_nan(t: torch.Tensor) -> int:
    """E4M3FN bytes: S.1111.111 is NaN (there is no infinity)."""
    return int(((t & 0x7F) == 0x7F).sum())


def _e8m0_nan(t: torch.Tensor) -> int:
    """E8M0 bytes: 0xFF is NaN."""
    return int((t == 0xFF).sum())


# format → NaN counters of its byte scale fields and of its codes (None: cannot hold NaN)
NAN_BYTES = {
    "nvfp4": (_e4m3_nan, None),
    "mxfp4": (_e8m0_nan, None),
    "fp8_e4m3": (None, _e4m3_nan),
}


@dataclass(frozen=True)
class QuantWeight:
    fmt: str
    codes: torch.Tensor  # uint8 [out, in], one code per weight
    fields: tuple[torch.Tensor, ...]  # per output row (int8 / FP8) or per row and group of 32
    scalar: float | None = None
    shape: tuple[int, int] = (0, 0)

    def nonfinite(self) -> int:
        """How many stored values decode to NaN / ±Inf: float scales (and NVFP4's global), FP8
        scale bytes, E8M0 NaN exponents, FP8 NaN codes (the load-time check; no decoding of
        the whole weight)."""
        bad = 0 if self.scalar is None or torch.isfinite(torch.tensor(self.scalar)) else 1
        scale_nan, code_nan = NAN_BYTES.get(self.fmt, (None, None))
        for field in self.fields:
            if field.is_floating_point():
                bad += int((~torch.isfinite(field)).sum())
            elif scale_nan is not None:
                bad += scale_nan(field)
        if code_nan is not None:
            bad += code_nan(self.codes)
        return bad

    @staticmethod
    def cat(parts: list[QuantWeight]) -> QuantWeight | None:
        """Concatenated along `out` (fused q/k/v, gate/up), or None when the parts cannot share
        one prepared weight (different formats, or different NVFP4 global scales)."""
        first = parts[0]
        if any(p.fmt != first.fmt or p.scalar != first.scalar for p in parts):
            return None
        fields = tuple(torch.cat(f) for f in zip(*(p.fields for p in parts), strict=True))
        rows = sum(p.shape[0] for p in parts)
        codes = torch.cat([p.codes for p in parts])
        return QuantWeight(first.fmt, codes, fields, first.scalar, (rows, first.shape[1]))
