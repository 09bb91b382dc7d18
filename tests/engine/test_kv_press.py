"""The KV press in the engine (engine/kv_press.py) against transformers: SnapKV's and KNorm's
scores from the engine's captured queries and cached keys equal those computed on transformers'
attention weights and keys; after a press, decoding equals transformers decoding with the
removed positions masked out; ratio 0 equals no press; freed blocks, prefix hits, preemption,
speculation and the FP8 cache keep working; unsupported models are clear errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from infergen import LLM, SamplingParams
from infergen.errors import ConfigError, RequestError
from infergen.kvcache.presses import PRESSES
from infergen.kvcache.presses.snapkv import KERNEL, WINDOW
from tests.hf_models import build_hf_model


def _prompt(vocab: int, n: int, seed: int = 3) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _record_scores(monkeypatch, name: str) -> list[tuple]:
    """Every call of the press row `name`: (layer, keys, queries, scores); a budgeted press's
    accumulated scores (its layer: the order of the calls)."""
    press, seen = PRESSES.get(name), []
    scores, accumulated = press.scores, press.accumulated

    def scoring(keys, queries, scale, layer):
        out = scores(keys, queries, scale, layer)
        seen.append((layer, keys.clone(), queries, out.clone()))
        return out

    def accumulating(keys, queries, scale):
        out = accumulated(keys, queries, scale)
        seen.append((len(seen), keys.clone(), queries, out.clone()))
        return out

    monkeypatch.setattr(press, "scores", scoring)
    monkeypatch.setattr(press, "accumulated", accumulating)
    return seen


def _assert_no_block_held(llm: LLM) -> None:
    pool = llm.engine.scheduler.pool
    assert all(pool.refcount(b) == 0 for b in range(pool.num_blocks))


def test_snapkv_h2o_and_knorm_scores_equal_transformers(tmp_path, monkeypatch):
    """SnapKV: transformers' attention weights of the prompt's last 32 queries, averaged over
    the window and each KV head's two query heads, max-pooled over 7 positions; H2O: every
    prompt query's weights summed, averaged over the query heads;
    KNorm: −‖k‖ of transformers' cached (rotated) keys. Within 1e-5, every layer."""
    hf = build_hf_model("llama_gqa", tmp_path)
    prompt = _prompt(211, 60)
    with torch.no_grad():
        out = hf(torch.tensor([prompt]), output_attentions=True, use_cache=True)
    for name in ("snapkv", "h2o", "knorm"):
        llm = LLM(str(tmp_path), block_size=4, kv_press=name, kv_press_ratio=0.5)
        seen = _record_scores(monkeypatch, name)
        llm.generate([prompt], SamplingParams(max_tokens=2, temperature=0))
        assert [layer for layer, *_ in seen] == [0, 1, 2]
        for layer, keys, _, scores in seen:
            hf_keys = out.past_key_values.layers[layer].keys[0].transpose(0, 1)  # [n, kv, d]
            torch.testing.assert_close(keys, hf_keys, atol=1e-5, rtol=1e-5)
            if name == "knorm":
                want = -hf_keys.norm(dim=-1).t()
            elif name == "h2o":  # (every prompt query's attention, accumulated)
                weights = out.attentions[layer][0].sum(dim=1)  # [heads, n]
                want = weights.view(2, 2, -1).mean(dim=1)
            else:
                weights = out.attentions[layer][0, :, -WINDOW:, :].mean(dim=1)  # [heads, n]
                per_kv = weights.view(2, 2, -1).mean(dim=1)[:, : 60 - WINDOW]
                want = F.max_pool1d(per_kv[:, None], KERNEL, 1, KERNEL // 2)[:, 0]
                assert torch.isinf(scores[:, 60 - WINDOW :]).all()  # the window: kept
                scores = scores[:, : 60 - WINDOW]
            torch.testing.assert_close(scores, want, atol=1e-5, rtol=1e-5)
        _assert_no_block_held(llm)


@pytest.mark.parametrize("chunk", [256, 16])
def test_kvzip_scores_equal_transformers_rereading_the_prompt(tmp_path, monkeypatch, chunk):
    """KVzip's second pass: the 40-token prompt read again right after itself (no tokenizer:
    no instruction), in one chunk or in chunks of 16 (each after the prompt alone); a prompt
    token's score is the most attention any re-reading query of any chunk pays it, over the
    query heads of its KV head — transformers' attention weights on prompt + chunk are the
    oracle, within 1e-5 in every layer; no scratch block is left held."""
    hf = build_hf_model("llama_gqa", tmp_path)
    monkeypatch.setattr(PRESSES.get("kvzip"), "chunk", chunk)
    prompt = _prompt(hf.config.vocab_size, 40)
    llm = LLM(str(tmp_path), block_size=4, kv_press="kvzip", kv_press_ratio=0.5)
    seen, reread = [], PRESSES.get("kvzip").reread_scores

    def recording(keys, queries, context, scale):
        out = reread(keys, queries, context, scale)
        seen.append(out)
        return out

    monkeypatch.setattr(PRESSES.get("kvzip"), "reread_scores", recording)
    llm.generate([prompt], SamplingParams(max_tokens=2, temperature=0))
    chunks = [prompt[i : i + chunk] for i in range(0, 40, chunk)]
    assert len(seen) == 3 * len(chunks)  # (a call per layer and chunk)
    want = [None] * 3
    for part in chunks:
        with torch.no_grad():
            out = hf(torch.tensor([prompt + part]), output_attentions=True)
        for layer in range(3):
            weights = out.attentions[layer][0, :, 40:, :40].amax(dim=1)  # [heads, 40]
            got = weights.view(2, 2, 40).amax(dim=1)
            want[layer] = got if want[layer] is None else torch.maximum(want[layer], got)
    for layer in range(3):
        best = seen[layer]
        for k in range(1, len(chunks)):
            best = torch.maximum(best, seen[3 * k + layer])
        torch.testing.assert_close(best, want[layer], atol=1e-5, rtol=1e-5)
    assert llm.engine.kv_press.stats["pressed"] == 1
    _assert_no_block_held(llm)


def _hf_masked_greedy(hf, prompt: list[int], removed: range, steps: int):
    """transformers' greedy tokens and their log-probabilities after `prompt`, each decode
    attending to every earlier position but `removed` (a 2-D attention mask over the cache)."""
    tokens, logprobs = [], []
    with torch.no_grad():
        out = hf(torch.tensor([prompt]), use_cache=True)
        for step in range(steps):
            logp = out.logits[0, -1].log_softmax(-1)
            token = int(logp.argmax())
            tokens.append(token)
            logprobs.append(float(logp[token]))
            position = len(prompt) + step
            mask = torch.ones(1, position + 1, dtype=torch.long)
            mask[0, removed.start : removed.stop] = 0
            out = hf(
                torch.tensor([[token]]),
                past_key_values=out.past_key_values,
                attention_mask=mask,
                position_ids=torch.tensor([[position]]),
                cache_position=torch.tensor([position]),
                use_cache=True,
            )
    return tokens, logprobs


@pytest.mark.parametrize("name,blocks", [("llama_gqa", None), ("gemma3", None), ("llama_gqa", 11)])
def test_decoding_after_a_press_equals_transformers_with_the_removed_positions_masked(
    name, blocks, tmp_path
):
    """`streaming` at 0.5 keeps the 4 sinks and the last 16 of 40 prompt tokens in every
    layer and head: the kept keys move to the first cache indices of new blocks, the decodes
    after them are written past them, and their logits equal transformers' with positions
    4..23 masked (RoPE positions unchanged; Gemma-3's sliding-window layers keep their own
    window, which the press leaves alone). Greedy tokens equal, log-probabilities within 1e-4;
    half the prompt's blocks go back to the pool. With a pool of 11 blocks (one free after
    the prompt's 10) the kept tokens are compacted in place, into the sequence's own first
    blocks (no longer prefix-cache entries), with the same result."""
    hf = build_hf_model(name, tmp_path)
    prompt = _prompt(hf.config.vocab_size, 40)
    llm = LLM(str(tmp_path), block_size=4, kv_press="streaming", kv_press_ratio=0.5,
              num_kv_blocks=blocks)  # fmt: skip
    got = llm.generate([prompt], SamplingParams(max_tokens=8, temperature=0, logprobs=1))[0]
    tokens, logprobs = _hf_masked_greedy(hf, prompt, range(4, 24), 8)
    assert got.token_ids == tokens
    assert [x.logprob for x in got.logprobs] == pytest.approx(logprobs, abs=1e-4)
    stats = llm.engine.kv_press.stats
    assert stats["pressed"] == 1 and stats["tokens_removed"] == 20
    assert stats["in_place"] == (blocks is not None)
    if blocks is not None:  # the rewritten blocks left the prefix cache: a new run misses
        assert llm.generate([prompt], SamplingParams(max_tokens=1))[0].num_cached_prompt_tokens == 0
    full_groups = sum(group.window is None for group in llm.engine.kv_cache.groups)
    assert stats["blocks_freed"] == 5 * full_groups  # 10 prompt blocks → 5 per full group
    _assert_no_block_held(llm)


def test_pyramid_budgets_per_layer_group_equal_transformers_masked_per_layer(tmp_path, monkeypatch):
    """PyramidKV's per-layer budgets: the engine is built with a cache group per layer (the
    row's group_layers set to 1 for the 3-layer model), and at 0.5 on 40 prompt tokens the
    groups keep 30 / 20 / 10 tokens (shares 1.5, 1, 0.5). With StreamingLLM's scores in
    place of SnapKV's (the same tokens in every head, so transformers can mask them), the
    decodes equal transformers' with each layer's removed positions masked in that layer
    alone (a forward pre-hook per attention layer): tokens, log-probabilities within 1e-4."""
    hf = build_hf_model("llama_gqa", tmp_path)
    row = PRESSES.get("pyramidkv")
    monkeypatch.setattr(row, "group_layers", 1)
    monkeypatch.setattr(row, "scores", PRESSES.get("streaming").scores)
    prompt = _prompt(hf.config.vocab_size, 40)
    llm = LLM(str(tmp_path), block_size=4, kv_press="pyramidkv", kv_press_ratio=0.5)
    assert [g.layers for g in llm.engine.kv_cache.groups] == [(0,), (1,), (2,)]
    got = llm.generate([prompt], SamplingParams(max_tokens=6, temperature=0, logprobs=1))[0]
    removed = {0: range(4, 14), 1: range(4, 24), 2: range(4, 34)}  # 4 sinks + the last ones

    def masking(layer):
        def hook(module, args, kwargs):
            hidden = kwargs.get("hidden_states", args[0] if args else None)
            if hidden.shape[1] == 1:  # a decode: this layer's removed positions masked
                length = kwargs["cache"].get_seq_length(layer) + 1  # (before its entry)
                mask = torch.zeros(1, 1, 1, length)
                mask[..., removed[layer].start : removed[layer].stop] = float("-inf")
                kwargs["attention_mask"] = mask
            return args, kwargs

        return hook

    for i, layer in enumerate(hf.model.layers):
        layer.self_attn.register_forward_pre_hook(masking(i), with_kwargs=True)
    tokens, logprobs = _hf_masked_greedy(hf, prompt, range(0, 0), 6)
    assert got.token_ids == tokens
    assert [x.logprob for x in got.logprobs] == pytest.approx(logprobs, abs=1e-4)
    assert llm.engine.kv_press.stats["blocks_freed"] == sum(
        10 - -(-keep // 4) for keep in (30, 20, 10)
    )
    _assert_no_block_held(llm)


def test_ratio_zero_equals_no_press_and_fp8_codes_move_exactly(tmp_path):
    """Ratio 0 runs the whole press (capture, scores, compaction into new blocks) keeping every
    token: the outputs equal the engine's without a press, log-probabilities exactly, for the
    engine dtype and the FP8 KV cache (its codes move as they are)."""
    hf = build_hf_model("llama_gqa", tmp_path)
    prompts = [_prompt(hf.config.vocab_size, n, seed=n) for n in (37, 50)]
    params = SamplingParams(max_tokens=10, temperature=0, logprobs=1)
    for kv_format in (None, "fp8_e4m3"):
        plain = LLM(str(tmp_path), block_size=4, kv_format=kv_format).generate(prompts, params)
        llm = LLM(str(tmp_path), block_size=4, kv_format=kv_format, kv_press="snapkv",
                  kv_press_ratio=0.0)  # fmt: skip
        pressed = llm.generate(prompts, params)
        assert llm.engine.kv_press.stats["pressed"] == 2
        for a, b in zip(pressed, plain, strict=True):
            assert a.token_ids == b.token_ids
            assert [x.logprob for x in a.logprobs] == [x.logprob for x in b.logprobs]
        _assert_no_block_held(llm)


def test_freed_blocks_prefix_hits_and_speculation(tmp_path):
    """At 0.5, each 64-token prompt gives back 8 of its 16 blocks (≥ 45 %). A second request
    sharing the first's prompt hits its uncompressed blocks (released, not rewritten, by the
    press) up to SnapKV's window, which is computed again for its queries, and equals the
    same request on a fresh engine; a pressed sequence's own blocks are
    never hashed. ngram speculation (verify rows past the press's cache indices) leaves greedy
    outputs unchanged."""
    hf = build_hf_model("llama_gqa", tmp_path)
    vocab = hf.config.vocab_size
    prompts = [_prompt(vocab, 64, seed=s) for s in range(4)]
    params = SamplingParams(max_tokens=12, temperature=0)
    options = dict(block_size=4, kv_press="snapkv", kv_press_ratio=0.5)
    llm = LLM(str(tmp_path), **options)
    first = llm.generate(prompts, params)
    stats = llm.engine.kv_press.stats
    assert stats["pressed"] == 4 and stats["blocks_freed"] == 4 * 8
    longer = prompts[0] + _prompt(vocab, 9, seed=9)
    hit = llm.generate([longer], params)[0]
    # (the window's 32 tokens at the prompt's end are computed: their queries are read)
    assert hit.num_cached_prompt_tokens == (len(longer) - WINDOW) // 4 * 4 > 0
    assert hit.token_ids == LLM(str(tmp_path), **options).generate([longer], params)[0].token_ids
    _assert_no_block_held(llm)
    spec = LLM(str(tmp_path), speculative="ngram", num_speculative_tokens=3, **options)
    assert [o.token_ids for o in spec.generate(prompts, params)] == [o.token_ids for o in first]
    _assert_no_block_held(spec)


def test_preemption_of_pressed_sequences(tmp_path):
    """A pool too small for every sequence at once preempts pressed sequences: recomputed as
    they first ran (chunks stop at the prompt's end, the press runs there, the generated
    tokens follow), every request gets the tokens it gets on a pool that never preempts,
    no block left held."""
    hf = build_hf_model("llama_gqa", tmp_path)
    prompts = [_prompt(hf.config.vocab_size, 48, seed=s) for s in range(6)]
    llm = LLM(str(tmp_path), block_size=4, num_kv_blocks=60, max_num_batched_tokens=64,
              kv_press="snapkv", kv_press_ratio=0.5)  # fmt: skip
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    outs = llm.generate(prompts, params)
    roomy = LLM(str(tmp_path), block_size=4, kv_press="snapkv", kv_press_ratio=0.5)
    assert [o.token_ids for o in outs] == [o.token_ids for o in roomy.generate(prompts, params)]
    assert llm.engine.scheduler.num_preemptions > 0
    assert llm.engine.kv_press.stats["pressed"] > len(prompts)  # (again after recomputing)
    _assert_no_block_held(llm)


def test_h2o_holds_the_budget_during_decode(tmp_path, monkeypatch):
    """H2O at 0.5 on a 60-token prompt keeps 30 tokens per head; while 40 tokens are generated
    the cache never holds more than 30 + a block of 4 (an eviction each time it reaches 34).
    The prompt's queries and then each decode's add the attention they paid each cached token
    to its score: a plain-torch loop (one query and head at a time, causal by cache index) is
    the oracle of every increment, within 1e-5."""
    hf = build_hf_model("llama_gqa", tmp_path)
    llm = LLM(str(tmp_path), block_size=4, kv_press="h2o", kv_press_ratio=0.5)
    presser, press = llm.engine.kv_press, PRESSES.get("h2o")
    calls, accumulated = [], press.accumulated

    def recording(keys, queries, scale):
        out = accumulated(keys, queries, scale)
        calls.append((keys, queries, scale, out.clone()))
        return out

    monkeypatch.setattr(press, "accumulated", recording)
    cached = []
    llm.engine.on_step = lambda record: cached.extend(
        presser._cached(s) for s in llm.engine.scheduler.running if s.pressed
    )
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    out = llm.generate([_prompt(hf.config.vocab_size, 60)], params)[0]
    assert len(out.token_ids) == 40 and max(cached) <= 34 and min(cached) >= 30
    stats = presser.stats
    assert stats["pressed"] == 1 and stats["evictions"] >= 8
    for keys, queries, scale, got in calls:  # (the prompt's, then each decode's)
        tokens, kv_heads, _ = keys.shape
        heads = queries.shape[1]
        want = torch.zeros(kv_heads, tokens)
        for i in range(queries.shape[0]):
            position = tokens - queries.shape[0] + i  # (the last m cache indices, in order)
            for h in range(heads):
                k = keys[: position + 1, h // (heads // kv_heads)]
                p = torch.softmax(k @ queries[i, h] * scale, dim=0)
                want[h // (heads // kv_heads), : position + 1] += p / (heads // kv_heads)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert len(calls) > 3
    _assert_no_block_held(llm)


def test_a_press_per_request(tmp_path):
    """An engine without kv_press runs a request's own press (SamplingParams.kv_press, its
    ratio) beside requests without one in the same batches: each equals the same request on
    an engine with that press engine-wide, or with none. Requests naming an unknown press,
    or a press this model cannot run, are refused."""
    hf = build_hf_model("llama_gqa", tmp_path / "llama")
    vocab = hf.config.vocab_size
    prompts = [_prompt(vocab, 44, seed=s) for s in range(3)]
    plain = SamplingParams(max_tokens=8, temperature=0, logprobs=1)
    pressed = SamplingParams(max_tokens=8, temperature=0, logprobs=1, kv_press="snapkv",
                             kv_press_ratio=0.75)  # fmt: skip
    llm = LLM(str(tmp_path / "llama"), block_size=4)
    got = llm.generate(prompts, [pressed, plain, pressed])
    whole = LLM(str(tmp_path / "llama"), block_size=4, kv_press="snapkv", kv_press_ratio=0.75)
    want_pressed = whole.generate([prompts[0], prompts[2]], plain)
    want_plain = LLM(str(tmp_path / "llama"), block_size=4).generate([prompts[1]], plain)
    for a, b in zip([got[0], got[2], got[1]], [*want_pressed, *want_plain], strict=True):
        assert a.token_ids == b.token_ids
        assert [x.logprob for x in a.logprobs] == pytest.approx([x.logprob for x in b.logprobs],
                                                                abs=1e-5)  # fmt: skip
    assert llm.engine.kv_press.stats["pressed"] == 2
    _assert_no_block_held(llm)
    with pytest.raises(RequestError, match="unknown KV press"):
        llm.generate(prompts[:1], SamplingParams(kv_press="nope"))
    with pytest.raises(RequestError, match="kv_press_ratio"):
        SamplingParams(kv_press="snapkv", kv_press_ratio=1.0)
    build_hf_model("mamba2", tmp_path / "mamba")
    with pytest.raises(RequestError, match="recurrent"):
        LLM(str(tmp_path / "mamba")).generate([[1, 2, 3]], SamplingParams(kv_press="snapkv"))


@pytest.mark.parametrize("name", ["snapkv", "pyramidkv", "h2o", "kvzip", "knorm"])
def test_prompts_shorter_than_the_window(tmp_path, name):
    """A prompt of fewer tokens than SnapKV's 32-token window (all of it the window) and one
    of a single token: every press runs and decoding goes on, no block left held."""
    hf = build_hf_model("llama_gqa", tmp_path)
    llm = LLM(str(tmp_path), block_size=4, kv_press=name, kv_press_ratio=0.5)
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    outs = llm.generate([_prompt(hf.config.vocab_size, 9), [5]], params)
    assert [len(o.token_ids) for o in outs] == [6, 6]
    assert llm.engine.kv_press.stats["pressed"] == 2
    _assert_no_block_held(llm)


def test_what_the_press_refuses(tmp_path):
    build_hf_model("llama_gqa", tmp_path / "llama")
    with pytest.raises(ConfigError, match="kv_press"):
        LLM(str(tmp_path / "llama"), kv_press="nope")
    with pytest.raises(ConfigError, match="kv_press_ratio"):
        LLM(str(tmp_path / "llama"), kv_press="snapkv", kv_press_ratio=1.0)
    with pytest.raises(ConfigError, match="evicts during decode"):
        LLM(str(tmp_path / "llama"), kv_press="h2o", speculative="ngram")
    with pytest.raises(ConfigError, match="own block stores"):
        LLM(str(tmp_path / "llama"), kv_press="snapkv", kv_format="int4_kivi", block_size=16)
    build_hf_model("mamba2", tmp_path / "mamba")
    with pytest.raises(ConfigError, match="recurrent"):
        LLM(str(tmp_path / "mamba"), kv_press="snapkv")
    build_hf_model("deepseek_v2", tmp_path / "mla")
    with pytest.raises(ConfigError, match="latent"):
        LLM(str(tmp_path / "mla"), kv_press="snapkv")
