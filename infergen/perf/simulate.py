"""Discrete-event simulation of serving: the engine's continuous-batching scheduler replayed
on predicted step times, over a workload's request shapes.

It follows the engine's rules (engine/scheduler.py) step by step:
- running sequences first, oldest admission first: a decode needs one token (1 + k with
  speculative decoding), an unfinished prefill takes what is left of the token budget;
  when the KV cache cannot grow, the most recently admitted sequence is preempted (its KV
  freed, recomputed later, back at the head of the queue);
- then, if nothing was preempted, waiting sequences in arrival order while the batch has
  room (`max_num_seqs`), budget (`max_num_batched_tokens`) and KV capacity; a prompt longer
  than the remaining budget is chunked (chunked prefill); optionally (`reserve`) admission
  reserves the KV of the whole answer up front, as TensorRT-LLM's default scheduler does;
- prefix cache: when a turn of a multi-turn session finishes, its full KV blocks stay cached
  (evictable, least recently used first); the session's next turn reuses them if they are
  still there;
- speculative decoding: each decode verifies k drafted tokens in one step of k + 1 tokens
  and emits 1 + (accepted) tokens, acceptance drawn per token with the given probability;
  the draft model (if any) adds k decode steps of its own per step.
A step takes `step_time(chunks)`; tokens a step emits leave at its end. Arrivals come from
a closed loop (N clients, each sending its next request or turn when the last one finished)
or an open loop (Poisson arrivals of requests / sessions at a rate), as `infergen bench`.

The result is the same `RequestResult` list the load generator measures, so the same
`summarize` gives TTFT, ITL, TPOT, e2e percentiles and throughput for both.
"""

from __future__ import annotations

import heapq
import random
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from infergen.bench.client import RequestResult
from infergen.bench.workloads import Shape
from infergen.config import SchedulerConfig
from infergen.perf.step_cost import Chunk


@dataclass(frozen=True)
class SpecDecode:
    """k drafted tokens per decode step, each accepted with probability `acceptance` given
    the previous ones were; `draft_step_time(chunks)` is one draft decode step (None: a free
    proposer such as n-gram lookup)."""

    tokens: int
    acceptance: float
    draft_step_time: Callable[[list[Chunk]], float] | None = None

    def __post_init__(self) -> None:
        if self.tokens < 1 or not 0.0 <= self.acceptance <= 1.0:
            raise ValueError(
                f"speculative decoding needs tokens >= 1 and 0 <= acceptance <= 1, got "
                f"{self.tokens}, {self.acceptance}"
            )

    def expected_tokens(self) -> float:
        """Tokens emitted per verify step: 1 + a + a^2 + ... + a^k."""
        return sum(self.acceptance**i for i in range(self.tokens + 1))


@dataclass(eq=False)  # identity: two requests of equal shape are different requests
class _Seq:
    job: int
    turn: int
    arrival: float
    prompt: int
    output: int
    computed: int = 0  # tokens whose KV is cached
    generated: int = 0
    reserved: int = 0  # tokens of KV reserved (whole blocks)
    reserved_bytes: float = 0.0
    running: bool = False
    last: float | None = None
    result: RequestResult = field(default_factory=lambda: RequestResult(ok=True))

    @property
    def uncomputed(self) -> int:
        """Tokens still to run before the next token can be sampled (the last sampled token
        is not yet in the cache)."""
        return self.prompt + self.generated - self.computed


@dataclass
class SimStats:
    steps: int = 0
    sequences: int = 0  # summed over steps: the mean batch is sequences / steps
    preemptions: int = 0
    prefix_hit_tokens: int = 0
    prompt_tokens: int = 0
    peak_running: int = 0
    busy_s: float = 0.0
    in_system_s: float = 0.0  # integral over time of the requests in the system

    def as_dict(self, wall: float) -> dict:
        return {
            "steps": self.steps,
            "mean_batch": self.sequences / self.steps if self.steps else 0.0,
            "preemptions": self.preemptions,
            "prefix_hit_rate": self.prefix_hit_tokens / self.prompt_tokens
            if self.prompt_tokens
            else 0.0,
            "peak_running": self.peak_running,
            "busy_fraction": self.busy_s / wall if wall else 0.0,
            "mean_in_system": self.in_system_s / wall if wall else 0.0,
        }


