"""Mamba2 selective state-space mixer (Mamba2 models; the SSM half of Falcon-H1 hybrid layers).

For tokens x [T, hidden] of a packed varlen batch (continuous batching: prefill chunks and
decode steps mixed), with I = heads·head_dim and G·N = groups·state:

    z | xBC | dt = in_proj(x)                     [T, I] | [T, I + 2·G·N] | [T, heads]
    xBC          = silu(causal_conv1d(xBC))       ops/causal_conv1d.py, state "conv"
    x' | B | C   = xBC                            [T, heads, head_dim] | [T, G, N] | [T, G, N]
    y            = ssd_scan(x', dt, A = −exp(A_log), B, C, D; softplus(dt + dt_bias), clamped
                   to time_step_limit)            ops/ssd_scan.py, state "ssm"
    y            = gated_rms_norm(y, z)           per group of I/G channels (below)
    out          = out_proj(y)                    [T, hidden]

Gated RMSNorm, n(v) = v / sqrt(mean(v², over each of the G groups) + eps) · weight:
    norm after gate  (Mamba2; Falcon-H1 with mamba_norm_before_gate false): n(y · silu(z))
    norm before gate (Falcon-H1 default):                                    n(y) · silu(z)
    no norm          (Falcon-H1 with mamba_rms_norm false):                  y · silu(z)

Falcon-H1's µP multipliers inside the mixer, in_proj(x · ssm_in_multiplier) · mup, where mup
scales the z, x, B, C, dt column blocks by ssm_multipliers[0..4], are folded into in_proj's
weight (and mup into its bias) at load time. ssm_out_multiplier is applied by the decoder layer
to this mixer's output, not here (as in Hugging Face).

Our layout: in_proj rows [z; xBC; dt] as in the checkpoint; conv weight [conv_dim, width];
A = −exp(A_log), D, dt_bias kept in fp32.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from infergen.config.mixers import SSMSpec
from infergen.errors import CheckpointError
from infergen.layers.linear import Linear
from infergen.ops.causal_conv1d import CAUSAL_CONV1D_BACKENDS
from infergen.ops.ssd_scan import SSD_SCAN_BACKENDS
from infergen.ops.stored_weights import dense


def gated_rms_norm(
    y: torch.Tensor,  # [tokens, I]
    gate: torch.Tensor,  # [tokens, I]
    weight: torch.Tensor | None,  # [I], None: no norm
    groups: int,
    eps: float,
    norm_before_gate: bool,
) -> torch.Tensor:
    """The gated RMSNorm of the module docstring, in fp32; returns y's dtype."""
    tokens, channels = y.shape
    y32, silu_gate = y.float(), F.silu(gate.float())
    if weight is None:
        return (y32 * silu_gate).to(y.dtype)
    if not norm_before_gate:
        y32 = y32 * silu_gate
    grouped = y32.view(tokens, groups, channels // groups)
    grouped = grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + eps)
    out = grouped.view(tokens, channels) * weight.float()
    if norm_before_gate:
        out = out * silu_gate
    return out.to(y.dtype)


