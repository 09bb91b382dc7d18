"""QuantizedTensor: codes + raw scale codes + what is needed to decode them; safetensors I/O.

- `codes` uint8 [..., n] with the quantized axis last (4-bit codes two per byte, 2-bit four
  per byte: formats/pack.py);
- `scales`: E8M0 bytes (MX), E4M3 bytes (NVFP4), fp32 (FP8 per-tensor, integer formats),
  one per block: [..., n / block];
- `zero_points`: per group, uint8 zero points or (KIVI-style int2) fp32 minimums; else None;
- `global_scale`: fp32 scalar (NVFP4) or None;
- `shape`, `dtype` of the original tensor, `axis` it was blocked along, `block_size`
  (formats/spec.py: > 0 a group, 0 per tensor, -1 per channel), `scale_rule`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

_DTYPES = {str(d): d for d in (torch.float32, torch.float16, torch.bfloat16, torch.float64)}
_TENSORS = ("codes", "scales", "zero_points", "global_scale")


@dataclass
class QuantizedTensor:
    format: str
    codes: torch.Tensor
    scales: torch.Tensor
    zero_points: torch.Tensor | None
    global_scale: torch.Tensor | None
    shape: tuple[int, ...]
    dtype: torch.dtype
    axis: int
    block_size: int
    scale_rule: str | None = None

    @property
    def nbytes(self) -> int:
        """Bytes stored (codes, scales, zero points, global scale)."""
        return sum(t.numel() * t.element_size() for t in self._tensors().values())

    def _tensors(self) -> dict[str, torch.Tensor]:
        return {n: getattr(self, n) for n in _TENSORS if getattr(self, n) is not None}

    def _metadata(self) -> dict[str, str]:
        return {
            "format": self.format,
            "shape": json.dumps(list(self.shape)),
            "dtype": str(self.dtype),
            "axis": str(self.axis),
            "block_size": str(self.block_size),
            "scale_rule": self.scale_rule or "",
        }

    def save(self, path: str | Path) -> None:
        from safetensors.torch import save_file

        tensors = {n: t.contiguous() for n, t in self._tensors().items()}
        save_file(tensors, str(path), metadata=self._metadata())

    @classmethod
    def load(cls, path: str | Path) -> QuantizedTensor:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {n: f.get_tensor(n) for n in f.keys()}
        missing = [k for k in ("format", "shape", "dtype", "axis", "block_size") if k not in meta]
        if missing or "codes" not in tensors or "scales" not in tensors:
            raise ValueError(
                f"{path}: not a saved QuantizedTensor (missing metadata {missing} or the "
                f"codes/scales tensors; found tensors {sorted(tensors)})"
            )
        if meta["dtype"] not in _DTYPES:
            raise ValueError(f"{path}: dtype {meta['dtype']!r}, expected one of {list(_DTYPES)}")
        return cls(
            format=meta["format"],
            codes=tensors["codes"],
            scales=tensors["scales"],
            zero_points=tensors.get("zero_points"),
            global_scale=tensors.get("global_scale"),
            shape=tuple(json.loads(meta["shape"])),
            dtype=_DTYPES[meta["dtype"]],
            axis=int(meta["axis"]),
            block_size=int(meta["block_size"]),
            scale_rule=meta.get("scale_rule") or None,
        )
