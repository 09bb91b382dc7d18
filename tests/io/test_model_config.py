"""The one reader of a model's config without its weights (io/model_config.py): a config.json,
a directory holding one or one GGUF, a GGUF file (by suffix or by its magic). Oracle: the
checkpoint loader, which reads configs through it and must agree."""

from __future__ import annotations

import pytest

from infergen.errors import CheckpointError
from infergen.io.checkpoint import load_checkpoint
from infergen.io.model_config import read_model_config
from tests.hf_models import build_hf_model


def test_a_config_json_and_its_directory_read_as_the_loader_does(tmp_path):
    build_hf_model("qwen3_next", tmp_path)
    loaded = load_checkpoint(tmp_path, load_weights=False).config
    assert read_model_config(tmp_path) == loaded
    assert read_model_config(tmp_path / "config.json") == loaded
    assert read_model_config(tmp_path).describe().name == tmp_path.name


def tiny_gguf(path, qtype: str = "Q8_0"):
    import gguf

    from tests.io.test_gguf import _write_gguf, tiny_llama

    _write_gguf(path, tiny_llama(), getattr(gguf.GGMLQuantizationType, qtype))
    return path


def test_a_gguf_by_suffix_by_directory_and_by_magic(tmp_path):
    (tmp_path / "one").mkdir()
    gguf_file = tiny_gguf(tmp_path / "one" / "m.gguf")
    config = read_model_config(gguf_file)
    assert config == load_checkpoint(gguf_file, load_weights=False).config
    assert config.architecture == "llama" and config.stored_weights.weights == "q8_0"
    (tmp_path / "model").symlink_to(gguf_file)  # no suffix: the magic says GGUF
    for path in (tmp_path / "one", tmp_path / "model"):
        assert read_model_config(path) == config


def test_missing_and_ambiguous_paths_are_named(tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        read_model_config(tmp_path / "nonesuch.json")
    with pytest.raises(CheckpointError, match="no model config"):
        read_model_config(tmp_path)
    tiny_gguf(tmp_path / "a.gguf")
    (tmp_path / "b.gguf").symlink_to(tmp_path / "a.gguf")
    with pytest.raises(CheckpointError, match="several GGUF"):
        read_model_config(tmp_path)


def test_invalid_json_is_named(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text('{"model_type": ')
    with pytest.raises(CheckpointError, match="invalid JSON"):
        read_model_config(bad)
