"""Gated DeltaNet: the linear-attention token mixer of Qwen3-Next (its "linear_attention"
layers), over a packed varlen batch with a conv state and a recurrent state per sequence.

    [q | k | v | z | b | a] = x · W_inᵀ                     (one fused projection)
    q, k, v = split(silu(causal_conv1d([q | k | v])))       (per-sequence conv state)
    β = sigmoid(b);  g = −exp(A_log) · softplus(a + dt_bias)   (fp32; g ≤ 0 is the log decay)
    o = gated_delta_rule(q, k, v, g, β)                      (per-sequence recurrent state)
    y = W_out · (rms_norm(o) · w_norm · silu(z))             (per value head, norm before gate)

Our layout differs from the checkpoint: Hugging Face's in_proj_qkvz / in_proj_ba interleave
q, k, v, z (and b, a) per key-head group; `load` de-interleaves them into one projection whose
rows are [q (Hk·Dk) | k (Hk·Dk) | v (Hv·Dv) | z (Hv·Dv) | b (Hv) | a (Hv)], so the conv input
is a contiguous column range and v/z heads come out in value-head order. A_log is kept as
decay_rate = exp(A_log) (fp32); conv1d.weight [C, 1, W] as [C, W]. The conv state holds the last
W-1 inputs (HF's cache holds W columns; the oldest is never read).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from infergen.config.mixers import DeltaNetSpec
from infergen.errors import CheckpointError
from infergen.layers.linear import Linear
from infergen.ops.causal_conv1d import CAUSAL_CONV1D_BACKENDS
from infergen.ops.gated_delta_rule import GATED_DELTA_RULE_BACKENDS
from infergen.ops.rms_norm import RMS_NORM_BACKENDS


class GatedDeltaNet(nn.Module):
    """The Qwen3-Next linear-attention mixer: x [tokens, hidden] → [tokens, hidden]."""

    def __init__(
        self,
        spec: DeltaNetSpec,
        dtype: torch.dtype = torch.float32,
        linear_backend: str = "torch",
        conv_backend: str = "torch",
        rule_backend: str = "torch",
        norm_backend: str = "torch",
    ) -> None:
        super().__init__()
        self.spec, self.dtype = spec, dtype
        s = spec
        in_features = s.conv_dim + s.value_dim + 2 * s.num_v_heads
        self.in_proj = Linear(s.hidden_size, in_features, False, dtype, linear_backend)
        self.out_proj = Linear(s.value_dim, s.hidden_size, False, dtype, linear_backend)
        self.conv_weight = nn.Parameter(torch.zeros(s.conv_dim, s.conv_width, dtype=dtype), False)
        # decay rate exp(A_log) and dt_bias per value head, in fp32 (as HF computes g)
        self.decay_rate = nn.Parameter(torch.ones(s.num_v_heads), False)
        self.dt_bias = nn.Parameter(torch.zeros(s.num_v_heads), False)
        self.norm_weight = nn.Parameter(torch.ones(s.v_head_dim, dtype=dtype), False)
        self.conv = CAUSAL_CONV1D_BACKENDS.get(conv_backend, where="kernels", fallback="torch")
        self.rule = GATED_DELTA_RULE_BACKENDS.get(rule_backend, where="kernels", fallback="torch")
        self.norm = RMS_NORM_BACKENDS.get(norm_backend, where="kernels", fallback="torch")

    # ---- state -----------------------------------------------------------------------------

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        """Per-sequence state shapes: the conv's last width-1 inputs, the delta-rule state."""
        s = self.spec
        return {
            "conv": (s.conv_dim, s.conv_width - 1),
            "recurrent": (s.num_v_heads, s.k_head_dim, s.v_head_dim),
        }

    def state_dtypes(self, dtype: torch.dtype | None = None) -> dict[str, torch.dtype]:
        """Recommended state dtypes: the conv state in the activation dtype, the recurrent
        state in fp32 (it accumulates over the whole sequence; HF keeps it in fp32 too)."""
        return {"conv": dtype or self.dtype, "recurrent": torch.float32}

    def state_bytes(self, dtype_bytes: int, recurrent_dtype_bytes: int | None = None) -> int:
        """Bytes of one sequence's state (`recurrent_dtype_bytes` defaults to dtype_bytes)."""
        shapes = self.state_shapes()
        rec_bytes = dtype_bytes if recurrent_dtype_bytes is None else recurrent_dtype_bytes
        return math.prod(shapes["conv"]) * dtype_bytes + math.prod(shapes["recurrent"]) * rec_bytes

    def allocate_states(
        self, num_slots: int, device: torch.device | str = "cpu"
    ) -> dict[str, torch.Tensor]:
        """Zeroed states {name: [num_slots, *shape]} in the recommended dtypes."""
        dtypes = self.state_dtypes()
        return {
            name: torch.zeros(num_slots, *shape, dtype=dtypes[name], device=device)
            for name, shape in self.state_shapes().items()
        }

    # ---- weights ---------------------------------------------------------------------------

    def load(self, get: Callable[[str], torch.Tensor], prefix: str) -> None:
        """Take the Hugging Face tensors `prefix + name` (e.g. prefix
        "model.layers.0.linear_attn."): in_proj_qkvz, in_proj_ba, conv1d, A_log, dt_bias,
        norm, out_proj."""
        s = self.spec
        r = s.v_per_k

        def fetch(name: str, shape: tuple[int, ...]) -> torch.Tensor:
            tensor = get(prefix + name)
            if tuple(tensor.shape) != shape:
                raise CheckpointError(
                    "gated DeltaNet tensor has the wrong shape",
                    where=prefix + name,
                    found=tuple(tensor.shape),
                    expected=shape,
                )
            return tensor

        group = 2 * s.k_head_dim + 2 * r * s.v_head_dim
        qkvz = fetch("in_proj_qkvz.weight", (s.num_k_heads * group, s.hidden_size))
        ba = fetch("in_proj_ba.weight", (s.num_k_heads * 2 * r, s.hidden_size))
        # per key-head group: [q Dk | k Dk | v r·Dv | z r·Dv] and [b r | a r]
        q, k, v, z = qkvz.reshape(s.num_k_heads, group, s.hidden_size).split(
            [s.k_head_dim, s.k_head_dim, r * s.v_head_dim, r * s.v_head_dim], dim=1
        )
        b, a = ba.reshape(s.num_k_heads, 2 * r, s.hidden_size).split([r, r], dim=1)
        parts = [t.reshape(-1, s.hidden_size) for t in (q, k, v, z, b, a)]
        self.in_proj.load(torch.cat(parts, dim=0))
        self.out_proj.load(fetch("out_proj.weight", (s.hidden_size, s.value_dim)))
        conv = fetch("conv1d.weight", (s.conv_dim, 1, s.conv_width))
        with torch.no_grad():
            self.conv_weight.copy_(conv[:, 0])
            a_log = fetch("A_log", (s.num_v_heads,)).to(torch.float32)
            self.decay_rate.copy_(a_log.exp())
            self.dt_bias.copy_(fetch("dt_bias", (s.num_v_heads,)))
            self.norm_weight.copy_(fetch("norm.weight", (s.v_head_dim,)))

    # ---- forward ---------------------------------------------------------------------------

    def forward(
        self,
        x: torch.Tensor,  # [tokens, hidden]
        states: dict[
            str, torch.Tensor
        ],  # "conv" [slots, conv_dim, W-1], "recurrent" [slots, Hv, Dk, Dv]
        query_start_loc: list[int],
        state_slots: torch.Tensor,  # [seqs] int64, distinct
        fresh: torch.Tensor,  # [seqs] bool: the sequence starts here (its slot is ignored)
    ) -> torch.Tensor:
        """Sequences are rows query_start_loc[i]:query_start_loc[i+1] of x; the states of
        their slots are read (unless fresh) and overwritten in place. Returns [tokens, hidden]."""
        s = self.spec
        tokens = x.shape[0]
        proj = self.in_proj(x)  # [tokens, conv_dim + value_dim + 2·Hv]
        qkv, z, b, a = proj.split([s.conv_dim, s.value_dim, s.num_v_heads, s.num_v_heads], -1)
        qkv = self.conv(
            qkv,
            self.conv_weight,
            None,
            states["conv"],
            query_start_loc,
            state_slots,
            fresh,
            s.activation,
        )  # [tokens, conv_dim]
        q, k, v = qkv.split([s.key_dim, s.key_dim, s.value_dim], dim=-1)
        q = q.reshape(tokens, s.num_k_heads, s.k_head_dim)
        k = k.reshape(tokens, s.num_k_heads, s.k_head_dim)
        v = v.reshape(tokens, s.num_v_heads, s.v_head_dim)
        beta = b.sigmoid()  # [tokens, Hv]
        g = -self.decay_rate * F.softplus(a.float() + self.dt_bias)  # [tokens, Hv] fp32
        o = self.rule(
            q,
            k,
            v,
            g,
            beta,
            states["recurrent"],
            query_start_loc,
            state_slots,
            fresh,
            l2norm=True,
            chunk_size=s.chunk_size,
        )  # [tokens, Hv, Dv]
        # gated RMSNorm per value head: normalise (fp32 statistics), scale, then · silu(z)
        normed = self.norm(o.to(self.dtype), None, self.norm_weight, s.rms_norm_eps)
        gate = F.silu(z.reshape(tokens, s.num_v_heads, s.v_head_dim).float())
        mixed = (normed * gate).to(self.dtype)  # [tokens, Hv, Dv]
        return self.out_proj(mixed.reshape(tokens, s.value_dim))
