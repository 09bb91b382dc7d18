"""The KV tiers below the pool (issue 23): blocks the pool evicts move to the host tier and
come back on a prefix hit instead of being recomputed.

Metamorphic: with a pool too small to keep a conversation's prefix, generation with a host
tier equals generation without (greedy tokens, logprobs within 1e-5) and its prefix hits are
served from the tier (blocks loaded, prompt tokens cached); teacher-forced logits after a
reload equal a cold recompute; the host tier never holds more than its budget and never
drops a prefix block while a longer entry that depends on it remains (hypothesis)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from infergen import LLM, SamplingParams
from infergen.errors import ConfigError
from infergen.kvcache.tiers.host import HostTier
from tests.hf_models import build_hf_model

GREEDY = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=1)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    directory = tmp_path_factory.mktemp("llama")
    build_hf_model("llama_gqa", directory)
    return str(directory)


def _turns() -> list[list[int]]:
    """A conversation: each turn re-sends the last one's prompt plus new tokens."""
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, 200, (40,), generator=gen).tolist()
    turns = [prompt]
    for _ in range(3):
        prompt = prompt + torch.randint(3, 200, (12,), generator=gen).tolist()
        turns.append(prompt)
    return turns


def _other() -> list[int]:
    return torch.randint(3, 200, (60,), generator=torch.Generator().manual_seed(9)).tolist()


def test_evicted_prefix_blocks_come_back_from_the_host_tier(llama):
    # 24 blocks of 4: one turn fits, but another prompt in between evicts the conversation
    options = dict(block_size=4, num_kv_blocks=24, max_num_seqs=1)
    plain = LLM(llama, **options)
    tiered = LLM(llama, kv_offload_memory="1MiB", **options)
    for llm in (plain, tiered):
        llm.results = []
        for turn in _turns():
            llm.results += llm.generate([turn, _other()], GREEDY)
    tiers = tiered.engine.kv_tiers
    assert tiers.saved > 0 and tiers.loaded > 0
    cached_plain = sum(r.num_cached_prompt_tokens for r in plain.results)
    cached_tiered = sum(r.num_cached_prompt_tokens for r in tiered.results)
    assert cached_tiered > cached_plain
    for a, b in zip(tiered.results, plain.results, strict=True):
        assert a.token_ids == b.token_ids
        for x, y in zip(a.logprobs, b.logprobs, strict=True):
            assert abs(x.logprob - y.logprob) < 1e-5


def test_logits_after_a_reload_equal_a_cold_recompute(llama):
    """The top-20 logprobs of every generated token after the prompt's prefix came back from
    the tier equal a cold run's (the engine without prefix caching recomputes it all)."""
    prompt, params = _turns()[-1], SamplingParams(max_tokens=4, temperature=0, logprobs=20)
    cold = LLM(llama, block_size=4, num_kv_blocks=24, enable_prefix_caching=False)
    want = cold.generate(prompt, params)[0]
    tiered = LLM(llama, block_size=4, num_kv_blocks=24, kv_offload_memory="1MiB")
    tiered.generate(prompt, params)  # its blocks cached...
    tiered.generate(_other(), params)  # ... evicted to the host tier
    got = tiered.generate(prompt, params)[0]
    tiers = tiered.engine.kv_tiers
    assert tiers.loaded > 0 or tiers.states_loaded > 0 and got.num_cached_prompt_tokens >= 32
    assert got.token_ids == want.token_ids
    for x, y in zip(got.logprobs, want.logprobs, strict=True):
        assert dict(x.top).keys() == dict(y.top).keys()
        for token, logprob in dict(x.top).items():
            assert abs(logprob - dict(y.top)[token]) < 1e-5


