"""A mixture-of-experts layer (layers/moe.py) as the layer programs run it: the C `moe_args`
(kernels/layer_kernels.h) of one layer's MoE module — its router, each expert's prepared
gate/up and down panels, their formats and biases, the activation — built once when the
program binds its weights. The program calls `lk_moe` on it (codegen_layer.py).

What the C code computes is GPT-OSS's routing ("softmax_topk": the top k logits, a softmax
over them) with SwiGLU or the clamped SwiGLU; any other router, shared experts, a rank's
share of the experts, or an expert without packed panels is refused (CodegenError, naming
it): the graph walker runs those layers, the module itself.
"""

from __future__ import annotations

import ctypes

from infergen.compiler.codegen_c import CodegenError

ACTIVATIONS = {"silu": 0, "clamped_swiglu": 1}  # layers/moe.py EXPERT_ACTIVATIONS → C code


class MoEArgs(ctypes.Structure):  # kernels/layer_kernels.h moe_args, field for field
    _fields_ = [
        ("experts", ctypes.c_long),
        ("top_k", ctypes.c_long),
        ("inter", ctypes.c_long),
        ("router", ctypes.c_void_p),
        ("router_bias", ctypes.c_void_p),
        ("gate_up", ctypes.c_void_p),
        ("down", ctypes.c_void_p),
        ("gate_up_bias", ctypes.c_void_p),
        ("down_bias", ctypes.c_void_p),
        ("gate_up_format", ctypes.c_void_p),
        ("down_format", ctypes.c_void_p),
        ("activation", ctypes.c_long),
        ("limit", ctypes.c_float),
        ("alpha", ctypes.c_float),
    ]


def _panels(linear, where: str) -> int:
    """A projection's packed-panel format (what lk_gemm_any reads); CodegenError otherwise."""
    fmt = linear.backend.decode_format
    if fmt is None or linear.act is not None or linear.weight.dim() != 3:
        raise CodegenError(f"{where}: no packed-panel GEMM")
    return fmt


def moe_args(module, where: str) -> tuple[MoEArgs, list]:
    """The C arguments of one MoE module, and what must stay alive while they are used."""
    moe = module.moe
    if moe.router != "softmax_topk":
        raise CodegenError(f"{where}: the {moe.router!r} router has no layer-program code")
    if module.shared is not None or module.experts != (0, moe.num_experts):
        raise CodegenError(f"{where}: shared experts or a share of the experts")
    if moe.activation not in ACTIVATIONS:
        raise CodegenError(f"{where}: expert activation {moe.activation!r}")
    experts = moe.num_experts

    def pointers(values) -> ctypes.Array:
        return (ctypes.c_void_p * experts)(*values)

    def biases(linears) -> ctypes.Array:
        return pointers(lin.bias.data_ptr() if lin.bias is not None else None for lin in linears)

    gate_up, down = list(module.gate_up), list(module.down)
    keep = [
        pointers(lin.weight.data_ptr() for lin in gate_up),
        pointers(lin.weight.data_ptr() for lin in down),
        biases(gate_up),
        biases(down),
        (ctypes.c_long * experts)(*(_panels(lin, f"{where} expert gate/up") for lin in gate_up)),
        (ctypes.c_long * experts)(*(_panels(lin, f"{where} expert down") for lin in down)),
    ]
    router = module.router.detach().contiguous()
    router_bias = module.router_bias if moe.expert_bias else None
    keep.append(router)
    args = MoEArgs(
        experts,
        moe.top_k,
        moe.intermediate_size,
        router.data_ptr(),
        router_bias.data_ptr() if router_bias is not None else None,
        *(ctypes.addressof(array) for array in keep[:6]),
        ACTIVATIONS[moe.activation],
        moe.swiglu_limit,
        moe.swiglu_alpha,
    )
    return args, keep
