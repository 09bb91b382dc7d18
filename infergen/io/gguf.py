"""GGUF checkpoints: metadata → `ModelConfig`, tensors dequantized to fp32 under canonical names.
The file is parsed by gguf_file.py (its metadata, tensor infos and data views).

GGUF (llama.cpp's format) stores each tensor with its ggml type; `gguf.quants.dequantize`
decodes F32/F16/BF16/Q8_0/Q4_0/Q4_1/Q4_K/Q6_K/... blocks. Tensor names are mapped onto the
Hugging Face names the generic decoder uses. For Llama, llama.cpp's converter permutes the
rows of attn_q / attn_k so that rotary pairs are interleaved; we undo it so that every
architecture uses the half-split rotary layout (`ArchSpec.gguf_permute_qk`).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from infergen.config.architectures import ArchSpec, arch_for_gguf
from infergen.errors import CheckpointError, ConfigError
from infergen.formats.block_weight import BLOCK_TYPES, BlockWeight, decode_blocks
from infergen.io.gguf_file import GGUFFile

# GGUF tensor name → Hugging Face name ("{i}" is the layer index).
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "{mlp_norm}",  # the norm in front of the MLP (ArchSpec.mlp_norm_name)
    "post_attention_norm": "post_attention_layernorm",  # sandwich norms (Gemma)
    "post_ffw_norm": "post_feedforward_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")
# Tensors llama.cpp writes that the decoder recomputes itself.
_IGNORED = {"rope_freqs.weight"}


def open_gguf(path: Path) -> GGUFFile:
    """Open a GGUF file (gguf_file.py), turning every low-level failure into a
    CheckpointError."""
    try:
        return GGUFFile(path)
    except Exception as exc:  # ValueError / struct.error / UnicodeDecodeError / OSError
        raise CheckpointError(
            "not a readable GGUF file (truncated or corrupt?)",
            where=str(path),
            found=f"{type(exc).__name__}: {exc}",
            expected="a complete GGUF v2/v3 file",
        ) from exc


def _field(reader: Any, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return default
    value = field.contents()
    return value


def gguf_hf_config(reader: Any, source: str) -> tuple[dict[str, Any], ArchSpec]:
    """Map GGUF metadata onto Hugging Face `config.json` keys."""
    arch_name = _field(reader, "general.architecture")
    if arch_name is None:
        raise CheckpointError(
            "GGUF metadata has no general.architecture", where=source, expected="e.g. 'llama'"
        )
    spec = arch_for_gguf(arch_name, source=source)

    def key(name: str, default: Any = None) -> Any:
        return _field(reader, f"{arch_name}.{name}", default)

    heads = key("attention.head_count")
    hidden = key("embedding_length")
    cfg: dict[str, Any] = {
        "model_type": spec.hf_model_types[0],
        "hidden_size": hidden,
        "intermediate_size": key("feed_forward_length"),
        "num_hidden_layers": key("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": key("attention.head_count_kv", heads),
        "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(key("rope.freq_base", 10000.0)),
        "max_position_embeddings": key("context_length", 4096),
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
    }
    head_dim = key("attention.key_length")
    if head_dim is not None:
        cfg["head_dim"] = head_dim
    vocab = key("vocab_size")
    if vocab is None:
        tokens = reader.fields.get("tokenizer.ggml.tokens")
        vocab = len(tokens.data) if tokens is not None else None
    cfg["vocab_size"] = vocab
    scaling = key("rope.scaling.type")
    if scaling not in (None, "none"):
        cfg["rope_scaling"] = {
            "rope_type": scaling,
            "factor": float(key("rope.scaling.factor", 1.0)),
            "original_max_position_embeddings": key("rope.scaling.original_context_length", 8192),
        }
    names = {t.name for t in reader.tensors}
    cfg["tie_word_embeddings"] = "output.weight" not in names
    if "rope_freqs.weight" in names:
        raise ConfigError(
            "GGUF carries a rope_freqs tensor (Llama-3 rope scaling), not supported yet",
            where=f"{source}: rope_freqs.weight",
            expected="a GGUF without rope_freqs, or the Hugging Face safetensors directory",
        )
    if spec.qkv_bias is None:
        cfg["attention_bias"] = "blk.0.attn_q.bias" in names
    if reader.tensors:
        cfg["quantization_config"] = _stored_types(reader)
    extra = GGUF_ARCH_RULES.get(arch_name)
    if extra is not None:
        extra(key, cfg)
    return cfg, spec


# ggml float types → our names for them (config/stored.py PLAIN_BITS)
_PLAIN_TYPES = {"F32": "fp32", "F16": "fp16", "BF16": "bf16"}


def _stored_types(reader: Any) -> dict[str, Any]:
    """The file's tensor types as a "gguf" quantization_config (config/stored.py): the type
    holding the most weights, and the bits per weight of all tensors together (the file's
    weight bytes · 8 / its weights: Q4_K_M's Q6_K tensors included)."""
    elements: Counter[str] = Counter()
    stored_bytes = 0
    for t in reader.tensors:
        elements[t.tensor_type.name] += int(t.n_elements)
        stored_bytes += int(t.n_bytes)
    dominant = max(elements, key=elements.__getitem__)
    return {
        "quant_method": "gguf",
        "weights": _PLAIN_TYPES.get(dominant, dominant.lower()),
        "bits_per_weight": 8 * stored_bytes / max(1, sum(elements.values())),
    }


def _gemma3(key: Callable[..., Any], cfg: dict[str, Any]) -> None:
    """What llama.cpp hard-codes for Gemma-3 (llama-model.cpp) as config.json keys: five local
    layers per global one, the local layers' RoPE base 10000, the query scale (27B: hidden /
    heads, else head_dim), GeGLU."""
    layers = cfg["num_hidden_layers"]
    cfg["sliding_window"] = key("attention.sliding_window")
    cfg["layer_types"] = [
        "full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(layers)
    ]
    cfg["rope_local_base_freq"] = 10000.0
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    big = layers == 62  # the 27B model
    cfg["query_pre_attn_scalar"] = (
        cfg["hidden_size"] // cfg["num_attention_heads"] if big else head_dim
    )
    cfg["hidden_activation"] = "gelu_pytorch_tanh"


# general.architecture → the metadata llama.cpp does not store but derives from the name
GGUF_ARCH_RULES: dict[str, Callable[[Callable[..., Any], dict[str, Any]], None]] = {
    "gemma3": _gemma3,
}


def _unpermute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (interleaved rotary pairs → half-split)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _canonical_name(name: str, spec: ArchSpec) -> str | None:
    if name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[name]
    match = _LAYER_RE.match(name)
    if match and match.group(2) in _LAYER_NAMES:
        layer, part, kind = match.groups()
        hf_name = _LAYER_NAMES[part].format(mlp_norm=spec.mlp_norm_name)
        return f"model.layers.{layer}.{hf_name}.{kind}"
    return None


def load_gguf_tensors(
    reader: Any, source: str, config: Any, spec: ArchSpec, keep_blocks: bool = False
) -> dict[str, torch.Tensor | BlockWeight]:
    """Dequantize every tensor to fp32 under its canonical (Hugging Face) name; with
    `keep_blocks`, Q4_0 / Q4_1 / Q8_0 matrices stay in their blocks (`BlockWeight`)."""
    from gguf import quants

    tensors: dict[str, torch.Tensor | BlockWeight] = {}
    for t in reader.tensors:
        if t.name in _IGNORED:
            continue
        name = _canonical_name(t.name, spec)
        if name is None:
            raise CheckpointError(
                "unexpected tensor in GGUF file",
                where=f"{source}: {t.name}",
                expected="the tensors of a " + spec.name + " decoder",
            )
        shape = tuple(int(d) for d in t.shape[::-1])
        if keep_blocks and t.tensor_type.name in BLOCK_TYPES and len(shape) == 2:
            tensors[name] = blocks = _blocks(t, shape, config, spec)
            _require_finite(*blocks.nonfinite_scales(), source, t)
            continue
        try:
            if t.tensor_type.name in BLOCK_TYPES:  # (ours: whole-tensor torch ops)
                array = decode_blocks(t.tensor_type.name, torch.from_numpy(np.array(t.data)))
                array = array.numpy()
            else:
                array = quants.dequantize(t.data, t.tensor_type)
        except Exception as exc:
            raise CheckpointError(
                "could not decode tensor (truncated file or unsupported type?)",
                where=f"{source}: {t.name}",
                found=f"type {t.tensor_type.name}: {exc}",
                expected="F32/F16/BF16/Q8_0/Q4_0/Q4_1/Q4_K/Q6_K/... data",
            ) from exc
        array = np.asarray(array, dtype=np.float32).reshape(shape)
        _require_finite(int(array.size - np.isfinite(array).sum()), array.size, source, t)
        array = _canonical_rows(t.name, array, config, spec)
        tensors[name] = torch.from_numpy(np.array(array, copy=not array.flags.writeable, order="C"))
    return tensors


def _require_finite(bad: int, total: int, source: str, t: Any) -> None:
    """A checkpoint tensor with NaN / Inf values (or block scales) is corrupt: refuse it."""
    if bad:
        raise CheckpointError(
            "tensor holds non-finite values (corrupt data or block scales)",
            where=f"{source}: {t.name}",
            found=f"{bad} NaN/Inf among {total} ({t.tensor_type.name})",
            expected="finite values",
        )


def _canonical_rows(name: str, array: np.ndarray, config: Any, spec: ArchSpec) -> np.ndarray:
    """Rows in Hugging Face order: llama.cpp permutes q/k rows (the rows of a block-quantized
    matrix are its blocks' rows, so blocks are permuted the same way)."""
    if spec.gguf_permute_qk and (".attn_q." in name or ".attn_k." in name):
        heads = config.num_attention_heads if ".attn_q." in name else config.num_key_value_heads
        array = _unpermute_rows(array, heads)
    if spec.norm_offset and name.endswith("norm.weight"):  # llama.cpp stores offset + w
        array = array - np.float32(spec.norm_offset)
    return array


def _blocks(t: Any, shape: tuple[int, int], config: Any, spec: ArchSpec) -> BlockWeight:
    """A block-quantized matrix as loaded: its rows of blocks, in Hugging Face row order."""
    raw = np.asarray(t.data, dtype=np.uint8).reshape(shape[0], -1)
    rows = _canonical_rows(t.name, raw, config, spec)
    return BlockWeight(t.tensor_type.name, torch.from_numpy(np.array(rows, order="C")), shape)