def test_generation_with_compact_host_blocks_stays_close_to_without(llama):
    """kv_offload_format="fp8_e4m3": the conversation of the first test, its prefix hits served
    from FP8 host blocks. FP8 is lossy, so this is a tolerance test: on this model the greedy
    tokens all agree (48 of 48) and the chosen tokens' logprobs differ by at most 0.0012 from
    the run whose host blocks are exact; asserted: equal tokens, |Δ logprob| < 0.01, and a
    nonzero difference (the reloaded blocks did go through FP8). Its loads are counted, and a
    compact block takes 3.76x fewer bytes than an fp32 one here (4-token blocks of head_dim 16:
    a 4-byte scale per 64 one-byte codes; ~3.98x on the default model's 16 × 64)."""
    options = dict(block_size=4, num_kv_blocks=24, max_num_seqs=1, kv_offload_memory="1MiB")
    exact = LLM(llama, **options)
    compact = LLM(llama, kv_offload_format="fp8_e4m3", **options)
    largest = 0.0
    for turn in _turns():
        want = exact.generate([turn, _other()], GREEDY)
        got = compact.generate([turn, _other()], GREEDY)
        for a, b in zip(got, want, strict=True):
            assert a.token_ids == b.token_ids
            assert a.num_cached_prompt_tokens == b.num_cached_prompt_tokens
            for x, y in zip(a.logprobs, b.logprobs, strict=True):
                largest = max(largest, abs(x.logprob - y.logprob))
    assert 0 < largest < 0.01
    tiers, plain_tiers = compact.engine.kv_tiers, exact.engine.kv_tiers
    host = tiers.stats()["tiers"]["host"]
    assert tiers.loaded == plain_tiers.loaded > 0 and host["hits"] == tiers.loaded
    assert host["bytes_read"] == tiers.loaded * tiers.block_bytes
    assert plain_tiers.block_bytes / tiers.block_bytes == 4 * 64 / (64 + 4)


def test_tiers_refuse_what_they_cannot_move(llama):
    """A block-quantized KV format keeps its own stores: no pages to copy down a tier."""
    with pytest.raises(ConfigError, match="move pages"):
        LLM(llama, kv_format="int4_kivi", kv_offload_memory="1MiB")


chains = st.lists(st.tuples(st.integers(0, 30), st.integers(1, 5)), min_size=1, max_size=60)


@settings(max_examples=60, deadline=None)
@given(chains, st.integers(4, 40))
def test_host_tier_budget_and_prefixes(puts, budget_blocks):
    """Random chains put block by block (each put's parent: an earlier key, or none): the
    budget holds, and a stored entry's parent that was stored when it came stays while it
    does (a parent may live elsewhere — in the pool or another tier — and is not checked)."""
    tier = HostTier(budget_blocks * 16)
    keys: list[bytes] = []
    parents: dict[bytes, bytes | None] = {}
    for i, (parent_pick, size) in enumerate(puts):
        key = i.to_bytes(4, "little")
        parent = keys[parent_pick] if parent_pick < len(keys) else None
        parent_here = parent is not None and parent in tier
        if tier.put(key, parent, torch.zeros(size * 4)):
            keys.append(key)
            parents[key] = parent if parent_here else None
        assert tier.nbytes <= tier.budget_bytes
        for stored in [k for k in keys if k in tier]:
            if parents[stored] is not None:
                assert parents[stored] in tier, "a prefix block went while its child remains"


def test_tier_counters_in_the_metrics_exposition(llama):
    """/metrics' tier families (server/metrics.py) carry the tiers' own counters, read back
    with prometheus_client's parser."""
    from prometheus_client.parser import text_string_to_metric_families

    from infergen.server.metrics import ServerMetrics

    llm = LLM(llama, block_size=4, num_kv_blocks=24, kv_offload_memory="1MiB")
    for turn in _turns()[:2]:
        llm.generate([turn, _other()], GREEDY)
    stats = llm.engine.kv_tiers.stats()
    metrics = ServerMetrics()
    metrics.set_tiers(stats)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(metrics.render().decode())
        for s in family.samples
    }
    host = stats["tiers"]["host"]
    assert host["hits"] > 0 and stats["loaded"] > 0
    assert samples[("infergen_kv_tier_hits_total", (("tier", "host"),))] == host["hits"]
    assert samples[("infergen_kv_tier_bytes_held", (("tier", "host"),))] == host["nbytes"]
    moved = ("infergen_kv_tier_bytes_total", (("direction", "written"), ("tier", "host")))
    assert samples[moved] == host["bytes_written"]
    assert samples[("infergen_kv_tier_blocks_total", (("move", "loaded"),))] == stats["loaded"]
    load = ("infergen_kv_tier_decisions_total", (("decision", "load"),))
    assert samples[load] == stats["decisions"]["load"] > 0
    inline = ("infergen_kv_tier_loads_total", (("mode", "inline"),))
    assert samples[inline] == stats["loads"]["inline"] > 0  # host hits: copied inline
    swaps = ("infergen_kv_preemptions_total", (("mode", "swap"),))
    assert samples[swaps] == stats["preemptions"]["swap"]


