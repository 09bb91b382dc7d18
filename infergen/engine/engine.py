"""The engine step loop: admit requests, schedule, run the model, sample, detokenize, stop.

engine.add_request(prompt or token ids, SamplingParams) → request_id
engine.step() → [StreamDelta]   (one forward pass over the scheduled batch)
engine.output(request_id) → RequestOutput
"""

from __future__ import annotations

import dataclasses
import itertools
import time
import warnings
from collections.abc import Callable
from collections.abc import Sequence as Seq

import torch

from infergen.compiler.runtime import CompiledLayers
from infergen.config import ModelConfig
from infergen.engine.config import EngineConfig
from infergen.engine.request import RequestOutput, Sequence, Status, StreamDelta
from infergen.engine.runner import ModelRunner
from infergen.engine.sampler import Sampler, SamplingState
from infergen.engine.sampling_params import SamplingParams
from infergen.engine.scheduler import ScheduledBatch, Scheduler
from infergen.engine.step_trace import StepRecord
from infergen.engine.stopping import StopChecker
from infergen.errors import ConfigError, RequestError
from infergen.formats.block_weight import BlockWeight
from infergen.io.checkpoint import Checkpoint, load_checkpoint
from infergen.io.tokenizer import IncrementalDetokenizer
from infergen.kernels.build import build_all
from infergen.kvcache.block_pool import BlockPool
from infergen.kvcache.calibrate import calibrate_kv_scales
from infergen.kvcache.kv_format import kv_format_of
from infergen.kvcache.paged_cache import PagedKVCache
from infergen.kvcache.sizing import blocks_for
from infergen.kvcache.state_cache import StateCache
from infergen.layers.probe import check_kv_scales
from infergen.models.transformer import Transformer
from infergen.ops.sparse_decode import QuestDecode
from infergen.process import configure_process
from infergen.quant.activations import load_activation_scales
from infergen.quant.apply import CalibrationResult, quantize_calibrated, rewrites_weights
from infergen.quant.schemes import WEIGHT_SCHEMES, apply_weight_scheme

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _check_fallbacks(model: Transformer, config: EngineConfig) -> dict[str, tuple[float, float]]:
    """The load-time check's verdicts (layers/probe.py): {projection: (error, limit)} of those
    kept at full precision; with on_bad_layer="refuse", an error naming them instead."""
    bad = {name: m.fallback for name, m in model.named_modules() if getattr(m, "fallback", None)}
    if not bad:
        return bad
    listing = ", ".join(f"{name} ({err:.3g} > {limit:.3g})" for name, (err, limit) in bad.items())
    if config.on_bad_layer == "refuse":
        raise ConfigError(
            f"weights {config.weights!r}: the load-time probe of some projections is far above "
            "the scheme's error level",
            found=listing,
            expected="probe error (mean per-channel relative error) within the limit",
            hint="on_bad_layer='fallback' keeps those projections at full precision",
        )
    warnings.warn(
        f"weights {config.weights!r}: kept at full precision (load-time probe error above the "
        f"scheme's limit): {listing}",
        stacklevel=3,
    )
    return bad


def _streaming(model: ModelConfig, config: EngineConfig) -> ModelConfig:
    """With `streaming_window` (StreamingLLM): every attention layer reads the last
    `streaming_window` positions and the first `streaming_sinks`; blocks in between go back
    to the pool, so a sequence's cache stays bounded however long it runs. Positions are not
    re-numbered (RoPE sees the true distance; the context stays capped at the model's)."""
    if config.streaming_window is None:
        return model
    if model.sliding_window is not None:
        raise ConfigError(
            "streaming_window applies to models without their own sliding windows",
            where="streaming_window",
            found=f"{model.architecture} with sliding_window {model.sliding_window}",
            expected="None for this model",
        )
    return model.replace(
        sliding_window=config.streaming_window,
        layer_types=tuple(
            "sliding_attention" if model.has_kv(i) else model.layer_type(i)
            for i in range(model.num_hidden_layers)
        ),
        sink_tokens=config.streaming_sinks,
    )


