"""Every bad input gets one clear message naming the file / tensor / field, what was found and
what was expected; the CLI exits with code 2 and no traceback."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from infergen.cli import main
from infergen.errors import CheckpointError, ConfigError, InfergenError
from infergen.io.checkpoint import load_checkpoint
from tests.hf_models import build_hf_model


@pytest.fixture(scope="module")
def good_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("good")
    build_hf_model("llama_gqa", directory)
    return directory


@pytest.fixture
def bad_dir(good_dir, tmp_path):
    target = tmp_path / "model"
    shutil.copytree(good_dir, target)
    return target


def _edit_config(directory: Path, **changes) -> None:
    path = directory / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def _edit_tensors(directory: Path, edit) -> None:
    path = directory / "model.safetensors"
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path))


def _cli_error(capsys, *argv: str) -> str:
    code = main(list(argv))
    err = capsys.readouterr().err
    assert code == 2
    assert "Traceback" not in err
    return err


def test_good_checkpoint_loads(good_dir):
    assert load_checkpoint(good_dir).config.architecture == "llama"


def test_missing_path(capsys, tmp_path):
    missing = tmp_path / "nope.gguf"
    err = _cli_error(capsys, "info", "--model", str(missing))
    assert str(missing) in err and "does not exist" in err


def test_directory_without_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="not a checkpoint"):
        load_checkpoint(tmp_path)


@pytest.mark.parametrize("fraction", [0.001, 0.3, 0.999])
def test_truncated_gguf(default_model_path, tmp_path, capsys, fraction):
    data = default_model_path.read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[: int(len(data) * fraction)])
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert str(path) in str(info.value) and "truncated or corrupt" in str(info.value)
    err = _cli_error(capsys, "generate", "--model", str(path), "hi")
    assert str(path) in err


def test_corrupt_gguf_magic(tmp_path):
    path = tmp_path / "junk.gguf"
    path.write_bytes(b"NOTGGUF" + bytes(4096))
    with pytest.raises(CheckpointError, match="magic"):
        load_checkpoint(path)


def test_truncated_safetensors(bad_dir):
    path = bad_dir / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-1000])
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(bad_dir)
    assert "model.safetensors" in str(info.value)


def test_corrupt_safetensors_header(bad_dir):
    path = bad_dir / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[8:20] = b"{garbage!!!!"
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_checkpoint(bad_dir)


def test_invalid_config_json(bad_dir, capsys):
    (bad_dir / "config.json").write_text("{not json")
    err = _cli_error(capsys, "info", "--model", str(bad_dir))
    assert "config.json" in err and "invalid JSON" in err


def test_unknown_architecture(bad_dir):
    _edit_config(bad_dir, model_type="gpt_neox")
    with pytest.raises(ConfigError) as info:
        load_checkpoint(bad_dir)
    message = str(info.value)
    assert "model_type" in message and "gpt_neox" in message and "llama" in message


def test_missing_tensor(bad_dir, capsys):
    name = "model.layers.1.mlp.up_proj.weight"
    _edit_tensors(bad_dir, lambda t: t.pop(name))
    err = _cli_error(capsys, "generate", "--model", str(bad_dir), "hi")
    assert name in err and "missing" in err


def test_wrong_tensor_shape(bad_dir):
    name = "model.layers.0.self_attn.k_proj.weight"
    _edit_tensors(bad_dir, lambda t: t.__setitem__(name, torch.zeros(3, 64)))
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(bad_dir)
    message = str(info.value)
    assert name in message and "[3, 64]" in message and "[32, 64]" in message


def test_unexpected_tensor(bad_dir):
    _edit_tensors(
        bad_dir, lambda t: t.__setitem__("model.layers.0.self_attn.q_proj.bias", torch.zeros(64))
    )
    with pytest.raises(ConfigError, match="q_proj.bias"):
        load_checkpoint(bad_dir)


@pytest.mark.parametrize(
    "changes,field",
    [
        (dict(num_key_value_heads=3), "num_key_value_heads"),  # 4 heads, 3 KV heads
        (dict(hidden_size=66, head_dim=None), "hidden_size"),  # not divisible by heads
        (dict(head_dim=15), "head_dim"),  # odd: no rotary pairs
        (dict(num_hidden_layers=0), "num_hidden_layers"),
        (dict(num_attention_heads=0), "num_attention_heads"),
        (dict(rms_norm_eps=-1.0), "rms_norm_eps"),
        (dict(vocab_size=None), "vocab_size"),
        (dict(rope_parameters=dict(rope_type="dynamic", rope_theta=1e4)), "rope_type"),
        (dict(hidden_act="relu"), "hidden_act"),
    ],
)
def test_contradicting_config(bad_dir, changes, field):
    _edit_config(bad_dir, **changes)
    with pytest.raises(InfergenError) as info:
        load_checkpoint(bad_dir)
    assert field in str(info.value) and "config.json" in str(info.value)


def test_shape_disagreeing_with_config(bad_dir):
    _edit_config(bad_dir, intermediate_size=100)  # tensors were saved with 136
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(bad_dir)
    assert "mlp" in str(info.value) and "100" in str(info.value)


def test_sharded_index_names_missing_shard(bad_dir):
    (bad_dir / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}})
    )
    with pytest.raises(CheckpointError, match="model-00002-of-00002"):
        load_checkpoint(bad_dir)


def test_debug_flag_shows_traceback(tmp_path):
    with pytest.raises(CheckpointError):
        main(["--debug", "info", "--model", str(tmp_path / "missing")])
