"""infergen/io/random_checkpoint.py (the models the GPU check builds without transformers) against
transformers: the saved config dicts are still what transformers makes of tests/hf_models.py's
tiny models, and transformers run on the same random tensors gives the engine's logits."""

from __future__ import annotations

import json

import pytest
import torch

from infergen.engine.engine import Engine
from infergen.engine.options import engine_config
from infergen.io.random_checkpoint import CONFIGS, random_checkpoint
from tests.hf_models import ARCH_VARIANTS, BASE, VARIANTS

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_saved_configs_are_what_transformers_makes(name):
    cls, extra = {**VARIANTS, **ARCH_VARIANTS}[name]
    made = getattr(transformers, cls)(**{**BASE, **extra}).to_dict()
    saved = CONFIGS[name]
    for key, value in saved.items():
        if key != "architectures":
            assert json.loads(json.dumps(made[key])) == value, key


# transformers names these families' tensors otherwise (fused experts, Falcon-H1's
# feed_forward, Mamba-2's backbone; the engine's name maps translate them when it loads a saved
# checkpoint, and tests/models/test_architectures_hf.py checks their logits against
# transformers that way)
OTHER_NAMES = {"deepseek_v2", "falcon_h1", "mamba2", "qwen3_next"}


@pytest.mark.parametrize("name", sorted(CONFIGS.keys() - OTHER_NAMES))
def test_transformers_on_the_random_tensors_gives_the_engines_logits(name, tmp_path):
    checkpoint = random_checkpoint(name, seed=1)
    state = {k: v.clone() for k, v in checkpoint.tensors.items()}
    cfg = getattr(transformers, {**VARIANTS, **ARCH_VARIANTS}[name][0])(**CONFIGS[name])
    cfg._attn_implementation = "eager"
    hf = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and all("lm_head" in k or "rotary" in k for k in missing), missing
    if cfg.tie_word_embeddings:
        hf.tie_weights()
    tokens = list(range(5, 40))
    with torch.no_grad():
        want = hf(torch.tensor([tokens])).logits[0]
    engine = Engine(engine_config(block_size=4, num_kv_blocks=64), checkpoint)
    got = engine.prompt_logits(tokens)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
