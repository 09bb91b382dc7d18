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


def fake_quantize(hf_model, quantize_dequantize, lm_head: bool = True, skip=()) -> None:
    """Replace every projection's weight by quantize_dequantize(weight) in place, q/k/v and
    gate/up fused as the engine holds them (a per-tensor scale is then shared by the parts);
    `skip`: (layer index, "o_proj" ...) pairs left alone; `lm_head`: the LM head too."""
    import torch

    with torch.no_grad():
        for i, layer in enumerate(hf_model.model.layers):
            a, m = layer.self_attn, layer.mlp
            groups = ([a.q_proj, a.k_proj, a.v_proj], [a.o_proj], [m.gate_proj, m.up_proj],
                      [m.down_proj])  # fmt: skip
            for group in groups:
                if (i, _proj_name(layer, group[0])) in skip:
                    continue
                fused = quantize_dequantize(torch.cat([lin.weight for lin in group]))
                parts = fused.split([lin.out_features for lin in group])
                for lin, part in zip(group, parts, strict=True):
                    lin.weight.copy_(part)
        if lm_head:
            hf_model.lm_head.weight.copy_(quantize_dequantize(hf_model.lm_head.weight.clone()))


def _proj_name(layer, module) -> str:
    for name, child in [*layer.self_attn.named_children(), *layer.mlp.named_children()]:
        if child is module:
            return name
    return ""
