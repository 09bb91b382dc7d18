"""Model descriptions from real published configs (tests/perf/configs, sources in SOURCES.md).

Oracles: transformers instantiating each architecture on the meta device (exact parameter
counts), the model cards' published totals (active parameters), the KV-cache sizes the
architectures' papers state, and the tensors of a real GGUF. No published Mamba-2 config.json
is available offline, so the SSM case uses a small config of our own (transformers is still
the oracle)."""

from __future__ import annotations

import json
import pathlib

import gguf
import pytest
import torch

from infergen.errors import ConfigError
from infergen.perf.model_desc import MLA, SSM, Attention, from_config, from_path

CONFIGS = pathlib.Path(__file__).with_name("configs")
NAMES = sorted(p.stem for p in CONFIGS.glob("*.json"))


def transformers_count(config: dict) -> int:
    """sum of parameter sizes of the transformers model built from `config` on the meta device
    (no memory, no weights)."""
    transformers = pytest.importorskip("transformers")
    kwargs = {k: v for k, v in config.items() if k not in ("quantization_config", "auto_map")}
    cfg = transformers.AutoConfig.for_model(kwargs.pop("model_type"), **kwargs)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", NAMES)
def test_parameter_count_equals_transformers(name):
    config = json.loads((CONFIGS / f"{name}.json").read_text())
    desc = from_path(CONFIGS / f"{name}.json")
    assert desc.params_total() == transformers_count(config)
    assert 0 < desc.params_active() <= desc.params_total()


# (model card: total, active parameters), rounded as published; active excludes the input
# embedding lookup (gpt-oss card: 5.1B = 4.5B + the 0.58B unembedding)
PUBLISHED = {
    "llama-3.1-8b": (8.03e9, None),  # dense: the cards give no active count
    "llama-3.1-70b": (70.6e9, None),
    "deepseek-v3": (671e9, 37e9),  # without the 14B multi-token-prediction module
    "gpt-oss-20b": (20.9e9, 3.61e9),
    "gpt-oss-120b": (116.8e9, 5.13e9),
}


@pytest.mark.parametrize("name", sorted(set(PUBLISHED) & set(NAMES)))
def test_total_and_active_parameters_match_the_model_cards(name):
    desc = from_path(CONFIGS / f"{name}.json")
    total, active = PUBLISHED[name]
    assert desc.params_total() == pytest.approx(total, rel=0.02)
    if active is not None:
        assert desc.params_active() == pytest.approx(active, rel=0.03)


def test_kv_bytes_per_token_of_gqa_and_mla():
    if "llama-3.1-8b" in NAMES:  # 32 layers x 8 KV heads x 128 dims x (K, V) x 2 bytes
        llama = from_path(CONFIGS / "llama-3.1-8b.json")
        assert llama.kv_bytes_per_token(2) == 128 * 1024
    if "deepseek-v3" in NAMES:  # MLA caches (kv_lora_rank + rope dim) = 576 per layer
        ds = from_path(CONFIGS / "deepseek-v3.json")
        assert isinstance(ds.layers[0].mixer, MLA)
        assert ds.kv_bytes_per_token(2) == 61 * 576 * 2


@pytest.mark.skipif("gpt-oss-20b" not in NAMES, reason="fixture not collected")
def test_sliding_window_layers_cap_the_cache_per_sequence():
    desc = from_path(CONFIGS / "gpt-oss-20b.json")
    windows = [layer.mixer.window for layer in desc.layers]
    assert windows.count(128) == windows.count(None) == len(windows) // 2  # alternating
    per_layer = 2 * 8 * 64  # K and V, 8 KV heads of 64
    full, sliding = windows.count(None), windows.count(128)
    assert desc.kv_bytes_for_context(8192, 1) == per_layer * (full * 8192 + sliding * 128)
    assert desc.kv_bytes_for_context(100, 1) == desc.kv_bytes_per_token(1) * 100


def test_ssm_state_is_constant_per_sequence():
    config = {
        "model_type": "mamba2",
        "hidden_size": 64,
        "num_heads": 4,
        "head_dim": 32,
        "state_size": 16,
        "n_groups": 2,
        "conv_kernel": 4,
        "num_hidden_layers": 3,
        "vocab_size": 100,
        "expand": 2,
    }
    desc = from_config(config)
    assert isinstance(desc.layers[0].mixer, SSM)
    assert desc.kv_bytes_per_token(2) == 0
    assert desc.kv_bytes_for_context(10_000, 2) == 0
    conv_dim = 128 + 2 * 2 * 16
    assert desc.state_bytes_per_sequence(4) == 3 * (conv_dim * 3 + 4 * 32 * 16) * 4
    assert desc.params_total() == transformers_count(config)


@pytest.mark.parametrize(
    "layout",
    [
        dict(num_attention_heads=4, num_key_value_heads=4),  # MHA
        dict(num_attention_heads=4, num_key_value_heads=2),  # GQA
        dict(num_attention_heads=4, num_key_value_heads=1),  # MQA
        dict(num_attention_heads=4, num_key_value_heads=2, attention_bias=True, mlp_bias=True),
    ],
)
def test_llama_head_layouts_equal_transformers(layout):
    config = {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "vocab_size": 211,
        "tie_word_embeddings": False,
        **layout,
    }
    desc = from_config(config)
    assert desc.params_total() == transformers_count(config)
    assert isinstance(desc.layers[0].mixer, Attention)


def test_the_default_model_gguf(default_model_path):
    from infergen.io.checkpoint import load_checkpoint

    desc = from_path(default_model_path)
    cfg = load_checkpoint(default_model_path, load_weights=False).config
    # oracle: the elements of every tensor the checkpoint holds
    reader = gguf.GGUFReader(str(default_model_path))
    assert desc.params_total() == sum(int(t.n_elements) for t in reader.tensors)
    assert desc.kv_bytes_per_token(4) == 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * (
        cfg.head_dim * 4
    )


def test_unknown_architecture_and_missing_fields_are_named():
    with pytest.raises(ConfigError, match="model_type"):
        from_config({"model_type": "nonesuch"}, "x.json")
    with pytest.raises(ConfigError, match="config lacks 'num_attention_heads'"):
        from_config({"model_type": "llama", "num_hidden_layers": 2}, "x.json")


def test_cli_info_describes_a_config_json(capsys):
    from infergen.cli import main

    assert main(["info", "--model", str(CONFIGS / "gpt-oss-20b.json")]) == 0
    out = capsys.readouterr().out
    desc = from_path(CONFIGS / "gpt-oss-20b.json")
    assert f"{desc.params_total():,}" in out and f"{desc.params_active():,}" in out
    assert "12 attention(window 128), 12 attention" in out and "moe(32 experts, top 4)" in out


def test_cli_info_names_a_bad_config(tmp_path, capsys):
    from infergen.cli import main

    bad = tmp_path / "config.json"
    bad.write_text('{"model_type": "llama"}')
    assert main(["info", "--model", str(bad)]) == 2
    assert "lacks" in capsys.readouterr().err
