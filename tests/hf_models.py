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

# Architectures beyond the Llama-shaped layer (tests/models/test_architectures_hf.py); the
# fused decode does not take them, the compiler takes Gemma-3's and GPT-OSS's
# (COMPILED_VARIANTS).
_GEMMA3_TYPES = ["sliding_attention"] * 2 + ["full_attention"]
ARCH_VARIANTS: dict[str, tuple[str, dict]] = {
    # 4 sliding + 2 full layers: three KV cache groups of two layers, window 8
    "gemma3": (
        "Gemma3TextConfig",
        dict(
            num_key_value_heads=2,
            head_dim=16,
            num_hidden_layers=6,
            layer_types=_GEMMA3_TYPES * 2,
            sliding_window=8,
            query_pre_attn_scalar=24,
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
            },
        ),
    ),
    "mistral_small_window": ("MistralConfig", dict(num_key_value_heads=2, sliding_window=6)),
    # alternating window-8 / full layers, learned sinks, YaRN RoPE, 6 experts top-2 with biases
    # and the clamped SwiGLU (limit 0.05, so the clamp bites on small random weights)
    "gpt_oss": (
        "GptOssConfig",
        dict(
            num_key_value_heads=2,
            head_dim=16,
            num_hidden_layers=4,
            num_local_experts=6,
            num_experts_per_tok=2,
            sliding_window=8,
            swiglu_limit=0.05,
            rope_parameters={
                "rope_type": "yarn",
                "factor": 8.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": False,
                "original_max_position_embeddings": 64,
                "rope_theta": 1.5e5,
            },
        ),
    ),
    # attention-free: 3 Mamba2 layers, 8 SSM heads of 16, state 16, 2 groups, chunk 16
    "mamba2": (
        "Mamba2Config",
        dict(
            num_heads=8,
            head_dim=16,
            state_size=16,
            n_groups=2,
            expand=2,
            conv_kernel=4,
            chunk_size=16,
        ),
    ),  # fmt: skip
    # hybrid: 3 gated-DeltaNet layers + 1 gated full-attention layer (partial RoPE 1/4, QK
    # norm), MoE with a gated shared expert (layer 1 dense)
    "qwen3_next": (
        "Qwen3NextConfig",
        dict(
            num_hidden_layers=4,
            num_key_value_heads=2,
            head_dim=16,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            linear_key_head_dim=16,
            linear_value_head_dim=12,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=64,
            mlp_only_layers=[1],
        ),
    ),  # fmt: skip
    # parallel hybrid: attention + Mamba2 SSM in every layer, µP multipliers away from 1
    "falcon_h1": (
        "FalconH1Config",
        dict(
            num_key_value_heads=2,
            head_dim=16,
            mamba_d_ssm=64,
            mamba_n_heads=4,
            mamba_d_head=16,
            mamba_d_state=8,
            mamba_n_groups=1,
            mamba_chunk_size=16,
            mamba_rms_norm=True,
            attention_in_multiplier=0.8,
            attention_out_multiplier=1.3,
            key_multiplier=0.7,
            ssm_out_multiplier=1.2,
            ssm_in_multiplier=0.9,
            ssm_multipliers=[1.1, 0.9, 1.2, 0.8, 1.05],
            mlp_multipliers=[0.9, 1.1],
            embedding_multiplier=1.5,
            lm_head_multiplier=0.8,
        ),
    ),  # fmt: skip
    # MLA (latent 16, RoPE 8 interleaved) + MoE: 8 experts top-2, one shared, first layer dense
    "deepseek_v2": (
        "DeepseekV2Config",
        dict(
            num_key_value_heads=4,
            n_routed_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=24,
            first_k_dense_replace=1,
            kv_lora_rank=16,
            q_lora_rank=None,
            qk_rope_head_dim=8,
            qk_nope_head_dim=16,
            v_head_dim=12,
            n_shared_experts=1,
            routed_scaling_factor=1.5,
        ),
    ),  # fmt: skip
    "deepseek_v2_group_limited": (
        "DeepseekV2Config",
        dict(
            num_key_value_heads=4,
            n_routed_experts=8,
            num_experts_per_tok=3,
            moe_intermediate_size=24,
            first_k_dense_replace=1,
            kv_lora_rank=16,
            q_lora_rank=20,
            qk_rope_head_dim=8,
            qk_nope_head_dim=16,
            v_head_dim=16,
            n_shared_experts=2,
            topk_method="group_limited_greedy",
            n_group=4,
            topk_group=2,
        ),
    ),  # fmt: skip
    # V3: q LoRA, sigmoid routing with the correction bias, 4 groups (best 2), normalised
    # top-k × 2.5, YaRN with mscale (the softmax scale gets mscale²)
    "deepseek_v3": (
        "DeepseekV3Config",
        dict(
            num_key_value_heads=4,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_group=4,
            topk_group=2,
            moe_intermediate_size=24,
            first_k_dense_replace=1,
            kv_lora_rank=16,
            q_lora_rank=24,
            qk_rope_head_dim=8,
            qk_nope_head_dim=16,
            v_head_dim=16,
            n_shared_experts=1,
            rope_parameters={
                "rope_type": "yarn",
                "factor": 4.0,
                "beta_fast": 32,
                "beta_slow": 1,
                "mscale": 0.707,
                "mscale_all_dim": 0.707,
                "rope_theta": 10000.0,
                "original_max_position_embeddings": 128,
            },
        ),
    ),  # fmt: skip
}

