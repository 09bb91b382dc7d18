"""Tiny random-initialised Hugging Face models of every supported architecture and head layout,
saved as safetensors: the numerics oracle for the generic decoder."""

from __future__ import annotations

from pathlib import Path

import torch

BASE = dict(
    vocab_size=211,
    hidden_size=64,
    intermediate_size=136,
    num_hidden_layers=3,
    num_attention_heads=4,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
)

# name → (config class name, extra config)
VARIANTS: dict[str, tuple[str, dict]] = {
    "llama_mha": ("LlamaConfig", dict(num_key_value_heads=4)),
    "llama_gqa": ("LlamaConfig", dict(num_key_value_heads=2)),
    "llama_mqa_tied": ("LlamaConfig", dict(num_key_value_heads=1, tie_word_embeddings=True)),
    "llama_bias": ("LlamaConfig", dict(num_key_value_heads=2, attention_bias=True, mlp_bias=True)),
    "llama3_rope": (
        "LlamaConfig",
        dict(
            num_key_value_heads=2,
            rope_theta=500000.0,
            rope_scaling=dict(
                rope_type="llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=32,
            ),
        ),
    ),
    "qwen2_qkv_bias": ("Qwen2Config", dict(num_key_value_heads=2, tie_word_embeddings=True)),
    "qwen3_qk_norm": ("Qwen3Config", dict(num_key_value_heads=2, head_dim=24)),
    "mistral_window": ("MistralConfig", dict(num_key_value_heads=2, sliding_window=12)),
}


def build_hf_model(name: str, directory: Path, seed: int = 0, **overrides):
    """Build, save (safetensors + config.json) and return the transformers model (`overrides`
    replace BASE / variant config values)."""
    import transformers

    cls_name, extra = VARIANTS[name]
    config = getattr(transformers, cls_name)(**{**BASE, **extra, **overrides})
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # random init of norms is all-ones: perturb so they matter
        for pname, param in model.named_parameters():
            if "norm" in pname or pname.endswith("bias"):
                param.add_(torch.randn_like(param) * 0.1)
    model.eval()
    model.save_pretrained(directory, safe_serialization=True)
    return model
