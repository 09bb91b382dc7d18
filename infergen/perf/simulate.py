"""Discrete-event simulation of serving: the engine's own continuous-batching scheduler
(engine/scheduler.py `Scheduler` over a kvcache `BlockPool`) run on predicted step times, over
a workload's request shapes. One set of scheduling rules serves the engine and its
prediction:
- running sequences first, oldest admission first: a decode needs one token (1 + k with
  speculative decoding: the scheduler's lookahead), an unfinished prefill takes what is left
  of the token budget; when the pool cannot grow, the most recently admitted sequence is
  preempted (its KV freed, recomputed later, back at the head of the queue);
- then, if nothing was preempted, waiting sequences in arrival order while the batch has
  room (`max_num_seqs`), budget (`max_num_batched_tokens`) and KV blocks; a prompt longer
  than the remaining budget is chunked; the admission policy (engine/admission.py) may
  reserve the whole answer's KV up front ("reserve", TensorRT-LLM's default scheduler);
- the pool has the deployment's shape (perf/memory.py `kv_pool`): cache groups for sliding
  windows, a state slot per running sequence for recurrent layers;
- prefix cache: finished sequences' full blocks stay cached (evictable, least recently used
  first) under the chained hashes of their (synthetic) tokens; a session's next turn reuses
  what is still there;
- speculative decoding: each decode verifies k drafted tokens in one step of k + 1 tokens
  and emits 1 + (accepted) tokens, acceptance drawn per token with the given probability;
  the draft model (if any) adds k decode steps of its own per step;
- KV tiers (`tiers`, perf/kv_tiers.py): the engine's KVTiers over data-less host / disk tiers
  below the pool: evicted blocks move down, prefix hits load back at admission when the
  engine's cost rule says loading beats recomputing. Inline loads and the saves of a step add
  their modeled seconds to it; a background load (the engine's rule: a copy over a tenth of
  a decode step) completes on the simulated clock after its seconds, one job after another,
  and its sequence is admitted at the first schedule after that (others step meanwhile;
  when nothing can run, the clock jumps to the load's end or the next arrival, as the
  engine's `Scheduler.wait_for_loads`). The rules' prefill cost per token and decode step are
  the engine's moving averages (engine/backlog.py `StepCost`) of the simulated steps;
- prefix checkpoints: for recurrent layers (Mamba2, Falcon-H1, Qwen3-Next) the engine's state
  checkpoints, for attention-only models its partial-block tails
  (perf/checkpoints.py: kvcache/state_checkpoints.py over sizes, no data) under the
  deployment's budget, spilling to the tiers, so a prefix resumes where the engine's would;
  a spilled checkpoint read back adds its tier's read seconds to the step.
A step takes `step_time(chunks)` (plus its inline tier loads and saves); tokens a step emits
leave at its end. Arrivals come from a closed loop (N clients, each sending its next request or turn
when the last one finished; `lockstep`: every session's turn k together, once all of turn k-1
finished; `rotate`: sessions take turns, a session whose turn finished queuing behind the
waiting ones for its next turn — the time a tool runs between a session's turns, as
benchmarks/bench_kv_tiers.py's loop) or an open loop (Poisson arrivals of requests /
sessions at a rate), as `infergen bench`. `shared_prefix` tokens open every session alike
(a system prompt).

Reuse accounting (`SimStats.as_dict()["reuse"]`): for every turn from the second on, the
reusable prompt tokens (the full blocks of what the session's earlier turns computed: their
prompt and answer) and where the first admission found them — in the pool, loaded from the
host or the disk tier — the rest recomputed.

The result is the same `RequestResult` list the load generator measures, so the same
`summarize` gives TTFT, ITL, TPOT, e2e percentiles and throughput for both.
"""

from __future__ import annotations

import collections
import heapq
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from infergen.bench.client import RequestResult
from infergen.bench.workloads import Shape
from infergen.config import SchedulerConfig
from infergen.engine.backlog import StepCost
from infergen.engine.request import Sequence
from infergen.engine.sampling_params import SamplingParams
from infergen.engine.scheduler import ScheduledBatch, Scheduler
from infergen.kvcache.block_pool import BlockPool
from infergen.kvcache.state_cache import SlotPool
from infergen.perf.checkpoints import SimulatedCheckpoints
from infergen.perf.kv_tiers import SimulatedTiers, TierSpec
from infergen.perf.memory import PoolShape
from infergen.perf.step_cost import Chunk


