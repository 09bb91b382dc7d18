"""Random checkpoints built without transformers or a model file (the GPU machine of the
device check has neither; `infergen perf calibrate` times the engine's layers on them): a tiny
model's config from tiny_configs.json beside this file (transformers' own config dicts of
tests/hf_models.py's models, one per layer family, saved; tests/engine/
test_random_checkpoint.py checks they still match) or the default model's shapes, with
random tensors of every name and shape the generic decoder reads
(models/tensor_names.expected_tensors). Deterministic by seed; a fresh Checkpoint per
engine (the build step empties its tensors)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from infergen.config import ModelConfig
from infergen.io.checkpoint import Checkpoint
from infergen.models.tensor_names import expected_tensors

CONFIGS: dict[str, dict] = json.loads((Path(__file__).parent / "tiny_configs.json").read_text())
# the default model's (SmolLM2-135M-Instruct) shapes, as its GGUF file gives them
SMOLLM2_135M = dict(
    architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=576,
    intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
    head_dim=64, vocab_size=49152, max_position_embeddings=8192, rope_theta=100000.0,
    rms_norm_eps=1e-5, hidden_act="silu", tie_word_embeddings=True, bos_token_id=1,
    eos_token_id=2,
)  # fmt: skip


def random_checkpoint(model: str | dict, seed: int = 0, head_std: float = 0.02) -> Checkpoint:
    """`model`: a name of CONFIGS or a Hugging Face config dict. Projections ~ N(0, 0.02²)
    (transformers' initializer range), norms and biases perturbed by N(0, 0.1²) so they
    matter, the embedding (and LM head) ~ N(0, head_std²): a large one makes the logits of
    a random model peaked, as a trained model's are."""
    cfg = CONFIGS[model] if isinstance(model, str) else model
    name = model if isinstance(model, str) else cfg["architectures"][0]
    config = ModelConfig.from_hf_dict(cfg, source=f"random {name}")
    gen = torch.Generator().manual_seed(seed)
    base = 0.0 if config.arch.norm_offset else 1.0  # Gemma stores norm weights − 1
    tensors = {}
    for tensor, shape in expected_tensors(config).items():
        noise = torch.randn(shape, generator=gen)
        if "norm" in tensor:
            tensors[tensor] = base + 0.1 * noise
        elif tensor.endswith("bias"):
            tensors[tensor] = 0.1 * noise
        elif tensor in ("model.embed_tokens.weight", "lm_head.weight"):
            tensors[tensor] = head_std * noise
        else:
            tensors[tensor] = 0.02 * noise
    return Checkpoint(config, tensors, None, Path(f"random-{name}"), "hf")
