"""Mixture-of-experts feed-forward: a router picks top_k of num_experts gated MLPs per token,
their outputs are summed with the router's weights (+ shared experts that every token uses).

    weights, experts = ROUTERS[router](logits = x·Wᵣᵀ (+ bᵣ))       # [tokens, top_k] each
    y_t = Σ_j weights[t, j] · expert_{experts[t, j]}(x_t) + shared(x_t)

Tokens are grouped by expert before the GEMMs (a stable sort of the token-expert pairs): each
expert with work runs one [its tokens, hidden] × [hidden, 2·inter] GEMM and one back, so the
Python loop is over experts, never over tokens. Bytes moved per step: the weights of every
expert that at least one token picked (decode at batch 1 reads top_k experts, not all).

Routers (config.MoEConfig.router) follow the papers / reference code:
  softmax_topk            GPT-OSS: top-k of the logits, softmax over those k
  softmax_greedy          DeepSeek-V2: softmax over all experts, top-k, × routed_scaling
  softmax_group_limited   DeepSeek-V2: as greedy, only experts of the best topk_groups groups
                          (a group scores its best expert)
  sigmoid_group_limited   DeepSeek-V3: sigmoid scores; the choice adds the correction bias and
                          keeps the best topk_groups groups (a group scores its top-2 sum);
                          weights are the chosen sigmoid scores, normalised (norm_topk) and
                          × routed_scaling
Expert activations: "silu" (SwiGLU) and "clamped_swiglu" (GPT-OSS: gate ≤ limit, |up| ≤ limit,
out = (up + 1) · gate · sigmoid(alpha · gate)).

Under tensor parallelism (models/sharding.py) a layer holds a slice of every expert's features
(config.moe.intermediate_size is the rank's), or, with expert parallelism, a run of whole
experts (`experts`): the router still scores every expert and routes every token, the layer
computes the token-expert pairs of its own experts only (the others' contribute zeros), and the
decoder layer's all-reduce after the feed-forward sums the ranks' outputs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from infergen.config import ModelConfig, MoEConfig
from infergen.layers.linear import Linear
from infergen.layers.mlp import GatedMLP
from infergen.ops.stored_weights import dense
from infergen.registry import Registry

Router = Callable[[torch.Tensor, MoEConfig, torch.Tensor | None], tuple[torch.Tensor, torch.Tensor]]
ROUTERS: Registry[Router] = Registry("MoE router")


@ROUTERS.decorator("softmax_topk")
def softmax_topk(logits, moe, correction):
    top, experts = torch.topk(logits, moe.top_k, dim=-1)
    return torch.softmax(top, dim=-1), experts


def _group_mask(choice: torch.Tensor, moe: MoEConfig, group_score) -> torch.Tensor:
    """[tokens, experts] bool: experts in the best `topk_groups` groups of each token."""
    groups = choice.view(choice.shape[0], moe.num_groups, -1)
    best = torch.topk(group_score(groups), moe.topk_groups, dim=-1).indices
    keep = torch.zeros(groups.shape[:2], dtype=torch.bool).scatter_(1, best, True)
    return keep.unsqueeze(-1).expand_as(groups).reshape(choice.shape)


@ROUTERS.decorator("softmax_greedy")
def softmax_greedy(logits, moe, correction):
    weights, experts = torch.topk(torch.softmax(logits.float(), dim=-1), moe.top_k, dim=-1)
    if moe.norm_topk:  # Qwen3-Next
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights * moe.routed_scaling, experts


@ROUTERS.decorator("softmax_group_limited")
def softmax_group_limited(logits, moe, correction):
    scores = torch.softmax(logits.float(), dim=-1)
    scores = scores.masked_fill(~_group_mask(scores, moe, lambda g: g.amax(-1)), 0.0)
    weights, experts = torch.topk(scores, moe.top_k, dim=-1)
    return weights * moe.routed_scaling, experts


@ROUTERS.decorator("sigmoid_group_limited")
def sigmoid_group_limited(logits, moe, correction):
    scores = torch.sigmoid(logits.float())
    choice = scores if correction is None else scores + correction
    top2 = lambda g: torch.topk(g, min(2, g.shape[-1]), dim=-1).values.sum(-1)  # noqa: E731
    choice = choice.masked_fill(~_group_mask(choice, moe, top2), float("-inf"))
    experts = torch.topk(choice, moe.top_k, dim=-1).indices
    weights = scores.gather(1, experts)
    if moe.norm_topk:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * moe.routed_scaling, experts


def _swiglu(gate_up: torch.Tensor, moe: MoEConfig) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def _clamped_swiglu(gate_up: torch.Tensor, moe: MoEConfig) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    gate = gate.clamp(max=moe.swiglu_limit)
    up = up.clamp(-moe.swiglu_limit, moe.swiglu_limit)
    return (up + 1) * gate * torch.sigmoid(gate * moe.swiglu_alpha)


EXPERT_ACTIVATIONS = {"silu": _swiglu, "clamped_swiglu": _clamped_swiglu}


class MoE(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        dtype: torch.dtype,
        backend: str = "torch",
        experts: tuple[int, int] | None = None,  # [first, end) of the experts held; None: all
    ):
        super().__init__()
        moe = config.moe
        self.moe = moe
        e, h, i = moe.num_experts, config.hidden_size, moe.intermediate_size
        self.experts = (0, e) if experts is None else experts
        held = self.experts[1] - self.experts[0]
        self.router = nn.Parameter(torch.zeros(e, h, dtype=dtype), False)
        self.router_bias = nn.Parameter(torch.zeros(e, dtype=dtype), False)
        self.correction = (  # DeepSeek-V3: added to the scores for the choice only
            nn.Parameter(torch.zeros(e), False) if moe.router == "sigmoid_group_limited" else None
        )
        # each expert's projections are Linear layers: the engine's GEMM backends (native
        # packed panels, weight schemes) run them like any other projection
        bias = moe.expert_bias
        # (index j: expert experts[0] + j)
        self.gate_up = nn.ModuleList(Linear(h, 2 * i, bias, dtype, backend) for _ in range(held))
        self.down = nn.ModuleList(Linear(i, h, bias, dtype, backend) for _ in range(held))
        self.layout = config.arch.mlp  # the checkpoint's expert layout (load)
        self.route = ROUTERS.get(moe.router, where="moe.router")
        self.act = EXPERT_ACTIVATIONS[moe.activation]
        shared = moe.shared_intermediate_size
        self.shared = GatedMLP(config, dtype, backend, shared) if shared else None
        self.shared_gate = (  # Qwen3-Next: the shared expert's output × sigmoid(x·w)
            nn.Parameter(torch.zeros(1, h, dtype=dtype), False) if moe.shared_gate else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [tokens, hidden]
        k = self.moe.top_k
        logits = F.linear(x, self.router, self.router_bias if self.moe.expert_bias else None)
        weights, experts = self.route(logits, self.moe, self.correction)  # [tokens, k] each
        flat = experts.flatten()
        order = torch.argsort(flat, stable=True)  # token-expert pairs grouped by expert
        counts = torch.bincount(flat, minlength=self.moe.num_experts).tolist()
        first, end = self.experts  # the pairs of the experts held: one run of `order`
        order = order[sum(counts[:first]) : sum(counts[:end])]
        token_of = order // k
        grouped = x.index_select(0, token_of)  # [pairs, hidden]
        out = torch.empty_like(grouped)
        start = 0
        for expert, count in enumerate(counts[first:end]):  # experts with work: a GEMM pair
            if count == 0:
                continue
            rows = slice(start, start + count)
            hidden = self.gate_up[expert](grouped[rows])
            out[rows] = self.down[expert](self.act(hidden, self.moe))
            start += count
        out.mul_(weights.flatten()[order].to(out.dtype).unsqueeze(-1))
        y = torch.zeros_like(x).index_add_(0, token_of, out)
        return y if self.shared is None else y + self._shared(x)

    def _shared(self, x: torch.Tensor) -> torch.Tensor:
        out = self.shared(x)
        return out if self.shared_gate is None else out * torch.sigmoid(x @ self.shared_gate.T)

    def load(self, get: callable, prefix: str) -> None:
        """Hugging Face names: GPT-OSS (router.*, experts.gate_up_proj [E, hidden, 2·inter]
        with gate/up columns interleaved, experts.down_proj [E, inter, hidden], biases) or
        DeepSeek (gate.weight, gate.e_score_correction_bias, experts.{e}.gate_proj/up_proj/
        down_proj.weight, shared_experts.*). Expert tensors come as `get` gives them: under
        tensor parallelism the rank's part (models/sharding.py: GPT-OSS's fused tensors cut
        to the experts and features held, each gate/up column pair kept together)."""
        first, end = self.experts
        if self.layout == "gpt_oss_moe":
            self.router.copy_(get(prefix + "router.weight"))
            self.router_bias.copy_(get(prefix + "router.bias"))
            gate_up = dense(get(prefix + "experts.gate_up_proj")).transpose(1, 2)  # [E, 2i, h]
            gate_up = torch.cat([gate_up[:, 0::2], gate_up[:, 1::2]], dim=1)  # [gate; up]
            bias = get(prefix + "experts.gate_up_proj_bias")
            bias = torch.cat([bias[:, 0::2], bias[:, 1::2]], dim=1)
            down = dense(get(prefix + "experts.down_proj")).transpose(1, 2)
            down_bias = get(prefix + "experts.down_proj_bias")
            for e in range(end - first):  # (the tensors hold the experts held, in order)
                self.gate_up[e].load(gate_up[e].contiguous(), bias[e])
                self.down[e].load(down[e].contiguous(), down_bias[e])
        else:  # DeepSeek / Qwen3-Next: one module per expert
            self.router.copy_(get(prefix + "gate.weight"))
            if self.correction is not None:
                self.correction.copy_(get(prefix + "gate.e_score_correction_bias"))
            for e in range(first, end):
                p = f"{prefix}experts.{e}."
                self.gate_up[e - first].load(
                    Linear.fused([get(p + "gate_proj.weight"), get(p + "up_proj.weight")])
                )
                self.down[e - first].load(get(p + "down_proj.weight"))
        if self.shared is not None:
            self.shared.load(get, f"{prefix}{self.moe.shared_name}.")
        if self.shared_gate is not None:
            self.shared_gate.copy_(get(prefix + "shared_expert_gate.weight"))


def reference(x: torch.Tensor, moe_layer: MoE) -> torch.Tensor:
    """Oracle: every token through its experts one at a time (no grouping; the experts the
    layer holds only)."""
    logits = F.linear(x, moe_layer.router, moe_layer.router_bias if moe_layer.moe.expert_bias
                      else None)  # fmt: skip
    weights, experts = moe_layer.route(logits, moe_layer.moe, moe_layer.correction)
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(moe_layer.moe.top_k):
            e = int(experts[t, j]) - moe_layer.experts[0]
            if not 0 <= e < len(moe_layer.gate_up):  # (not held: another rank's)
                continue
            h = moe_layer.gate_up[e](x[t : t + 1])
            out[t] += weights[t, j] * moe_layer.down[e](moe_layer.act(h, moe_layer.moe))[0]
    return out if moe_layer.shared is None else out + moe_layer._shared(x)
