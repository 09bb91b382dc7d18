"""The layer programs' mixture of experts (kernels/layer_kernels.c lk_moe, compiler/
program_moe.py) called directly on an MoE layer's arguments, against the token-by-token
oracle (layers/moe.py reference): GPT-OSS's routing (top k of the logits, a softmax over
them) with the clamped SwiGLU and with SwiGLU, expert biases on and off, one token to many
(experts with no tokens, experts with most); and what it refuses, by name."""

from __future__ import annotations

import ctypes

import pytest
import torch

from infergen.compiler.codegen_c import CodegenError
from infergen.compiler.program import LIBRARY
from infergen.compiler.program_moe import moe_args
from infergen.config import ModelConfig, MoEConfig
from infergen.kernels.build import library
from infergen.layers.moe import MoE, reference
from infergen.models.tensor_names import MOE_TENSORS

HIDDEN = 48


def _layer(router: str, activation: str, shared: int = 0, bias: bool = True, seed: int = 0,
           shared_gate: bool = False):  # fmt: skip
    moe = MoEConfig(8, 3, 40, router, activation, 40 * shared, 1.3, True, 4, 2,
                    expert_bias=bias, swiglu_limit=0.5, shared_gate=shared_gate)  # fmt: skip
    arch = "gpt_oss" if activation == "clamped_swiglu" else "deepseek_v3"
    config = ModelConfig(arch, 64, HIDDEN, 40, 2, 4, 4, 8, moe=moe)
    layer = MoE(config, torch.float32, "native")  # (experts in packed panels)
    gen = torch.Generator().manual_seed(seed)
    shapes = MOE_TENSORS[config.arch.mlp](config, "")
    weights = {name: torch.randn(shape, generator=gen) * 0.3 for name, shape in shapes.items()}
    layer.load(weights.__getitem__, "")
    if layer.correction is not None:  # (DeepSeek-V3's choice bias: big enough to matter)
        layer.correction.copy_(torch.randn(8, generator=gen))
    return layer


def _lk_moe(layer: MoE, x: torch.Tensor) -> torch.Tensor:
    fn = ctypes.CDLL(str(library(LIBRARY))).lk_moe
    fn.restype = None
    fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_long] * 2 + [ctypes.c_int]
    args, keep = moe_args(layer, "test")
    y = torch.full_like(x, float("nan"))
    fn(ctypes.addressof(args), x.data_ptr(), y.data_ptr(), x.shape[0], x.shape[1], 2)
    del keep
    return y


@pytest.mark.parametrize("tokens", [1, 3, 64])
@pytest.mark.parametrize("activation, bias", [("clamped_swiglu", True), ("silu", False)])
def test_lk_moe_matches_the_token_by_token_oracle(tokens, activation, bias):
    layer = _layer("softmax_topk", activation, bias=bias, seed=tokens)
    x = torch.randn(tokens, HIDDEN, generator=torch.Generator().manual_seed(7))
    torch.testing.assert_close(_lk_moe(layer, x), reference(x, layer), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tokens", [1, 5, 40])
@pytest.mark.parametrize(
    "router, shared, shared_gate",
    [("softmax_greedy", 0, False), ("softmax_group_limited", 1, False),
     ("sigmoid_group_limited", 2, False), ("softmax_greedy", 1, True)],
)  # fmt: skip
def test_every_router_and_shared_experts_match_the_oracle(tokens, router, shared, shared_gate):
    """DeepSeek-V2's greedy and group-limited routers, DeepSeek-V3's (sigmoid, a correction
    bias for the choice, groups scored by their best two), norm_topk and routed scaling, shared
    experts with and without Qwen3-Next's gate."""
    layer = _layer(router, "silu", shared, bias=False, seed=tokens, shared_gate=shared_gate)
    x = torch.randn(tokens, HIDDEN, generator=torch.Generator().manual_seed(11))
    torch.testing.assert_close(_lk_moe(layer, x), reference(x, layer), rtol=1e-5, atol=1e-5)


def test_what_lk_moe_does_not_compute_is_refused_by_name():
    layer = _layer("softmax_topk", "silu", 0, bias=False)
    layer.experts = (0, 4)  # (a tensor-parallel rank holding half the experts)
    with pytest.raises(CodegenError, match="layer 3 mlp: a tensor-parallel rank's share"):
        moe_args(layer, "layer 3 mlp")