@dataclass(frozen=True)
class SpecDecode:
    """k drafted tokens per decode step, each accepted with probability `acceptance` given
    the previous ones were; a decode has drafts to verify with probability `verify_fraction`
    (else it decodes one token); `draft_step_time(chunks)` is one draft decode step (None: a
    free proposer such as n-gram lookup); `drafts` ({d: share}, None: always `tokens`): the
    drafts a verifying step verifies, drawn per step (an engine with num_speculative_tokens
    "auto" verifies as many as the proposer and the cost model give, perf/
    measured_acceptance.py)."""

    tokens: int
    acceptance: float
    draft_step_time: Callable[[list[Chunk]], float] | None = None
    verify_fraction: float = 1.0
    drafts: dict[int, float] | None = None

    def __post_init__(self) -> None:
        if (self.tokens < 1 or not 0.0 <= self.acceptance <= 1.0
                or not 0.0 <= self.verify_fraction <= 1.0):  # fmt: skip
            raise ValueError(
                f"speculative decoding needs tokens >= 1 and 0 <= acceptance, verify_fraction "
                f"<= 1, got {self.tokens}, {self.acceptance}, {self.verify_fraction}"
            )

    def expected_tokens(self) -> float:
        """Tokens emitted per verify step: 1 + a + a^2 + ... + a^k (k: `tokens`, or drawn
        from `drafts`)."""
        shares = self.drafts or {self.tokens: 1.0}
        return sum(w * sum(self.acceptance**i for i in range(d + 1)) for d, w in shares.items())

    def draw(self, rng: random.Random) -> list[int] | None:
        """A decode's drafts for the scheduler (seq.drafts): None (the whole lookahead,
        `tokens`) or placeholders, as many as drawn from `drafts`; [] when it does not
        verify (1 - verify_fraction of decodes)."""
        if self.verify_fraction < 1.0 and rng.random() >= self.verify_fraction:
            return []
        if not self.drafts or set(self.drafts) == {self.tokens}:  # (one count: the fixed k)
            return None
        counts, weights = zip(*self.drafts.items(), strict=True)
        return [0] * min(self.tokens, rng.choices(counts, weights)[0])


@dataclass
class _Request:
    """What the simulator knows of one request beside the engine's Sequence."""

    job: int
    turn: int
    arrival: float
    output: int
    reusable: int = 0  # prompt tokens in full blocks the session's earlier turns computed
    generated: int = 0
    last: float | None = None
    result: RequestResult = field(default_factory=lambda: RequestResult(ok=True))