class Simulator:
    """Replays the scheduler on `step_time(chunks)` (seconds of one engine step) with a KV
    capacity in bytes; `kv_bytes(tokens)` is what one sequence holding `tokens` tokens uses.

    Admission is optimistic by default (infergen's and vLLM's rule: KV for what is computed,
    preemption when it runs out); `reserve=True` reserves a request's prompt + max_tokens when
    it is admitted (TensorRT-LLM's GUARANTEED_NO_EVICT), so nothing is ever preempted."""

    def __init__(
        self,
        step_time: Callable[[list[Chunk]], float],
        kv_capacity: float,
        kv_bytes: Callable[[int], float],
        scheduler: SchedulerConfig | None = None,
        block_size: int = 16,
        prefix_caching: bool = True,
        spec: SpecDecode | None = None,
        seed: int = 0,
        reserve: bool = False,
    ):
        self.step_time, self.kv_capacity, self.kv_bytes = step_time, kv_capacity, kv_bytes
        self.limits, self.block_size = scheduler or SchedulerConfig(), block_size
        self.prefix_caching, self.spec = prefix_caching, spec
        self.rng = random.Random(seed)
        self.reserve = reserve  # admission reserves prompt + max_tokens: no preemption

    # ---- the run ---------------------------------------------------------------------------
    def run(
        self,
        shapes: list[Shape],
        concurrency: int | None = None,
        rate: float | None = None,
        seed: int = 0,
    ) -> tuple[list[RequestResult], float, SimStats]:
        """Simulate the workload; returns (per-request results, wall seconds, stats)."""
        if (concurrency is None) == (rate is None):
            raise ValueError("give exactly one of concurrency and rate")
        self.stats = SimStats()
        self.clock, self.results = 0.0, []
        self.log: list[tuple[RequestResult, int, float]] = []  # result, job, arrival
        self.waiting: deque[_Seq] = deque()
        self.running: list[_Seq] = []
        self.used = 0.0  # KV bytes of running sequences and cached prefixes
        self.cache: OrderedDict[int, tuple[int, float]] = OrderedDict()  # job -> tokens, bytes
        self.arrivals: list[tuple[float, int, int, int, int]] = []  # time, order, job, turn, ctx
        self.shapes, self.order = shapes, 0
        self.closed_loop = concurrency is not None
        if concurrency is not None:
            self.next_job = min(concurrency, len(shapes))
            for job in range(self.next_job):
                self._arrive(0.0, job, 0, 0)
        else:
            arrival_rng, at = random.Random(seed), 0.0
            for job in range(len(shapes)):
                self._arrive(at, job, 0, 0)
                at += arrival_rng.expovariate(rate)
            self.next_job = len(shapes)
        while self.arrivals or self.waiting or self.running:
            self._admit_arrivals()
            if not self.waiting and not self.running:
                self.clock = self.arrivals[0][0]
                continue
            batch = self._schedule()
            if not batch:
                raise RuntimeError("simulator scheduled nothing with requests waiting (a bug)")
            self._step(batch)
        wall = self.clock
        return self.results, wall, self.stats

    def steady_state(self, warmup: int) -> tuple[list[RequestResult], float]:
        """After `run`: the results of jobs from the `warmup`-th on (the first jobs arrive
        together and queue behind each other: a load generator's warm-up), and the time from
        the first of them arriving to the end."""
        kept = [(r, at) for r, job, at in self.log if job >= warmup]
        if not kept:
            return [], 0.0
        return [r for r, _ in kept], self.clock - min(at for _, at in kept)

    # ---- arrivals --------------------------------------------------------------------------
    def _arrive(self, at: float, job: int, turn: int, context: int) -> None:
        heapq.heappush(self.arrivals, (at, self.order, job, turn, context))
        self.order += 1

    def _admit_arrivals(self) -> None:
        while self.arrivals and self.arrivals[0][0] <= self.clock:
            at, _, job, turn, context = heapq.heappop(self.arrivals)
            self.stats.in_system_s += self.clock - at  # arrived during the last step
            shape = self.shapes[job]
            new = shape.prompt_tokens if turn == 0 else shape.follow_up_tokens[turn - 1]
            seq = _Seq(job, turn, at, context + new, shape.max_tokens)
            seq.result.session, seq.result.turn = shape.session, turn
            seq.result.input_tokens = seq.prompt
            need = self.kv_bytes(self._round(seq.prompt + seq.output))
            if need > self.kv_capacity:
                seq.result.ok = False
                seq.result.error = (
                    f"needs {need / 2**20:.1f} MiB of KV for {seq.prompt + seq.output} tokens, "
                    f"the cache holds {self.kv_capacity / 2**20:.1f} MiB"
                )
                self._record(seq)
                self._job_done(seq, at)
                continue
            self.stats.prompt_tokens += seq.prompt
            self.waiting.append(seq)

    def _job_done(self, seq: _Seq, at: float) -> None:
        """The request is over: the session's next turn, or (closed loop) the next job."""
        shape = self.shapes[seq.job]
        if seq.result.ok and seq.turn < len(shape.follow_up_tokens):
            self._arrive(at, seq.job, seq.turn + 1, seq.prompt + seq.output)
        elif self.closed_loop and self.next_job < len(self.shapes):
            self._arrive(at, self.next_job, 0, 0)
            self.next_job += 1

    # ---- KV accounting ---------------------------------------------------------------------
    def _round(self, tokens: int) -> int:
        return -(-tokens // self.block_size) * self.block_size

    def _grow(self, seq: _Seq, new: int) -> bool:
        tokens = self._round(seq.computed + new)
        if tokens <= seq.reserved:
            return True
        extra = self.kv_bytes(tokens) - seq.reserved_bytes
        while self.used + extra > self.kv_capacity and self.cache:
            _, (_, freed) = self.cache.popitem(last=False)  # least recently used prefix
            self.used -= freed
        if self.used + extra > self.kv_capacity:
            return False
        self.used += extra
        seq.reserved, seq.reserved_bytes = tokens, seq.reserved_bytes + extra
        return True

    def _release(self, seq: _Seq) -> None:
        self.used -= seq.reserved_bytes
        seq.reserved, seq.reserved_bytes = 0, 0.0

    def _reuse_prefix(self, seq: _Seq) -> None:
        """Take over the session's cached full blocks (at least one prompt token stays to be
        computed, so the step yields logits)."""
        if seq.job not in self.cache or seq.computed:
            return
        tokens, nbytes = self.cache.pop(seq.job)
        hit = min(tokens, (seq.prompt - 1) // self.block_size * self.block_size)
        keep = self.kv_bytes(hit) if hit else 0.0
        self.used -= nbytes - keep
        seq.computed, seq.reserved, seq.reserved_bytes = hit, hit, keep
        self.stats.prefix_hit_tokens += hit

    def _return_prefix(self, seq: _Seq) -> None:
        """Admission failed: the reused blocks go back to the cache (as the engine releases
        them, still hashed)."""
        if seq.reserved:
            self.cache[seq.job] = (seq.reserved, seq.reserved_bytes)
            self.stats.prefix_hit_tokens -= seq.computed
        seq.computed, seq.reserved, seq.reserved_bytes = 0, 0, 0.0

    # ---- one step --------------------------------------------------------------------------
    def _schedule(self) -> list[tuple[_Seq, int]]:
        budget = self.limits.max_num_batched_tokens
        batch: list[tuple[_Seq, int]] = []
        preempted = False
        for seq in list(self.running):
            if not seq.running or budget <= 0:  # preempted meanwhile
                continue
            n = self._tokens_wanted(seq, budget)
            while not self._grow(seq, n):
                victim = self.running[-1]
                self._preempt(victim)
                budget += sum(k for s, k in batch if s is victim)
                batch = [(s, k) for s, k in batch if s is not victim]
                preempted = True
                if victim is seq:
                    break
            else:
                batch.append((seq, n))
                budget -= n
        while (
            not preempted
            and self.waiting
            and budget > 0
            and len(self.running) < self.limits.max_num_seqs
        ):
            seq = self.waiting[0]
            if self.prefix_caching:
                self._reuse_prefix(seq)
            n = self._tokens_wanted(seq, budget)
            if not self.limits.enable_chunked_prefill and n < seq.uncomputed and batch:
                break
            if not self._grow(seq, seq.prompt + seq.output - seq.computed if self.reserve else n):
                self._return_prefix(seq)
                break
            self.waiting.popleft()
            self.running.append(seq)
            seq.running = True
            batch.append((seq, n))
            budget -= n
        self.stats.peak_running = max(self.stats.peak_running, len(self.running))
        return batch

    def _tokens_wanted(self, seq: _Seq, budget: int) -> int:
        if seq.uncomputed == 1 and seq.generated and self.spec:
            drafts = min(self.spec.tokens, seq.output - seq.generated - 1)
            return 1 + max(0, drafts)
        if not self.limits.enable_chunked_prefill:
            return seq.uncomputed
        return min(seq.uncomputed, budget)

    def _preempt(self, seq: _Seq) -> None:
        self.running.remove(seq)
        seq.running = False
        self._release(seq)
        seq.computed = 0
        self.waiting.appendleft(seq)
        self.stats.preemptions += 1

    def _step(self, batch: list[tuple[_Seq, int]]) -> None:
        chunks = [Chunk(n, seq.computed + n) for seq, n in batch]
        seconds = self.step_time(chunks)
        verifying = [seq for seq, n in batch if n > 1 and seq.uncomputed == 1]
        if self.spec and self.spec.draft_step_time and verifying:
            drafts = [Chunk(1, seq.computed + 1) for seq in verifying]
            seconds += self.spec.tokens * self.spec.draft_step_time(drafts)
        in_system = len(self.waiting) + len(self.running)
        self.stats.in_system_s += in_system * seconds
        self.stats.busy_s += seconds
        self.stats.steps += 1
        self.stats.sequences += len(batch)
        self.clock += seconds
        for seq, n in batch:
            if seq.uncomputed == 1 and n > 1:  # a verify step: 1 + accepted drafts
                accepted = 0
                while accepted < n - 1 and self.rng.random() < self.spec.acceptance:
                    accepted += 1
                seq.computed += 1 + accepted
                self._emit(seq, 1 + accepted)
            else:
                seq.computed += n
                if seq.uncomputed == 0:
                    self._emit(seq, 1)
            if seq.generated >= seq.output:
                self._finish(seq)

    def _record(self, seq: _Seq) -> None:
        self.results.append(seq.result)
        self.log.append((seq.result, seq.job, seq.arrival))

    def _emit(self, seq: _Seq, tokens: int) -> None:
        tokens = min(tokens, seq.output - seq.generated)
        result = seq.result
        if result.ttft is None:
            result.ttft = self.clock - seq.arrival
        else:
            result.itl.append(self.clock - seq.last)
        result.itl.extend([0.0] * (tokens - 1))  # emitted in the same step
        seq.generated += tokens
        seq.last = self.clock

    def _finish(self, seq: _Seq) -> None:
        self.running.remove(seq)
        seq.running = False
        seq.result.output_tokens = seq.generated
        seq.result.e2e = self.clock - seq.arrival
        self._record(seq)
        shape = self.shapes[seq.job]
        if self.prefix_caching and seq.turn < len(shape.follow_up_tokens):
            full = seq.computed // self.block_size * self.block_size
            keep = self.kv_bytes(full) if full else 0.0
            self.used -= seq.reserved_bytes - keep
            seq.reserved, seq.reserved_bytes = 0, 0.0
            self.cache[seq.job] = (full, keep)
        else:
            self._release(seq)
        self._job_done(seq, self.clock)
