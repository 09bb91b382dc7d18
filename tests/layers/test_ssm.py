"""Mamba2Mixer against transformers' Mamba2Mixer and FalconH1Mixer (torch_forward path):
random tiny configs, weights copied through `load`, prefill of several sequences of different
lengths then decode steps with transformers' cache vs our packed varlen state; plus the
config reader and state sizes."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import FalconH1Config, Mamba2Config
from transformers.cache_utils import DynamicCache
from transformers.models.falcon_h1.modeling_falcon_h1 import FalconH1Mixer, compute_mup_vector
from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer as HFMamba2Mixer

from infergen.errors import ConfigError
from infergen.layers.ssm import Mamba2Mixer, SSMSpec

PROMPTS = [7, 1, 12]  # tokens per sequence: shorter, equal and longer than chunk_size=5
DECODE_STEPS = 4


def _perturb(hf: torch.nn.Module, seed: int) -> None:
    """Random values where transformers initialises constants, so they all matter."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.5 if p.dim() > 1 else 1.0))
        hf.A_log.copy_(torch.rand(hf.A_log.shape, generator=g) * 2 - 1)
        if isinstance(hf.norm, torch.nn.Module) and hasattr(hf.norm, "weight"):
            hf.norm.weight.copy_(1 + torch.randn(hf.norm.weight.shape, generator=g) * 0.5)


def _ours(hf: torch.nn.Module, spec: SSMSpec, prefix: str) -> Mamba2Mixer:
    mixer = Mamba2Mixer(spec, torch.float32)
    weights = {prefix + name: t.detach() for name, t in hf.state_dict().items()}
    mixer.load(weights.__getitem__, prefix)
    return mixer


def _compare(hf: torch.nn.Module, hf_config, mixer: Mamba2Mixer, hidden: int, seed: int) -> None:
    """Prefill PROMPTS (one transformers call per sequence, one packed call for us), then
    DECODE_STEPS steps of all sequences at once, the last steps joined by a new prefill."""
    g = torch.Generator().manual_seed(seed + 1)
    seqs = len(PROMPTS)
    caches = [DynamicCache(config=hf_config) for _ in range(seqs)]
    shapes = mixer.state_shapes()
    slots_total = seqs + 3
    states = {k: torch.randn(slots_total, *shape, generator=g) for k, shape in shapes.items()}
    slots = torch.tensor([4, 0, 2])
    late_slot, late_len = 5, 6  # a sequence that joins with a prefill during decode

    def ours(inputs: list[torch.Tensor], slot_ids, fresh) -> list[torch.Tensor]:
        qsl = [0, *torch.tensor([len(t) for t in inputs]).cumsum(0).tolist()]
        y = mixer(torch.cat(inputs), states, qsl, torch.tensor(slot_ids), torch.tensor(fresh))
        return [y[a:b] for a, b in zip(qsl[:-1], qsl[1:], strict=True)]

    def check(got: torch.Tensor, want: torch.Tensor) -> None:
        err = (got - want).abs().max().item()
        assert err <= 1e-4 * want.abs().max().item(), (err, want.abs().max().item())

    prompts = [torch.randn(n, hidden, generator=g) for n in PROMPTS]
    late_prompt = torch.randn(late_len, hidden, generator=g)
    late_cache = DynamicCache(config=hf_config)
    with torch.no_grad():
        got = ours(prompts, slots.tolist(), [True] * seqs)
        for i in range(seqs):
            check(got[i], hf(prompts[i][None], cache=caches[i])[0])
        for step in range(DECODE_STEPS):
            tokens = [torch.randn(1, hidden, generator=g) for _ in range(seqs)]
            inputs, slot_ids, fresh = list(tokens), slots.tolist(), [False] * seqs
            if step == 1:  # mixed batch: decodes + a fresh prefill
                inputs.insert(1, late_prompt)
                slot_ids.insert(1, late_slot)
                fresh.insert(1, True)
            if step > 1:  # then it decodes too
                inputs.insert(1, torch.randn(1, hidden, generator=g))
                slot_ids.insert(1, late_slot)
                fresh.insert(1, False)
            got = ours(inputs, slot_ids, fresh)
            if step >= 1:
                check(got.pop(1), hf(inputs[1][None], cache=late_cache)[0])
            for i in range(seqs):
                check(got[i], hf(tokens[i][None], cache=caches[i])[0])


