"""`ThroughWriter` (kvcache/tiers/writer.py): write-through blocks stored off the engine thread.
Oracles: a real DiskTier (files on disk, read back by a fresh tier), a gate the test opens (a
save returns while its write waits; no timing), and the engine's own steps."""

from __future__ import annotations

import os
import threading

import pytest
import torch

from infergen import LLM, SamplingParams
from infergen.kvcache.tiers.disk import DiskTier
from infergen.kvcache.tiers.writer import ThroughWriter
from tests.hf_models import build_hf_model

GATE_S = 60.0  # a gated write gives up after this long (a hung test fails instead)


class Gate:
    def __init__(self) -> None:
        self.open, self.entered = threading.Event(), threading.Event()

    def __call__(self) -> None:
        self.entered.set()
        if not self.open.wait(GATE_S):
            raise TimeoutError("the test never opened the gate")


def _gated_writer(tier: DiskTier, gate: Gate, max_pending: int = 4) -> ThroughWriter:
    """A writer whose worker thread waits at `gate` before each put (a save written on the
    calling thread passes)."""

    def write(key, parent, data):
        if threading.current_thread().name.startswith("kv-tier-write"):
            gate()
        tier.put(key, parent, data)

    return ThroughWriter(write, max_pending)


def _gate_puts(tier: DiskTier) -> Gate:
    """Hold every put of `tier` at a gate (returned) until the test opens it."""
    gate, put = Gate(), tier.put

    def gated_put(key, parent, data):
        gate()
        return put(key, parent, data)

    tier.put = gated_put
    return gate


def test_saves_return_at_once_and_flush_waits_for_the_files(tmp_path):
    tier, gate = DiskTier(tmp_path, 1 << 20, "fp"), Gate()
    writer = _gated_writer(tier, gate)
    page = torch.arange(64, dtype=torch.float32)
    keys = [bytes([i]) * 16 for i in range(3)]
    for i, key in enumerate(keys):
        writer.save(key, keys[i - 1] if i else None, page + i)
    page.zero_()  # the caller reuses its page: the queued copies are unaffected
    assert gate.entered.wait(GATE_S) and all(writer.pending(k) for k in keys)
    writer.save(keys[0], None, page)  # pending: not queued twice
    assert writer.queued == 3 and not any(key in tier for key in keys)
    gate.open.set()
    writer.flush()
    assert not any(writer.pending(k) for k in keys)
    fresh = DiskTier(tmp_path, 1 << 20, "fp")  # read back from the files
    for i, key in enumerate(keys):
        assert torch.equal(fresh.get(key), torch.arange(64, dtype=torch.float32) + i)


def test_past_max_pending_a_save_is_written_on_the_callers_thread(tmp_path):
    tier, gate = DiskTier(tmp_path, 1 << 20, "fp"), Gate()
    writer = _gated_writer(tier, gate, max_pending=2)
    keys = [bytes([i]) * 16 for i in range(3)]
    writer.save(keys[0], None, torch.ones(8))
    writer.save(keys[1], None, torch.ones(8))
    assert gate.entered.wait(GATE_S)  # the worker holds key 0 at the gate: 2 pending
    writer.save(keys[2], None, torch.ones(8))
    assert writer.inline == 1 and keys[2] in tier  # written before save returned
    assert keys[0] not in tier and keys[1] not in tier  # (the worker's still wait)
    gate.open.set()
    writer.flush()
    assert all(key in tier for key in keys)


def test_an_error_in_the_worker_is_raised_by_flush():
    def write(key, parent, data):
        raise RuntimeError("a bug in a tier")

    writer = ThroughWriter(write)
    writer.save(b"k" * 16, None, torch.ones(2))
    with pytest.raises(RuntimeError, match="a bug in a tier"):
        writer.flush()
    writer.flush()  # raised once


