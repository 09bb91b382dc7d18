"""How long a waiting request may wait before the scheduler admits it: the server's admission
by cost (server/async_engine.py) sheds a request whose estimate passes the queue-time budget.

The estimate replays the scheduler's first-come-first-served admission over its running and
waiting sequences. Each holds the KV blocks of the tokens it can still occupy (its prompt and
its expected output: `Scheduler.blocks_for_tokens`) and its seat (`max_num_seqs`) until it
ends; a waiting sequence, in queue order, is admitted as soon as its blocks fit beside those
still held and a seat is free.

Time is counted with the engine's measured step costs (`StepCost`): a step takes
`decode_step` seconds plus `prefill_token` seconds per prompt token it computes. A sequence
runs for its prompt's chunks plus one step per further token; the prompt tokens themselves
go through one step budget shared by every prefill, so they are queued one sequence after
another (a burst of prompts takes as long as all of their tokens, however many seats are
free). A request's wait is the time at which its own prompt could begin.

A sequence's expected output is its max_tokens (capped by the context) when it cannot stop
early (`ignore_eos`) or before any request has finished; otherwise at most `typical` more
tokens than it has, `typical` being the 90th percentile of the output lengths of the last
requests that finished (`OutputLengths`): chat clients leave max_tokens unset and stop at
EOS long before the context's end, and a bound that assumed otherwise would shed them all.

Prefix-cache hits (shorter prefills) and speculative decoding (several tokens a step) make
the real wait shorter; preemption under the optimistic admission policy makes it longer.
With `StepCost(1, 0)` the answer is in steps, and with the reserving policy and prompts that
fit one step's budget together it is the engine's own count (tests/engine/test_backlog.py).
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass

from infergen.engine.request import Sequence
from infergen.engine.scheduler import Scheduler

TYPICAL_PERCENTILE = 0.9
TYPICAL_WINDOW = 256  # finished requests the percentile is taken over
COST_WEIGHT = 0.1  # of the newest step in the moving averages of StepCost


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


@dataclass
class StepCost:
    """Seconds of a step: `decode_step`, plus `prefill_token` per prompt token computed in it;
    moving averages over the engine's recent steps (None until measured)."""

    decode_step: float | None = None
    prefill_token: float | None = None

    def observe(self, seconds: float, prefill_tokens: int) -> None:
        """A step that took `seconds` and computed `prefill_tokens` prompt tokens (besides
        one token of each decoding sequence)."""
        if not prefill_tokens:
            self.decode_step = _average(self.decode_step, seconds)
            return
        rest = seconds - (self.decode_step or 0.0)
        self.prefill_token = _average(self.prefill_token, max(0.0, rest) / prefill_tokens)

    @property
    def known(self) -> bool:
        return self.decode_step is not None or self.prefill_token is not None


def _average(old: float | None, new: float) -> float:
    return new if old is None else old + COST_WEIGHT * (new - old)


def seconds_until_admitted(
    scheduler: Scheduler, seq: Sequence, typical: int | None, cost: StepCost
) -> float:
    """Seconds before `seq`, a waiting sequence, can begin (0.0: in the next step)."""
    chunk = scheduler.config.max_num_batched_tokens
    seats = scheduler.config.max_num_seqs
    capacity = scheduler.pool.num_blocks
    step, per_token = cost.decode_step or 0.0, cost.prefill_token or 0.0
    ends: list[tuple[float, int]] = []  # (when a sequence ends, the blocks it frees)
    held, now, prefilled = 0, 0.0, 0.0  # prefilled: when the prompts so far are computed
    for running in scheduler.running:
        prompt, steps, blocks = _cost(scheduler, running, typical, chunk)
        started = 0.0  # a decoding sequence goes on at once; a prefilling one after the prompts
        if prompt:
            prefilled += prompt * per_token
            started = prefilled
        heapq.heappush(ends, (started + steps * step, blocks))
        held += blocks
    for ahead in scheduler.waiting:
        prompt, steps, blocks = _cost(scheduler, ahead, typical, chunk)
        while ends and (held + blocks > capacity or len(ends) >= seats):
            end, freed = heapq.heappop(ends)
            now, held = max(now, end), held - freed
        if ahead is seq:
            return max(now, prefilled)
        prefilled = max(now, prefilled) + prompt * per_token
        heapq.heappush(ends, (prefilled + steps * step, blocks))
        held += blocks
    raise ValueError(f"request {seq.request_id} is not waiting")


def _cost(
    scheduler: Scheduler, seq: Sequence, typical: int | None, chunk: int
) -> tuple[int, int, int]:
    """(prompt tokens still to compute, steps `seq` still runs, KV blocks it holds by its
    end), with its expected output."""
    prompt = len(seq.prompt_token_ids)
    generated = seq.num_tokens - prompt
    most = scheduler.longest(seq) - prompt  # max_tokens, capped by the context
    output = most
    if typical is not None and not seq.params.ignore_eos:
        output = min(most, generated + typical)
    # the step that computes the last uncomputed token (a prompt's last chunk, or a decode's
    # input) samples one new token; every step after it one more
    uncomputed = max(1, seq.num_uncomputed)
    steps = -(-uncomputed // chunk) + max(0, output - generated - 1)
    prefill = uncomputed if uncomputed > 1 else 0
    return prefill, steps, scheduler.blocks_for_tokens(prompt + output)
