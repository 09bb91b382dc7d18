"""GatedDeltaNet against transformers' Qwen3NextGatedDeltaNet (tiny random config, fp32, torch
fallback path): a packed varlen prefill, decode steps, and a mixed step (continuation chunks +
decodes + a new sequence in a reused slot), each sequence checked against HF run alone with its
own cache."""

from __future__ import annotations

import importlib

import pytest
import torch

from infergen.errors import CheckpointError, ConfigError
from infergen.layers.linear_attention import DeltaNetSpec, GatedDeltaNet

qwen3_next = importlib.import_module("transformers.models.qwen3_next.modeling_qwen3_next")
from transformers import Qwen3NextConfig  # noqa: E402
from transformers.cache_utils import DynamicCache  # noqa: E402

HIDDEN = 48


def _hf_config(k_heads: int, v_heads: int, k_dim: int, v_dim: int) -> Qwen3NextConfig:
    return Qwen3NextConfig(
        hidden_size=HIDDEN,
        linear_num_key_heads=k_heads,
        linear_num_value_heads=v_heads,
        linear_key_head_dim=k_dim,
        linear_value_head_dim=v_dim,
        linear_conv_kernel_dim=4,
        num_hidden_layers=1,
        layer_types=["linear_attention"],
        rms_norm_eps=1e-6,
        vocab_size=16,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        num_experts=2,
        num_experts_per_tok=1,
    )


def _models(heads):
    torch.manual_seed(0)
    cfg = _hf_config(*heads)
    hf = qwen3_next.Qwen3NextGatedDeltaNet(cfg, layer_idx=0).eval()
    with torch.no_grad():  # non-trivial values for what HF initialises to constants
        hf.dt_bias.normal_()
        hf.norm.weight.copy_(1 + 0.3 * torch.randn_like(hf.norm.weight))
        hf.conv1d.weight.mul_(2.0)
    ours = GatedDeltaNet(DeltaNetSpec.from_hf_config(cfg.to_dict()))
    weights = {f"model.layers.0.linear_attn.{n}": t for n, t in hf.state_dict().items()}
    ours.load(weights.__getitem__, "model.layers.0.linear_attn.")
    return cfg, hf, ours


class _HFSequence:
    """One sequence run alone through the HF mixer with its own cache."""

    def __init__(self, hf, cfg) -> None:
        self.hf, self.cache = hf, DynamicCache(config=cfg)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # [n, hidden] → [n, hidden]
        return self.hf(x[None], cache=self.cache)[0]


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    err = float((got - want).abs().max())
    assert err <= 1e-4 * float(want.abs().max()), (err, float(want.abs().max()))


@pytest.mark.parametrize("heads", [(2, 4, 8, 12), (3, 3, 16, 8)])
@torch.no_grad()
def test_matches_transformers_prefill_decode_and_mixed(heads):
    cfg, hf, ours = _models(heads)
    gen = torch.Generator().manual_seed(1)
    num_slots = 6
    states = ours.allocate_states(num_slots)
    for t in states.values():  # garbage: fresh sequences must not read it
        t.normal_(generator=gen)
    slot_of = {0: 2, 1: 0, 2: 5}
    hf_seqs = {i: _HFSequence(hf, cfg) for i in slot_of}

    def step(lengths: dict[int, int], fresh: set[int]) -> None:
        members = list(lengths)
        xs = {i: torch.randn(lengths[i], HIDDEN, generator=gen) for i in members}
        qsl = [0]
        for i in members:
            qsl.append(qsl[-1] + lengths[i])
        got = ours(
            torch.cat([xs[i] for i in members]),
            states,
            qsl,
            torch.tensor([slot_of[i] for i in members]),
            torch.tensor([i in fresh for i in members]),
        )
        for i, piece in zip(members, got.split([lengths[i] for i in members]), strict=True):
            _close(piece, hf_seqs[i](xs[i]))

    step({0: 5, 1: 70, 2: 1}, fresh={0, 1, 2})  # packed prefill, one over a chunk
    for _ in range(3):  # decode: one vectorised recurrent step
        step({0: 1, 1: 1, 2: 1}, fresh=set())
    slot_of[3] = 1  # a new sequence in a slot nobody used (garbage state)
    hf_seqs[3] = _HFSequence(hf, cfg)
    step({0: 6, 3: 9, 1: 1, 2: 2}, fresh={3})  # continuation chunks + decode + new prefill
    for _ in range(2):
        step({2: 1, 0: 1, 3: 1, 1: 1}, fresh=set())


def test_spec_from_config_and_state_sizes():
    cfg = _hf_config(2, 4, 8, 12).to_dict()
    spec = DeltaNetSpec.from_hf_config(cfg)
    assert (spec.num_k_heads, spec.num_v_heads, spec.k_head_dim, spec.v_head_dim) == (2, 4, 8, 12)
    assert spec.conv_dim == 2 * 16 + 48 and spec.conv_width == 4 and spec.activation == "silu"
    layer = GatedDeltaNet(spec)
    assert layer.state_shapes() == {"conv": (80, 3), "recurrent": (4, 8, 12)}
    assert layer.state_bytes(2) == (80 * 3 + 4 * 8 * 12) * 2
    assert layer.state_bytes(2, recurrent_dtype_bytes=4) == 80 * 3 * 2 + 4 * 8 * 12 * 4
    del cfg["linear_num_key_heads"]
    with pytest.raises(ConfigError, match="linear_num_key_heads"):
        DeltaNetSpec.from_hf_config(cfg)
    with pytest.raises(ConfigError, match="multiple"):
        DeltaNetSpec(hidden_size=8, num_k_heads=3, num_v_heads=4, k_head_dim=2, v_head_dim=2)


def test_load_names_a_wrong_shape():
    spec = DeltaNetSpec(hidden_size=8, num_k_heads=1, num_v_heads=2, k_head_dim=2, v_head_dim=2)
    with pytest.raises(CheckpointError, match="in_proj_qkvz"):
        GatedDeltaNet(spec).load(lambda name: torch.zeros(3, 3), "p.")