def test_preempted_sequences_come_back_through_the_tier(llama):
    """A pool that forces preemption: the preempted sequences' full blocks are evicted to the
    tier and loaded back when they resume; the tokens equal the run without tiers."""
    gen = torch.Generator().manual_seed(4)
    prompts = [torch.randint(3, 200, (n,), generator=gen).tolist() for n in (30, 26, 34, 22)]
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, logprobs=1)
    options = dict(block_size=4, num_kv_blocks=30, max_num_seqs=4, max_num_batched_tokens=16)
    plain = LLM(llama, **options)
    tiered = LLM(llama, kv_offload_memory="1MiB", **options)
    want, got = plain.generate(prompts, params), tiered.generate(prompts, params)
    assert tiered.engine.scheduler.num_preemptions > 0
    tiers = tiered.engine.kv_tiers
    assert tiers.loaded > 0 or tiers.states_loaded > 0
    for a, b in zip(got, want, strict=True):
        assert a.token_ids == b.token_ids


def test_a_restarted_engine_serves_prefix_hits_from_disk(llama, tmp_path):
    """Blocks written through to the disk tier outlive the engine: a new engine on the same
    directory (same model and format) loads the prefix of its first request from there, and
    its tokens equal a cold run's; an engine of another KV format ignores them."""
    options = dict(block_size=4, num_kv_blocks=24, max_num_seqs=1)
    prompt = _turns()[-1]
    first = LLM(llama, kv_offload_memory="1MiB", kv_offload_dir=str(tmp_path),
                kv_offload_write_through=True, **options)  # fmt: skip
    first.generate(prompt, GREEDY)  # every full block written through to the disk tier
    stats = first.engine.kv_tiers.stats()
    computed = len(prompt) + GREEDY.max_tokens - 1
    full_blocks = computed // 4
    # and the partial blocks where the prompt ends and the answer finishes (tails)
    tails = len({n for n in (len(prompt), computed) if n % 4})
    # the host tier is filled by the pool's evictions (nothing evicted here: it stays empty)
    assert stats["tiers"]["disk"]["puts"] == full_blocks + tails
    assert stats["tiers"]["host"]["puts"] == 0 and stats["states_saved"] == tails
    assert stats["saved"] == full_blocks
    del first
    cold = LLM(llama, **options).generate(prompt, GREEDY)[0]
    again = LLM(llama, kv_offload_dir=str(tmp_path), **options)
    got = again.generate(prompt, GREEDY)[0]
    assert got.num_cached_prompt_tokens >= 32 and again.engine.kv_tiers.loaded > 0
    assert got.token_ids == cold.token_ids
    for x, y in zip(got.logprobs, cold.logprobs, strict=True):
        assert abs(x.logprob - y.logprob) < 1e-5
    other = LLM(llama, kv_offload_dir=str(tmp_path), kv_format="fp8_e4m3", **options)
    assert other.generate(prompt, GREEDY)[0].num_cached_prompt_tokens == 0


def test_a_corrupt_disk_block_is_recomputed(llama, tmp_path):
    """A flipped byte in a stored block: the restarted engine finds it by its checksum,
    recomputes from there and gives the cold run's tokens."""
    options = dict(block_size=4, num_kv_blocks=24, max_num_seqs=1)
    prompt = _turns()[-1]
    LLM(llama, kv_offload_dir=str(tmp_path), kv_offload_write_through=True, **options).generate(
        prompt, GREEDY
    )
    files = sorted(tmp_path.glob("*.kv"))
    assert files
    for path in files[::2]:  # every other block: a chain broken in several places
        raw = bytearray(path.read_bytes())
        raw[-3] ^= 0x10
        path.write_bytes(bytes(raw))
    cold = LLM(llama, **options).generate(prompt, GREEDY)[0]
    again = LLM(llama, kv_offload_dir=str(tmp_path), **options)
    got = again.generate(prompt, GREEDY)[0]
    stats = again.engine.kv_tiers.stats()
    assert stats["tiers"]["disk"]["corrupt"] >= 1
    assert stats["loads"]["background"] >= 1 and stats["loads"]["failed"] >= 1  # disk: off-path
    assert got.token_ids == cold.token_ids
    for x, y in zip(got.logprobs, cold.logprobs, strict=True):
        assert abs(x.logprob - y.logprob) < 1e-5