@pytest.mark.parametrize("n_groups", [1, 2])
def test_matches_transformers_mamba2(n_groups):
    cfg = Mamba2Config(
        num_heads=4, head_dim=6, hidden_size=12, expand=2, state_size=5, n_groups=n_groups,
        conv_kernel=4, chunk_size=5, num_hidden_layers=1, vocab_size=16, use_bias=True,
        layer_norm_epsilon=1e-5,
    )  # fmt: skip
    hf = HFMamba2Mixer(cfg, layer_idx=0).eval()
    _perturb(hf, seed=n_groups)
    spec = SSMSpec.from_hf_config(cfg.to_dict())
    assert (spec.n_groups, spec.norm_before_gate, spec.rms_norm) == (n_groups, False, True)
    _compare(hf, cfg, _ours(hf, spec, "backbone.layers.0.mixer."), 12, seed=n_groups)


@pytest.mark.parametrize(
    "rms_norm,norm_before_gate,n_groups", [(True, True, 2), (True, False, 1), (False, True, 2)]
)
def test_matches_transformers_falcon_h1(rms_norm, norm_before_gate, n_groups):
    cfg = FalconH1Config(
        hidden_size=10, mamba_d_ssm=16, mamba_n_heads=4, mamba_d_head=4, mamba_d_state=6,
        mamba_n_groups=n_groups, mamba_d_conv=3, mamba_chunk_size=5, mamba_rms_norm=rms_norm,
        mamba_norm_before_gate=norm_before_gate, mamba_proj_bias=True, projectors_bias=True,
        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, vocab_size=16,
        intermediate_size=8, ssm_in_multiplier=0.7,
        ssm_multipliers=[1.3, 0.6, 1.5, 0.8, 1.2],
    )  # fmt: skip
    hf = FalconH1Mixer(cfg, layer_idx=0).eval()
    hf.register_buffer("mup_vector", compute_mup_vector(cfg), persistent=False)
    _perturb(hf, seed=3)
    spec = SSMSpec.from_hf_config(cfg.to_dict())
    assert spec.in_multiplier == 0.7 and spec.proj_multipliers == (1.3, 0.6, 1.5, 0.8, 1.2)
    assert spec.conv_kernel == 3 and spec.out_proj_bias
    _compare(hf, cfg, _ours(hf, spec, "model.layers.0.mamba."), 10, seed=3)


def test_config_reading_and_state_size():
    cfg = {
        "model_type": "mamba2", "hidden_size": 64, "num_heads": 8, "head_dim": 16, "expand": 2,
        "state_size": 32, "n_groups": 2, "conv_kernel": 4, "chunk_size": 128,
        "time_step_limit": [0.0, math.inf], "use_conv_bias": True, "layer_norm_epsilon": 1e-6,
    }  # fmt: skip
    spec = SSMSpec.from_hf_config(cfg)
    assert spec.conv_dim == 128 + 2 * 2 * 32 and spec.projection_size == 128 + 256 + 8
    mixer = Mamba2Mixer(spec, torch.float32)
    assert mixer.state_shapes() == {"conv": (256, 3), "ssm": (8, 16, 32)}
    assert mixer.state_bytes(4) == 4 * (256 * 3 + 8 * 16 * 32)
    with pytest.raises(ConfigError):
        SSMSpec.from_hf_config({**cfg, "num_heads": 7})
    with pytest.raises(ConfigError):
        SSMSpec.from_hf_config({**cfg, "model_type": "llama"})
