"""Model descriptions (config/description.py) of configs read by the one reader
(io/model_config.py): transformers' default config of every family the engine runs, and real
published configs (tests/perf/configs, sources in SOURCES.md).

Oracles: transformers instantiating each architecture on the meta device (exact parameter
counts; its own layer_types for the windows), the model cards' published totals (active
parameters), the KV-cache sizes the architectures' papers state, the tensors of a real GGUF,
and the engine's own recurrent state buffers. No published Mamba-2 config.json is available
offline, so the SSM case also uses a small config of our own (transformers is still the
oracle)."""

from __future__ import annotations

import json
import pathlib

import gguf
import pytest
import torch

from infergen.cli import main
from infergen.config import ModelConfig
from infergen.config.architectures import ARCHITECTURES
from infergen.config.description import MLA, SSM, Attention, AttentionSSM, LinearAttention
from infergen.errors import ConfigError
from infergen.io.model_config import read_model_config

transformers = pytest.importorskip("transformers")

CONFIGS = pathlib.Path(__file__).parents[1] / "perf" / "configs"
NAMES = sorted(p.stem for p in CONFIGS.glob("*.json"))

# every family the engine runs: config.json model_type → overrides of transformers' default
# config (its full size: the meta device holds no memory)
FAMILIES = {
    "llama": {},
    "mistral": {},
    "qwen2": {},
    "qwen3": {},
    "gemma3_text": {},
    "gpt_oss": {},
    "deepseek_v2": {"num_experts_per_tok": 6},  # the default is None: no routing at all
    "deepseek_v3": {},
    "qwen3_next": {},
    "mamba2": {},
    "falcon_h1": {},
}


def describe_dict(config: dict, source: str = "x.json"):
    return ModelConfig.from_hf_dict(config, source=source).describe()


def meta_count(hf_config) -> int:
    """Parameters of the transformers model built from `hf_config` on the meta device (no
    memory, no weights)."""
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_config)
    return sum(p.numel() for p in model.parameters())


def transformers_count(config: dict) -> int:
    kwargs = {k: v for k, v in config.items() if k not in ("quantization_config", "auto_map")}
    return meta_count(transformers.AutoConfig.for_model(kwargs.pop("model_type"), **kwargs))


def saved_default(model_type: str, directory: pathlib.Path, **changes):
    """transformers' default config of a family (with FAMILIES' overrides and `changes`),
    saved as config.json the way save_pretrained writes it."""
    hf_config = transformers.AutoConfig.for_model(model_type, **FAMILIES[model_type], **changes)
    hf_config.save_pretrained(directory)
    return hf_config


def test_the_grid_covers_every_architecture():
    types = {t for _, spec in ARCHITECTURES.items() for t in spec.hf_model_types}
    assert types == set(FAMILIES)


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_default_config_of_every_family_counts_as_transformers(model_type, tmp_path):
    hf_config = saved_default(model_type, tmp_path)
    desc = read_model_config(tmp_path).describe()
    assert desc.params_total() == meta_count(hf_config)
    assert 0 < desc.params_active() <= desc.params_total()
    assert desc.name == tmp_path.name  # a config.json is named by its directory
    layer_types = getattr(hf_config, "layer_types", None)
    if layer_types and set(layer_types) <= {"full_attention", "sliding_attention"}:
        windows = [hf_config.sliding_window if t == "sliding_attention" else None
                   for t in layer_types]  # fmt: skip
        assert [layer.mixer.window for layer in desc.layers] == windows


@pytest.mark.parametrize("name", NAMES)
def test_published_config_counts_as_transformers(name):
    config = json.loads((CONFIGS / f"{name}.json").read_text())
    desc = read_model_config(CONFIGS / f"{name}.json").describe()
    assert desc.params_total() == transformers_count(config)
    assert 0 < desc.params_active() <= desc.params_total()
    assert desc.name == name


