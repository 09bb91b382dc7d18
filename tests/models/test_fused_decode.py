"""The fused decode step (models/fused_decode.py, kernels/decode_layers_f32.c) against the
per-op path it replaces: bit-identical logits for every architecture it covers, step after
step (teacher-forced one token at a time, so every step is a decode step) and for batches of
sequences, and against transformers within float tolerance. QK-norm models fall back to the
per-op path."""

from __future__ import annotations

import pytest
import torch

from infergen import LLM, SamplingParams
from tests.hf_models import VARIANTS, build_hf_model

COVERED = {name for name in VARIANTS if name != "qwen3_qk_norm"}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_fused_decode_equals_per_op_path(name, tmp_path, fused_steps):
    hf_model = build_hf_model(name, tmp_path)
    llm = LLM(str(tmp_path), kv_cache_memory="16MiB")
    engine = llm.engine
    model = engine.runner.model
    torch.manual_seed(2)
    tokens = torch.randint(0, hf_model.config.vocab_size, (30,)).tolist()  # > sliding window
    fused = engine.prompt_logits(tokens, chunk=1)
    assert sum(fused_steps) == (len(tokens) if name in COVERED else 0)
    model.fast_path = None
    per_op = engine.prompt_logits(tokens, chunk=1)
    assert torch.equal(fused, per_op), name
    with torch.no_grad():
        expected = hf_model(torch.tensor([tokens])).logits[0]
    assert (fused - expected).abs().max() <= 1e-4 * expected.abs().max(), name


def test_fused_decode_batches_equal_per_op_path(tmp_path, fused_steps):
    build_hf_model("llama_gqa", tmp_path)
    llm = LLM(str(tmp_path), kv_cache_memory="16MiB")
    prompts = [[3, 17, 42], [5, 8, 150, 23, 77, 9, 11], [99], [7, 7, 7, 7]]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=3)
    fused = llm.generate(prompts, params)
    assert sum(fused_steps) > 0
    llm.engine.runner.model.fast_path = None
    per_op = llm.generate(prompts, params)
    for a, b in zip(fused, per_op, strict=True):
        assert a.token_ids == b.token_ids
        assert [x.top for x in a.logprobs] == [x.top for x in b.logprobs]


@pytest.mark.parametrize(
    "name, options, embed_kind",
    [
        ("llama_gqa", {}, 0),  # its own fp32 embedding
        ("llama_mqa_tied", {}, 1),  # the tied head's fp32 panels
        ("llama_mqa_tied", {"weights": "int8"}, 2),
        ("llama_mqa_tied", {"weights": "int8", "activations": "int8"}, 2),
        ("qwen2_qkv_bias", {"weights": "fp8_e4m3"}, 3),
    ],
)
def test_fused_head_equals_per_op_head(name, options, embed_kind, tmp_path, monkeypatch):
    """Decode steps whose rows are all sampled run the embedding, the layers, the final norm
    and the LM head in the driver's call (FusedDecode.run_logits): the same logits as
    Transformer.embed_rows and Transformer.head, bit for bit, for fp32 and quantized heads (a
    tied int8 head, W8A8 layers beside it, FP8 codes) and each embedding the driver reads."""
    from infergen.models.fused_decode import FusedDecode

    build_hf_model(name, tmp_path)
    llm = LLM(str(tmp_path), kv_cache_memory="16MiB", **options)
    engine = llm.engine
    driver = engine.runner.model.fast_path_for(engine.kv_cache)
    assert driver.embed is not None and driver.embed.kind == embed_kind
    heads = []
    run_logits = FusedDecode.run_logits

    def counting(self, batch):
        logits = run_logits(self, batch)
        heads.append(logits is not None)
        return logits

    monkeypatch.setattr(FusedDecode, "run_logits", counting)
    tokens = torch.randint(0, 200, (12,), generator=torch.Generator().manual_seed(3)).tolist()
    fused = engine.prompt_logits(tokens, chunk=1)
    assert heads and all(heads), name  # every step: the head ran in the driver
    heads.clear()
    engine.runner.model.fast_path = None
    per_op = engine.prompt_logits(tokens, chunk=1)
    assert not heads
    assert torch.equal(fused, per_op), name


def test_fused_head_argmax_is_the_greedy_token(tmp_path, monkeypatch):
    """A greedy batch's decode steps take the driver's argmax of the logits it wrote
    (batch.argmax): torch.argmax of those logits, and the same tokens as the per-op path.
    A batch with a sampled or logprobs row gets no argmax."""
    from infergen.models.fused_decode import FusedDecode

    build_hf_model("llama_mqa_tied", tmp_path)
    llm = LLM(str(tmp_path), kv_cache_memory="16MiB", weights="int8", activations="int8")
    seen = []
    run_logits = FusedDecode.run_logits

    def checking(self, batch):
        logits = run_logits(self, batch)
        if logits is not None:
            seen.append((batch.greedy, batch.argmax, logits.argmax(dim=-1).tolist()))
        return logits

    monkeypatch.setattr(FusedDecode, "run_logits", checking)
    prompts = [[3, 17, 42], [5, 8, 150, 23, 77, 9, 11], [99]]
    greedy = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    fused = llm.generate(prompts, greedy)
    assert seen and all(flag and got == expected for flag, got, expected in seen)
    seen.clear()
    mixed = [greedy, greedy, SamplingParams(max_tokens=10, temperature=0.8, seed=1)]
    llm.generate(prompts, mixed)
    assert seen and all(not flag and got is None for flag, got, _ in seen)
    llm.engine.runner.model.fast_path = None
    per_op = llm.generate(prompts, greedy)
    assert [o.token_ids for o in fused] == [o.token_ids for o in per_op]


def test_fused_step_refuses_an_id_outside_the_embedding(tmp_path, monkeypatch):
    """An id past the embedding's rows raises IndexError naming it (the driver checks before
    it runs a layer), as Transformer.embed_rows does."""
    from infergen.models.fused_decode import FusedDecode

    build_hf_model("llama_mqa_tied", tmp_path)
    llm = LLM(str(tmp_path), kv_cache_memory="16MiB", weights="int8")
    run_logits = FusedDecode.run_logits

    def corrupting(self, batch):
        batch.input_ids = torch.full_like(batch.input_ids, 10**6)
        return run_logits(self, batch)

    monkeypatch.setattr(FusedDecode, "run_logits", corrupting)
    with pytest.raises(IndexError, match="row 1000000 is outside the weight's"):
        llm.engine.prompt_logits([3, 17, 42], chunk=1)
