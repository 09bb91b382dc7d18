"""Scheduler invariants, driven directly (no model): budgets, chunking, preemption order."""

from __future__ import annotations

from infergen.config import SchedulerConfig
from infergen.engine.request import Sequence, Status
from infergen.engine.sampling_params import SamplingParams
from infergen.engine.scheduler import Scheduler
from infergen.kvcache.block_pool import BlockPool
from infergen.kvcache.groups import NO_BLOCK, CacheGroup


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


def _run(sched: Scheduler, seqs: list[Sequence]) -> list[int]:
    """Drive the scheduler until every sequence has its max_tokens; the running count of each
    step."""
    for seq in seqs:
        sched.add(seq)
    running = []
    while sched.has_unfinished():
        batch = sched.schedule()
        assert batch, "scheduled nothing with sequences waiting"
        running.append(len(sched.running))
        for seq, n in zip(batch.seqs, batch.num_tokens, strict=True):
            sched.commit(seq, n)
            if seq.num_uncomputed == 0:
                seq.token_ids.append(7)
                if seq.num_tokens - len(seq.prompt_token_ids) >= seq.params.max_tokens:
                    sched.finish(seq)
    return running


def test_reserve_admission_never_preempts_and_admits_what_fits_for_life():
    """Three requests of 8 + 8 tokens (4 blocks of 4 each at most) in a 10-block pool:
    optimistic admission runs all three and must preempt; reserving admits two (8 blocks
    reserved), the third only when one finishes, and nothing is ever preempted."""

    def seqs():
        return [
            Sequence(
                f"r{i}", None, list(range(1, 9)), SamplingParams(max_tokens=8), None, None, None, i
            )  # fmt: skip
            for i in range(3)
        ]

    results = {}
    for admission in ("optimistic", "reserve"):
        config = SchedulerConfig(max_num_batched_tokens=64, admission=admission)
        pool = BlockPool(10)
        sched = Scheduler(config, pool, block_size=4)
        running = _run(sched, seqs())
        assert pool.num_free == 10 and sched.reserved_blocks == 0
        results[admission] = (max(running), sched.num_preemptions)
    assert results["optimistic"][0] == 3 and results["optimistic"][1] > 0
    assert results["reserve"] == (2, 0)


def test_reserve_is_capped_by_the_models_context():
    """max_tokens past the context reserves only up to max_model_len: still admitted."""
    sched = Scheduler(
        SchedulerConfig(admission="reserve"), BlockPool(4), block_size=4, max_model_len=16
    )
    seq = Sequence("r", None, [1, 2, 3], SamplingParams(max_tokens=1000), None, None, None, 0)
    assert sched.longest(seq) == 16 and sched.blocks_for_tokens(16) == 4
    sched.add(seq)
    assert sched.schedule().seqs == [seq] and sched.reserved_blocks == 4


def test_lookahead_schedules_drafts_up_to_max_tokens():
    """With lookahead k a decoding sequence computes its last token + k drafts (blocks for
    all of them), fewer when max_tokens is near; a prefill is unaffected."""
    sched = Scheduler(SchedulerConfig(), BlockPool(20), block_size=4, lookahead=3)
    seq = Sequence("r", None, [1, 2, 3, 4, 5], SamplingParams(max_tokens=6), None, None, None, 0)
    sched.add(seq)
    assert sched.schedule().num_tokens == [5]
    sched.commit(seq, 5)
    seq.token_ids.append(9)  # the first generated token
    batch = sched.schedule()
    assert batch.num_tokens == [4]  # 1 + 3 drafts (5 tokens may still come)
    assert len(seq.blocks[0]) == 3  # room for 6 + 3 tokens
    seq.token_ids += [9, 9, 9]  # 2 drafts accepted + the bonus token
    sched.commit(seq, 3)
    assert sched.schedule().num_tokens == [2]  # 2 tokens left: the last one + 1 draft


def test_windowed_groups_release_exactly_the_blocks_out_of_the_window():
    """After every grow, a windowed group holds the blocks from the first one a query still
    reads (and the sink blocks), and no earlier one; the pool gets the rest back."""
    groups = (CacheGroup((0,), window=9, sinks=4), CacheGroup((1,)))
    pool = BlockPool(100)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=5), pool, 4, groups)
    seq = Sequence("r", None, list(range(1, 31)), SamplingParams(max_tokens=20),
                   None, None, None, 0)  # fmt: skip
    sched.add(seq)
    while seq.num_tokens < 50:
        batch = sched.schedule()
        first = groups[0].first_needed_block(seq.num_computed_tokens, 4)
        windowed = seq.blocks[0]
        assert windowed[0] != NO_BLOCK  # the sink block
        assert all(b == NO_BLOCK for b in windowed[1:first])
        assert all(b != NO_BLOCK for b in windowed[first:])
        held = sum(b != NO_BLOCK for blocks in seq.blocks for b in blocks)
        assert pool.num_free == 100 - held
        sched.commit(seq, batch.num_tokens[0])
        if seq.num_uncomputed == 0:
            seq.token_ids.append(1)
