"""`EngineConfig`: everything the engine needs besides the checkpoint, in sections
(config/sections.py): cache, scheduler, quantization, attention policy, compile. Names of
registry rows (weight / activation schemes, calibration, smoothing, KV formats, attention
operands) and the rules between sections are checked here, against the registries themselves.
Users do not build it by hand: `engine/options.py` builds it from flat options (LLM keywords,
command-line flags)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from infergen.config.sections import (
    AttentionPolicy,
    CacheConfig,
    CompileConfig,
    ParallelConfig,
    QuantConfig,
    SchedulerConfig,
)
from infergen.config.specs import require
from infergen.engine.admission import ADMISSION
from infergen.engine.spec.rows import PROPOSERS
from infergen.kvcache.kv_format import KV_FORMATS
from infergen.kvcache.presses import PRESSES
from infergen.ops.attention_operands import ATTENTION_OPERANDS
from infergen.quant.activations import ACTIVATION_SCHEMES
from infergen.quant.clipping import CLIP_METHODS
from infergen.quant.schemes import WEIGHT_SCHEMES
from infergen.quant.smoothing import SMOOTHINGS

# "auto" values are resolved where the engine is built, for its device (engine/device.py)
DTYPES = ("auto", "float32", "bfloat16", "float16")
# op backends: "native" (C kernels, CPU), "torch", "triton" (Triton kernels: compiled on a GPU,
# in Triton's interpreter on the CPU); an op without a kernel of the set runs its torch row
KERNELS = ("auto", "native", "torch", "triton")
DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine needs besides the checkpoint itself."""

    model: str | None = None
    device: str = "auto"  # "auto" | "cpu" | "cuda" | "cuda:N"
    dtype: str = "auto"
    num_threads: int | None = None
    seed: int = 0
    kernels: str = "auto"  # op backends: one of KERNELS
    max_model_len: int | None = None  # context cap in tokens (None: the model's own)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    quant: QuantConfig = field(default_factory=QuantConfig)
    attention: AttentionPolicy = field(default_factory=AttentionPolicy)
    compile: CompileConfig = field(default_factory=CompileConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    def __post_init__(self) -> None:
        require(
            self.dtype in DTYPES,
            "unsupported engine dtype",
            where="dtype",
            found=self.dtype,
            expected=f"one of {DTYPES}",
        )
        require(
            bool(DEVICE.match(self.device)),
            "unknown device",
            where="device",
            found=self.device,
            expected="'auto', 'cpu', 'cuda' or 'cuda:N'",
        )
        require(
            self.kernels in KERNELS,
            "unknown kernel set",
            where="kernels",
            found=self.kernels,
            expected=f"one of {KERNELS}",
        )
        require(
            self.max_model_len is None or self.max_model_len >= 2,
            "max_model_len must leave room for a prompt token and a generated one",
            where="max_model_len",
            found=self.max_model_len,
            expected="an integer >= 2 (or None for the model's own context length)",
        )
        self._check_cache()
        ADMISSION.get(self.scheduler.admission, where="admission")  # unknown → error now
        if self.scheduler.speculative is not None:
            PROPOSERS.get(self.scheduler.speculative, where="speculative")
        require(  # (its KV takes a share of the cache budget: only for the draft proposer)
            self.scheduler.draft_model is None or self.scheduler.speculative == "draft",
            "draft_model is the draft proposer's",
            where="draft_model",
            found=self.scheduler.draft_model,
            expected="speculative='draft' with it (or no draft_model)",
        )
        self._check_preemption()
        self._check_weights()
        self._check_calibration()
        self._check_attention()

    def _check_cache(self) -> None:
        """The KV format is a KV_FORMATS row; its blocks are at least its min_block_size (a
        block-quantized one needs multi-token blocks)."""
        if self.cache.kv_press is not None:
            PRESSES.get(self.cache.kv_press, where="kv_press")  # unknown → error now
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

    def _check_preemption(self) -> None:
        """Preemption by swap copies a sequence's blocks to the host tier and brings them back
        through the prefix index: it needs both, and no per-block key summaries (sparse
        decode: a restored partial block's would be lost)."""
        if self.scheduler.preemption_mode != "swap":
            return
        cache = self.cache
        problems = [
            what
            for what, bad in (
                ("no kv_offload_memory (no host tier)", cache.offload_memory_bytes is None),
                ("enable_prefix_caching off", not cache.enable_prefix_caching),
                ("sparse_decode_blocks set", cache.sparse_decode_blocks is not None),
            )
            if bad
        ]
        require(
            not problems,
            "preemption_mode 'swap' moves preempted sequences' blocks to the host KV tier",
            where="preemption_mode",
            found=f"swap with {', '.join(problems)}",
            expected="kv_offload_memory set, prefix caching on, dense decode; or "
            "preemption_mode 'auto' / 'recompute'",
        )

    def _check_weights(self) -> None:
        quant = self.quant
        if quant.weights is not None:
            scheme = WEIGHT_SCHEMES.get(quant.weights, where="weights")
            require(
                self.dtype in (*scheme.dtypes, "auto"),
                f"weights {quant.weights!r} are quantized from another engine dtype",
                where="dtype",
                found=self.dtype,
                expected=f"one of {scheme.dtypes}",
            )
        if quant.activations is not None:
            ACTIVATION_SCHEMES.get(quant.activations, where="activations")

    def _check_calibration(self) -> None:
        """Calibration methods and smoothings are registry rows; the calibrated options need
        a float32 engine and weights they can rewrite."""
        quant = self.quant
        CLIP_METHODS.get(quant.calibration, where="calibration")
        if quant.smoothing is not None:
            SMOOTHINGS.get(quant.smoothing, where="smoothing")
        if quant.calibration_text is not None:
            require(
                os.path.isfile(quant.calibration_text),
                "calibration text file not found",
                where="calibration_text",
                found=quant.calibration_text,
                expected="a readable text file",
            )
        require(
            not quant.calibrated or self.dtype in ("float32", "auto"),
            "quantized activations and calibration run on a float32 engine",
            where="dtype",
            found=self.dtype,
            expected="float32",
        )
        if quant.weights is not None and (quant.smoothing or quant.calibration == "mse"):
            require(
                not WEIGHT_SCHEMES.get(quant.weights).keep_blocks,
                f"weights {quant.weights!r} run a file's blocks as stored: there is nothing to "
                "smooth or clip",
                where="smoothing" if quant.smoothing else "calibration",
                found=quant.smoothing or quant.calibration,
                expected="a scheme that quantizes (e.g. 'q4_1', 'int4')",
            )

    def _check_attention(self) -> None:
        operands = self.attention.operands
        if operands in (None, "fp32"):
            return
        ATTENTION_OPERANDS.get(operands, where="attention")
        require(
            self.cache.kv_format == operands,
            f"attention operands {operands!r} read K and V as the KV cache stores them",
            where="kv_format",
            found=self.cache.kv_format,
            expected=repr(operands),
        )
