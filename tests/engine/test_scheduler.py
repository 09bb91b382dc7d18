"""Scheduler invariants, driven directly (no model): budgets, chunking, preemption order."""

from __future__ import annotations

from infergen.config import SchedulerConfig
from infergen.engine.request import Sequence, Status
from infergen.engine.sampling_params import SamplingParams
from infergen.engine.scheduler import Scheduler
from infergen.kvcache.block_pool import BlockPool


def _seq(n_prompt: int, arrival: int) -> Sequence:
    return Sequence(
        f"r{arrival}",
        None,
        list(range(1, n_prompt + 1)),
        SamplingParams(),
        None,
        None,
        None,
        arrival,
    )


def _complete(batch) -> None:
    """Pretend the model ran: computed tokens advance; finished prefills sample a token."""
    for seq, n in zip(batch.seqs, batch.num_tokens, strict=True):
        seq.num_computed_tokens += n
        if seq.num_computed_tokens == seq.num_tokens:
            seq.token_ids.append(7)


def test_token_budget_and_chunking():
    sched = Scheduler(
        SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=10), BlockPool(100), block_size=4
    )
    a, b = _seq(23, 0), _seq(5, 1)
    sched.add(a)
    sched.add(b)
    steps = []
    while a.num_computed_tokens < 23 or b.num_computed_tokens < 5:
        batch = sched.schedule()
        assert sum(batch.num_tokens) <= 10
        steps.append([(s.request_id, n) for s, n in zip(batch.seqs, batch.num_tokens, strict=True)])
        _complete(batch)
    assert steps[0] == [("r0", 10)]
    assert steps[1] == [("r0", 10)]
    assert steps[2] == [("r0", 3), ("r1", 5)]  # chunk tail and the next prompt share a step
    # both now decode: one token each per step
    batch = sched.schedule()
    assert batch.num_tokens == [1, 1]


def test_max_num_seqs():
    sched = Scheduler(
        SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=100), BlockPool(100), block_size=4
    )
    for i in range(4):
        sched.add(_seq(3, i))
    batch = sched.schedule()
    assert [s.request_id for s in batch.seqs] == ["r0", "r1"]
    assert len(sched.waiting) == 2


def test_preempts_newest_and_requeues_it_first():
    pool = BlockPool(4)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=100), pool, block_size=4)
    a, b = _seq(8, 0), _seq(8, 1)
    sched.add(a)
    sched.add(b)
    _complete(sched.schedule())  # each takes 2 blocks; now 9 tokens each, pool empty
    assert pool.num_free == 0
    batch = sched.schedule()  # a needs a 3rd block → b (newest) is preempted
    assert [s.request_id for s in batch.seqs] == ["r0"]
    assert b.status is Status.WAITING and b.num_computed_tokens == 0 and not b.blocks
    assert sched.waiting[0] is b and sched.num_preemptions == 1
    assert b.num_tokens == 9  # its generated token is kept and recomputed later
