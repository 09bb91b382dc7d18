"""Hugging Face directories: a sharded checkpoint loads the same tensors as a single file."""

from __future__ import annotations

import json

import torch

from infergen.io.checkpoint import load_checkpoint
from tests.hf_models import build_hf_model


def test_sharded_equals_single(tmp_path):
    single, sharded = tmp_path / "single", tmp_path / "sharded"
    model = build_hf_model("qwen2_qkv_bias", single)
    model.save_pretrained(sharded, safe_serialization=True, max_shard_size="40KB")
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1  # really sharded
    a, b = load_checkpoint(single), load_checkpoint(sharded)
    assert a.config == b.config
    assert a.tensors.keys() == b.tensors.keys()
    for name in a.tensors:
        assert torch.equal(a.tensors[name], b.tensors[name]), name
    state = model.state_dict()
    for name, tensor in a.tensors.items():
        assert torch.equal(tensor, state[name].float()), name