# the architectures the compiler captures (compiler/runtime.py CAPTURED_FEATURES): the
# Llama-shaped variants, Gemma-3 (cache groups, two RoPE tables, sandwich norms, GeGLU) and
# GPT-OSS (learned sinks, mixture-of-experts layers)
COMPILED_VARIANTS = [*sorted(VARIANTS), "gemma3", "gpt_oss"]
# the architectures whose mixers the compiler runs as their modules (compiler/decoder.py
# module_mixer: MIXER nodes, the per-layer fallback), the rest of their layers captured
MIXER_VARIANTS = ["mamba2", "qwen3_next", "falcon_h1", "deepseek_v2", "deepseek_v3"]


def build_hf_model(name: str, directory: Path, seed: int = 0, **overrides):
    """Build, save (safetensors + config.json) and return the transformers model (`overrides`
    replace BASE / variant config values)."""
    import transformers

    cls_name, extra = {**VARIANTS, **ARCH_VARIANTS}[name]
    config = getattr(transformers, cls_name)(**{**BASE, **extra, **overrides})
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # random init of norms is all-ones: perturb so they matter
        for pname, param in model.state_dict().items():  # (buffers too: DeepSeek's bias)
            if "norm" in pname or pname.endswith("bias"):
                param.add_(torch.randn_like(param) * 0.1)
            if pname.endswith("sinks"):  # large enough to take real weight in the softmax
                param.copy_(torch.randn_like(param) * 2)
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


def assert_prefill_matches(name: str, hf_model, llm, chunk: int = 16, length: int = 40) -> None:
    """infergen's teacher-forced logits (chunks of `chunk`: later chunks read cached blocks)
    within 1e-4 · max |logit| of transformers' on the same random tokens."""
    torch.manual_seed(1)
    tokens = torch.randint(0, hf_model.config.vocab_size, (length,)).tolist()
    with torch.no_grad():
        expected = hf_model(torch.tensor([tokens])).logits[0]
    got = llm.engine.prompt_logits(tokens, chunk=chunk)
    assert (got - expected).abs().max() <= 1e-4 * expected.abs().max(), name


def hf_greedy(hf_model, prompt: list[int], new_tokens: int) -> list[int]:
    """transformers' greedy continuation of `prompt` (EOS ignored)."""
    with torch.no_grad():
        out = hf_model.generate(
            torch.tensor([prompt]),
            max_new_tokens=new_tokens,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()