@pytest.mark.parametrize(
    "model_type, changes",
    [
        ("gemma3_text", {}),  # 5 sliding : 1 full (sliding_window_pattern)
        ("gemma3_text", {"sliding_window_pattern": 3}),
        ("gpt_oss", {"num_hidden_layers": 5}),  # alternating
        ("qwen3_next", {"num_hidden_layers": 6}),  # full_attention_interval
        ("qwen2", {"use_sliding_window": True, "num_hidden_layers": 6, "max_window_layers": 4}),
        ("qwen3", {"use_sliding_window": True, "num_hidden_layers": 6, "max_window_layers": 2}),
    ],
)
def test_layer_types_a_config_does_not_list_are_derived_as_transformers_does(
    model_type, changes, tmp_path
):
    """Older config.json files (and gpt-oss / Qwen3-Next ones) carry no layer_types."""
    hf_config = saved_default(model_type, tmp_path, **changes)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["layer_types"]
    ours = ModelConfig.from_hf_dict(config, source="x.json")
    layers = range(ours.num_hidden_layers)
    assert [ours.layer_type(i) for i in layers] == list(hf_config.layer_types)
    expected = [hf_config.sliding_window if t == "sliding_attention" else None
                for t in hf_config.layer_types]  # fmt: skip
    assert [ours.window(i) for i in layers] == expected


def test_a_multimodal_config_describes_its_text_model(tmp_path):
    text = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                num_attention_heads=2, num_key_value_heads=1, head_dim=64)  # fmt: skip
    hf_config = transformers.Gemma3Config(text_config=text)
    hf_config.save_pretrained(tmp_path)
    desc = read_model_config(tmp_path).describe()
    assert desc.architecture == "gemma3"
    assert desc.params_total() == meta_count(hf_config.text_config)


def test_a_sparse_text_config_takes_transformers_defaults(tmp_path):
    """google/gemma-3-4b-it's config.json lists only what differs from Gemma3TextConfig's
    defaults in its text_config (its shape as quoted by the stored index; vision tower
    omitted)."""
    text = {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
            "num_hidden_layers": 34, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
            "sliding_window": 1024}  # fmt: skip
    config = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
              "eos_token_id": [1, 106], "text_config": text}  # fmt: skip
    ours = ModelConfig.from_hf_dict(config, source="gemma-3-4b-it.json")
    hf_text = transformers.AutoConfig.for_model(**text)
    assert ours.describe().params_total() == meta_count(hf_text)  # 3.88 B without vision
    assert ours.eos_token_ids == (1, 106) and ours.tie_word_embeddings
    assert [ours.layer_type(i) for i in range(34)] == list(hf_text.layer_types)
    assert ours.rope_theta == 1e6 and ours.rope_local_theta == 1e4 and ours.head_dim == 256


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
    desc = read_model_config(CONFIGS / f"{name}.json").describe()
    total, active = PUBLISHED[name]
    assert desc.params_total() == pytest.approx(total, rel=0.02)
    if active is not None:
        assert desc.params_active() == pytest.approx(active, rel=0.03)


def test_kv_bytes_per_token_of_gqa_and_mla():
    if "llama-3.1-8b" in NAMES:  # 32 layers x 8 KV heads x 128 dims x (K, V) x 2 bytes
        llama = read_model_config(CONFIGS / "llama-3.1-8b.json").describe()
        assert llama.kv_bytes_per_token(2) == 128 * 1024
    if "deepseek-v3" in NAMES:  # MLA caches (kv_lora_rank + rope dim) = 576 per layer
        ds = read_model_config(CONFIGS / "deepseek-v3.json").describe()
        assert isinstance(ds.layers[0].mixer, MLA)
        assert ds.kv_bytes_per_token(2) == 61 * 576 * 2
        assert ds.notes and "multi-token-prediction" in ds.notes[0]  # not counted


@pytest.mark.skipif("gpt-oss-20b" not in NAMES, reason="fixture not collected")
def test_sliding_window_layers_cap_the_cache_per_sequence():
    desc = read_model_config(CONFIGS / "gpt-oss-20b.json").describe()
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
    desc = describe_dict(config)
    assert isinstance(desc.layers[0].mixer, SSM)
    assert desc.kv_bytes_per_token(2) == 0
    assert desc.kv_bytes_for_context(10_000, 2) == 0
    conv_dim = 128 + 2 * 2 * 16
    assert desc.state_bytes_per_sequence(4) == 3 * (conv_dim * 3 + 4 * 32 * 16) * 4
    assert desc.params_total() == transformers_count(config)


