"""Activation schemes: a row per scheme (ACTIVATION_SCHEMES) saying how a projection's input is
quantized before the product (ops/quantize_activation.py). With a weight scheme they make the
weight + activation schemes: W8A8 FP8 (`weights="fp8_e4m3", activations="fp8_e4m3"` per-token
dynamic, or "fp8_e4m3_static"), W8A8 int8, W4A8 (`weights="int4", activations="int8"`), W4A4
(`weights="nvfp4", activations="nvfp4"`, `weights="mxfp4", activations="mxfp4"`).

Static scales come from calibration (quant/calibrate.py) with the engine's clipping method
(quant/clipping.py). The LM head's input is kept in full precision (ACTIVATIONS_KEEP), as
compressed-tensors checkpoints keep `lm_head`.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

import torch
from torch import nn

from infergen.errors import CheckpointError
from infergen.layers.linear import Linear
from infergen.ops.quantize_activation import ActivationFormat, fake_quantize
from infergen.registry import Registry

ACTIVATIONS_KEEP = ("lm_head",)


@dataclass(frozen=True)
class ActivationScheme:
    act: ActivationFormat
    description: str


ACTIVATION_SCHEMES: Registry[ActivationScheme] = Registry("activation scheme")
for _name, _act, _what in (
    ("fp8_e4m3", ActivationFormat("fp8_e4m3", "token", 8.0),
     "FP8 E4M3, a dynamic scale per token (amax / 448)"),
    ("fp8_e4m3_static", ActivationFormat("fp8_e4m3", "tensor", 8.0),
     "FP8 E4M3, one static scale per projection input from calibration"),
    ("int8", ActivationFormat("int8", "token", 8.0),
     "int8, a dynamic scale per token (amax / 127)"),
    ("int8_static", ActivationFormat("int8", "tensor", 8.0),
     "int8, one static scale per projection input from calibration"),
    ("mxfp8", ActivationFormat("mxfp8_e4m3", "block", 8.25),
     "MXFP8 E4M3: an E8M0 scale per 32 values of a token (OCP MX v1.0)"),
    ("mxfp4", ActivationFormat("mxfp4", "block", 4.25),
     "MXFP4: E2M1, an E8M0 scale per 32 values of a token (OCP MX v1.0)"),
    ("nvfp4", ActivationFormat("nvfp4", "block", 4.5),
     "NVFP4: E2M1, an E4M3 scale per 16 values of a token, a static fp32 global scale per "
     "projection input from calibration"),
):  # fmt: skip
    ACTIVATION_SCHEMES.register(_name, ActivationScheme(_act, _what))


class ActivationQuant(nn.Module):
    """A projection's input quantizer: its format and (static formats) calibrated scale."""

    def __init__(self, act: ActivationFormat):
        super().__init__()
        self.act = act
        self.register_buffer("scale", None)  # fp32 [1], set by calibration when act.static

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [tokens, in] → x̂ [tokens, in]
        return fake_quantize(x, self.act, self.scale)


def apply_activation_scheme(model: nn.Module, name: str, keep: tuple[str, ...] = ()) -> list[str]:
    """Give every projection (but ACTIVATIONS_KEEP and `keep` globs) an input quantizer.
    Returns the names of the projections that take one."""
    scheme = ACTIVATION_SCHEMES.get(name, where="activations")
    kept = ACTIVATIONS_KEEP + tuple(keep)
    changed = []
    for module_name, module in model.named_modules():
        if isinstance(module, Linear) and not any(fnmatch.fnmatch(module_name, g) for g in kept):
            module.act = ActivationQuant(scheme.act)
            changed.append(module_name)
    return changed


# a Hugging Face projection (in model.layers.N) → the engine's projection that holds it
HF_PROJECTIONS = {
    "self_attn.q_proj": "attn.qkv", "self_attn.k_proj": "attn.qkv", "self_attn.v_proj": "attn.qkv",
    "self_attn.o_proj": "attn.o", "mlp.gate_proj": "mlp.gate_up", "mlp.up_proj": "mlp.gate_up",
    "mlp.down_proj": "mlp.down",
}  # fmt: skip


def engine_name(hf_prefix: str) -> str:
    """`model.layers.N.self_attn.q_proj` → `layers.N.attn.qkv`."""
    _, _, index, module, proj = hf_prefix.split(".")
    return f"layers.{index}.{HF_PROJECTIONS[f'{module}.{proj}']}"


def load_activation_scales(
    model: nn.Module, name: str, input_scales: dict[str, torch.Tensor], where: str
) -> None:
    """Put scheme `name`'s input quantizers on the model with a checkpoint's static scales
    (by Hugging Face prefix; parts of a fused projection share its input: the largest wins)."""
    apply_activation_scheme(model, name)
    if not ACTIVATION_SCHEMES.get(name).act.static:
        return
    scales: dict[str, torch.Tensor] = {}
    for prefix, scale in input_scales.items():
        ours = engine_name(prefix)
        scales[ours] = torch.maximum(scales[ours], scale) if ours in scales else scale
    for module_name, module in model.named_modules():
        if not isinstance(module.__dict__.get("_modules", {}).get("act"), ActivationQuant):
            continue
        if module_name not in scales:
            raise CheckpointError(
                f"static {name} input activations: a projection has no input scale",
                where=f"{where}: {module_name}",
                expected="an input scale for every quantized projection",
            )
        module.act.scale = scales[module_name].reshape(1).float()
