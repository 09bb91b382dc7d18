"""`EngineConfig`: everything the engine needs besides the checkpoint, with the cache and
scheduler sections (config/sections.py). Names of registry rows (weight / activation schemes,
calibration, smoothing, KV formats, attention operands) are checked here, against the
registries themselves."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from infergen.config.sections import CacheConfig, SchedulerConfig
from infergen.config.specs import require
from infergen.kvcache.kv_format import KV_FORMATS
from infergen.ops.attention_operands import ATTENTION_OPERANDS
from infergen.quant.activations import ACTIVATION_SCHEMES
from infergen.quant.clipping import CLIP_METHODS
from infergen.quant.schemes import WEIGHT_SCHEMES
from infergen.quant.smoothing import SMOOTHINGS


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine needs besides the checkpoint itself."""

    model: str | None = None
    dtype: str = "float32"
    num_threads: int | None = None
    seed: int = 0
    kernels: str = "native"  # op backends: "native" (C kernels, torch fallback) | "torch"
    weights: str | None = None  # a quant.WEIGHT_SCHEMES row, e.g. "int8" (None: unquantized)
    # a projection whose load-time probe error is far above its scheme's level (layers/probe.py):
    # "fallback" keeps it at full precision (and says so), "refuse" stops the engine
    on_bad_layer: str = "fallback"
    # a quant.ACTIVATION_SCHEMES row: projection inputs quantized too, e.g. "fp8_e4m3" (W8A8
    # with weights="fp8_e4m3"), "int8" (W4A8 with weights="int4"), "nvfp4" (W4A4)
    activations: str | None = None
    # calibration (quant/): the clipping method of static activation scales ("max",
    # "percentile", "mse"; "mse" also clips quantized weights), smoothing ("smoothquant",
    # "awq") and a file to save the statistics and chosen scales to
    calibration: str = "max"
    smoothing: str | None = None
    calibration_stats: str | None = None
    calibration_text: str | None = None  # a text file to calibrate on (None: the shipped corpus)
    # projections (module-name globs, e.g. "lm_head", "layers.0.*") kept at full precision by
    # the weight and activation schemes
    keep: tuple[str, ...] = ()
    # attention operands (ops/attention_operands.py): "fp8_e4m3" computes Q·Kᵀ and P·V on FP8
    # Q, K, V and P (needs the FP8 KV cache); None: the engine dtype
    attention: str | None = None
    max_model_len: int | None = None  # context cap in tokens (None: the model's own)
    # the decoder layers through the compiler (compiler/runtime.py): "off" (the per-op path
    # and the hand-written fused decode step), "eager" (the captured graph op by op),
    # "jit" (fused groups as generated C kernels)
    compile: str = "off"
    # StreamingLLM (Xiao et al. 2023): every attention layer reads only the last
    # `streaming_window` positions and the first `streaming_sinks` (engine.py:_streaming)
    streaming_window: int | None = None
    streaming_sinks: int = 4
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)

    DTYPES = ("float32", "bfloat16", "float16")

    def _check_cache(self) -> None:
        """The KV format is a KV_FORMATS row; its blocks are at least its min_block_size (a
        block-quantized one needs multi-token blocks)."""
        if self.cache.kv_format is None:
            return
        fmt = KV_FORMATS.get(self.cache.kv_format, where="kv_format")  # unknown → error now
        require(
            self.cache.block_size >= fmt.min_block_size,
            f"KV format {self.cache.kv_format!r} needs blocks of several tokens",
            where="cache.block_size",
            found=self.cache.block_size,
            expected=f">= {fmt.min_block_size}",
        )

    def _check_quantization(self) -> None:
        """Activation schemes, calibration methods and smoothings are registry rows; the
        calibrated options need a dtype and weights they can rewrite."""
        CLIP_METHODS.get(self.calibration, where="calibration")
        if self.smoothing is not None:
            SMOOTHINGS.get(self.smoothing, where="smoothing")
        if self.activations is not None:
            ACTIVATION_SCHEMES.get(self.activations, where="activations")
        if self.attention not in (None, "fp32"):
            ATTENTION_OPERANDS.get(self.attention, where="attention")
            require(
                self.cache.kv_format == self.attention,
                f"attention operands {self.attention!r} read K and V as the KV cache stores them",
                where="kv_format",
                found=self.cache.kv_format,
                expected=repr(self.attention),
            )
        calibrated = self.activations or self.smoothing or self.calibration != "max"
        if self.calibration_text is not None:
            require(
                os.path.isfile(self.calibration_text),
                "calibration text file not found",
                where="calibration_text",
                found=self.calibration_text,
                expected="a readable text file",
            )
        require(
            not calibrated or self.dtype == "float32",
            "quantized activations and calibration run on a float32 engine",
            where="dtype",
            found=self.dtype,
            expected="float32",
        )
        if self.weights is not None and (self.smoothing or self.calibration == "mse"):
            require(
                not WEIGHT_SCHEMES.get(self.weights).keep_blocks,
                f"weights {self.weights!r} run a file's blocks as stored: there is nothing to "
                "smooth or clip",
                where="smoothing" if self.smoothing else "calibration",
                found=self.smoothing or self.calibration,
                expected="a scheme that quantizes (e.g. 'q4_1', 'int4')",
            )

    def __post_init__(self) -> None:
        require(
            self.dtype in self.DTYPES,
            "unsupported engine dtype",
            where="dtype",
            found=self.dtype,
            expected=f"one of {self.DTYPES}",
        )
        if self.streaming_window is not None:
            require(
                self.streaming_window > 0 and self.streaming_sinks >= 0,
                "streaming_window must be positive and streaming_sinks not negative",
                where="streaming_window",
                found=f"window {self.streaming_window}, sinks {self.streaming_sinks}",
                expected="window > 0, sinks >= 0",
            )
        require(
            self.on_bad_layer in ("fallback", "refuse"),
            "unknown load-time check policy",
            where="on_bad_layer",
            found=self.on_bad_layer,
            expected="'fallback' or 'refuse'",
        )
        if self.weights is not None:
            scheme = WEIGHT_SCHEMES.get(self.weights, where="weights")
            require(
                self.dtype in scheme.dtypes,
                f"weights {self.weights!r} are quantized from another engine dtype",
                where="dtype",
                found=self.dtype,
                expected=f"one of {scheme.dtypes}",
            )
        self._check_cache()
        self._check_quantization()
        require(
            self.compile in ("off", "eager", "jit"),
            f"unknown compile mode {self.compile!r}",
            where="compile",
            found=self.compile,
            expected="'off', 'eager' or 'jit'",
        )
        require(
            self.max_model_len is None or self.max_model_len >= 2,
            "max_model_len must leave room for a prompt token and a generated one",
            where="max_model_len",
            found=self.max_model_len,
            expected="an integer >= 2 (or None for the model's own context length)",
        )
