"""Mixture of experts (layers/moe.py): each router against transformers' own router module on
the same weights, and the expert-grouped forward against the token-by-token reference."""

from __future__ import annotations

import pytest
import torch
import transformers

from infergen.config import ModelConfig, MoEConfig
from infergen.layers.moe import ROUTERS, MoE, reference
from infergen.models.tensor_names import MOE_TENSORS

HIDDEN = 32


def _hf_router(name: str, model: str):
    """(transformers router module, our MoEConfig) with random weights."""
    if model == "qwen3_next":
        cfg = transformers.Qwen3NextConfig(
            hidden_size=HIDDEN, num_experts=8, num_experts_per_tok=3, norm_topk_prob=True
        )
        from transformers.models.qwen3_next.modeling_qwen3_next import (
            Qwen3NextTopKRouter as Router,
        )  # fmt: skip
    elif name == "softmax_topk":
        cfg = transformers.GptOssConfig(hidden_size=HIDDEN, num_local_experts=8,
                                        num_experts_per_tok=3)  # fmt: skip
        from transformers.models.gpt_oss.modeling_gpt_oss import GptOssTopKRouter as Router
    elif name == "sigmoid_group_limited":
        cfg = transformers.DeepseekV3Config(
            hidden_size=HIDDEN,
            n_routed_experts=8,
            num_experts_per_tok=3,
            n_group=4,
            topk_group=2,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
        )
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
            DeepseekV3TopkRouter as Router,
        )
    else:
        method = "greedy" if name == "softmax_greedy" else "group_limited_greedy"
        cfg = transformers.DeepseekV2Config(
            hidden_size=HIDDEN,
            n_routed_experts=8,
            num_experts_per_tok=3,
            n_group=4,
            topk_group=2,
            routed_scaling_factor=1.5,
            topk_method=method,
        )
        from transformers.models.deepseek_v2.modeling_deepseek_v2 import (
            DeepseekV2TopkRouter as Router,
        )  # fmt: skip
    torch.manual_seed(0)
    router = Router(cfg)
    with torch.no_grad():
        for tensor in router.state_dict().values():
            tensor.copy_(torch.randn_like(tensor))
    grouped = name.endswith("group_limited")
    moe = MoEConfig(8, 3, 16, name, num_groups=4 if grouped else 1,
                    topk_groups=2 if grouped else 1,
                    norm_topk=name == "sigmoid_group_limited" or model == "qwen3_next",
                    routed_scaling=getattr(cfg, "routed_scaling_factor", 1.0))  # fmt: skip
    return router, moe


@pytest.mark.parametrize(
    "name,model",
    [*((n, "") for n, _ in ROUTERS.items()), ("softmax_greedy", "qwen3_next")],
)
def test_router_matches_transformers(name, model):
    assert {n for n, _ in ROUTERS.items()} == {
        "softmax_topk", "softmax_greedy", "softmax_group_limited", "sigmoid_group_limited"
    }  # every router has a transformers oracle here  # fmt: skip
    router, moe = _hf_router(name, model)
    x = torch.randn(50, HIDDEN, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        _, hf_weights, hf_experts = router(x)
        logits = torch.nn.functional.linear(x, router.weight, getattr(router, "bias", None))
    weights, experts = ROUTERS.get(name)(logits, moe, getattr(router, "e_score_correction_bias",
                                                               None))  # fmt: skip
    # the same experts with the same weights (the order within a token's top-k may differ)
    ours = torch.zeros(50, 8).scatter_(1, experts, weights.float())
    theirs = torch.zeros(50, 8).scatter_(1, hf_experts, hf_weights.float())
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)


def _config(router: str, activation: str, shared: int) -> ModelConfig:
    moe = MoEConfig(6, 2, 12, router, activation, 12 * shared, 1.3, True, 3, 2,
                    expert_bias=activation == "clamped_swiglu", swiglu_limit=0.5)  # fmt: skip
    arch = "gpt_oss" if activation == "clamped_swiglu" else "deepseek_v3"
    return ModelConfig(arch, 64, HIDDEN, 40, 2, 4, 4, 8, moe=moe)


@pytest.mark.parametrize("tokens", [1, 7, 33])
@pytest.mark.parametrize(
    "router,activation,shared",
    [("softmax_topk", "clamped_swiglu", 0), ("sigmoid_group_limited", "silu", 1),
     ("softmax_group_limited", "silu", 2)],
)  # fmt: skip
def test_grouped_experts_equal_token_by_token(router, activation, shared, tokens):
    config = _config(router, activation, shared)
    layer = MoE(config, torch.float32)
    gen = torch.Generator().manual_seed(tokens)
    shapes = MOE_TENSORS[config.arch.mlp](config, "")  # the checkpoint's names and shapes
    weights = {name: torch.randn(shape, generator=gen) * 0.3 for name, shape in shapes.items()}
    layer.load(weights.__getitem__, "")
    x = torch.randn(tokens, HIDDEN, generator=gen)
    torch.testing.assert_close(layer(x), reference(x, layer), rtol=1e-5, atol=1e-5)
