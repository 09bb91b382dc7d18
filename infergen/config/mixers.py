"""Typed specs of the recurrent token mixers, read from a Hugging Face config.json: Mamba2's
SSM (Mamba2, Falcon-H1; layers/ssm.py runs it) and Qwen3-Next's gated DeltaNet
(layers/linear_attention.py runs it)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from infergen.errors import ConfigError
from infergen.registry import Registry

# the gated delta rule's chunk length (ops/gated_delta_rule.py takes it from here)
DELTANET_CHUNK_SIZE = 64
# activations of the short causal conv in front of a recurrent mixer (ops/causal_conv1d.py)
CONV_ACTIVATIONS = (None, "silu")


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


@dataclass(frozen=True)
class DeltaNetSpec:
    """Shapes of one gated DeltaNet mixer."""

    hidden_size: int
    num_k_heads: int
    num_v_heads: int
    k_head_dim: int
    v_head_dim: int
    conv_width: int = 4
    rms_norm_eps: float = 1e-6
    activation: str = "silu"  # of the conv (Hugging Face reads config.hidden_act)
    chunk_size: int = DELTANET_CHUNK_SIZE

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_k_heads", "num_v_heads", "k_head_dim", "v_head_dim"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be ≥ 1", where="DeltaNetSpec", found=self)
        if self.conv_width < 1 or self.chunk_size < 1:
            raise ConfigError("conv_width and chunk_size must be ≥ 1", where="DeltaNetSpec")
        if self.num_v_heads % self.num_k_heads:
            raise ConfigError(
                "linear_num_value_heads must be a multiple of linear_num_key_heads",
                where="DeltaNetSpec",
                found=(self.num_v_heads, self.num_k_heads),
            )
        if self.activation not in CONV_ACTIVATIONS:
            raise ConfigError(
                "unsupported conv activation (hidden_act)",
                where="DeltaNetSpec",
                found=self.activation,
                expected=[a for a in CONV_ACTIVATIONS if a],
            )

    @property
    def key_dim(self) -> int:  # Hk·Dk
        return self.num_k_heads * self.k_head_dim

    @property
    def value_dim(self) -> int:  # Hv·Dv
        return self.num_v_heads * self.v_head_dim

    @property
    def conv_dim(self) -> int:  # channels of the conv: q, k, v
        return 2 * self.key_dim + self.value_dim

    @property
    def v_per_k(self) -> int:  # value heads sharing one query/key head
        return self.num_v_heads // self.num_k_heads

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any]) -> DeltaNetSpec:
        """From a Qwen3-Next config.json (a dict); a nested "text_config" is used if present."""
        cfg = cfg.get("text_config", cfg)
        keys = {
            "hidden_size": "hidden_size",
            "num_k_heads": "linear_num_key_heads",
            "num_v_heads": "linear_num_value_heads",
            "k_head_dim": "linear_key_head_dim",
            "v_head_dim": "linear_value_head_dim",
            "conv_width": "linear_conv_kernel_dim",
        }
        missing = [hf for hf in keys.values() if hf not in cfg]
        if missing:
            raise ConfigError(
                "config.json lacks the gated DeltaNet (linear attention) fields",
                where="config.json",
                found=f"missing {missing}",
                expected="a Qwen3-Next config",
            )
        return cls(
            **{ours: int(cfg[hf]) for ours, hf in keys.items()},
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            activation=cfg.get("hidden_act", "silu"),
        )
