"""A Mamba2 mixer (layers/ssm.py) as the decode layer program runs it natively: the C
`ssm_args` (kernels/layer_kernels.h) of one layer's mixer — in_proj and out_proj panels, the
conv weights, A, D, dt_bias, the gated norm's weight, the state tensors — built once when the
program binds its weights; each step sets the rows' state slots and fresh flags. The
decode program calls `lk_ssm_decode` on it instead of calling the module back (a MIXER node's
native form, codegen_layer.py); so does the prefill program for steps of up to its
prefill_rows rows (program.NATIVE_MIXERS: a sequence's rows in order), longer ones call the
module back.

Refused (CodegenError, naming it: the module runs, called back): a mixer other than Mamba2's,
weights that are not fp32 packed panels, an activation other than silu or none.
"""

from __future__ import annotations

import ctypes
import math

import torch

from infergen.compiler.codegen_c import CodegenError
from infergen.compiler.program_moe import _panels

# ops/causal_conv1d.py ACTIVATIONS → the C code's (SSMSpec takes silu only so far)
CONV_ACTIVATIONS = {"silu": 0, None: 1}


class SSMArgs(ctypes.Structure):  # kernels/layer_kernels.h ssm_args, field for field
    _fields_ = [
        *[
            (n, ctypes.c_long)
            for n in "hidden inter heads head_dim groups state conv_dim width".split()
        ],
        ("in_proj", ctypes.c_void_p),
        ("in_format", ctypes.c_long),
        ("in_bias", ctypes.c_void_p),
        ("conv_w", ctypes.c_void_p),
        ("conv_b", ctypes.c_void_p),
        ("activation", ctypes.c_long),
        ("A", ctypes.c_void_p),
        ("D", ctypes.c_void_p),
        ("dt_bias", ctypes.c_void_p),
        ("dt_lo", ctypes.c_float),
        ("dt_hi", ctypes.c_float),
        ("norm_w", ctypes.c_void_p),
        ("norm_before_gate", ctypes.c_long),
        ("eps", ctypes.c_float),
        ("out_proj", ctypes.c_void_p),
        ("out_format", ctypes.c_long),
        ("out_bias", ctypes.c_void_p),
        ("conv_state", ctypes.c_void_p),
        ("ssm_state", ctypes.c_void_p),
        ("slots", ctypes.c_void_p),
        ("fresh", ctypes.c_void_p),
    ]


def _ptr(tensor) -> int | None:
    return None if tensor is None else tensor.data_ptr()


def ssm_args(mixer, states: dict, where: str) -> tuple[SSMArgs, list]:
    """The C arguments of one Mamba2 mixer (layers/ssm.Mamba2Mixer) over its layer's state
    tensors, and what must stay alive while they are used."""
    s = mixer.spec
    if s.activation not in CONV_ACTIVATIONS:
        raise CodegenError(f"{where}: conv activation {s.activation!r}")
    f32 = torch.float32
    tensors = [mixer.conv_weight, mixer.A, mixer.D, mixer.dt_bias, states["conv"], states["ssm"]]
    if any(t.dtype != f32 for t in tensors) or mixer.dtype != f32:
        raise CodegenError(f"{where}: a Mamba2 mixer that is not fp32")
    if not (states["conv"].is_contiguous() and states["ssm"].is_contiguous()):
        raise CodegenError(f"{where}: strided state tensors")
    in_format = _panels(mixer.in_proj, f"{where} in_proj")
    out_format = _panels(mixer.out_proj, f"{where} out_proj")
    keep = [t.detach().contiguous() for t in tensors[:4]]
    conv_w, A, D, dt_bias = keep
    conv_b = mixer.conv_bias.detach().contiguous() if mixer.conv_bias is not None else None
    norm_w = mixer.norm_weight.detach().contiguous() if mixer.norm_weight is not None else None
    keep += [conv_b, norm_w]
    lo, hi = s.time_step_limit
    args = SSMArgs(
        s.hidden_size, s.intermediate_size, s.num_heads, s.head_dim, s.n_groups,
        s.state_size, s.conv_dim, s.conv_kernel,
        mixer.in_proj.weight.data_ptr(), in_format,
        _ptr(mixer.in_proj.bias),
        conv_w.data_ptr(), _ptr(conv_b), CONV_ACTIVATIONS[s.activation],
        A.data_ptr(), D.data_ptr(), dt_bias.data_ptr(),
        lo, hi if math.isfinite(hi) else float("inf"),
        _ptr(norm_w), int(s.norm_before_gate), s.norm_eps,
        mixer.out_proj.weight.data_ptr(), out_format,
        _ptr(mixer.out_proj.bias),
        states["conv"].data_ptr(), states["ssm"].data_ptr(), None, None,
    )  # fmt: skip
    return args, keep
