"""A mixture-of-experts layer (layers/moe.py) as the layer programs run it: the C `moe_args`
(kernels/layer_kernels.h) of one layer's MoE module — its router, each expert's prepared
gate/up and down panels, their formats and biases, the activation — built once when the
program binds its weights. The program calls `lk_moe` on it (codegen_layer.py).

What the C code computes: every router of layers/moe.py (GPT-OSS's, DeepSeek-V2's two,
DeepSeek-V3's with its correction bias and groups; norm_topk, routed scaling), experts with
SwiGLU or the clamped SwiGLU, and shared experts (a SwiGLU MLP without biases, with
Qwen3-Next's sigmoid gate or without). A rank's share of the experts, more than 256 experts or
64 groups, or a projection without packed panels is refused (CodegenError, naming it): the
graph walker runs those layers, the module itself.
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
        ("router_kind", ctypes.c_long),
        ("groups", ctypes.c_long),
        ("topk_groups", ctypes.c_long),
        ("norm_topk", ctypes.c_long),
        ("routed_scaling", ctypes.c_float),
        ("correction", ctypes.c_void_p),
        ("shared_inter", ctypes.c_long),
        ("shared_gate_up", ctypes.c_void_p),
        ("shared_down", ctypes.c_void_p),
        ("shared_gate_up_format", ctypes.c_long),
        ("shared_down_format", ctypes.c_long),
        ("shared_gate", ctypes.c_void_p),
    ]


# layers/moe.py ROUTERS row → the C code's router (kernels/layer_kernels.c moe_route)
ROUTERS = {"softmax_topk": 0, "softmax_greedy": 1, "softmax_group_limited": 2,
           "sigmoid_group_limited": 3}  # fmt: skip
MAX_EXPERTS, MAX_GROUPS = 256, 64  # moe_route's per-token arrays


def _panels(linear, where: str) -> int:
    """A projection's packed-panel format (what lk_gemm_any reads); CodegenError otherwise."""
    fmt = linear.backend.decode_format
    if fmt is None or linear.act is not None or linear.weight.dim() != 3:
        raise CodegenError(f"{where}: no packed-panel GEMM")
    return fmt


def moe_args(module, where: str) -> tuple[MoEArgs, list]:
    """The C arguments of one MoE module, and what must stay alive while they are used."""
    moe = module.moe
    if moe.router not in ROUTERS:
        raise CodegenError(f"{where}: the {moe.router!r} router has no layer-program code")
    if module.experts != (0, moe.num_experts):
        raise CodegenError(f"{where}: a tensor-parallel rank's share of the experts")
    if moe.num_experts > MAX_EXPERTS or moe.num_groups > MAX_GROUPS:
        raise CodegenError(f"{where}: more than {MAX_EXPERTS} experts or {MAX_GROUPS} groups")
    if moe.activation not in ACTIVATIONS:
        raise CodegenError(f"{where}: expert activation {moe.activation!r}")
    shared = module.shared
    if shared is not None and (shared.hidden_act != "silu" or shared.gate_up.bias is not None):
        raise CodegenError(f"{where}: shared experts other than a SwiGLU MLP without biases")
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
    shared_args = (0, None, None, 0, 0, None)
    if shared is not None:
        gate = module.shared_gate.detach().reshape(-1).contiguous() if moe.shared_gate else None
        keep.append(gate)
        shared_args = (
            shared.down.in_features,
            shared.gate_up.weight.data_ptr(),
            shared.down.weight.data_ptr(),
            _panels(shared.gate_up, f"{where} shared gate/up"),
            _panels(shared.down, f"{where} shared down"),
            gate.data_ptr() if gate is not None else None,
        )
    correction = module.correction
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
        ROUTERS[moe.router],
        moe.num_groups,
        moe.topk_groups,
        int(moe.norm_topk),
        moe.routed_scaling,
        correction.data_ptr() if correction is not None else None,
        *shared_args,
    )
    return args, keep