def test_a_prefill_step_does_not_wait_for_its_blocks_files(tmp_path):
    """With write-through to disk, the step that computes a prompt returns while its blocks'
    files are still being written (the writer held at a gate); once written (LLM.generate
    flushes) a restarted engine serves the prompt from disk."""
    build_hf_model("llama_gqa", tmp_path / "model")
    model, options = str(tmp_path / "model"), dict(block_size=4, num_kv_blocks=64,
        kv_offload_dir=str(tmp_path / "kv"), kv_offload_write_through=True)  # fmt: skip
    llm = LLM(model, **options)
    (disk,) = llm.engine.kv_tiers.tiers
    gate = _gate_puts(disk)
    prompt = torch.randint(3, 200, (40,), generator=torch.Generator().manual_seed(3)).tolist()
    params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
    request = llm.engine.add_request(prompt, params)
    deltas = llm.engine.step()  # the prompt's step: 10 blocks registered, written through
    assert [d.request_id for d in deltas] == [request]  # returned its first token
    assert gate.entered.wait(GATE_S) and disk.stats["puts"] == 0
    gate.open.set()
    while llm.engine.has_unfinished():
        llm.engine.step()
    llm.engine.kv_tiers.flush()
    assert disk.stats["puts"] >= 10
    restarted = LLM(model, **options)
    out = restarted.generate(prompt, params)[0]
    assert out.num_cached_prompt_tokens >= 36


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_the_writer_thread_starts_no_openmp_team(tmp_path):
    """The writer only writes files: blocks of 49152 elements (which torch copies in parallel)
    written through add the writer's one thread to the process and no OpenMP team (which
    would slow every later step: tiers/loader.py). (A first prompt shorter than a block
    starts the engine thread's own team and writes nothing: no prefix checkpoints, which
    would write its partial block.)"""
    build_hf_model("llama_gqa", tmp_path / "model")
    llm = LLM(str(tmp_path / "model"), block_size=256, num_kv_blocks=8, num_threads=2,
              kv_offload_dir=str(tmp_path / "kv"), kv_offload_write_through=True,
              state_checkpoint_memory="0")  # fmt: skip
    assert llm.engine.kv_cache.page(0).numel() > 32768
    prompt = torch.randint(3, 200, (500,), generator=torch.Generator().manual_seed(4)).tolist()
    params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
    llm.generate(prompt[:10], params)
    before = set(os.listdir("/proc/self/task"))
    llm.generate(prompt, params)
    (disk,) = llm.engine.kv_tiers.tiers
    assert disk.stats["puts"] >= 1
    # new threads only (an earlier test's idle writer may exit meanwhile, when collected)
    assert len(set(os.listdir("/proc/self/task")) - before) == 1


def test_a_hybrids_state_checkpoints_are_written_through_off_the_engine_thread(tmp_path):
    """A hybrid (Falcon-H1) with write-through: the prompt's step returns while its state
    checkpoint's file (and its blocks') wait at the gate; once flushed, a restarted engine
    resumes the prompt from the checkpoint on disk."""
    build_hf_model("falcon_h1", tmp_path / "model")
    model, options = str(tmp_path / "model"), dict(block_size=4, num_kv_blocks=64,
        kv_offload_dir=str(tmp_path / "kv"), kv_offload_write_through=True)  # fmt: skip
    llm = LLM(model, **options)
    tiers = llm.engine.kv_tiers
    (disk,) = tiers.tiers
    gate = _gate_puts(disk)
    prompt = torch.randint(3, 200, (40,), generator=torch.Generator().manual_seed(5)).tolist()
    params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
    request = llm.engine.add_request(prompt, params)
    deltas = llm.engine.step()  # the prompt: its blocks and its end's checkpoint written through
    assert [d.request_id for d in deltas] == [request]
    assert llm.engine.scheduler.checkpoints.stats["saved"] >= 1
    assert gate.entered.wait(GATE_S) and tiers.states_saved == 0
    gate.open.set()
    while llm.engine.has_unfinished():
        llm.engine.step()
    tiers.flush()
    assert tiers.states_saved >= 1
    restarted = LLM(model, **options)
    out = restarted.generate(prompt + [7, 8, 9], params)[0]
    assert out.num_cached_prompt_tokens >= 36
    assert restarted.engine.kv_tiers.states_loaded >= 1
