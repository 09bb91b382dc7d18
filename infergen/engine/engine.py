"""The engine step loop: admit requests, schedule, run the model, sample, detokenize, stop.

engine.add_request(prompt or token ids, SamplingParams) → request_id
engine.step() → [StreamDelta]   (one forward pass over the scheduled batch)
engine.output(request_id) → RequestOutput
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Callable
from collections.abc import Sequence as Seq

import torch

from infergen.compiler.traffic import TrafficRecord
from infergen.config import ModelConfig
from infergen.engine.backlog import OutputLengths, StepCost, seconds_until_admitted
from infergen.engine.build import build, press_blockers
from infergen.engine.config import EngineConfig
from infergen.engine.kv_press import KVPresser
from infergen.engine.request import PressChoice, RequestOutput, Sequence, Status, StreamDelta
from infergen.engine.sampler import Sampler, SamplingState
from infergen.engine.sampling_params import SamplingParams
from infergen.engine.scoring import serving_parts, teacher_forced_logits
from infergen.engine.step_trace import StepRecord
from infergen.engine.stopping import StopChecker
from infergen.engine.workers import Workers
from infergen.errors import ConfigError, RequestError
from infergen.io.checkpoint import Checkpoint
from infergen.io.tokenizer import IncrementalDetokenizer
from infergen.kvcache.presses import PRESSES, kept_count
from infergen.layers.tensor_parallel import TPGroup
from infergen.ops.sparse_decode import QuestDecode


def pairs(batch) -> zip:
    """(sequence, tokens scheduled) of each sequence of a scheduled batch."""
    return zip(batch.seqs, batch.num_tokens, strict=True)


# with nothing to step but sequences waiting on background KV tier loads, step() waits this
# long for one to complete before it returns empty-handed (no busy loop; a server drains its
# inbox in between)
LOAD_WAIT_S = 0.05


class Engine:
    """Requests and the step loop over a built model and cache (engine/build.py)."""

    def __init__(
        self,
        config: EngineConfig,
        checkpoint: Checkpoint | None = None,
        progress: bool = False,
        keep_dense: bool = False,  # keep calibration's rewritten fp32 weights (engine/export.py)
        tp: TPGroup | None = None,  # a tensor-parallel rank (engine/build.py)
    ):
        # tensor_parallel_size > 1: this process is rank 0 of a group of worker processes
        # (engine/workers.py) unless the caller placed it in a group itself (`tp`)
        self.workers = _workers(config, checkpoint) if tp is None else None
        if self.workers is not None:
            tp = self.workers.tp
        try:
            built = build(config, checkpoint, progress, keep_dense, tp)
            if self.workers is not None:
                self.workers.built()
        except BaseException:
            if self.workers is not None:
                self.workers.stop()
            raise
        self.config = built.config
        self.model_config: ModelConfig = built.model_config
        self.tokenizer = built.tokenizer
        self.checkpoint_path = built.checkpoint_path
        self.max_model_len = built.max_model_len
        self.calibration = built.calibration
        self.fallback_layers = built.fallback_layers
        self.compile_report = built.compile_report
        # compile_budget_s: what the startup plan built, tuned and skipped (compiler/startup.py)
        self.compile_plan = built.compile_plan
        self.graph_capture = built.graph_capture  # CUDA graphs recorded at start (GPU)
        self.kv_cache = built.kv_cache
        self.pool, self.scheduler, self.runner = serving_parts(
            built.model,
            built.kv_cache,
            self.config.scheduler,
            self.config.cache.enable_prefix_caching,
            self.max_model_len,
            built.kv_tiers,
            built.state_checkpoints,
        )
        self.runner.workers = self.workers
        self.kv_tiers = built.kv_tiers  # host / disk tiers below the pool (kv_offload_*)
        self.sampler = Sampler(self.config.kernels)
        self.speculator = built.speculator  # speculative decoding's drafts (None: off)
        # KV presses at prompts' ends (engine-wide kv_press, or per request): None when this
        # engine cannot run one (press_blockers names why)
        self._press_blockers = functools.partial(press_blockers, built)
        self.kv_press = None if built.press_blockers else KVPresser(
            self.kv_cache, self.pool, self.model_config.attention_scale,
            functools.partial(self.runner.model, kv_cache=self.kv_cache),
            None if self.tokenizer is None else self.tokenizer.encode,
        )  # fmt: skip
        self.on_step: Callable[[StepRecord], None] | None = None  # e.g. a StepTraceWriter
        # steps per token-count bucket (a server records its traffic: compiler/traffic.py)
        self.traffic: TrafficRecord | None = None
        self._requests: dict[str, Sequence] = {}
        self._counter = itertools.count()
        self.output_lengths = OutputLengths()  # of the requests that finished lately
        self.step_cost = StepCost()  # measured by step()
        self._busy_since: float | None = None  # the last step's end, while work remained

    def close(self) -> None:
        """Stop the tensor-parallel workers, if any (the engine cannot step after)."""
        if self.workers is not None:
            self.workers.close()

    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens the KV pool holds (over all sequences) when every cache group keeps every
        token (windowed groups keep fewer: more fit)."""
        cache = self.kv_cache
        return cache.num_blocks * cache.block_size // max(1, len(cache.groups))

    def sparse_read_fraction(self) -> float | None:
        """Share of the KV the sparse decode steps read, over every layer and decode so far
        (None without sparse decode or before any decode)."""
        decoders = [layer.attn.decode for layer in self.runner.model.layers]
        read = sum(d.kv_read_total for d in decoders if isinstance(d, QuestDecode))
        dense = sum(d.kv_dense_total for d in decoders if isinstance(d, QuestDecode))
        return read / dense if dense else None

    # ---- requests ---------------------------------------------------------------------------
    def encode(self, prompt: str) -> list[int]:
        if self.tokenizer is None:
            raise RequestError(
                "this checkpoint has no tokenizer; pass token ids instead of text",
                where=str(self.checkpoint_path),
            )
        return self.tokenizer.encode(prompt)

    def add_request(
        self,
        prompt: str | Seq[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
    ) -> str:
        params = params or SamplingParams()
        index = next(self._counter)
        request_id = request_id or f"req-{index}"
        if request_id in self._requests:
            raise RequestError("duplicate request id", found=request_id, expected="a new id")
        text = prompt if isinstance(prompt, str) else None
        token_ids = self.encode(prompt) if isinstance(prompt, str) else list(prompt)
        press = self._press_choice(params)
        self._validate(token_ids, params, press)
        detokenizer = None
        if self.tokenizer is not None:
            detokenizer = IncrementalDetokenizer(self.tokenizer, params.skip_special_tokens)
        seq = Sequence(
            request_id=request_id,
            prompt=text,
            prompt_token_ids=token_ids,
            params=params,
            sampling=SamplingState(params, token_ids, self.config.seed, index, self.runner.device),
            stop_checker=StopChecker(params, self.model_config.eos_token_ids),
            detokenizer=detokenizer,
            arrival=index,
            press=press,
        )
        self._requests[request_id] = seq
        if self.speculator is not None:
            self.speculator.start(seq)
        self.scheduler.add(seq)
        return request_id

    def _press_choice(self, params: SamplingParams) -> PressChoice | None:
        """The request's KV press: its own (kv_press, kv_press_ratio) or the engine's."""
        cache = self.config.cache
        name = params.kv_press or cache.kv_press
        if name is None:
            return None
        if name not in PRESSES:
            raise RequestError(f"unknown KV press {name!r}", where="kv_press",
                               expected=f"one of {PRESSES.names()}")  # fmt: skip
        blockers = self._press_blockers(name)
        if blockers:
            raise RequestError(
                "this engine cannot run a KV press: " + ", ".join(blockers),
                where="kv_press",
                found=name,
                expected="no kv_press for this model / engine configuration",
            )
        ratio = cache.kv_press_ratio if params.kv_press_ratio is None else params.kv_press_ratio
        return PressChoice(name, ratio, PRESSES.get(name).window)

    def _validate(
        self, token_ids: list[int], params: SamplingParams, press: PressChoice | None = None
    ) -> None:
        vocab = self.model_config.vocab_size
        if not token_ids:
            raise RequestError("prompt is empty", where="prompt", expected="at least one token")
        bad = [t for t in token_ids if not (isinstance(t, int) and 0 <= t < vocab)]
        if bad:
            raise RequestError(
                "prompt has token ids outside the vocabulary",
                where="prompt",
                found=bad[:5],
                expected=f"integers in [0, {vocab})",
            )
        if len(token_ids) >= self.max_model_len:
            raise RequestError(
                "prompt is too long for the model's context",
                where="prompt",
                found=f"{len(token_ids)} tokens",
                expected=f"fewer than {self.max_model_len} tokens",
            )
        if params.stop and self.tokenizer is None:
            raise RequestError("stop strings need a tokenizer", where="stop", found=params.stop)
        longest = min(len(token_ids) + params.max_tokens, self.max_model_len)
        block_size = self.kv_cache.block_size
        needed = self.scheduler.blocks_for_tokens(longest)
        if press is not None:  # the whole prompt, then what the press keeps + output
            kept = kept_count(len(token_ids), press.ratio)
            needed = max(
                self.scheduler.blocks_for_tokens(len(token_ids)),
                self.scheduler.blocks_for_tokens(longest - len(token_ids) + kept),
            )
        if needed > self.pool.num_blocks:
            raise RequestError(
                "request can never fit in the KV cache",
                where="prompt + max_tokens",
                found=f"{longest} tokens = {needed} blocks of {block_size}",
                expected=f"at most {self.pool.num_blocks} blocks "
                "(raise the KV cache memory budget or lower max_tokens)",
            )

    def abort(self, request_id: str, reason: str = "abort") -> StreamDelta | None:
        """Stop a request now (its blocks go back to the pool) with finish_reason `reason`;
        the last delta it yields (text held back for a stop string included), or None when it
        had finished already."""
        seq = self._requests.get(request_id)
        if seq is None or seq.finished:
            return None
        seq.finish_reason = reason
        self._finish(seq)
        return self._delta(seq)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def seconds_until_admitted(self, request_id: str, cost: StepCost | None = None) -> float:
        """Seconds a waiting request may wait before it runs, every request ahead of it
        generating its expected output, at the measured step costs (or `cost`; StepCost(1, 0)
        counts steps): engine/backlog.py."""
        seq, typical = self._requests[request_id], self.output_lengths.typical()
        return seconds_until_admitted(self.scheduler, seq, typical, cost or self.step_cost)

    # ---- one step ---------------------------------------------------------------------------
    def step(self) -> list[StreamDelta]:
        start = time.perf_counter()
        if self.speculator is not None:
            budget = self.config.scheduler.max_num_batched_tokens
            self.speculator.draft(
                self.scheduler.running,
                self.step_cost.prefill_token,
                budget,
                self.scheduler.remaining,
                draining=not self.scheduler.waiting,
            )
        batch = self.scheduler.schedule()
        if not batch and self.scheduler.wait_for_loads(LOAD_WAIT_S):
            start = time.perf_counter()
            batch = self.scheduler.schedule()
        if not batch:
            return []
        scheduled = time.perf_counter()
        if self.traffic is not None:
            self.traffic.add(sum(batch.num_tokens))
        if self.speculator is not None:
            self.speculator.before_step(batch.seqs, batch.num_tokens)
        capture = (
            None if self.kv_press is None else self.kv_press.capture(batch.seqs, batch.num_tokens)
        )
        logits, sampling, argmax = self.runner.run(batch, capture)
        forward_end = time.perf_counter()
        sampled = [batch.seqs[i] for i in sampling]
        # logits rows per sampling sequence: 1, or 1 + the drafts it verifies (runner.py)
        rows = [1 + batch.seqs[i].drafts_verified(batch.num_tokens[i]) for i in sampling]
        verifying = {batch.seqs[i] for i, r in zip(sampling, rows, strict=True) if r > 1}
        for seq, n in pairs(batch):
            if seq not in verifying:  # (a verifying decode commits what it accepted, below)
                self.scheduler.commit(seq, n)
        firsts = list(itertools.accumulate(rows, initial=0))  # each one's first logits row
        # one sampler call for the one-row sequences; each verifying one's rows go to the
        # speculator (the target's sample at each position, matched against the drafts)
        plain = [k for k, seq in enumerate(sampled) if seq not in verifying]
        index = [firsts[k] for k in plain]
        whole = len(index) == logits.shape[0]
        subset = logits if whole else logits[index]
        states = [sampled[k].sampling for k in plain]
        result = self.sampler(subset, states, argmax if whole else None) if plain else None
        at = {k: j for j, k in enumerate(plain)}
        for k, seq in enumerate(sampled):
            if seq in verifying:
                kept = self.speculator.verify(self.sampler, seq, logits[firsts[k] : firsts[k + 1]])
                self._append_verified(seq, kept.token_ids, kept.logprobs, rows[k] - 1)
            else:
                self._append_token(seq, result.token_ids[at[k]], result.logprobs[at[k]])
        deltas = [self._delta(seq) for seq in sampled]
        if self.kv_press is not None:  # (the prefills that ended: their cache pressed)
            self.kv_press.after_step()
        if self.speculator is not None:
            self.speculator.after_step(batch.seqs, batch.num_tokens)
        if self.kv_tiers is not None:  # (blocks registered this step, riders' KV now in)
            self.kv_tiers.end_step()
        if self.speculator is not None and all(n == 1 or s in verifying for s, n in pairs(batch)):
            # the cost model's t(n): a decode-only step, drafts or not (spec/cost.py)
            self.speculator.observe_step(sum(batch.num_tokens), time.perf_counter() - start)
        # (a decode verifying drafts is no prefill: the step cost's prefill rate leaves it out)
        self._measure(start, [1 if seq in verifying else n for seq, n in pairs(batch)])
        if self.on_step is not None:
            chunks = [(n, seq.num_computed_tokens) for seq, n in pairs(batch)]
            self.on_step(
                StepRecord(
                    start,
                    scheduled - start,
                    forward_end - scheduled,
                    time.perf_counter() - forward_end,
                    chunks,
                )
            )
        return deltas

    def _measure(self, start: float, num_tokens: list[int]) -> None:
        """Feed the step's cost to `step_cost`: while work remains, the wall time since the
        previous step ended (what the caller does between steps, e.g. a server admitting and
        delivering, is part of what a queued request waits for); else since this one began."""
        end = time.perf_counter()
        began = start if self._busy_since is None else self._busy_since
        self.step_cost.observe(end - began, sum(n for n in num_tokens if n > 1))
        self._busy_since = end if self.scheduler.has_unfinished() else None
        if self.kv_tiers is not None:  # what a tier hit saves: the measured prefill per token
            self.kv_tiers.recompute_seconds_per_token = self.step_cost.prefill_token
            self.kv_tiers.step_seconds = self.step_cost.decode_step  # (inline loads' bound)

    def _append_verified(
        self, seq: Sequence, tokens: list[int], logprobs: list, verified: int
    ) -> None:
        """A decode that verified `verified` drafts: the tokens it keeps (spec/speculator.py),
        appended one by one through the stop checks, then its computed tokens (its last token
        and the accepted drafts) committed — after the appends, whose token ids the prefix
        cache hashes; none when its recurrent state was rolled back (spec/rollback.py)."""
        computed = len(tokens)  # the last token + the accepted drafts
        for token, logprob in zip(tokens, logprobs, strict=True):
            self._append_token(seq, token, logprob)
            if seq.finished:
                break
        if self.speculator.settle(seq, computed, verified) and not seq.finished:
            self.scheduler.commit(seq, computed)

    def _append_token(self, seq: Sequence, token: int, logprobs: object) -> None:
        if self.speculator is not None:
            self.speculator.extend(seq, token)
        seq.token_ids.append(token)
        seq.sampling.append(token)
        if seq.params.logprobs is not None:
            seq.logprobs.append(logprobs)
        delta = seq.detokenizer.push(token) if seq.detokenizer is not None else ""
        seq.text += delta
        reason, kept = seq.stop_checker.check(
            token, len(seq.token_ids) - len(seq.prompt_token_ids), seq.text, len(delta)
        )
        truncated, seq.text = len(kept) < len(seq.text), kept
        if reason is None and seq.num_tokens >= self.max_model_len:
            reason = "length"
        if reason is not None:
            if seq.detokenizer is not None and not truncated:
                seq.text += seq.detokenizer.flush()  # bytes of an unfinished character
            seq.finish_reason = reason
            self._finish(seq)
            if not seq.params.ignore_eos:  # (an ignore_eos length says nothing of the rest)
                self.output_lengths.add(len(seq.token_ids) - len(seq.prompt_token_ids))

    def _finish(self, seq: Sequence) -> None:
        self.scheduler.finish(seq)
        if self.speculator is not None:
            self.speculator.finish(seq)

    def _delta(self, seq: Sequence) -> StreamDelta:
        hold = 0 if seq.finished else seq.stop_checker.max_stop_len
        end = max(seq.streamed_chars, len(seq.text) - hold)
        text = seq.text[seq.streamed_chars : end]
        seq.streamed_chars = end
        tokens = seq.output_token_ids[seq.streamed_tokens :]
        seq.streamed_tokens += len(tokens)
        return StreamDelta(seq.request_id, text, tokens, seq.finished, seq.finish_reason)

    # ---- scoring ----------------------------------------------------------------------------
    @torch.no_grad()
    def prompt_logits(self, token_ids: Seq[int], chunk: int | None = None) -> torch.Tensor:
        """Logits [len(token_ids), vocab] (fp32) of a teacher-forced pass, computed in chunks of
        `chunk` tokens through the paged cache (for evaluation: perplexity, top-1 agreement)."""
        token_ids = list(token_ids)
        self._validate(token_ids, SamplingParams(max_tokens=1))
        chunk = chunk or self.config.scheduler.max_num_batched_tokens
        return teacher_forced_logits(self.scheduler, self.runner, token_ids, chunk)

    # ---- results ----------------------------------------------------------------------------
    def output(self, request_id: str) -> RequestOutput:
        seq = self._requests[request_id]
        return RequestOutput(
            request_id=seq.request_id,
            prompt=seq.prompt,
            prompt_token_ids=seq.prompt_token_ids,
            text=seq.text,
            token_ids=seq.output_token_ids,
            finish_reason=seq.finish_reason,
            logprobs=seq.logprobs if seq.params.logprobs is not None else None,
            num_cached_prompt_tokens=seq.num_cached_prompt_tokens or 0,
            finished=seq.status is Status.FINISHED,
        )

    def release(self, request_id: str) -> None:
        """Forget a finished request (its output has been delivered)."""
        seq = self._requests.get(request_id)
        if seq is not None and seq.finished:
            del self._requests[request_id]


def _workers(config: EngineConfig, checkpoint: Checkpoint | None) -> Workers | None:
    """tensor_parallel_size > 1: the worker processes, started (None: one process)."""
    size = config.parallel.tensor_parallel_size
    if size == 1:
        return None
    if checkpoint is not None:
        raise ConfigError(
            "tensor parallelism loads the checkpoint in every worker process: pass its path "
            "as the model, not a loaded checkpoint",
            where="tensor_parallel_size",
            found=size,
            expected="1 with an in-memory checkpoint",
        )
    return Workers(config, size)
