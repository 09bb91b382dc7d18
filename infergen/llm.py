"""`LLM`: the Python API.

from infergen import LLM, SamplingParams
llm = LLM()                                   # the default model
outs = llm.generate(["Hello"], SamplingParams(max_tokens=32, temperature=0))
print(outs[0].text)
"""

from __future__ import annotations

from collections.abc import Iterator
from collections.abc import Sequence as Seq
from typing import Any

from tqdm import tqdm

from infergen.config import CacheConfig, SchedulerConfig, parse_bytes
from infergen.engine.config import EngineConfig
from infergen.engine.engine import Engine
from infergen.engine.request import RequestOutput, StreamDelta
from infergen.engine.sampling_params import SamplingParams
from infergen.errors import RequestError

Prompt = str | Seq[int]


class LLM:
    """An engine plus the conveniences of batch generation, chat and streaming.

    Args:
        model: a .gguf file, a Hugging Face directory, or None for the default model.
        kv_cache_memory: KV cache budget, e.g. "1GiB" (ignored when num_kv_blocks is set).
        num_kv_blocks: exact number of KV blocks (tests use tiny pools to force preemption).
        block_size: tokens per KV block.
        max_num_seqs: most sequences running at once.
        max_num_batched_tokens: token budget of one step (prefill chunks + decodes).
        enable_chunked_prefill / enable_prefix_caching: switches.
        num_threads: torch CPU threads (None: torch's default).
        seed: engine seed for requests without their own seed.
        kernels: "native" (C kernels for linear, norms, RoPE, SwiGLU, decode attention)
            or "torch" (torch ops only).
        weights: a weight quantization scheme (infergen.quant.WEIGHT_SCHEMES), e.g. "int8",
            "int4", "q4_1", or "gguf" (a GGUF file's own blocks); None keeps the checkpoint's
            values.
        kv_format: what the KV cache stores (infergen.kvcache.KV_FORMATS), e.g. "fp8_e4m3":
            codes with per-head scales calibrated at start, 4x the tokens of fp32 in the same
            memory; None stores the engine dtype.
        on_bad_layer: a quantized projection whose load-time probe error is far above its
            scheme's level: "fallback" keeps it at full precision (a warning names it),
            "refuse" raises.
        activations: projection inputs quantized too (infergen.quant.ACTIVATION_SCHEMES):
            "fp8_e4m3" / "int8" (a dynamic scale per token), "fp8_e4m3_static" /
            "int8_static" (calibrated), "mxfp4", "mxfp8", "nvfp4"; with `weights` they make
            W8A8, W4A8, W4A4.
        calibration: how calibrated scales clip (quant/clipping.py): "max", "percentile",
            "mse" ("mse" also searches each quantized weight group's clipping).
        smoothing: "smoothquant" or "awq" (quant/smoothing.py): per-channel scales moved
            between activations and weights before quantizing.
        calibration_stats: a .safetensors path to save calibration statistics and the
            scales chosen.
        calibration_text: a text file to calibrate on (default: the shipped corpus).
        keep: projections the weight / activation schemes leave at full precision, as
            module-name globs, e.g. ("lm_head", "layers.0.*").
        attention: "fp8_e4m3" computes attention on FP8 Q, K, V and softmax P (with
            kv_format="fp8_e4m3"); None: the engine dtype.
        streaming_window / streaming_sinks: StreamingLLM — every attention layer reads only the
            last `streaming_window` positions and the first `streaming_sinks` (attention
            sinks); the blocks between go back to the pool, so memory per sequence is flat.
        sparse_decode_blocks: Quest-style sparse decode — each decode query reads this many
            KV blocks per KV head (the last, the first `sparse_keep_first`, the best by a
            block-summary bound of q·k); None: dense. `engine.sparse_read_fraction()` reports
            the share of the KV the decode steps read.
        compile: "off" (default: the per-op path and the fused decode step), "eager" (the
            decoder layer's captured graph, op by op) or "jit" (its fused groups as
            generated C kernels, cached on disk); `infergen compile` shows the graphs.
        progress: show progress bars while calibrating.
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        kv_cache_memory: str | int = "1GiB",
        num_kv_blocks: int | None = None,
        block_size: int = 16,
        max_num_seqs: int = 64,
        max_num_batched_tokens: int = 512,
        enable_chunked_prefill: bool = True,
        enable_prefix_caching: bool = True,
        num_threads: int | None = None,
        seed: int = 0,
        dtype: str = "float32",
        kernels: str = "native",
        weights: str | None = None,
        kv_format: str | None = None,
        on_bad_layer: str = "fallback",
        activations: str | None = None,
        calibration: str = "max",
        smoothing: str | None = None,
        calibration_stats: str | None = None,
        calibration_text: str | None = None,
        keep: tuple[str, ...] | list[str] = (),
        attention: str | None = None,
        max_model_len: int | None = None,
        compile: str = "off",
        sparse_decode_blocks: int | None = None,
        sparse_keep_first: int = 1,
        streaming_window: int | None = None,
        streaming_sinks: int = 4,
        checkpoint: Any = None,
        progress: bool = False,
    ):
        config = EngineConfig(
            model=model,
            dtype=dtype,
            kernels=kernels,
            weights=weights,
            on_bad_layer=on_bad_layer,
            activations=activations,
            calibration=calibration,
            smoothing=smoothing,
            calibration_stats=calibration_stats,
            calibration_text=calibration_text,
            keep=tuple(keep),
            attention=attention,
            max_model_len=max_model_len,
            compile=compile,
            streaming_window=streaming_window,
            streaming_sinks=streaming_sinks,
            num_threads=num_threads,
            seed=seed,
            cache=CacheConfig(
                block_size=block_size,
                memory_bytes=parse_bytes(kv_cache_memory, where="kv_cache_memory"),
                num_blocks=num_kv_blocks,
                enable_prefix_caching=enable_prefix_caching,
                kv_format=kv_format,
                sparse_decode_blocks=sparse_decode_blocks,
                sparse_keep_first=sparse_keep_first,
            ),
            scheduler=SchedulerConfig(
                max_num_seqs=max_num_seqs,
                max_num_batched_tokens=max_num_batched_tokens,
                enable_chunked_prefill=enable_chunked_prefill,
            ),
        )
        self.engine = Engine(config, checkpoint, progress=progress)
        self.config = self.engine.model_config
        self.tokenizer = self.engine.tokenizer

    # ---- batch generation -------------------------------------------------------------------
    def generate(
        self,
        prompts: Prompt | list[Prompt],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        *,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Generate for every prompt (text, or a list of token ids); outputs in prompt order."""
        prompt_list = _as_prompt_list(prompts)
        params = _as_params_list(sampling_params, len(prompt_list))
        ids = [self.engine.add_request(p, sp) for p, sp in zip(prompt_list, params, strict=True)]
        with tqdm(total=len(ids), disable=not use_tqdm, unit="req") as bar:
            while self.engine.has_unfinished():
                bar.update(sum(d.finished for d in self.engine.step()))
        outputs = [self.engine.output(i) for i in ids]
        for i in ids:
            self.engine.release(i)
        return outputs

    def chat(
        self,
        messages: list[dict[str, str]] | list[list[dict[str, str]]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        **kwargs: Any,
    ) -> list[RequestOutput]:
        """One conversation (a list of {"role", "content"}) or a list of them."""
        conversations = messages if messages and isinstance(messages[0], list) else [messages]
        prompts = [self.chat_prompt(c) for c in conversations]
        return self.generate(prompts, sampling_params, **kwargs)

    def chat_prompt(self, conversation: list[dict[str, str]]) -> list[int]:
        if self.tokenizer is None:
            raise RequestError("this checkpoint has no tokenizer, so no chat template")
        text = self.tokenizer.apply_chat_template(conversation, add_generation_prompt=True)
        return self.tokenizer.encode(text, add_special_tokens=False)

    # ---- streaming --------------------------------------------------------------------------
    def stream(
        self, prompt: Prompt, sampling_params: SamplingParams | None = None
    ) -> Iterator[StreamDelta]:
        """Yield text/token deltas of one request as they are generated."""
        request_id = self.engine.add_request(prompt, sampling_params)
        try:
            while True:
                done = False
                for delta in self.engine.step():
                    if delta.request_id == request_id:
                        done = delta.finished
                        if delta.text or delta.token_ids or done:
                            yield delta
                if done or not self.engine.has_unfinished():
                    return
        finally:
            self.engine.abort(request_id)
            self.engine.release(request_id)


def _as_prompt_list(prompts: Prompt | list[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, Seq) and prompts and all(isinstance(t, int) for t in prompts):
        return [list(prompts)]
    if isinstance(prompts, Seq) and prompts:
        return list(prompts)
    raise RequestError(
        "no prompts given", found=repr(prompts)[:80], expected="a string, token ids, or a list"
    )


def _as_params_list(
    params: SamplingParams | list[SamplingParams] | None, n: int
) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * n
    if isinstance(params, SamplingParams):
        return [params] * n
    if len(params) != n:
        raise RequestError(
            "one SamplingParams per prompt expected",
            found=f"{len(params)} for {n} prompts",
            expected=f"{n}, or a single SamplingParams",
        )
    return list(params)