@dataclass
class SimStats:
    steps: int = 0
    sequences: int = 0  # summed over steps: the mean batch is sequences / steps
    preemptions: int = 0
    prefix_hit_tokens: int = 0  # prompt tokens cached at first admission (as the engine counts)
    prompt_tokens: int = 0
    peak_running: int = 0
    busy_s: float = 0.0
    in_system_s: float = 0.0  # integral over time of the requests in the system
    reusable_tokens: int = 0  # turns 2+: prompt tokens an earlier turn of the session computed
    reused_tokens: dict[str, float] = field(default_factory=dict)  # of those: pool / tier

    def reuse(self) -> dict:
        """Turns 2+: the reusable prompt tokens and the share of them found in the pool,
        loaded from each tier, recomputed (shares None without reusable tokens)."""
        total = self.reusable_tokens
        found = {where: self.reused_tokens.get(where, 0.0) for where in ("pool", "host", "disk")}
        found["recomputed"] = max(0.0, total - sum(found.values()))
        shares = {k: v / total if total else None for k, v in found.items()}
        return {"reusable_tokens": total, **shares}

    def as_dict(self, wall: float) -> dict:
        return {
            "reuse": self.reuse(),
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
    """Runs the engine's `Scheduler` over a `BlockPool` of the deployment's shape (and a slot
    per running sequence for recurrent layers) on `step_time(chunks)`, the seconds of one
    engine step. The scheduler's config carries the admission policy (engine/admission.py):
    optimistic by default, "reserve" as TensorRT-LLM. Requests carry synthetic token ids, the
    same stream for every turn of a session, so the prefix cache finds a session's earlier
    turns exactly as the engine does."""

    def __init__(
        self,
        step_time: Callable[[list[Chunk]], float],
        pool: PoolShape,
        scheduler: SchedulerConfig | None = None,
        prefix_caching: bool = True,
        spec: SpecDecode | None = None,
        seed: int = 0,
        tiers: TierSpec | None = None,
        checkpoint_bytes: int = 0,  # prefix checkpoints' budget (0: none kept)
    ):
        self.step_time, self.pool_shape = step_time, pool
        self.checkpoint_bytes = checkpoint_bytes
        self.limits = scheduler or SchedulerConfig()
        self.prefix_caching, self.spec = prefix_caching, spec
        self.rng = random.Random(seed)
        self.tier_spec = tiers  # bandwidths chosen (TierSpec.for_hardware)

    # ---- the run ---------------------------------------------------------------------------
    def run(
        self,
        shapes: list[Shape],
        concurrency: int | None = None,
        rate: float | None = None,
        seed: int = 0,
        lockstep: bool = False,
        shared_prefix: int = 0,
        rotate: bool = False,
    ) -> tuple[list[RequestResult], float, SimStats]:
        """Simulate the workload; returns (per-request results, wall seconds, stats)."""
        if (concurrency is None) == (rate is None):
            raise ValueError("give exactly one of concurrency and rate")
        if lockstep and (concurrency is None or concurrency < len(shapes)):
            raise ValueError("lockstep turns need every session at once (concurrency >= jobs)")
        if rotate and (concurrency is None or lockstep):
            raise ValueError("rotating sessions need a closed loop (concurrency) without lockstep")
        if any(s.prompt_tokens <= shared_prefix for s in shapes):
            raise ValueError("every first prompt must be longer than the shared prefix")
        shape = self.pool_shape
        self.pool = BlockPool(shape.num_blocks, self.prefix_caching)
        states = SlotPool(shape.state_slots) if shape.state_slots is not None else None
        lookahead = self.spec.tokens if self.spec else 0
        self.tiers = self._tiers() if self.tier_spec is not None else None
        self.sched = Scheduler(
            self.limits, self.pool, shape.block_size, shape.groups, states, lookahead=lookahead,
            tiers=self.tiers, checkpoints=self._checkpoints(),
        )  # fmt: skip
        self.step_cost = StepCost()  # the engine's measure of a prefill token (tiers' rule)
        self.requests: dict[Sequence, _Request] = {}
        self.stats = SimStats()
        self.shared_prefix = shared_prefix
        self.lockstep, self.held, self.round_left = lockstep, [], 0
        self.rotate = rotate
        self.ready: collections.deque[tuple[int, int, int]] = collections.deque()  # rotate
        self.clock, self.results = 0.0, []
        self.log: list[tuple[RequestResult, int, float]] = []  # result, job, arrival
        self.arrivals: list[tuple[float, int, int, int, int]] = []  # time, order, job, turn, ctx
        self.shapes, self.order = shapes, 0
        self.closed_loop = concurrency is not None
        if rotate:
            self.ready.extend((job, 0, 0) for job in range(len(shapes)))
            self.next_job = len(shapes)
            for _ in range(min(concurrency, len(shapes))):
                self._arrive(0.0, *self.ready.popleft())
        elif concurrency is not None:
            self.next_job = min(concurrency, len(shapes))
            self.round_left = self.next_job
            for job in range(self.next_job):
                self._arrive(0.0, job, 0, 0)
        else:
            arrival_rng, at = random.Random(seed), 0.0
            for job in range(len(shapes)):
                self._arrive(at, job, 0, 0)
                at += arrival_rng.expovariate(rate)
            self.next_job = len(shapes)
        while self.arrivals or self.sched.has_unfinished():
            self._admit_arrivals()
            if not self.sched.has_unfinished():
                if self.arrivals:  # (none left: every remaining request was refused)
                    self.clock = self.arrivals[0][0]
                continue
            if self.spec is not None and (self.spec.verify_fraction < 1.0 or self.spec.drafts):
                for seq in self.sched.running:  # None: the whole lookahead, []: no drafts
                    seq.drafts = self.spec.draw(self.rng)
            batch = self.sched.schedule()
            if not batch:
                self._wait_for_loads()
                continue
            self._step(batch)
        self.stats.preemptions = self.sched.num_preemptions
        return self.results, self.clock, self.stats

    def steady_state(self, warmup: int) -> tuple[list[RequestResult], float]:
        """After `run`: the results of jobs from the `warmup`-th on (the first jobs arrive
        together and queue behind each other: a load generator's warm-up), and the time from
        the first of them arriving to the end."""
        kept = [(r, at) for r, job, at in self.log if job >= warmup]
        if not kept:
            return [], 0.0
        return [r for r, _ in kept], self.clock - min(at for _, at in kept)

    def _wait_for_loads(self) -> None:
        """Nothing could run: as the engine (`Scheduler.wait_for_loads`), wait for the next
        background load to be done, or for the next arrival if it comes first."""
        ready = self.tiers.next_ready() if self.tiers is not None else None
        if ready is None:
            raise RuntimeError("simulator scheduled nothing with requests waiting (a bug)")
        if self.arrivals:
            ready = min(ready, self.arrivals[0][0])
        waited = max(0.0, ready - self.clock)
        self.stats.in_system_s += (len(self.sched.waiting) + len(self.sched.running)) * waited
        self.clock += waited

    def _considered(self) -> Sequence:
        """The waiting sequence the scheduler is considering for admission (whose prefix the
        tiers load): the first not waiting on a background load (those are passed over)."""
        moves = self.sched.moves
        return next(seq for seq in self.sched.waiting if not moves.loading(seq))

    def _tiers(self) -> SimulatedTiers:
        """The tiers below the pool, wired as engine/scoring.py `serving_parts` wires them."""
        shape = self.pool_shape
        tiers = SimulatedTiers(
            self.tier_spec, math.ceil(shape.page_bytes), shape.block_size,
            self._considered, lambda: self.clock,
        )  # fmt: skip
        self.pool.on_evict = tiers.save
        if tiers.write_through:
            self.pool.on_register = tiers.save_through
        return tiers

    def _checkpoints(self) -> SimulatedCheckpoints | None:
        """Prefix checkpoints as engine/build.py keeps them (recurrent states; an
        attention-only model's partial-block tails): prefix caching on and a budget; spilling
        to the tiers, and written through with them, when there are tiers. (The engine keeps
        no tails for a block-quantized KV format or with sparse decode; the pool's shape does
        not say, so give such a deployment checkpoint_bytes 0.)"""
        shape, tiers = self.pool_shape, self.tiers
        if not self.prefix_caching or not self.checkpoint_bytes:
            return None
        return SimulatedCheckpoints(
            shape.state_bytes, shape.page_bytes, shape.block_size, self.checkpoint_bytes,
            spill=tiers.save_state if tiers is not None else None,
            fetch=tiers.load_state if tiers is not None else None,
            through=tiers.save_state_through if tiers is not None and tiers.write_through
            else None,
        )  # fmt: skip

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
            prompt = context + new
            # a session's tokens: position p holds p, position `shared_prefix` (0 without a
            # shared prefix) names the session
            cut = self.shared_prefix
            tokens = [*range(cut), -1 - job, *range(cut + 1, prompt)]
            params = SamplingParams(max_tokens=shape.max_tokens, ignore_eos=True)
            seq = Sequence(f"{job}.{turn}", None, tokens, params, None, None, None, self.order)
            req = _Request(job, turn, at, shape.max_tokens)
            if turn:  # the earlier turns computed the KV of all but their last answer token
                req.reusable = (context - 1) // self.sched.block_size * self.sched.block_size
            req.result.session, req.result.turn = shape.session, turn
            req.result.input_tokens = prompt
            needed = self.sched.blocks_for_tokens(prompt + shape.max_tokens)
            if needed > self.pool.num_blocks:
                req.result.ok = False
                req.result.error = (
                    f"needs {needed} KV blocks for {prompt + shape.max_tokens} tokens, the "
                    f"cache holds {self.pool.num_blocks}"
                )
                self._record(req)
                self._job_done(req, prompt, at)
                continue
            self.stats.prompt_tokens += prompt
            self.requests[seq] = req
            self.sched.add(seq)

    def _job_done(self, req: _Request, context: int, at: float) -> None:
        """The request is over: the session's next turn, or (closed loop) the next job; in
        lockstep the next turns wait for the round's last request; rotating, the session
        queues for its next turn and the first waiting session's turn comes in."""
        shape = self.shapes[req.job]
        if self.rotate:
            if req.result.ok and req.turn < len(shape.follow_up_tokens):
                self.ready.append((req.job, req.turn + 1, context))
            if self.ready:
                self._arrive(at, *self.ready.popleft())
        elif self.lockstep:
            if req.result.ok and req.turn < len(shape.follow_up_tokens):
                self.held.append((req.job, req.turn + 1, context))
            self.round_left -= 1
            if not self.round_left:
                for job, turn, held_context in self.held:
                    self._arrive(at, job, turn, held_context)
                self.round_left, self.held = len(self.held), []
        elif req.result.ok and req.turn < len(shape.follow_up_tokens):
            self._arrive(at, req.job, req.turn + 1, context)
        elif self.closed_loop and self.next_job < len(self.shapes):
            self._arrive(at, self.next_job, 0, 0)
            self.next_job += 1

    # ---- one step --------------------------------------------------------------------------
    def _step(self, batch: ScheduledBatch) -> None:
        pairs = list(zip(batch.seqs, batch.num_tokens, strict=True))
        verifying = [seq for seq, n in pairs if n > 1 and seq.num_uncomputed == 1]
        chunks = [Chunk(n, seq.num_computed_tokens + n, seq in verifying) for seq, n in pairs]
        seconds = self.step_time(chunks)
        if self.tiers is not None:  # loads at admission, saves as blocks leave or register
            seconds += self.tiers.take_seconds()
        if self.spec and self.spec.draft_step_time and verifying:
            drafts = [Chunk(1, seq.num_computed_tokens + 1) for seq in verifying]
            seconds += self.spec.tokens * self.spec.draft_step_time(drafts)
        in_system = len(self.sched.waiting) + len(self.sched.running)
        self.stats.in_system_s += in_system * seconds
        self.stats.busy_s += seconds
        if self.tiers is not None:  # as engine.py `_measure`
            self.step_cost.observe(seconds, sum(n for n in batch.num_tokens if n > 1))
            self.tiers.recompute_seconds_per_token = self.step_cost.prefill_token
            self.tiers.step_seconds = self.step_cost.decode_step  # (inline loads' bound)
        self.stats.steps += 1
        self.stats.sequences += len(pairs)
        self.stats.peak_running = max(self.stats.peak_running, len(self.sched.running))
        self.clock += seconds
        # as engine.py's step: every sequence's tokens committed, then the new tokens emitted
        # and the finished sequences let go (their checkpoints and freed blocks come after the
        # step's registrations)
        sampled = []
        for seq, n in pairs:
            req = self.requests[seq]
            if n > 1 and seq.num_uncomputed == 1:  # a verify step: 1 + accepted drafts
                accepted = 0
                while accepted < n - 1 and self.rng.random() < self.spec.acceptance:
                    accepted += 1
                self.sched.commit(seq, self._emit(seq, req, 1 + accepted))
            else:
                self.sched.commit(seq, n)
                if seq.num_uncomputed == 0:
                    sampled.append((seq, req))
        for seq, req in sampled:
            self._emit(seq, req, 1)
        for seq, _ in pairs:
            req = self.requests[seq]
            if req.generated >= req.output:
                self._finish(seq, req)

    def _record(self, req: _Request) -> None:
        self.results.append(req.result)
        self.log.append((req.result, req.job, req.arrival))

    def _emit(self, seq: Sequence, req: _Request, tokens: int) -> int:
        """`tokens` new tokens of `seq` leave now (appended to it); returns how many."""
        tokens = min(tokens, req.output - req.generated)
        result = req.result
        if result.ttft is None:
            result.ttft = self.clock - req.arrival
        else:
            result.itl.append(self.clock - req.last)
        if tokens > 1:
            result.itl.extend([0.0] * (tokens - 1))  # emitted in the same step
        end = len(seq.token_ids)
        seq.token_ids.extend(range(end, end + tokens))
        req.generated += tokens
        req.last = self.clock
        return tokens

    def _finish(self, seq: Sequence, req: _Request) -> None:
        self.sched.finish(seq)
        del self.requests[seq]
        cached = seq.num_cached_prompt_tokens or 0
        self.stats.prefix_hit_tokens += cached
        loads = self.tiers.first_loads.pop(seq, {}) if self.tiers is not None else {}
        if req.turn:
            self._count_reuse(req.reusable, cached, loads)
        req.result.output_tokens = req.generated
        req.result.e2e = self.clock - req.arrival
        self._record(req)
        self._job_done(req, seq.num_tokens, self.clock)

    def _count_reuse(self, reusable: int, cached: int, loads: dict[str, int]) -> None:
        """A later turn's reusable tokens and where its first admission found them: loaded
        blocks count block_size / groups tokens each (a token's KV spans every group)."""
        cached = min(cached, reusable)
        per_block = self.sched.block_size / len(self.sched.groups)
        loaded = {tier: blocks * per_block for tier, blocks in loads.items()}
        scale = min(1.0, cached / sum(loaded.values())) if loaded else 1.0
        found = self.stats.reused_tokens
        for tier, tokens in loaded.items():
            found[tier] = found.get(tier, 0.0) + tokens * scale
        found["pool"] = found.get("pool", 0.0) + cached - sum(loaded.values()) * scale
        self.stats.reusable_tokens += reusable
