"""Fuzz: random requests through a speculating engine — copy-heavy and random prompts, greedy
and seeded sampled ones, random lengths, arriving while others run, a KV pool small enough to
preempt — with the pool's accounting checked after every step against the sequences
themselves (not the scheduler's own counts):

- every block's reference count is the number of times the running sequences' block tables
  hold it, and every block at no reference can be handed out (none lost);
- a block published in the prefix cache holds kept tokens only: its key is the chained hash
  of the tokens its sequence kept up to the block's end, all of them computed (a rejected
  draft's position is never hashed);
- recurrent layers: each running sequence holds a state slot of its own, the rest are free.

Requests share passages, so some start from prefix-cache hits. At the end nothing is held,
and every output equals the plain engine's (greedy: up to a near-tie; seeded sampled: token
for token)."""

from __future__ import annotations

import collections
import random

import pytest

from infergen import LLM, SamplingParams
from infergen.kvcache.prefix import block_hash, group_key
from tests.engine.greedy import assert_greedy_equivalent
from tests.hf_models import build_hf_model


def _requests(
    rng: random.Random, vocab: int, n: int
) -> list[tuple[int, list[int], SamplingParams]]:
    """(arrival step, prompt, params) of `n` requests, in arrival order."""
    passages = [[rng.randrange(5, vocab) for _ in range(rng.randint(6, 20))] for _ in range(3)]
    out, step = [], 0
    for i in range(n):
        if rng.random() < 0.6:  # a passage repeated: greedy continuations tend to copy it
            prompt = rng.choice(passages) * rng.randint(2, 4)
        else:
            prompt = [rng.randrange(5, vocab) for _ in range(rng.randint(3, 30))]
        if rng.random() < 0.6:
            params = SamplingParams(max_tokens=rng.randint(1, 40), temperature=0,
                                    ignore_eos=True, logprobs=2)  # fmt: skip
        else:
            params = SamplingParams(max_tokens=rng.randint(1, 40), temperature=0.9, seed=i,
                                    ignore_eos=True)  # fmt: skip
        out.append((step, prompt, params))
        step += rng.choice([0, 0, 1, 3, 8])
    return out


def _check_accounting(engine) -> None:
    scheduler = engine.scheduler
    pool, size = scheduler.pool, scheduler.block_size
    held = collections.Counter(
        b for seq in scheduler.running for group in seq.blocks for b in group if b >= 0
    )
    refs = [pool.refcount(b) for b in range(pool.num_blocks)]
    assert refs == [held[b] for b in range(pool.num_blocks)]
    assert pool.num_free == refs.count(0)
    for seq in scheduler.running:
        hashes: list[bytes] = []
        for g, group in enumerate(seq.blocks):
            for j, b in enumerate(group):
                key = None if b < 0 else pool.key_of(b)
                if key is None:
                    continue
                end = (j + 1) * size
                assert end <= seq.num_computed_tokens, (seq.request_id, j, end)
                while len(hashes) <= j:
                    at = len(hashes)
                    chunk = seq.token_ids[at * size : (at + 1) * size]
                    hashes.append(block_hash(hashes[-1] if hashes else None, chunk))
                assert key == group_key(g, hashes[j]), (seq.request_id, g, j)
    states = scheduler.states
    if states is not None:
        slots = [seq.state_slot for seq in scheduler.running]
        assert None not in slots and len(set(slots)) == len(slots)
        assert states.num_free + len(slots) == states.num_slots


@pytest.mark.parametrize(
    "model, proposer, k, seed",
    [("llama_gqa", "ngram", 3, 0), ("llama_gqa", "suffix", "auto", 1),
     ("llama_gqa", "ngram", "auto", 2), ("qwen3_next", "ngram", 4, 3)],
)  # fmt: skip
def test_pool_accounting_after_every_step(model, proposer, k, seed, tmp_path):
    vocab = build_hf_model(model, tmp_path).config.vocab_size
    rng = random.Random(seed)
    requests = _requests(rng, vocab, 14)
    options = dict(block_size=4, num_kv_blocks=36, max_num_batched_tokens=32, max_num_seqs=4)
    llm = LLM(str(tmp_path), speculative=proposer, num_speculative_tokens=k, **options)
    engine = llm.engine
    ids, pending, step = [], collections.deque(requests), 0
    while pending or engine.has_unfinished():
        while pending and pending[0][0] <= step:
            _, prompt, params = pending.popleft()
            ids.append(engine.add_request(prompt, params))
        engine.step()
        step += 1
        _check_accounting(engine)
    got = [engine.output(i) for i in ids]
    for i in ids:
        engine.release(i)
    assert engine.speculator.stats["steps"] > 0  # drafts were verified
    assert engine.scheduler.num_preemptions > 0  # the pool was short
    assert any(g.num_cached_prompt_tokens for g in got)  # prefix hits among them
    assert not engine.scheduler.running and not engine.scheduler.waiting
    _check_accounting(engine)  # (nothing running: every block unreferenced, none lost)
    want = LLM(str(tmp_path), **options).generate([p for _, p, _ in requests],
                                                  [q for _, _, q in requests])  # fmt: skip
    for (_, _, params), g, w in zip(requests, got, want, strict=True):
        assert len(g.token_ids) == params.max_tokens
        if params.temperature == 0:
            assert_greedy_equivalent(g, w)
        else:
            assert g.token_ids == w.token_ids
