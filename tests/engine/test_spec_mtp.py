"""The `mtp` proposer (issue 24: engine/spec/mtp.py, models/mtp.py) on a tiny random
DeepSeek-V3 carrying a multi-token-prediction layer (transformers builds none: its block is
the last layer of a one-layer-deeper transformers model, saved as checkpoint layer N, with
random eh_proj / norms / shared head beside it).

The oracle is plain torch around transformers' own decoder layer: at position i the layer
reads transformers' final hidden state h_i and the embedding of token i + 1 (zeroed at
position 0), eh_proj of their normed concatenation goes through the block, causal over the
positions, then the shared head; a draft further ahead feeds the layer's output back as h.
Every draft the engine makes must be that oracle's argmax; outputs with `mtp` speculation
equal decoding one token at a time; the layer's KV shares the cache budget."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from infergen import LLM, SamplingParams
from infergen.errors import CheckpointError, ConfigError
from tests.engine.test_speculative import (
    _assert_no_block_held,
    _copy_prompts,
    _record_drafts,
    _run_both,
)
from tests.hf_models import build_hf_model


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _mtp_checkpoint(directory, seed: int = 0):
    """A tiny DeepSeek-V3 with one MTP layer saved in `directory`: (the transformers target,
    the block (transformers' layer N), the MTP layer's own tensors by short name)."""
    hf = build_hf_model("deepseek_v3", directory, num_nextn_predict_layers=1)
    n, h = hf.config.num_hidden_layers, hf.config.hidden_size
    deeper = build_hf_model("deepseek_v3", directory / "deeper", seed=seed + 1,
                            num_hidden_layers=n + 1)  # fmt: skip
    prefix = f"model.layers.{n}."
    block = {k: v for k, v in load_file(directory / "deeper" / "model.safetensors").items()
             if k.startswith(prefix)}  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    own = {
        "enorm.weight": 1 + 0.1 * torch.randn(h, generator=gen),
        "hnorm.weight": 1 + 0.1 * torch.randn(h, generator=gen),
        "eh_proj.weight": 0.1 * torch.randn(h, 2 * h, generator=gen),
        "shared_head.norm.weight": 1 + 0.1 * torch.randn(h, generator=gen),
        "shared_head.head.weight": torch.randn(hf.config.vocab_size, h, generator=gen),
    }
    tensors = load_file(directory / "model.safetensors")
    tensors.update(block)
    tensors.update({prefix + k: v for k, v in own.items()})
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    return hf, deeper.model.layers[n], own


@torch.no_grad()
def _oracle(hf, block, own, hidden: torch.Tensor, inputs: list[int]):
    """The layer's outputs and logits at positions 0 .. len(inputs) − 1, row i reading
    hidden[i] and the token inputs[i] (the one at i + 1)."""
    eps, positions = hf.config.rms_norm_eps, torch.arange(len(inputs))
    embeds = hf.model.embed_tokens(torch.tensor(inputs))
    embeds[positions == 0] = 0
    x = torch.cat([_rms(embeds, own["enorm.weight"], eps),
                   _rms(hidden, own["hnorm.weight"], eps)], dim=-1)  # fmt: skip
    x = x @ own["eh_proj.weight"].T
    rope = hf.model.rotary_emb(x[None], positions[None])
    mask = torch.full((len(inputs), len(inputs)), float("-inf")).triu(1)[None, None]
    out = block(x[None], attention_mask=mask, position_ids=positions[None],
                position_embeddings=rope)[0]  # fmt: skip
    return out, _rms(out, own["shared_head.norm.weight"], eps) @ own["shared_head.head.weight"].T


@torch.no_grad()
def _oracle_drafts(hf, block, own, tokens: list[int], count: int) -> list[int]:
    """`count` greedy drafts after `tokens` (all but the last computed by the target)."""
    hidden = hf.model(torch.tensor([tokens[:-1]])).last_hidden_state[0]
    inputs, drafts = list(tokens[1:]), []
    for _ in range(count):
        out, logits = _oracle(hf, block, own, hidden, inputs)
        drafts.append(int(logits[-1].argmax()))
        hidden = torch.cat([hidden, out[-1:]])  # the layer's output stands in for h
        inputs.append(drafts[-1])
    return drafts


def test_mtp_drafts_are_the_layers_argmax_and_outputs_unchanged(tmp_path):
    hf, block, own = _mtp_checkpoint(tmp_path)
    prompts = _copy_prompts(hf.config.vocab_size)
    options = dict(block_size=4, max_num_batched_tokens=32, num_kv_blocks=256)
    llm, got, ref = _run_both(str(tmp_path), "mtp", prompts, k=3, max_tokens=12, **options)
    # a fresh batch: prefill chunks, decodes and verifying decodes all feed the layer's KV
    seen = _record_drafts(llm)
    llm.generate(prompts, SamplingParams(max_tokens=10, temperature=0, ignore_eos=True))
    assert len(seen) > 5 and any(len(d) == 3 for _, d in seen)
    for tokens, drafts in seen:
        assert drafts == _oracle_drafts(hf, block, own, tokens, len(drafts)), tokens


def test_the_layers_kv_follows_every_computed_position(tmp_path):
    """One request: each `after_step` output row (the positions the target computed in that
    step, at their cache slots) equals the oracle's at that position, 1e-4."""
    hf, block, own = _mtp_checkpoint(tmp_path)
    llm = LLM(str(tmp_path), block_size=4, max_num_batched_tokens=16, speculative="mtp",
              num_speculative_tokens=2)  # fmt: skip
    proposer, rows = llm.engine.speculator.proposer, []
    forward, after_step = proposer._forward, proposer.after_step
    proposer._forward = lambda batch, hidden: (
        rows.append((batch.positions.clone(), forward(batch, hidden))) or rows[-1][1]
    )

    def catching_up(*args):
        rows.append("after_step")
        after_step(*args)

    proposer.after_step = catching_up
    prompt = _copy_prompts(hf.config.vocab_size)[1]
    out = llm.generate([prompt], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    tokens = prompt + out[0].token_ids
    with torch.no_grad():
        hidden = hf.model(torch.tensor([tokens[:-1]])).last_hidden_state[0]
    want, _ = _oracle(hf, block, own, hidden, tokens[1:])
    caught_up = [rows[i + 1] for i, r in enumerate(rows[:-1]) if r == "after_step"]
    covered = torch.cat([p for p, _ in caught_up])  # every position once, in order
    assert len(caught_up) >= 8 and len(covered) >= len(prompt)
    assert covered.tolist() == list(range(len(covered)))
    for positions, got in caught_up:
        torch.testing.assert_close(got, want[positions], atol=1e-4, rtol=1e-4)


def test_mtp_with_auto_drafts_sampling_and_a_prefix_hit(tmp_path):
    """num_speculative_tokens="auto", seeded sampled requests (the target's own draws) and a
    second run of the same prompts (prefix-cache hits: the layer's KV of cached blocks)."""
    _mtp_checkpoint(tmp_path)
    prompts = _copy_prompts(211)
    params = [SamplingParams(max_tokens=10, temperature=0.8, seed=s) for s in range(3)]
    ref = LLM(str(tmp_path), block_size=4).generate(prompts, params)
    llm = LLM(str(tmp_path), block_size=4, speculative="mtp")
    for _ in range(2):
        got = llm.generate(prompts, params)
        assert [o.token_ids for o in got] == [o.token_ids for o in ref]
    stats = llm.engine.speculator.summary()
    assert stats["proposed"] > 0
    # the first draft is known before scheduling: compared with the next token at every
    # decode, verified or not (the random layer's drafts are rarely worth verifying)
    compared = stats["observed_kept"] + stats["observed_rejected"]
    assert compared >= 0.9 * stats["decodes"] > 0
    _assert_no_block_held(llm)


def test_mtp_shares_the_budget_and_its_errors(tmp_path):
    """The layer's KV cache has the target's blocks inside kv_cache_memory; a model without
    MTP layers, or a checkpoint declaring them without their tensors, is a clear error."""
    _mtp_checkpoint(tmp_path / "mtp")
    alone = LLM(str(tmp_path / "mtp"), kv_cache_memory="1MiB").engine.kv_cache
    llm = LLM(str(tmp_path / "mtp"), kv_cache_memory="1MiB", speculative="mtp")
    target, own = llm.engine.kv_cache, llm.engine.speculator.proposer.kv_cache
    assert own.num_blocks == target.num_blocks < alone.num_blocks
    assert target.nbytes + own.nbytes <= 2**20
    with pytest.raises(ConfigError, match="multi-token-prediction"):
        LLM(speculative="mtp")  # the default model (Llama) has none
    build_hf_model("deepseek_v3", tmp_path / "dropped", num_nextn_predict_layers=1)
    LLM(str(tmp_path / "dropped"))  # loads without them
    with pytest.raises(ConfigError, match="does not carry"):
        LLM(str(tmp_path / "dropped"), speculative="mtp")
    tensors = load_file(tmp_path / "mtp" / "model.safetensors")
    del tensors[next(name for name in tensors if name.endswith(".enorm.weight"))]
    save_file(tensors, tmp_path / "mtp" / "model.safetensors")
    with pytest.raises(CheckpointError, match="missing"):
        LLM(str(tmp_path / "mtp"))


def test_mtp_through_preemption(tmp_path):
    """A tiny pool preempts sequences mid-speculation: recomputed, their MTP KV is computed
    again with them; outputs equal decoding one token at a time, no block left held."""
    _mtp_checkpoint(tmp_path)
    prompts = _copy_prompts(211) * 2
    options = dict(block_size=4, num_kv_blocks=70, max_num_batched_tokens=64)
    llm, got, ref = _run_both(str(tmp_path), "mtp", prompts, k=2, max_tokens=30, **options)
    assert llm.engine.scheduler.num_preemptions > 0
    assert llm.engine.speculator.stats["steps"] > 0


def _record_after_step(proposer) -> list:
    """(positions, the layer's outputs) of every forward the proposer's `after_step` makes
    from now on (the positions the target computed, at their cache slots)."""
    rows, inside = [], []
    forward, after_step = proposer._forward, proposer.after_step

    def recording_forward(batch, hidden):
        out = forward(batch, hidden)
        if inside:
            rows.append((batch.positions.clone(), out))
        return out

    def recording_after_step(*args):
        inside.append(True)
        try:
            after_step(*args)
        finally:
            inside.clear()

    proposer._forward, proposer.after_step = recording_forward, recording_after_step
    return rows


def test_mtp_kv_rides_with_blocks_through_the_kv_tiers(tmp_path):
    """Prefix blocks evicted to the host tier and loaded back into other pool blocks, and a
    restarted engine's blocks read back from the disk tier, carry the MTP layer's KV
    (kvcache/tiers/riders.py): after such a hit, the layer's output at every position it
    computes — attending over the loaded blocks' MTP KV — is the oracle's, whose layer computed
    every position itself (1e-4; the blocks' stale MTP KV would give others)."""
    hf, block, own = _mtp_checkpoint(tmp_path / "model")
    prompts = _copy_prompts(hf.config.vocab_size)
    gen = torch.Generator().manual_seed(1)
    others = [torch.randint(5, hf.config.vocab_size, (90,), generator=gen).tolist()
              for _ in range(3)]  # fmt: skip
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    options = dict(block_size=4, num_kv_blocks=96, max_num_batched_tokens=32,
                   speculative="mtp", num_speculative_tokens=3, kv_offload_memory="64MiB",
                   kv_offload_dir=str(tmp_path / "kv"), kv_offload_write_through=True)  # fmt: skip
    for restart in (False, True):
        llm = LLM(str(tmp_path / "model"), **options)
        if not restart:  # the prompts' blocks go down to the host tier, the others' take the pool
            llm.generate(prompts, params)
            llm.generate(others, params)
        rows = _record_after_step(llm.engine.speculator.proposer)
        for prompt in prompts:
            rows.clear()
            out = llm.generate([prompt], params)[0].token_ids
            tokens = prompt + out
            with torch.no_grad():
                hidden = hf.model(torch.tensor([tokens[:-1]])).last_hidden_state[0]
            want, _ = _oracle(hf, block, own, hidden, tokens[1:])
            assert rows and rows[0][0][0] > 0  # (the first step computed past a prefix hit)
            for positions, got in rows:
                torch.testing.assert_close(got, want[positions], atol=1e-4, rtol=1e-4)
        tiers = llm.engine.kv_tiers.stats()
        assert tiers["loaded"] >= 40, tiers  # (the prompts' full blocks, from host / disk)
        assert tiers["tiers"]["disk" if restart else "host"]["hits"] > 0, tiers
        _assert_no_block_held(llm)
        llm.engine.kv_tiers.flush()