class Mamba2Mixer(nn.Module):
    def __init__(
        self,
        spec: SSMSpec,
        dtype: torch.dtype,
        backend: str = "torch",  # the linear backend
        op_backend: str = "torch",  # the ssd_scan / causal_conv1d backend
    ):
        super().__init__()
        self.spec, self.dtype = spec, dtype
        s = spec
        self.in_proj = Linear(s.hidden_size, s.projection_size, s.in_proj_bias, dtype, backend)
        self.out_proj = Linear(s.intermediate_size, s.hidden_size, s.out_proj_bias, dtype, backend)
        f32 = torch.float32
        self.conv_weight = nn.Parameter(torch.zeros(s.conv_dim, s.conv_kernel, dtype=dtype), False)
        self.conv_bias = (
            nn.Parameter(torch.zeros(s.conv_dim, dtype=dtype), False) if s.conv_bias else None
        )
        self.A = nn.Parameter(-torch.ones(s.num_heads, dtype=f32), False)  # −exp(A_log)
        self.D = nn.Parameter(torch.ones(s.num_heads, dtype=f32), False)
        self.dt_bias = nn.Parameter(torch.zeros(s.num_heads, dtype=f32), False)
        self.norm_weight = (
            nn.Parameter(torch.ones(s.intermediate_size, dtype=dtype), False)
            if s.rms_norm
            else None
        )
        # a kernel set without its own row of an op ("triton") runs the torch row
        self.scan = SSD_SCAN_BACKENDS.get(op_backend, where="kernels", fallback="torch")
        self.conv = CAUSAL_CONV1D_BACKENDS.get(op_backend, where="kernels", fallback="torch")

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        """Per-sequence state shapes (the engine allocates [num_slots, *shape] of each)."""
        s = self.spec
        return {
            "conv": (s.conv_dim, s.conv_kernel - 1),
            "ssm": (s.num_heads, s.head_dim, s.state_size),
        }

    def state_bytes(self, dtype_bytes: int) -> int:
        """Bytes of one sequence's state (conv + ssm) at `dtype_bytes` per element."""
        return dtype_bytes * sum(math.prod(shape) for shape in self.state_shapes().values())

    def _scale_vector(self) -> torch.Tensor | None:
        """The µP scale of in_proj's rows (z, x, B, C, dt blocks), or None when all ones."""
        s = self.spec
        if all(m == 1.0 for m in s.proj_multipliers):
            return None
        gn = s.n_groups * s.state_size
        sizes = (s.intermediate_size, s.intermediate_size, gn, gn, s.num_heads)
        return torch.cat(
            [torch.full((n,), m) for n, m in zip(sizes, s.proj_multipliers, strict=True)]
        )

    def load(self, get: Callable[[str], torch.Tensor], prefix: str) -> None:
        """`get(name)` returns a checkpoint tensor by Hugging Face name, e.g. prefix
        "backbone.layers.0.mixer." (Mamba2) or "model.layers.0.mamba." (Falcon-H1)."""
        s = self.spec

        def tensor(name: str, shape: tuple[int, ...]) -> torch.Tensor:
            value = get(prefix + name)
            if tuple(value.shape) != shape:
                raise CheckpointError(
                    "SSM tensor has the wrong shape", where=prefix + name,
                    found=tuple(value.shape), expected=shape,
                )  # fmt: skip
            return value

        weight = get(prefix + "in_proj.weight")
        bias = get(prefix + "in_proj.bias") if s.in_proj_bias else None
        scale = self._scale_vector()
        if scale is not None or s.in_multiplier != 1.0:  # fold the µP multipliers
            weight = dense(weight)
            rows = scale if scale is not None else torch.ones(s.projection_size)
            weight = weight.float() * (rows * s.in_multiplier)[:, None]
            bias = bias.float() * rows if bias is not None else None
        self.in_proj.load(weight, bias)
        self.out_proj.load(
            get(prefix + "out_proj.weight"),
            get(prefix + "out_proj.bias") if s.out_proj_bias else None,
        )
        conv = tensor("conv1d.weight", (s.conv_dim, 1, s.conv_kernel))
        self.conv_weight.data = conv[:, 0].to(self.dtype).contiguous()
        if self.conv_bias is not None:
            self.conv_bias.data = tensor("conv1d.bias", (s.conv_dim,)).to(self.dtype)
        heads = (s.num_heads,)
        self.A.data = -torch.exp(tensor("A_log", heads).float())
        self.D.data = tensor("D", heads).float()
        self.dt_bias.data = tensor("dt_bias", heads).float()
        if self.norm_weight is not None:
            self.norm_weight.data = tensor("norm.weight", (s.intermediate_size,)).to(self.dtype)

    def forward(
        self,
        x: torch.Tensor,  # [tokens, hidden]
        states: dict[
            str, torch.Tensor
        ],  # "conv" [slots, conv_dim, width-1], "ssm" [slots, H, P, N]
        query_start_loc: list[int],  # sequence i owns rows [i]:[i+1]
        state_slots: torch.Tensor,  # [seqs] int64
        fresh: torch.Tensor,  # [seqs] bool: start from zero state
    ) -> torch.Tensor:  # [tokens, hidden]
        s = self.spec
        tokens = x.shape[0]
        gn = s.n_groups * s.state_size
        zxbcdt = self.in_proj(x.to(self.dtype))  # [T, projection_size]
        z, xbc, dt = zxbcdt.split([s.intermediate_size, s.conv_dim, s.num_heads], dim=-1)
        xbc = self.conv(
            xbc, self.conv_weight, self.conv_bias, states["conv"], query_start_loc,
            state_slots, fresh, activation=s.activation,
        )  # fmt: skip  # [T, conv_dim]
        xs, B, C = xbc.split([s.intermediate_size, gn, gn], dim=-1)
        xs = xs.reshape(tokens, s.num_heads, s.head_dim)
        B = B.reshape(tokens, s.n_groups, s.state_size)
        C = C.reshape(tokens, s.n_groups, s.state_size)
        y = self.scan(
            xs, dt, self.A, B, C, self.D, states["ssm"], query_start_loc, state_slots, fresh,
            chunk_size=s.chunk_size, dt_bias=self.dt_bias, dt_softplus=True,
            dt_limit=s.time_step_limit,
        )  # fmt: skip  # [T, H, P]
        y = y.reshape(tokens, s.intermediate_size)
        y = gated_rms_norm(y, z, self.norm_weight, s.n_groups, s.norm_eps, s.norm_before_gate)
        return self.out_proj(y)