class Engine:
    def __init__(
        self,
        config: EngineConfig,
        checkpoint: Checkpoint | None = None,
        progress: bool = False,
        keep_dense: bool = False,  # keep calibration's rewritten fp32 weights (engine/export.py)
    ):
        configure_process(config.num_threads)
        if config.kernels == "native":
            build_all()  # compile (or load cached) C kernels now, not during the first request
        self.config = config
        keep_blocks = config.weights is not None and WEIGHT_SCHEMES.get(config.weights).keep_blocks
        checkpoint = checkpoint or load_checkpoint(config.model, keep_blocks=keep_blocks)
        if keep_blocks and not any(isinstance(t, BlockWeight) for t in checkpoint.tensors.values()):
            raise ConfigError(
                f"weights {config.weights!r} runs a GGUF file's Q4_0 / Q4_1 / Q8_0 blocks as "
                "loaded, and this checkpoint has none",
                where=str(checkpoint.path),
                expected="a GGUF file with Q4_0 / Q4_1 / Q8_0 tensors, or a scheme that "
                "quantizes (e.g. 'q4_1', 'int4', 'int8')",
            )
        self.checkpoint_path = checkpoint.path
        self.model_config: ModelConfig = _streaming(checkpoint.config, config)
        self.tokenizer = checkpoint.tokenizer
        dtype = _DTYPES[config.dtype]
        model = Transformer(self.model_config, dtype, config.kernels)
        if config.attention is not None:
            for layer in model.layers:
                layer.attn.set_operands(config.attention)
        if config.weights is not None and not rewrites_weights(config):
            apply_weight_scheme(model, config.weights, keep=config.keep)  # quantized as loaded
        model.load_weights(checkpoint.tensors)
        checkpoint.tensors.clear()  # the model holds its own (fused) copies
        self.sampler = Sampler()
        self.on_step: Callable[[StepRecord], None] | None = None  # e.g. a StepTraceWriter
        # the context a sequence may grow to: the model's, or less when config caps it
        self.max_model_len = min(
            self.model_config.max_position_embeddings,
            config.max_model_len or self.model_config.max_position_embeddings,
        )
        self.calibration: CalibrationResult | None = None
        if checkpoint.activations is not None:  # the checkpoint's scheme and static scales
            if config.activations not in (None, checkpoint.activations):
                raise ConfigError(
                    "the checkpoint's input activations are quantized by another scheme",
                    where="activations",
                    found=config.activations,
                    expected=f"{checkpoint.activations!r} or None (the checkpoint's)",
                )
            self.config = config = dataclasses.replace(config, activations=checkpoint.activations)
            load_activation_scales(
                model, config.activations, checkpoint.input_scales, str(checkpoint.path)
            )
        elif config.activations is not None or rewrites_weights(config):
            self.calibration = quantize_calibrated(
                self, model, config, dtype, progress, keep_dense=keep_dense
            )
        self.fallback_layers = _check_fallbacks(model, config)
        cache = config.cache
        scales = None
        if checkpoint.kv_scales is not None:  # the checkpoint's FP8 KV scales, keys unshifted
            if cache.kv_format not in (None, "fp8_e4m3"):
                raise ConfigError(
                    "the checkpoint carries FP8 KV cache scales",
                    where="kv_format",
                    found=cache.kv_format,
                    expected="fp8_e4m3 or None (the checkpoint's scheme)",
                )
            cache = dataclasses.replace(cache, kv_format="fp8_e4m3")
            self.config = config = dataclasses.replace(config, cache=cache)
            layers, _, heads = checkpoint.kv_scales.shape
            scales = (checkpoint.kv_scales, torch.zeros(layers, heads, self.model_config.head_dim))
        elif kv_format_of(cache.kv_format).calibrate:  # per-head scales from the model's
            scales = calibrate_kv_scales(self, model, dtype)  # own K / V
        # block-quantized KV: fp32 tails for every block a step writes (each running sequence's
        # last block, and the blocks a prefill chunk completes), + one for scoring
        sched = config.scheduler
        tails = sched.max_num_seqs + sched.max_num_batched_tokens // cache.block_size + 2
        # recurrent layers: one state slot per running sequence (+ one for scoring), set
        # aside from the same memory budget before the KV blocks
        slots = sched.max_num_seqs + 1 if model.state_layers else 0
        state_bytes = slots * StateCache.bytes_per_slot(model.state_layers)
        num_blocks = blocks_for(
            cache,
            self.model_config,
            torch.finfo(dtype).bits // 8,
            tails,
            reserved_bytes=state_bytes,
        )
        self._attach_cache(
            model,
            PagedKVCache(
                self.model_config,
                num_blocks,
                cache.block_size,
                dtype,
                cache.kv_format,
                tails,
                model.state_layers,
                slots,
                cache.sparse_decode_blocks is not None,
            ),  # fmt: skip
        )
        if cache.sparse_decode_blocks is not None:
            for i, layer in enumerate(model.layers):
                summary = self.kv_cache.layer(i).summary
                layer.attn.use_sparse_decode(
                    summary, cache.sparse_decode_blocks, cache.sparse_keep_first
                )
        if scales is not None:
            check_kv_scales(scales[0], where=f"kv_format {cache.kv_format!r} scales")
            self.kv_cache.scales.copy_(scales[0])
            self.kv_cache.k_shift.copy_(scales[1])
        self.compile_report = None
        if config.compile != "off" and cache.sparse_decode_blocks is not None:
            raise ConfigError(
                "the compiled layers do not run sparse decode",
                where="compile",
                found=f"compile={config.compile!r} with sparse_decode_blocks",
                expected="compile='off' with sparse decode",
            )
        if config.compile != "off" and not model.plain_layers:
            raise ConfigError(
                f"compile={config.compile!r} covers Llama-shaped layers only",
                where="compile",
                found=f"{self.model_config.architecture} (sliding-window cache groups, "
                "per-layer RoPE, GeGLU or sandwich norms)",
                expected="compile='off' for this architecture",
            )
        if config.compile != "off":  # the decoder layers through the compiler
            model.compiled = CompiledLayers(model, self.kv_cache, config.compile)
            self.compile_report = model.compiled.report
        self._requests: dict[str, Sequence] = {}
        self._counter = itertools.count()

    def attach_scratch_cache(self, model: Transformer, tokens: int, dtype: torch.dtype):
        """Run on a fresh engine-dtype cache that holds one prompt of `tokens` tokens (for
        calibration passes at start; the real cache is attached after). Returns it."""
        block = self.config.cache.block_size
        scratch = PagedKVCache(
            self.model_config, tokens // block + 2, block, dtype, None, 0, model.state_layers, 2
        )
        self._attach_cache(model, scratch)
        return scratch

    def _attach_cache(self, model: Transformer, kv_cache: PagedKVCache) -> None:
        """Run on `kv_cache`: its block pool, a scheduler over it, a runner writing to it."""
        self.kv_cache = kv_cache
        self.pool = BlockPool(kv_cache.num_blocks, self.config.cache.enable_prefix_caching)
        self.pool.on_free = kv_cache.block_freed
        if kv_cache.summaries:
            self.pool.on_allocate = kv_cache.block_allocated
        self.scheduler = Scheduler(
            self.config.scheduler, self.pool, kv_cache.block_size, kv_cache.groups,
            kv_cache.states,
        )  # fmt: skip
        self.runner = ModelRunner(model, kv_cache)

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
        self._validate(token_ids, params)
        detokenizer = None
        if self.tokenizer is not None:
            detokenizer = IncrementalDetokenizer(self.tokenizer, params.skip_special_tokens)
        seq = Sequence(
            request_id=request_id,
            prompt=text,
            prompt_token_ids=token_ids,
            params=params,
            sampling=SamplingState(params, token_ids, self.config.seed, index),
            stop_checker=StopChecker(params, self.model_config.eos_token_ids),
            detokenizer=detokenizer,
            arrival=index,
        )
        self._requests[request_id] = seq
        self.scheduler.add(seq)
        return request_id

    def _validate(self, token_ids: list[int], params: SamplingParams) -> None:
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
        chunk = self.config.scheduler.max_num_batched_tokens
        needed = sum(g.blocks_held(longest, chunk, block_size) for g in self.kv_cache.groups)
        if needed > self.pool.num_blocks:
            raise RequestError(
                "request can never fit in the KV cache",
                where="prompt + max_tokens",
                found=f"{longest} tokens = {needed} blocks of {block_size}",
                expected=f"at most {self.pool.num_blocks} blocks "
                "(raise the KV cache memory budget or lower max_tokens)",
            )

    def abort(self, request_id: str) -> None:
        seq = self._requests.get(request_id)
        if seq is not None and not seq.finished:
            seq.finish_reason = "abort"
            self.scheduler.finish(seq)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # ---- one step ---------------------------------------------------------------------------
    def step(self) -> list[StreamDelta]:
        start = time.perf_counter()
        batch = self.scheduler.schedule()
        if not batch:
            return []
        scheduled = time.perf_counter()
        logits, sampling = self.runner.run(batch)
        forward_end = time.perf_counter()
        for seq, n in zip(batch.seqs, batch.num_tokens, strict=True):
            seq.num_computed_tokens += n
            self.scheduler.register_full_blocks(seq)
        sampled = [batch.seqs[i] for i in sampling]
        result = self.sampler(logits, [seq.sampling for seq in sampled])
        for k, seq in enumerate(sampled):
            self._append_token(seq, result.token_ids[k], result.logprobs[k])
        deltas = [self._delta(seq) for seq in sampled]
        if self.on_step is not None:
            pairs = zip(batch.seqs, batch.num_tokens, strict=True)
            chunks = [(n, seq.num_computed_tokens) for seq, n in pairs]
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

    def _append_token(self, seq: Sequence, token: int, logprobs: object) -> None:
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
            self.scheduler.finish(seq)

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
        seq = Sequence("score", None, token_ids, SamplingParams(), None, None, None, -1)
        batch = ScheduledBatch([seq], [0])
        rows = []
        try:
            while seq.num_computed_tokens < len(token_ids):
                n = min(chunk, len(token_ids) - seq.num_computed_tokens)
                if not self.scheduler.grow(seq, n):
                    raise RequestError("KV cache is busy or too small to score this prompt")
                batch.num_tokens[0] = n
                forward_batch, _ = self.runner.prepare(batch)
                start = seq.num_computed_tokens
                forward_batch.logits_indices = torch.arange(n)
                rows.append(self.runner.model(forward_batch, self.kv_cache))
                seq.num_computed_tokens = start + n
        finally:
            self.scheduler.release_blocks(seq)
        return torch.cat(rows)

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
