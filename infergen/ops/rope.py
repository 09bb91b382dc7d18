"""Rotary position embedding (half-split / NeoX layout, as Hugging Face Llama/Qwen/Mistral).

For each head vector x = [x1, x2] (halves of head_dim) at position p:
    y = [x1·cos − x2·sin, x2·cos + x1·sin],  angle = p · inv_freq[j].
inv_freq[j] = theta^(−2j/d), changed by the scaling rule ("linear", "llama3").
Bytes moved: read/write q and k once, plus a [tokens, d/2] cos/sin gather.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from infergen import profiling
from infergen.config import ModelConfig, RopeScaling
from infergen.kernels.build import I, L, P, kernel
from infergen.profiling import Cost
from infergen.registry import Registry


def inv_frequencies(head_dim: int, theta: float, scaling: RopeScaling) -> torch.Tensor:
    """[head_dim/2] fp64 inverse frequencies after the scaling rule."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    if scaling.rope_type == "llama3":
        # Llama-3.1: keep high frequencies, divide low ones by `factor`, blend in between.
        old_len = scaling.original_max_position_embeddings
        low_wavelen = old_len / scaling.low_freq_factor
        high_wavelen = old_len / scaling.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        smooth = (old_len / wavelen - scaling.low_freq_factor) / (
            scaling.high_freq_factor - scaling.low_freq_factor
        )
        blended = (1 - smooth) * inv_freq / scaling.factor + smooth * inv_freq
        out = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
        middle = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(middle, blended, out)
    if scaling.rope_type == "yarn":
        return _yarn(head_dim, theta, scaling)
    return inv_freq


def _yarn(head_dim: int, theta: float, scaling: RopeScaling) -> torch.Tensor:
    """YaRN: dimensions that rotate more than beta_fast times over the original context keep
    their frequency, those under beta_slow are divided by `factor`, a linear ramp between."""

    def dim_at(rotations: float) -> float:  # the dimension that rotates `rotations` times
        turns = scaling.original_max_position_embeddings / (rotations * 2 * math.pi)
        return head_dim * math.log(turns) / (2 * math.log(theta))

    low, high = dim_at(scaling.beta_fast), dim_at(scaling.beta_slow)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    high = high + 0.001 if low == high else high
    # fp32 as Hugging Face computes it
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    freqs = theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    keep = 1 - ramp  # 1: the original frequency (extrapolate), 0: divided by factor
    return (1 / (scaling.factor * freqs)) * (1 - keep) + (1 / freqs) * keep


def cos_sin_cache(
    config: ModelConfig, max_positions: int | None = None, local: bool = False
) -> torch.Tensor:
    """[positions, rotary_dim] fp32: cos in the first half, sin in the second. `local`: the
    sliding layers' table (their own base, no scaling: Gemma-3's rope_local_base_freq)."""
    positions = max_positions or config.max_position_embeddings
    if local:
        inv_freq = inv_frequencies(config.rotary_dim, config.rope_local_theta, RopeScaling())
    else:
        inv_freq = inv_frequencies(config.rotary_dim, config.rope_theta, config.rope_scaling)
    # Same rounding path as Hugging Face: fp32 inv_freq, fp32 outer product.
    angles = torch.outer(torch.arange(positions, dtype=torch.float32), inv_freq.float())
    table = torch.cat([angles.cos(), angles.sin()], dim=-1)
    factor = 1.0 if local else config.rope_scaling.attention_factor
    return table if factor == 1.0 else table * factor


def cost(tokens: int, heads: int, dim: int, element_bytes: int) -> Cost:
    """FLOPs: two products and a sum per element; bytes: x read and written, the step's cos /
    sin rows (fp32) read."""
    elements = tokens * heads * dim
    return Cost(3 * elements, 2 * elements * element_bytes + tokens * dim * 4)


def region(x: torch.Tensor):
    """The profiler's region of one call on x [tokens, heads, dim] (infergen/profiling.py)."""
    tokens, heads, dim = x.shape
    return profiling.region("rope", f"h{heads} d{dim}", cost(tokens, heads, dim, x.element_size()))


def reference(x: torch.Tensor, positions: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
    """x [tokens, heads, head_dim], positions [tokens] → rotated copy."""
    half = x.shape[-1] // 2
    cos, sin = cache[positions].unsqueeze(1).split(half, dim=-1)  # [tokens, 1, half]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class RopeInputs:
    """What every layer's RoPE needs in one step: positions [tokens] and the cos/sin cache.
    The torch backend's per-step tables (cos2, sin2) are built on first use and shared."""

    def __init__(self, positions: torch.Tensor, cache: torch.Tensor):
        self.positions = positions
        self.cache = cache
        self._tables: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos2, sin2), each [tokens, 1, head_dim]: cos2 = [cos, cos], sin2 = [−sin, sin],
        so that y = x·cos2 + swap_halves(x)·sin2."""
        if self._tables is None:
            half = self.cache.shape[-1] // 2
            cos, sin = self.cache[self.positions].unsqueeze(1).split(half, dim=-1)
            self._tables = torch.cat([cos, cos], dim=-1), torch.cat([-sin, sin], dim=-1)
        return self._tables


RopeFn = Callable[[torch.Tensor, RopeInputs], torch.Tensor]
ROPE_BACKENDS: Registry[RopeFn] = Registry("rope backend")


@ROPE_BACKENDS.decorator("torch")
def apply_rope(x: torch.Tensor, rope: RopeInputs) -> torch.Tensor:
    """Rotate x [tokens, heads, d] (q and k may be rotated as one tensor); returns a new
    tensor (the native backend rotates in place and returns x). The tables are cast to x's
    dtype first, as transformers does: a bf16 / fp16 engine rotates in its own dtype."""
    cos2, sin2 = rope.tables
    if cos2.dtype != x.dtype:
        cos2, sin2 = cos2.to(x.dtype), sin2.to(x.dtype)
    half = x.shape[-1] // 2
    swapped = torch.cat([x[..., half:], x[..., :half]], dim=-1)
    return torch.addcmul(x * cos2, swapped, sin2)


@ROPE_BACKENDS.decorator("native")
def apply_rope_native(x: torch.Tensor, rope: RopeInputs) -> torch.Tensor:
    fn = kernel("rope_f32", P, P, P, L, L, L, L, I)
    tokens, heads, dim = x.shape
    dense_rows = x.stride(2) == 1 and x.stride(1) == dim
    if fn is None or x.dtype != torch.float32 or not dense_rows or rope.cache.dtype != x.dtype:
        return apply_rope(x, rope)
    fn(
        x.data_ptr(),
        rope.positions.data_ptr(),
        rope.cache.data_ptr(),
        tokens,
        heads,
        dim,
        x.stride(0),
        torch.get_num_threads(),
    )
    return x
