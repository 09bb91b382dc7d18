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
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from infergen.errors import CheckpointError, ConfigError
from infergen.layers.linear import Linear
from infergen.ops.causal_conv1d import CAUSAL_CONV1D_BACKENDS
from infergen.ops.ssd_scan import SSD_SCAN_BACKENDS
from infergen.registry import Registry


@dataclass(frozen=True)
class SSMSpec:
    """Shapes and options of one Mamba2 mixer (see the module docstring)."""

    hidden_size: int
    num_heads: int
    head_dim: int
    state_size: int
    n_groups: int
    conv_kernel: int
    chunk_size: int
    norm_eps: float
    in_proj_bias: bool = False
    out_proj_bias: bool = False
    conv_bias: bool = True
    rms_norm: bool = True  # the gated RMSNorm is present (else y · silu(z))
    norm_before_gate: bool = False
    time_step_limit: tuple[float, float] = (0.0, math.inf)
    in_multiplier: float = 1.0  # Falcon-H1 ssm_in_multiplier
    proj_multipliers: tuple[float, ...] = (1.0, 1.0, 1.0, 1.0, 1.0)  # z, x, B, C, dt blocks
    activation: str = "silu"

    def __post_init__(self) -> None:
        where = "SSMSpec"
        for name in ("hidden_size", "num_heads", "head_dim", "state_size", "n_groups"):
            if getattr(self, name) < 1:
                raise ConfigError(
                    f"{name} must be positive", where=where, found=getattr(self, name)
                )
        if self.num_heads % self.n_groups:
            raise ConfigError(
                "the SSM heads must split evenly into groups",
                where=where,
                found=f"num_heads={self.num_heads}, n_groups={self.n_groups}",
            )
        if self.conv_kernel < 1 or self.chunk_size < 1:
            raise ConfigError(
                "conv_kernel and chunk_size must be positive",
                where=where,
                found=(self.conv_kernel, self.chunk_size),
            )
        if len(self.proj_multipliers) != 5:
            raise ConfigError(
                "ssm_multipliers needs one value per in_proj block (z, x, B, C, dt)",
                where=where,
                found=self.proj_multipliers,
            )
        if self.activation != "silu":
            raise ConfigError("unsupported SSM activation", where=where, found=self.activation,
                              expected="silu")  # fmt: skip

    @property
    def intermediate_size(self) -> int:  # I: channels of x and z
        return self.num_heads * self.head_dim

    @property
    def conv_dim(self) -> int:  # channels through the conv: x, B, C
        return self.intermediate_size + 2 * self.n_groups * self.state_size

    @property
    def projection_size(self) -> int:  # in_proj rows: z, xBC, dt
        return self.intermediate_size + self.conv_dim + self.num_heads

    @staticmethod
    def from_hf_config(cfg: dict) -> SSMSpec:
        """Read a Hugging Face config.json (mamba2, falcon_h1)."""
        model_type = cfg.get("model_type", "mamba2")
        return SSM_SPEC_READERS.get(model_type, where="config.json model_type")(cfg)


SSM_SPEC_READERS: Registry[Callable[[dict], SSMSpec]] = Registry("SSM config reader")


def _time_step_limit(cfg: dict) -> tuple[float, float]:
    limit = cfg.get("time_step_limit") or (0.0, math.inf)
    if len(limit) != 2:
        raise ConfigError("time_step_limit must be [min, max]", where="config.json", found=limit)
    return float(limit[0]), float(limit[1])


@SSM_SPEC_READERS.decorator("mamba2")
def _mamba2_spec(cfg: dict) -> SSMSpec:
    """Defaults are transformers' Mamba2Config defaults. `rms_norm` / `norm_before_gate` are
    honoured when present (mamba_ssm's Mamba2; transformers always norms after the gate)."""
    if "hidden_size" not in cfg:
        raise ConfigError("missing hidden_size", where="config.json (mamba2)")
    spec = SSMSpec(
        hidden_size=cfg["hidden_size"],
        num_heads=cfg.get("num_heads", 128),
        head_dim=cfg.get("head_dim", 64),
        state_size=cfg.get("state_size", 128),
        n_groups=cfg.get("n_groups", 8),
        conv_kernel=cfg.get("conv_kernel", 4),
        chunk_size=cfg.get("chunk_size", 256),
        norm_eps=cfg.get("layer_norm_epsilon", cfg.get("rms_norm_eps", 1e-5)),
        in_proj_bias=cfg.get("use_bias", False),
        out_proj_bias=cfg.get("use_bias", False),
        conv_bias=cfg.get("use_conv_bias", True),
        rms_norm=cfg.get("rms_norm", True),
        norm_before_gate=cfg.get("norm_before_gate", False),
        time_step_limit=_time_step_limit(cfg),
        activation=cfg.get("hidden_act", "silu"),
    )
    expand = cfg.get("expand", 2)
    if spec.intermediate_size != expand * spec.hidden_size:
        raise ConfigError(
            "num_heads · head_dim must equal expand · hidden_size",
            where="config.json (mamba2)",
            found=f"{spec.num_heads}·{spec.head_dim} vs {expand}·{spec.hidden_size}",
        )
    return spec


@SSM_SPEC_READERS.decorator("falcon_h1")
def _falcon_h1_spec(cfg: dict) -> SSMSpec:
    """Defaults are transformers' FalconH1Config defaults. in_proj's bias is mamba_proj_bias,
    out_proj's is projectors_bias; the norm eps is rms_norm_eps."""
    hidden = cfg["hidden_size"]
    d_ssm = cfg.get("mamba_d_ssm", 1024)
    if d_ssm is None:
        d_ssm = cfg.get("mamba_expand", 2) * hidden
    heads = cfg.get("mamba_n_heads", 128)
    head_dim = cfg.get("mamba_d_head", "auto")
    if head_dim in (None, "auto"):
        head_dim = d_ssm // heads
    if heads * head_dim != d_ssm:
        raise ConfigError(
            "mamba_n_heads · mamba_d_head must equal mamba_d_ssm",
            where="config.json (falcon_h1)",
            found=f"{heads}·{head_dim} vs {d_ssm}",
        )
    return SSMSpec(
        hidden_size=hidden,
        num_heads=heads,
        head_dim=head_dim,
        state_size=cfg.get("mamba_d_state", 256),
        n_groups=cfg.get("mamba_n_groups", 1),
        conv_kernel=cfg.get("mamba_d_conv", 4),
        chunk_size=cfg.get("mamba_chunk_size", 256),
        norm_eps=cfg.get("rms_norm_eps", 1e-5),
        in_proj_bias=cfg.get("mamba_proj_bias", False),
        out_proj_bias=cfg.get("projectors_bias", False),
        conv_bias=cfg.get("mamba_conv_bias", True),
        rms_norm=cfg.get("mamba_rms_norm", False),
        norm_before_gate=cfg.get("mamba_norm_before_gate", True),
        time_step_limit=_time_step_limit(cfg),
        in_multiplier=float(cfg.get("ssm_in_multiplier", 1.0) or 1.0),
        proj_multipliers=tuple(float(m) for m in (cfg.get("ssm_multipliers") or (1.0,) * 5)),
        activation=cfg.get("hidden_act", "silu"),
    )


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
        self.scan = SSD_SCAN_BACKENDS.get(op_backend, where="kernels")
        self.conv = CAUSAL_CONV1D_BACKENDS.get(op_backend, where="kernels")

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
            weight = weight if isinstance(weight, torch.Tensor) else weight.dequantize()
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
