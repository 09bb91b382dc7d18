"""Hugging Face checkpoint directories: `config.json` + safetensors (single or sharded).

A sharded checkpoint has `model.safetensors.index.json` whose `weight_map` names the shard
of every tensor. Tensors are returned under their Hugging Face names, converted to fp32.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from infergen.errors import CheckpointError

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"


def read_json(path: Path) -> dict[str, Any]:
    """Read a JSON object, naming the file and the parse position on failure."""
    if not path.is_file():
        raise CheckpointError("file is missing", where=str(path), expected="a JSON file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(
            "invalid JSON", where=str(path), found=str(exc), expected="a JSON object"
        ) from exc
    if not isinstance(data, dict):
        raise CheckpointError(
            "JSON root is not an object", where=str(path), found=type(data).__name__
        )
    return data


def shard_files(directory: Path) -> list[Path]:
    """The safetensors files of a checkpoint directory, in index order."""
    index = directory / INDEX
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(
                "index has no weight_map", where=str(index), expected='{"weight_map": {...}}'
            )
        files = sorted(set(weight_map.values()))
        missing = [f for f in files if not (directory / f).is_file()]
        if missing:
            raise CheckpointError(
                "shard named in the index is missing",
                where=str(index),
                found=", ".join(missing),
                expected="every shard file beside the index",
            )
        return [directory / f for f in files]
    if (directory / SINGLE).is_file():
        return [directory / SINGLE]
    found = sorted(directory.glob("*.safetensors"))
    if found:
        return found
    raise CheckpointError(
        "no safetensors weights in checkpoint directory",
        where=str(directory),
        expected=f"{SINGLE} or {INDEX} with its shards",
    )


def load_safetensors(directory: Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint directory, keyed by Hugging Face name: floating-point
    values as fp32, integer and one-byte tensors (quantized codes) as stored."""
    from safetensors import safe_open

    tensors: dict[str, torch.Tensor] = {}
    for path in shard_files(directory):
        try:
            with safe_open(str(path), framework="pt") as handle:
                for name in handle.keys():
                    t = handle.get_tensor(name)
                    # values → fp32; codes (integers, FP8 / packed bytes) stay as stored
                    stored = not t.is_floating_point() or t.element_size() == 1
                    tensors[name] = t if stored else t.to(torch.float32)
        except CheckpointError:
            raise
        except Exception as exc:  # SafetensorError, OSError on truncated files
            raise CheckpointError(
                "not a readable safetensors file (truncated or corrupt?)",
                where=str(path),
                found=f"{type(exc).__name__}: {exc}",
                expected="a complete safetensors file",
            ) from exc
    return tensors
