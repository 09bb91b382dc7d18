"""How long a waiting request may wait before the scheduler admits it: the server's admission
by cost (server/async_engine.py) sheds a request whose estimate passes the queue-time budget.

The estimate replays the scheduler's first-come-first-served admission over its running and
waiting sequences. Each holds the KV blocks of the tokens it can still occupy (its prompt and
its expected output: `Scheduler.blocks_for_tokens`) for as many steps as it still runs (the
prompt chunks it has left, then one token a step):
- a running sequence frees its blocks and its seat (`max_num_seqs`) after those steps;
- a waiting sequence, in queue order, is admitted at the first step where its blocks fit
  beside those still held and a seat is free.

A sequence's expected output is its max_tokens (capped by the context) when it cannot stop
early (`ignore_eos`) or before any request has finished; otherwise at most `typical` more
tokens than it has, `typical` being the 90th percentile of the output lengths of the last
requests that finished (`OutputLengths`): chat clients leave max_tokens unset and stop at
EOS long before the context's end, and a bound that assumed otherwise would shed them all.

The answer is in engine steps; the caller turns it into seconds with a measured step time.
Prefix-cache hits (shorter prefills) and speculative decoding (several tokens a step) make
the real wait shorter; prefills that share one step's token budget, and preemption under the
optimistic admission policy, make it longer. With the reserving policy and prompts that fit
the budget together, it is the engine's own count (tests/engine/test_backlog.py).
"""

from __future__ import annotations

import heapq
from collections import deque

from infergen.engine.request import Sequence
from infergen.engine.scheduler import Scheduler

TYPICAL_PERCENTILE = 0.9
TYPICAL_WINDOW = 256  # finished requests the percentile is taken over


class OutputLengths:
    """Output lengths of the requests that finished lately (not those aborted)."""

    def __init__(self, window: int = TYPICAL_WINDOW):
        self.recent: deque[int] = deque(maxlen=window)

    def add(self, n: int) -> None:
        self.recent.append(n)

    def typical(self) -> int | None:
        """The 90th percentile of the recent lengths (None before any request finished)."""
        if not self.recent:
            return None
        ordered = sorted(self.recent)
        return ordered[min(len(ordered) - 1, int(TYPICAL_PERCENTILE * len(ordered)))]


def steps_until_admitted(scheduler: Scheduler, seq: Sequence, typical: int | None) -> int:
    """Engine steps before `seq`, a waiting sequence, is admitted (0: in the next step)."""
    chunk = scheduler.config.max_num_batched_tokens
    seats = scheduler.config.max_num_seqs
    capacity = scheduler.pool.num_blocks
    ends: list[tuple[int, int]] = []  # (step at which a sequence ends, the blocks it frees)
    held = 0
    for running in scheduler.running:
        steps, blocks = _cost(scheduler, running, typical, chunk)
        heapq.heappush(ends, (steps, blocks))
        held += blocks
    now = 0
    for ahead in scheduler.waiting:
        steps, blocks = _cost(scheduler, ahead, typical, chunk)
        while ends and (held + blocks > capacity or len(ends) >= seats):
            end, freed = heapq.heappop(ends)
            now, held = max(now, end), held - freed
        if ahead is seq:
            return now
        heapq.heappush(ends, (now + steps, blocks))
        held += blocks
    raise ValueError(f"request {seq.request_id} is not waiting")


def _cost(scheduler: Scheduler, seq: Sequence, typical: int | None, chunk: int) -> tuple[int, int]:
    """(steps `seq` still runs, KV blocks it holds by its end), with its expected output."""
    prompt = len(seq.prompt_token_ids)
    generated = seq.num_tokens - prompt
    most = scheduler.longest(seq) - prompt  # max_tokens, capped by the context
    output = most
    if typical is not None and not seq.params.ignore_eos:
        output = min(most, generated + typical)
    # the step that computes the last uncomputed token (a prompt's last chunk, or a decode's
    # input) samples one new token; every step after it one more
    steps = -(-max(1, seq.num_uncomputed) // chunk) + max(0, output - generated - 1)
    return steps, scheduler.blocks_for_tokens(prompt + output)
