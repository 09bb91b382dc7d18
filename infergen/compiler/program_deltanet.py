"""A gated DeltaNet mixer (layers/linear_attention.py, Qwen3-Next's linear-attention layers)
as the decode layer program runs it natively: the C `deltanet_args` (kernels/layer_kernels.h)
of one layer's mixer — in_proj and out_proj panels, the conv weight, the decay rate, dt_bias,
the output norm's weight, the state tensors — built once when the program binds its weights;
each step sets the rows' state slots and fresh flags (program.py). The decode program
calls `lk_deltanet_decode` on it instead of calling the module back; so does the prefill
program for steps of up to its prefill_rows rows (program.NATIVE_MIXERS), longer ones call
the module back.

Refused (CodegenError, naming it: the module runs, called back): weights or states that are
not fp32, strided states, projections without packed panels, a conv activation other than
silu or none.
"""

from __future__ import annotations

import ctypes

import torch

from infergen.compiler.codegen_c import CodegenError
from infergen.compiler.program_moe import _panels
from infergen.compiler.program_ssm import CONV_ACTIVATIONS


class DeltaNetArgs(ctypes.Structure):  # kernels/layer_kernels.h deltanet_args, field for field
    _fields_ = [
        *[(n, ctypes.c_long) for n in "hidden k_heads v_heads k_dim v_dim conv_dim width".split()],
        ("in_proj", ctypes.c_void_p),
        ("in_format", ctypes.c_long),
        ("out_proj", ctypes.c_void_p),
        ("out_format", ctypes.c_long),
        ("conv_w", ctypes.c_void_p),
        ("activation", ctypes.c_long),
        ("decay_rate", ctypes.c_void_p),
        ("dt_bias", ctypes.c_void_p),
        ("norm_w", ctypes.c_void_p),
        ("eps", ctypes.c_float),
        ("conv_state", ctypes.c_void_p),
        ("rec_state", ctypes.c_void_p),
        ("slots", ctypes.c_void_p),
        ("fresh", ctypes.c_void_p),
    ]


def deltanet_args(mixer, states: dict, where: str) -> tuple[DeltaNetArgs, list]:
    """The C arguments of one gated DeltaNet mixer over its layer's state tensors, and what
    must stay alive while they are used."""
    s = mixer.spec
    if s.activation not in CONV_ACTIVATIONS:
        raise CodegenError(f"{where}: conv activation {s.activation!r}")
    params = [mixer.conv_weight, mixer.decay_rate, mixer.dt_bias, mixer.norm_weight]
    tensors = [*params, states["conv"], states["recurrent"]]
    if any(t.dtype != torch.float32 for t in tensors) or mixer.dtype != torch.float32:
        raise CodegenError(f"{where}: a gated DeltaNet mixer that is not fp32")
    if not (states["conv"].is_contiguous() and states["recurrent"].is_contiguous()):
        raise CodegenError(f"{where}: strided state tensors")
    in_format = _panels(mixer.in_proj, f"{where} in_proj")
    out_format = _panels(mixer.out_proj, f"{where} out_proj")
    keep = [t.detach().contiguous() for t in params]
    conv_w, decay_rate, dt_bias, norm_w = keep
    args = DeltaNetArgs(
        s.hidden_size, s.num_k_heads, s.num_v_heads, s.k_head_dim, s.v_head_dim, s.conv_dim,
        s.conv_width,
        mixer.in_proj.weight.data_ptr(), in_format, mixer.out_proj.weight.data_ptr(), out_format,
        conv_w.data_ptr(), CONV_ACTIVATIONS[s.activation], decay_rate.data_ptr(),
        dt_bias.data_ptr(), norm_w.data_ptr(), s.rms_norm_eps,
        states["conv"].data_ptr(), states["recurrent"].data_ptr(), None, None,
    )  # fmt: skip
    return args, keep
