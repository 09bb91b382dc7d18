"""The architecture table of bench_architectures.py: one row per architecture, each a variant
of tests/hf_models.py built with random weights at one comparable size.

To add an architecture, add an `Arch` row: its label, the hf_models variant, and a function of
the `Size` that returns the config values overriding the variant's (tiny) test sizes. A row
whose variant hf_models.py does not have (yet), or that does not build, is skipped by the
benchmark with the reason.

SIZE: vocab 32000, hidden 512, 8 layers, 8 query heads of 64 with 2 KV heads, dense MLP 1408
(about 55M parameters, 220 MB in fp32). Mixtures of experts keep the active feed-forward width
of the dense MLP: GPT-OSS 8 experts top 2, each 704 wide; DeepSeek one shared expert + top 2 of
8, each 464 wide, first layer dense. MLA: latent 128, RoPE key 32, no-PE 64, V 64 (V3: query
LoRA 256, 4 groups of 2 experts, best 2 groups). Sliding windows: 128 tokens (Mistral: every
layer; Gemma-3: 3 local layers per global one; GPT-OSS: alternating). QUICK: the same shapes,
tiny, for a smoke run.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import pathlib
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Size:
    vocab: int = 32000
    hidden: int = 512
    layers: int = 8
    heads: int = 8
    kv_heads: int = 2
    head_dim: int = 64
    intermediate: int = 1408
    experts: int = 8
    top_k: int = 2
    window: int = 128
    kv_lora_rank: int = 128
    max_positions: int = 2048
    prompt: int = 64
    new_tokens: int = 64
    batch: int = 16
    bs1_prompts: int = 2  # distinct batch-1 prompts per round
    curve_prompt: int = 40
    curve_windows: int = 4  # the curve runs to this many windows of context
    curve_every: int = 8  # tokens between recorded points
    block_size: int = 16


SIZE = Size()
QUICK = dataclasses.replace(
    SIZE,
    vocab=2048,
    hidden=128,
    layers=4,
    heads=4,
    head_dim=32,
    intermediate=352,
    experts=4,
    window=32,
    kv_lora_rank=32,
    max_positions=512,
    prompt=16,
    new_tokens=16,
    batch=4,
    bs1_prompts=1,
    curve_prompt=10,
    curve_every=4,
    block_size=8,
)


def _common(s: Size) -> dict:
    return dict(
        vocab_size=s.vocab,
        hidden_size=s.hidden,
        num_hidden_layers=s.layers,
        num_attention_heads=s.heads,
        num_key_value_heads=s.kv_heads,
        head_dim=s.head_dim,
        intermediate_size=s.intermediate,
        max_position_embeddings=s.max_positions,
    )


def _gemma3(s: Size) -> dict:
    types = (["sliding_attention"] * 3 + ["full_attention"]) * (s.layers // 4)
    return {
        **_common(s),
        "layer_types": types,
        "sliding_window": s.window,
        "query_pre_attn_scalar": s.head_dim,
    }


def _gpt_oss(s: Size) -> dict:
    return {
        **_common(s),
        "num_local_experts": s.experts,
        "num_experts_per_tok": s.top_k,
        "intermediate_size": s.intermediate // s.top_k,
        "sliding_window": s.window,
        "swiglu_limit": 7.0,
        "layer_types": None,
    }


def _deepseek(s: Size, v3: bool = False) -> dict:
    out = {
        **_common(s),
        "num_key_value_heads": s.heads,
        "n_routed_experts": s.experts,
        "num_experts_per_tok": s.top_k,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "moe_intermediate_size": s.intermediate // (s.top_k + 1) // 8 * 8,
        "kv_lora_rank": s.kv_lora_rank,
        "qk_rope_head_dim": s.head_dim // 2,
        "qk_nope_head_dim": s.head_dim,
        "v_head_dim": s.head_dim,
        "q_lora_rank": s.hidden // 2 if v3 else None,
    }
    if v3:  # group-limited routing: groups of 2 experts, the best half of the groups
        out.update(n_group=min(4, s.experts // 2), topk_group=max(1, min(4, s.experts // 2) // 2))
    del out["head_dim"]
    return out


def _mamba2(s: Size) -> dict:  # expand 2, SSM heads of head_dim, state head_dim, 1 group
    return {
        **_common(s),
        "num_heads": 2 * s.hidden // s.head_dim,
        "state_size": s.head_dim,
        "expand": 2,
        "n_groups": 1,
        "chunk_size": 64,
    }


def _qwen3_next(s: Size) -> dict:
    """Gated DeltaNet layers (one full-attention layer in 4, the config's default), MoE like
    DeepSeek's: a shared expert + top_k routed, each a third of the dense MLP."""
    width = s.intermediate // (s.top_k + 1) // 8 * 8
    return {
        **_common(s),
        "linear_num_key_heads": s.heads // 2,
        "linear_num_value_heads": s.heads,
        "linear_key_head_dim": s.head_dim,
        "linear_value_head_dim": s.head_dim,
        "num_experts": s.experts,
        "num_experts_per_tok": s.top_k,
        "moe_intermediate_size": width,
        "shared_expert_intermediate_size": width,
        "mlp_only_layers": [],
    }


def _falcon_h1(s: Size) -> dict:  # attention and Mamba-2 side by side in every layer
    return {
        **_common(s),
        "mamba_d_ssm": 2 * s.hidden,
        "mamba_n_heads": 2 * s.hidden // s.head_dim,
        "mamba_d_head": s.head_dim,
        "mamba_d_state": s.head_dim,
        "mamba_n_groups": 1,
        "mamba_expand": 2,
        "mamba_chunk_size": 64,
    }


@dataclass(frozen=True)
class Arch:
    name: str  # the row's label
    variant: str  # tests/hf_models.py VARIANTS / ARCH_VARIANTS key
    overrides: Callable[[Size], dict]
    windowed: bool = False  # record the window memory curve


# One row per architecture; a variant hf_models.py does not have (yet) is skipped, not an error.
ARCHS: tuple[Arch, ...] = (
    Arch("llama", "llama_gqa", _common),
    Arch("qwen3", "qwen3_qk_norm", _common),
    Arch(
        "mistral",
        "mistral_small_window",
        lambda s: {**_common(s), "sliding_window": s.window},
        windowed=True,
    ),
    Arch("gemma3", "gemma3", _gemma3, windowed=True),
    Arch("gpt_oss", "gpt_oss", _gpt_oss, windowed=True),
    Arch("deepseek_v2", "deepseek_v2", _deepseek),
    Arch("deepseek_v3", "deepseek_v3", lambda s: _deepseek(s, v3=True)),
    Arch("mamba2", "mamba2", _mamba2),
    Arch("qwen3_next", "qwen3_next", _qwen3_next),
    Arch("falcon_h1", "falcon_h1", _falcon_h1),
)


def build(arch: Arch, size: Size, directory: pathlib.Path) -> dict:
    """Save the variant at `size` into `directory`; its parameter counts. Raises on failure."""
    from hf_models import ARCH_VARIANTS, VARIANTS, build_hf_model

    if arch.variant not in {**VARIANTS, **ARCH_VARIANTS}:
        raise LookupError(f"variant {arch.variant!r} is not in tests/hf_models.py (yet)")
    overrides = {k: v for k, v in arch.overrides(size).items() if v is not None}
    rope = {**VARIANTS, **ARCH_VARIANTS}[arch.variant][1].get("rope_parameters") or {}
    if rope.get("rope_type") == "yarn" and "rope_parameters" not in overrides:
        # YaRN's pre-extension context: the model's context over the factor (as real models)
        original = size.max_positions // int(rope["factor"])
        overrides["rope_parameters"] = {**rope, "original_max_position_embeddings": original}
    model = build_hf_model(arch.variant, directory, **overrides)
    total = sum(p.numel() for p in model.parameters())
    del model
    gc.collect()
    active = None
    try:  # as the engine reads the checkpoint's config
        from infergen.io.model_config import read_model_config

        active = read_model_config(directory).describe().params_active()
    except Exception:  # noqa: BLE001 - an architecture the engine does not read (yet)
        pass
    config = json.loads((directory / "config.json").read_text())
    return {
        "params_total": total,
        "params_active": active,
        "overrides": overrides,
        "mha_bytes_per_token": mha_bytes_per_token(config),
    }


def mha_bytes_per_token(config: dict) -> int:
    """Bytes per token if every layer cached full multi-head K and V in fp32."""
    heads = config["num_attention_heads"]
    if config.get("kv_lora_rank"):
        k = config["qk_nope_head_dim"] + config["qk_rope_head_dim"]
        v = config["v_head_dim"]
    else:
        k = v = config.get("head_dim") or config["hidden_size"] // heads
    return config["num_hidden_layers"] * heads * (k + v) * 4
