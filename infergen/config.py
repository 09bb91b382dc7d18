"""Frozen configuration dataclasses, composed (not inherited), validated on construction.

`ModelConfig` describes a decoder's shapes and numerics. It is built from a checkpoint in one
place: `ModelConfig.from_hf_dict` (GGUF metadata is first mapped onto the same keys by
`infergen.io.gguf`). `CacheConfig`, `SchedulerConfig` and `EngineConfig` describe the engine.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any

from infergen.errors import ConfigError


def _require(cond: bool, what: str, *, where: str, found: object, expected: object) -> None:
    if not cond:
        raise ConfigError(what, where=where, found=found, expected=expected)


@dataclass(frozen=True)
class RopeScaling:
    """Rotary-embedding frequency scaling. `rope_type` "default" means none.

    "linear": inv_freq / factor.  "llama3": the Llama-3.1 piecewise rule (long wavelengths
    divided by `factor`, short ones kept, a smooth blend between low/high_freq_factor).
    """

    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    source: str = field(default="rope_scaling", compare=False)

    SUPPORTED = ("default", "linear", "llama3")

    def __post_init__(self) -> None:
        _require(
            self.rope_type in self.SUPPORTED,
            "unsupported rope scaling type",
            where=f"{self.source}.rope_type",
            found=self.rope_type,
            expected=f"one of {self.SUPPORTED}",
        )
        _require(
            self.factor > 0,
            "rope scaling factor must be positive",
            where=f"{self.source}.factor",
            found=self.factor,
            expected="> 0",
        )


@dataclass(frozen=True)
class ModelConfig:
    """Shapes and numerics of a decoder-only transformer.

    `architecture` names a row of `infergen.models.arch.ARCHITECTURES`.
    """

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    sliding_window: int | None = None
    hidden_act: str = "silu"
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    source: str = field(default="<memory>", compare=False)

    def __post_init__(self) -> None:
        where = self.source
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "max_position_embeddings",
        ):
            value = getattr(self, name)
            _require(
                isinstance(value, int) and value > 0,
                f"{name} must be a positive integer",
                where=f"{where}: {name}",
                found=value,
                expected="an integer > 0",
            )
        _require(
            self.num_attention_heads % self.num_key_value_heads == 0,
            "num_attention_heads must be a multiple of num_key_value_heads (GQA groups)",
            where=f"{where}: num_key_value_heads",
            found=f"{self.num_key_value_heads} KV heads for {self.num_attention_heads} heads",
            expected=f"a divisor of {self.num_attention_heads}",
        )
        _require(
            self.head_dim % 2 == 0,
            "head_dim must be even for rotary embeddings",
            where=f"{where}: head_dim",
            found=self.head_dim,
            expected="an even integer",
        )
        _require(
            self.rms_norm_eps > 0 and math.isfinite(self.rms_norm_eps),
            "rms_norm_eps must be positive and finite",
            where=f"{where}: rms_norm_eps",
            found=self.rms_norm_eps,
            expected="> 0",
        )
        _require(
            self.rope_theta > 0,
            "rope_theta must be positive",
            where=f"{where}: rope_theta",
            found=self.rope_theta,
            expected="> 0",
        )
        _require(
            self.hidden_act in ("silu",),
            "unsupported hidden activation",
            where=f"{where}: hidden_act",
            found=self.hidden_act,
            expected="'silu'",
        )
        if self.sliding_window is not None:
            _require(
                self.sliding_window > 0,
                "sliding_window must be positive or null",
                where=f"{where}: sliding_window",
                found=self.sliding_window,
                expected="an integer > 0 or null",
            )

    # ---- derived values -------------------------------------------------------------------
    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def num_parameters(self) -> int:
        return self.describe().params_total()

    def kv_bytes_per_token(self, dtype_bytes: int = 4) -> int:
        return int(self.describe().kv_bytes_per_token(dtype_bytes))

    def describe(self):
        """The performance model's description of this model (infergen.perf.model_desc):
        parameter counts, weight and KV bytes are computed there, once for every config."""
        from infergen.perf.model_desc import from_model_config

        return from_model_config(self)

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    # ---- construction from a Hugging Face config.json dict --------------------------------
    @classmethod
    def from_hf_dict(cls, cfg: dict[str, Any], *, source: str) -> ModelConfig:
        """Build from a Hugging Face `config.json` dict (GGUF metadata is mapped onto it)."""
        from infergen.models.arch import arch_for_hf_config

        arch = arch_for_hf_config(cfg, source=source)

        def need(key: str) -> Any:
            if cfg.get(key) is None:
                raise ConfigError(
                    f"required field {key!r} is missing", where=source, expected=f"{key} set"
                )
            return cfg[key]

        heads = need("num_attention_heads")
        hidden = need("hidden_size")
        if not (isinstance(heads, int) and heads > 0):  # before dividing by it below
            raise ConfigError(
                "num_attention_heads must be a positive integer",
                where=f"{source}: num_attention_heads",
                found=heads,
                expected="an integer > 0",
            )
        kv_heads = cfg.get("num_key_value_heads") or heads
        head_dim = cfg.get("head_dim") or (hidden // heads if isinstance(hidden, int) else None)
        if cfg.get("head_dim") is None and isinstance(hidden, int) and hidden % heads != 0:
            raise ConfigError(
                "hidden_size is not divisible by num_attention_heads and head_dim is not given",
                where=f"{source}: hidden_size",
                found=f"{hidden} / {heads}",
                expected="hidden_size % num_attention_heads == 0, or an explicit head_dim",
            )
        rope = dict(cfg.get("rope_parameters") or {})
        legacy = cfg.get("rope_scaling") or {}
        rope = {**legacy, **rope}
        rope_theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        scaling = RopeScaling(
            rope_type=rope_type,
            source=f"{source}: rope_parameters",
            **{
                k: rope[k]
                for k in (
                    "factor",
                    "low_freq_factor",
                    "high_freq_factor",
                    "original_max_position_embeddings",
                )
                if k in rope
            },
        )
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        window = cfg.get("sliding_window")
        if arch.sliding_window_flag and not cfg.get(arch.sliding_window_flag, False):
            window = None
        return cls(
            architecture=arch.name,
            vocab_size=need("vocab_size"),
            hidden_size=hidden,
            intermediate_size=need("intermediate_size"),
            num_hidden_layers=need("num_hidden_layers"),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta),
            rope_scaling=scaling,
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=arch.qkv_bias
            if arch.qkv_bias is not None
            else cfg.get("attention_bias", False),
            o_bias=arch.o_bias if arch.o_bias is not None else cfg.get("attention_bias", False),
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            qk_norm=arch.qk_norm,
            sliding_window=window,
            hidden_act=cfg.get("hidden_act", "silu"),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos_ids,
            source=source,
        )


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)


def parse_bytes(text: str | int, *, where: str = "size") -> int:
    """Parse '512MiB', '2GB', '1.5G' or a plain integer into bytes (KiB = 1024, KB = 1000)."""
    if isinstance(text, int):
        return text
    match = _SIZE.match(str(text))
    if not match:
        raise ConfigError(
            "could not parse a byte size", where=where, found=text, expected="e.g. 512MiB, 2GB"
        )
    number, unit = float(match.group(1)), (match.group(2) or "B").upper()
    base = 1024 if "I" in unit else 1000
    return int(number * base ** "BKMGT".index(unit[0]))


@dataclass(frozen=True)
class CacheConfig:
    """Paged KV cache: `block_size` tokens per block; the pool holds `num_blocks` blocks,
    or as many as fit in `memory_bytes` when `num_blocks` is None."""

    block_size: int = 16
    memory_bytes: int = 1 << 30
    num_blocks: int | None = None
    enable_prefix_caching: bool = True
    kv_format: str | None = None  # a kvcache.KV_FORMATS row, e.g. "fp8_e4m3" (None: engine dtype)

    def __post_init__(self) -> None:
        if self.kv_format is not None:
            from infergen.kvcache.kv_format import KV_FORMATS

            KV_FORMATS.get(self.kv_format, where="kv_format")  # unknown → clear error now
            if self.blocked and self.block_size < 2:
                raise ConfigError("block-quantized KV formats need blocks of several tokens",
                                  where="cache.block_size", found=self.block_size,
                                  expected=">= 2")  # fmt: skip
        _require(
            self.block_size > 0,
            "block_size must be positive",
            where="cache.block_size",
            found=self.block_size,
            expected="> 0",
        )
        if self.num_blocks is not None:
            _require(
                self.num_blocks >= 1,
                "num_blocks must be at least 1",
                where="cache.num_blocks",
                found=self.num_blocks,
                expected=">= 1",
            )
        _require(
            self.memory_bytes > 0,
            "KV cache memory must be positive",
            where="cache.memory_bytes",
            found=self.memory_bytes,
            expected="> 0",
        )

    @property
    def blocked(self) -> bool:
        """The KV format quantizes whole blocks (kvcache/kv_blocked.py)."""
        if self.kv_format is None:
            return False
        from infergen.kvcache.kv_blocked import BlockedKVFormat
        from infergen.kvcache.kv_format import KV_FORMATS

        return isinstance(KV_FORMATS.get(self.kv_format), BlockedKVFormat)

    def element_bytes(self, dtype_bytes: int) -> int:
        """Bytes a cached K / V element takes: the KV format's, else the engine dtype's (a
        block-quantized format has no element size: see bytes_per_token)."""
        if self.kv_format is None:
            return dtype_bytes
        from infergen.kvcache.kv_format import KV_FORMATS

        return KV_FORMATS.get(self.kv_format).element_bytes

    def bytes_per_token(self, model: ModelConfig, dtype_bytes: int) -> float:
        """KV cache bytes one token takes over all layers (codes and their scales)."""
        if not self.blocked:
            return model.kv_bytes_per_token(self.element_bytes(dtype_bytes))
        from infergen.kvcache.kv_format import KV_FORMATS

        fmt = KV_FORMATS.get(self.kv_format)
        per_block = fmt.bytes_per_block(self.block_size, model.num_key_value_heads, model.head_dim)
        return model.num_hidden_layers * per_block / self.block_size

    def blocks_for(self, model: ModelConfig, dtype_bytes: int, tail_blocks: int = 0) -> int:
        """Blocks in the pool: `num_blocks`, or as many as `memory_bytes` holds at this
        format's bytes per token (the per-head scales of a scaled format are not counted: a
        few bytes a layer); a block-quantized format first sets aside `tail_blocks` fp32
        blocks for the blocks being filled."""
        if self.num_blocks is not None:
            return self.num_blocks
        budget = self.memory_bytes
        if self.blocked:
            budget -= tail_blocks * model.kv_bytes_per_token(4) * self.block_size
        per_block = self.bytes_per_token(model, dtype_bytes) * self.block_size
        blocks = budget // per_block
        if blocks < 1:
            raise ConfigError(
                "KV cache memory budget is smaller than one block",
                where="cache.memory_bytes",
                found=self.memory_bytes,
                expected=f">= {per_block:.0f} bytes (one block of {self.block_size} tokens"
                + (", after the fp32 blocks being filled)" if self.blocked else ")"),
            )
        return int(blocks)


@dataclass(frozen=True)
class SchedulerConfig:
    """Continuous batching limits: at most `max_num_seqs` running sequences and
    `max_num_batched_tokens` tokens (prefill chunks + decodes) per step."""

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    enable_chunked_prefill: bool = True

    def __post_init__(self) -> None:
        _require(
            self.max_num_seqs >= 1,
            "max_num_seqs must be at least 1",
            where="scheduler.max_num_seqs",
            found=self.max_num_seqs,
            expected=">= 1",
        )
        _require(
            self.max_num_batched_tokens >= 1,
            "max_num_batched_tokens must be at least 1",
            where="scheduler.max_num_batched_tokens",
            found=self.max_num_batched_tokens,
            expected=">= 1",
        )


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine needs besides the checkpoint itself."""

    model: str | None = None
    dtype: str = "float32"
    num_threads: int | None = None
    seed: int = 0
    kernels: str = "native"  # op backends: "native" (C kernels, torch fallback) | "torch"
    weights: str | None = None  # a quant.WEIGHT_SCHEMES row, e.g. "int8" (None: unquantized)
    # a projection whose load-time probe error is far above its scheme's level (quant/probe.py):
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
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)

    DTYPES = ("float32", "bfloat16", "float16")

    def _check_quantization(self) -> None:
        """Activation schemes, calibration methods and smoothings are registry rows; the
        calibrated options need a dtype and weights they can rewrite."""
        from infergen.quant.activations import ACTIVATION_SCHEMES
        from infergen.quant.clipping import CLIP_METHODS
        from infergen.quant.smoothing import SMOOTHINGS

        CLIP_METHODS.get(self.calibration, where="calibration")
        if self.smoothing is not None:
            SMOOTHINGS.get(self.smoothing, where="smoothing")
        if self.activations is not None:
            ACTIVATION_SCHEMES.get(self.activations, where="activations")
        if self.attention not in (None, "fp32"):
            from infergen.ops.attention_operands import ATTENTION_OPERANDS

            ATTENTION_OPERANDS.get(self.attention, where="attention")
            _require(
                self.cache.kv_format == self.attention,
                f"attention operands {self.attention!r} read K and V as the KV cache stores them",
                where="kv_format",
                found=self.cache.kv_format,
                expected=repr(self.attention),
            )
        calibrated = self.activations or self.smoothing or self.calibration != "max"
        if self.calibration_text is not None:
            import os

            _require(
                os.path.isfile(self.calibration_text),
                "calibration text file not found",
                where="calibration_text",
                found=self.calibration_text,
                expected="a readable text file",
            )
        _require(
            not calibrated or self.dtype == "float32",
            "quantized activations and calibration run on a float32 engine",
            where="dtype",
            found=self.dtype,
            expected="float32",
        )
        if self.weights is not None and (self.smoothing or self.calibration == "mse"):
            from infergen.quant.schemes import WEIGHT_SCHEMES

            _require(
                not WEIGHT_SCHEMES.get(self.weights).keep_blocks,
                f"weights {self.weights!r} run a file's blocks as stored: there is nothing to "
                "smooth or clip",
                where="smoothing" if self.smoothing else "calibration",
                found=self.smoothing or self.calibration,
                expected="a scheme that quantizes (e.g. 'q4_1', 'int4')",
            )

    def __post_init__(self) -> None:
        _require(
            self.dtype in self.DTYPES,
            "unsupported engine dtype",
            where="dtype",
            found=self.dtype,
            expected=f"one of {self.DTYPES}",
        )
        _require(
            self.on_bad_layer in ("fallback", "refuse"),
            "unknown load-time check policy",
            where="on_bad_layer",
            found=self.on_bad_layer,
            expected="'fallback' or 'refuse'",
        )
        if self.weights is not None:
            from infergen.quant.schemes import WEIGHT_SCHEMES

            scheme = WEIGHT_SCHEMES.get(self.weights, where="weights")
            _require(
                self.dtype in scheme.dtypes,
                f"weights {self.weights!r} are quantized from another engine dtype",
                where="dtype",
                found=self.dtype,
                expected=f"one of {scheme.dtypes}",
            )
        self._check_quantization()
        _require(
            self.compile in ("off", "eager", "jit"),
            f"unknown compile mode {self.compile!r}",
            where="compile",
            found=self.compile,
            expected="'off', 'eager' or 'jit'",
        )
        _require(
            self.max_model_len is None or self.max_model_len >= 2,
            "max_model_len must leave room for a prompt token and a generated one",
            where="max_model_len",
            found=self.max_model_len,
            expected="an integer >= 2 (or None for the model's own context length)",
        )