@pytest.mark.parametrize("name", ["mamba2", "qwen3_next", "falcon_h1"])
def test_recurrent_state_bytes_equal_the_engines_state_buffers(name):
    """The state the engine allocates per sequence (kvcache/state_cache.py) for the tiny
    recurrent and hybrid models, and the KV it caches per token (the attention beside)."""
    from infergen.kvcache.state_cache import StateCache
    from infergen.models.transformer import Transformer
    from tests.hf_models import ARCH_VARIANTS, BASE

    cls_name, extra = ARCH_VARIANTS[name]
    config = getattr(transformers, cls_name)(**{**BASE, **extra}).to_dict()
    ours = ModelConfig.from_hf_dict(config, source=f"{name}.json")
    desc = ours.describe()
    assert desc.params_total() == meta_count(getattr(transformers, cls_name)(**config))
    model = Transformer(ours)
    assert desc.state_bytes_per_sequence(4) == StateCache.bytes_per_slot(model.state_layers) > 0
    kinds = {type(layer.mixer) for layer in desc.layers}
    expected = {"mamba2": {SSM}, "qwen3_next": {LinearAttention, Attention},
                "falcon_h1": {AttentionSSM}}[name]  # fmt: skip
    assert kinds == expected


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
    desc = describe_dict(config)
    assert desc.params_total() == transformers_count(config)
    assert isinstance(desc.layers[0].mixer, Attention)


def test_the_default_model_gguf(default_model_path):
    cfg = read_model_config(default_model_path)
    desc = cfg.describe()
    # oracle: the elements of every tensor the checkpoint holds
    reader = gguf.GGUFReader(str(default_model_path))
    assert desc.params_total() == sum(int(t.n_elements) for t in reader.tensors)
    assert desc.kv_bytes_per_token(4) == 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * (
        cfg.head_dim * 4
    )
    assert desc.name == default_model_path.stem
    # stored as Q4_1 mostly (Q8_0 and F32 besides): weight bytes are the file's tensor bytes
    stored = desc.stored_weights
    assert stored.weights == "q4_1"
    stored_bytes = sum(int(t.n_bytes) for t in reader.tensors)
    assert desc.weight_bytes(stored.weight_bits) == pytest.approx(stored_bytes, rel=1e-12)


def test_unknown_architecture_and_missing_fields_are_named():
    with pytest.raises(ConfigError, match="model_type"):
        describe_dict({"model_type": "nonesuch"})
    with pytest.raises(ConfigError, match="'num_attention_heads' is missing"):
        describe_dict({"model_type": "llama", "num_hidden_layers": 2})
    with pytest.raises(ConfigError, match="'num_experts_per_tok' is missing"):
        describe_dict(transformers.AutoConfig.for_model("deepseek_v2").to_dict())


def _info(capsys, path) -> str:
    assert main(["info", "--model", str(path)]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_cli_info_describes_the_default_config_of_every_family(model_type, tmp_path, capsys):
    saved_default(model_type, tmp_path)
    out = _info(capsys, tmp_path / "config.json")
    desc = read_model_config(tmp_path).describe()
    assert f"{desc.params_total():,}" in out and f"{desc.params_active():,}" in out


@pytest.mark.parametrize("name", NAMES)
def test_cli_info_describes_every_published_config(name, capsys):
    out = _info(capsys, CONFIGS / f"{name}.json")
    desc = read_model_config(CONFIGS / f"{name}.json").describe()
    assert f"{desc.params_total():,}" in out and f"{desc.params_active():,}" in out


def test_cli_info_describes_a_config_json(capsys):
    out = _info(capsys, CONFIGS / "gpt-oss-20b.json")
    desc = read_model_config(CONFIGS / "gpt-oss-20b.json").describe()
    assert f"{desc.params_total():,}" in out and f"{desc.params_active():,}" in out
    assert "12 attention(window 128), 12 attention" in out and "moe(32 experts, top 4)" in out


def test_cli_info_names_a_bad_config(tmp_path, capsys):
    bad = tmp_path / "config.json"
    bad.write_text('{"model_type": "llama"}')
    assert main(["info", "--model", str(bad)]) == 2
    assert "is missing" in capsys.readouterr().err
