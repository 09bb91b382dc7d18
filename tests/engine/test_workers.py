"""`tensor_parallel_size` (issue 26): this process as rank 0 — scheduling, sampling and
broadcasting each step's ForwardBatch — and worker processes for the other ranks
(engine/workers.py). Two ranks generate what one process does; a worker killed mid-run, or one
whose build fails, ends in a WorkerError naming the rank, with no process left behind; what a
tensor-parallel engine does not run yet is refused by name."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from infergen import LLM, SamplingParams
from infergen.engine import workers
from infergen.engine.workers import WorkerError
from infergen.errors import ConfigError, RequestError
from tests.hf_models import build_hf_model

PROMPTS = [[5, 9, 13, 2, 7, 11, 3, 8, 1, 4, 6, 12, 10, 14, 15, 16, 17, 18], [3, 1], [7] * 9]


def _children() -> list[str]:
    """This process's live children but multiprocessing's resource tracker (started once per
    process by the first spawn, shared, gone at exit): their command lines."""
    lines = [" ".join(p.cmdline()) for p in psutil.Process().children(recursive=True)
             if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]  # fmt: skip
    return [line for line in lines if "resource_tracker" not in line]


UNEVEN = dict(hidden_size=96, num_attention_heads=6, num_key_value_heads=3)  # 1 + 2 KV heads


@pytest.mark.parametrize("name", ["llama_gqa", "llama_mqa_tied", "uneven", "gpt_oss_ep"])
def test_two_ranks_serve_what_one_process_does(name, tmp_path):
    """Greedy tokens identical and log-probabilities within 1e-4, chunked prefill (chunks of 8
    tokens) and continuous batching included; the workers stop on close. gpt_oss_ep: GPT-OSS
    (MoE, sinks) with its experts split whole over the two ranks (expert_parallel_size 2)."""
    builds = {"uneven": ("llama_gqa", UNEVEN), "gpt_oss_ep": ("gpt_oss", {})}
    kind, overrides = builds.get(name, (name, {}))
    build_hf_model(kind, tmp_path, **overrides)
    params = SamplingParams(max_tokens=10, temperature=0, logprobs=0, ignore_eos=True)
    options = dict(block_size=4, max_num_batched_tokens=8, num_threads=1)
    want = LLM(str(tmp_path), **options).generate(PROMPTS, params)
    parallel = dict(tensor_parallel_size=2, expert_parallel_size=2 if name.endswith("_ep") else 1)
    with LLM(str(tmp_path), **parallel, **options) as llm:
        group = llm.engine.workers
        assert len(group.processes) == 1
        calls = sum(v[0] for v in group.tp.stats.values())
        group.trace(True)
        got = llm.generate(PROMPTS, params)
        waits = group.waits()  # every rank waited in the same collectives, in the same order
        calls = sum(v[0] for v in group.tp.stats.values()) - calls
        assert [len(w) for w in waits] == [calls, calls] and calls > 0
        assert min(min(w) for w in waits) >= 0
    for a, b in zip(got, want, strict=True):
        assert a.token_ids == b.token_ids
        assert [x.logprob for x in a.logprobs] == pytest.approx(
            [x.logprob for x in b.logprobs], abs=1e-4
        )
    assert not _children()


def test_a_conversation_on_two_ranks(tmp_path):
    """Turn 2 = turn 1's prompt + answer + new tokens: one process resumes it from turn 1's
    partial last block, restored from a prefix checkpoint; that restore would reach rank 0's
    pages only, so tensor parallelism keeps no such checkpoint. Every turn generates what one
    process does."""
    build_hf_model("llama_gqa", tmp_path)
    params = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)

    def conversation(llm):
        prompt, answers = list(PROMPTS[0]), []
        for turn in range(3):
            answer = llm.generate([prompt], params)[0].token_ids
            answers.append(answer)
            prompt = prompt + answer + [turn + 3, 9, 4]
        return answers

    options = dict(block_size=4, num_threads=1)
    want = conversation(LLM(str(tmp_path), **options))
    with LLM(str(tmp_path), tensor_parallel_size=2, **options) as llm:
        assert conversation(llm) == want


def test_every_rank_has_the_pool_of_the_rank_with_most_heads(tmp_path):
    """3 KV heads on 2 ranks: rank 0 holds 1, rank 1 holds 2. Both pools get the blocks rank
    1's budget holds (half of what one KV head's would), so rank 0 never hands out a block
    rank 1 does not have; a pool filled to the last block generates as one process does."""
    build_hf_model("llama_gqa", tmp_path, **UNEVEN)
    options = dict(block_size=4, num_threads=1, kv_cache_memory="96KiB")
    single = LLM(str(tmp_path), **options)
    blocks = single.engine.kv_cache.num_blocks  # (3 KV heads)
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    prompts = [[(7 * i + j) % 200 + 1 for j in range(40)] for i in range(6)]
    want = single.generate(prompts, params)
    with LLM(str(tmp_path), tensor_parallel_size=2, **options) as llm:
        assert abs(llm.engine.kv_cache.num_blocks - blocks * 3 / 2) <= 1
        got = llm.generate(prompts, params)
        assert llm.engine.scheduler.num_preemptions > 0  # (the pool was full)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]


def test_a_killed_worker_is_named_and_nothing_is_left(tmp_path):
    build_hf_model("llama_gqa", tmp_path)
    llm = LLM(str(tmp_path), tensor_parallel_size=2, block_size=4, num_threads=1)
    worker = llm.engine.workers.processes[0]
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait(timeout=10)
    began = time.monotonic()
    with pytest.raises(WorkerError, match=r"rank 1 exited with code -9"):
        llm.generate(PROMPTS[:1], SamplingParams(max_tokens=4, temperature=0))
    assert time.monotonic() - began < 30
    assert not _children()
    with pytest.raises(WorkerError, match="stopped"):  # (and it stays stopped)
        llm.generate(PROMPTS[:1], SamplingParams(max_tokens=4, temperature=0))
    llm.close()


def test_a_hung_worker_is_named_within_the_timeout(tmp_path, monkeypatch):
    """A worker stopped (SIGSTOP) mid-run: the step fails once the collective's timeout (5 s
    here) passes, naming the silence; the stopped worker is killed, nothing is left."""
    monkeypatch.setattr(workers, "DEFAULT_TIMEOUT_S", 5.0)
    build_hf_model("llama_gqa", tmp_path)
    llm = LLM(str(tmp_path), tensor_parallel_size=2, block_size=4, num_threads=1)
    os.kill(llm.engine.workers.processes[0].pid, signal.SIGSTOP)
    began = time.monotonic()
    with pytest.raises(WorkerError, match="no worker exited.* at most 5 s"):
        llm.generate(PROMPTS[:1], SamplingParams(max_tokens=4, temperature=0))
    assert time.monotonic() - began < 20
    assert not _children()
    llm.close()


def test_workers_wait_for_requests_longer_than_the_timeout(tmp_path, monkeypatch):
    """An engine idle for longer than a collective may take (2 s here): its workers wait for
    the next step (on the control group) and the next request runs as the first did."""
    monkeypatch.setattr(workers, "DEFAULT_TIMEOUT_S", 2.0)
    build_hf_model("llama_gqa", tmp_path)
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    with LLM(str(tmp_path), tensor_parallel_size=2, block_size=4, num_threads=1) as llm:
        first = llm.generate(PROMPTS[:1], params)[0].token_ids
        time.sleep(5)
        assert llm.generate(PROMPTS[:1], params)[0].token_ids == first
    assert not _children()


def test_what_it_does_not_run_yet_is_refused(tmp_path):
    build_hf_model("llama_gqa", tmp_path / "llama")
    build_hf_model("mamba2", tmp_path / "mamba")
    with pytest.raises(ConfigError, match="speculative"):
        LLM(str(tmp_path / "llama"), tensor_parallel_size=2, speculative="ngram")
    with pytest.raises(ConfigError, match="recurrent layers"):
        LLM(str(tmp_path / "mamba"), tensor_parallel_size=2)
    assert not _children()
    with LLM(str(tmp_path / "llama"), tensor_parallel_size=2, num_threads=1) as llm:
        with pytest.raises(RequestError, match="tensor parallelism"):
            llm.generate([[1, 2, 3]], SamplingParams(kv_press="snapkv"))
        out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2, temperature=0))
        assert len(out[0].token_ids) == 2  # (a refused request leaves the engine serving)
    assert not _children()