@pytest.mark.parametrize(
    ("name", "blocks"),
    [("llama_mqa_tied", 24), ("qwen2_qkv_bias", 24), ("qwen3_qk_norm", 24),
     ("mistral_window", 10), ("gemma3", 34), ("gpt_oss", 34), ("deepseek_v3", 24),
     ("falcon_h1", 24), ("qwen3_next", 24), ("mamba2", 24)],
)  # fmt: skip
def test_generation_with_tiers_equals_without(name, blocks, tmp_path):
    """Every architecture family: sliding windows (their own cache groups), sinks + MoE,
    latent attention (MLA), and recurrent layers (their states checkpointed; Mamba2 has no KV
    blocks, so only its states go down a tier)."""
    build_hf_model(name, tmp_path)
    # chunks of 16 tokens: a windowed group lets blocks go as its window moves
    options = dict(block_size=4, num_kv_blocks=blocks, max_num_seqs=1, max_num_batched_tokens=16)
    plain = LLM(str(tmp_path), **options)
    # recurrent layers' checkpoints held in no memory of their own: straight to the tier
    tiered = LLM(str(tmp_path), kv_offload_memory="1MiB", state_checkpoint_memory="1B", **options)
    for turn in _turns()[:3]:
        want = plain.generate([turn, _other()], GREEDY)
        got = tiered.generate([turn, _other()], GREEDY)
        assert [o.token_ids for o in got] == [o.token_ids for o in want]
    tiers = tiered.engine.kv_tiers
    assert tiers.loaded > 0 or tiers.states_loaded > 0


@pytest.mark.parametrize("overlaps", [False, True])
def test_inline_or_background_by_what_the_background_hides(llama, tmp_path, monkeypatch, overlaps):
    """The rule (KVTiers.loads_inline) on measured read times: within a tenth of a decode
    step → inline; more, but on a CPU whose cores all run the forward (no overlap) and with
    reads that wait on no I/O → inline up to one step (a background load would take the same
    cores and delay its sequence a step); reads that wait on I/O, or a loader that overlaps
    (a GPU, a spare core) → background; over a step → background."""
    llm = LLM(llama, block_size=4, num_kv_blocks=64, kv_offload_memory="1MiB",
              kv_offload_dir=str(tmp_path))  # fmt: skip
    tiers = llm.engine.kv_tiers
    monkeypatch.setattr(type(tiers), "overlaps", property(lambda self: overlaps))
    host, disk = tiers.tiers
    keys = [bytes([i]) * 16 for i in range(40)]
    for i, key in enumerate(keys):
        assert disk.put(key, keys[i - 1] if i else None, tiers._stored(0))
    tiers.step_seconds = 0.020
    n = tiers.block_bytes
    tiers._count_read("disk", 10 * n, wall=0.040, run=0.040, queued=0.0)  # 4 ms a block, CPU
    assert tiers.loads_inline(keys[:3]) is not overlaps  # 12 ms: hides nothing without overlap
    assert tiers.loads_inline(keys[:6]) is False  # 24 ms: over a step
    tiers._count_read("disk", 10 * n, wall=0.540, run=0.040, queued=0.500)  # waited for a core
    assert tiers.bandwidth("disk") == pytest.approx(20 * n / 0.080)  # (the wait left out)
    assert tiers.loads_inline(keys[:3]) is not overlaps
    tiers._count_read("disk", 10 * n, wall=0.040, run=0.004, queued=0.0)  # mostly I/O waits
    # now 4 ms a block, 1.2 ms of it I/O: 3 blocks hide 3.6 ms (over 2 ms), 1 block 1.2 ms
    assert tiers.loads_inline(keys[:3]) is False
    assert tiers.loads_inline(keys[:1]) is not overlaps
