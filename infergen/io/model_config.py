"""The one reader of a model's description without its weights: a Hugging Face config.json (a
file, or a directory holding one) or a GGUF file's header (or a directory holding one GGUF)
→ `ModelConfig`. The checkpoint loader (io/checkpoint.py) reads configs through it; `infergen
info` / `infergen predict` and the performance model describe any model with it
(`read_model_config(path).describe()`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from infergen.config import ModelConfig
from infergen.errors import CheckpointError


def config_from_json(path: Path) -> ModelConfig:
    """A Hugging Face config.json (a multimodal one: its text_config)."""
    from infergen.io.safetensors import read_json

    return ModelConfig.from_hf_dict(read_json(path), source=str(path))


def config_from_gguf(reader: Any, source: str) -> tuple[ModelConfig, Any]:
    """A GGUF file's metadata and tensor types (an open GGUFReader) → (ModelConfig, ArchSpec)."""
    from infergen.io.gguf import gguf_hf_config

    hf_config, spec = gguf_hf_config(reader, source)
    return ModelConfig.from_hf_dict(hf_config, source=source), spec


GGUF_MAGIC = b"GGUF"


def _starts_with(path: Path, magic: bytes) -> bool:
    with open(path, "rb") as f:
        return f.read(len(magic)) == magic


def gguf_in_directory(directory: Path) -> Path | None:
    """The one .gguf file of a directory (None: none; an error: several)."""
    files = sorted(directory.glob("*.gguf"))
    if len(files) > 1:
        raise CheckpointError(
            "directory holds several GGUF files",
            where=str(directory),
            found=", ".join(f.name for f in files),
            expected="name the file itself",
        )
    return files[0] if files else None


def read_model_config(path: str | Path) -> ModelConfig:
    """A config.json, a directory holding one (or one GGUF file), or a GGUF file: no weights,
    no tokenizer."""
    resolved = Path(path).expanduser()
    if resolved.is_dir():
        if (resolved / "config.json").is_file():
            resolved = resolved / "config.json"
        else:
            gguf_file = gguf_in_directory(resolved)
            if gguf_file is None:
                raise CheckpointError(
                    "directory holds no model config",
                    where=str(resolved),
                    expected="a config.json or a .gguf file",
                )
            resolved = gguf_file
    if not resolved.is_file():
        raise CheckpointError(
            "model config not found",
            where=str(resolved),
            expected="a config.json, a directory holding one, or a .gguf file",
        )
    if resolved.suffix == ".gguf" or _starts_with(resolved, GGUF_MAGIC):
        from infergen.io.gguf import open_gguf

        return config_from_gguf(open_gguf(resolved), str(resolved))[0]
    return config_from_json(resolved)
