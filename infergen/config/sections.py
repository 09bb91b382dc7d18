"""Engine sections every layer of the stack reads: the paged KV cache's shape and budget
(`CacheConfig`), the continuous-batching limits (`SchedulerConfig`) and byte-size parsing.

Pure data with range checks; names of registry rows (KV formats) are checked where the
registry lives (engine/config.py), and sizes that depend on a KV format are kvcache/sizing.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from infergen.config.specs import require
from infergen.errors import ConfigError

# the KV budget when neither `kv_cache_memory` nor a GPU's free memory sizes it (the CPU)
DEFAULT_KV_MEMORY = 1 << 30
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
    or as many as fit in `memory_bytes` when `num_blocks` is None. `memory_bytes` None: on
    a GPU, what `gpu_memory_utilization` of its memory leaves after the weights and the
    activations (engine/device.py); on the CPU, DEFAULT_KV_MEMORY."""

    block_size: int = 16
    memory_bytes: int | None = None
    gpu_memory_utilization: float = 0.9  # share of the GPU's memory the engine may hold
    # KV tiers below the pool (kvcache/tiers/): a host-memory budget, a directory and its
    # budget; blocks the pool evicts move there and come back on prefix hits (None: off)
    offload_memory_bytes: int | None = None
    offload_dir: str | None = None
    offload_disk_bytes: int = 50 * 10**9
    # write every computed prefix block to the tiers as it is registered (write-through), not
    # only as the pool evicts it (write-back): a restart finds whole prefixes on disk
    offload_write_through: bool = False
    # how the tiers store a block (kvcache/tiers/compact.py): None as the pool stores it,
    # "fp8_e4m3" FP8 codes with per-(block, layer, K/V, head) scales
    offload_format: str | None = None
    # recurrent layers' states kept at chosen positions for prefix reuse
    # (kvcache/state_checkpoints.py): their budget (0: none kept, no prefix reuse for such models)
    state_checkpoint_bytes: int = 1 << 30
    num_blocks: int | None = None
    enable_prefix_caching: bool = True
    kv_format: str | None = None  # a KV_FORMATS row (kvcache/kv_format.py), e.g. "fp8_e4m3"
    # Quest-style sparse decode (ops/sparse_decode.py): each decode query reads only this many
    # KV blocks per KV head — its sequence's last block, the first `sparse_keep_first` ones,
    # the rest the best by a min/max block-summary bound of q·k. None: dense decode
    sparse_decode_blocks: int | None = None
    sparse_keep_first: int = 1
    # KV press (kvcache/presses/, engine/kv_press.py): a PRESSES row run at each prefill's end,
    # removing `kv_press_ratio` of the sequence's cached tokens per layer and KV head
    kv_press: str | None = None
    kv_press_ratio: float = 0.5

    def __post_init__(self) -> None:
        require(
            0 <= self.kv_press_ratio < 1,
            "kv_press_ratio is the share of a sequence's cached tokens the press removes",
            where="kv_press_ratio",
            found=self.kv_press_ratio,
            expected="a number in [0, 1), e.g. 0.5",
        )
        if self.sparse_decode_blocks is not None:
            require(
                self.sparse_decode_blocks > self.sparse_keep_first >= 0,
                "sparse decode must read more blocks than the kept first ones",
                where="cache.sparse_decode_blocks",
                found=f"{self.sparse_decode_blocks} blocks, {self.sparse_keep_first} kept first",
                expected="sparse_decode_blocks > sparse_keep_first >= 0",
            )
        require(
            self.block_size > 0,
            "block_size must be positive",
            where="cache.block_size",
            found=self.block_size,
            expected="> 0",
        )
        if self.num_blocks is not None:
            require(
                self.num_blocks >= 1,
                "num_blocks must be at least 1",
                where="cache.num_blocks",
                found=self.num_blocks,
                expected=">= 1",
            )
        require(
            self.memory_bytes is None or self.memory_bytes > 0,
            "KV cache memory must be positive",
            where="cache.memory_bytes",
            found=self.memory_bytes,
            expected="> 0",
        )
        require(
            0 < self.gpu_memory_utilization <= 1,
            "gpu_memory_utilization is a share of the GPU's memory",
            where="gpu_memory_utilization",
            found=self.gpu_memory_utilization,
            expected="a number in (0, 1], e.g. 0.9",
        )


# what a preempted sequence's KV becomes (engine/tier_moves.py): "swap" copies its blocks to
# the host tier and back, "recompute" lets them go, "auto" swaps when the tiers' cost rule says
# loading beats recomputing and a host tier exists
PREEMPTION_MODES = ("auto", "swap", "recompute")


AUTO_DRAFTS = 8  # the most drafts a step verifies with num_speculative_tokens="auto"


@dataclass(frozen=True)
class SchedulerConfig:
    """Continuous batching limits: at most `max_num_seqs` running sequences and
    `max_num_batched_tokens` tokens (prefill chunks + decodes) per step."""

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    enable_chunked_prefill: bool = True
    admission: str = "optimistic"  # an engine/admission.py ADMISSION row
    preemption_mode: str = "auto"  # one of PREEMPTION_MODES
    speculative: str | None = None  # an engine/spec PROPOSERS row (None: no speculation)
    # drafts a decode step verifies: k (each step up to k, as the proposer gives them) or
    # "auto" (up to AUTO_DRAFTS, as many per sequence as the cost model finds worth it,
    # engine/spec/cost.py; none when they would not pay)
    num_speculative_tokens: int | str = "auto"
    draft_layers: int | None = None  # layerskip: the target's first N layers draft (None: half)
    draft_model: str | None = None  # draft: a checkpoint with the target's tokenizer, "self:int4"

    def __post_init__(self) -> None:
        k = self.num_speculative_tokens
        require(
            k == "auto" or (isinstance(k, int) and not isinstance(k, bool) and k >= 1),
            "num_speculative_tokens is a number of drafts or 'auto'",
            where="num_speculative_tokens",
            found=k,
            expected="an integer >= 1, or 'auto' (speculative=None turns speculation off)",
        )
        require(
            self.draft_layers is None or self.draft_layers >= 1,
            "draft_layers must be at least 1",
            where="draft_layers",
            found=self.draft_layers,
            expected=">= 1, fewer than the model's layers (None: half of them)",
        )
        require(
            self.preemption_mode in PREEMPTION_MODES,
            "unknown preemption mode",
            where="preemption_mode",
            found=self.preemption_mode,
            expected=f"one of {', '.join(PREEMPTION_MODES)}",
        )
        require(
            self.max_num_seqs >= 1,
            "max_num_seqs must be at least 1",
            where="scheduler.max_num_seqs",
            found=self.max_num_seqs,
            expected=">= 1",
        )
        require(
            self.max_num_batched_tokens >= 1,
            "max_num_batched_tokens must be at least 1",
            where="scheduler.max_num_batched_tokens",
            found=self.max_num_batched_tokens,
            expected=">= 1",
        )

    @property
    def max_drafts(self) -> int:
        """The most drafts a decode step verifies (the scheduler's lookahead)."""
        k = self.num_speculative_tokens
        return AUTO_DRAFTS if k == "auto" else k


@dataclass(frozen=True)
class QuantConfig:
    """Which tensors get which low-precision format (quant/), and how calibrated scales are
    chosen. Names are registry rows, checked by engine/config.py."""

    weights: str | None = None  # a WEIGHT_SCHEMES row, e.g. "int8" (None: unquantized)
    # an ACTIVATION_SCHEMES row: projection inputs quantized too, e.g. "fp8_e4m3"
    activations: str | None = None
    calibration: str = "max"  # a CLIP_METHODS row: how static scales clip
    smoothing: str | None = None  # a SMOOTHINGS row: "smoothquant" | "awq"
    calibration_stats: str | None = None  # a .safetensors path to save statistics to
    calibration_text: str | None = None  # a text file to calibrate on (None: shipped corpus)
    keep: tuple[str, ...] = ()  # projection-name globs kept at full precision
    # a projection whose load-time probe error is far above its scheme's level
    # (layers/probe.py): "fallback" keeps it at full precision, "refuse" stops the engine
    on_bad_layer: str = "fallback"

    def __post_init__(self) -> None:
        require(
            self.on_bad_layer in ("fallback", "refuse"),
            "unknown load-time check policy",
            where="on_bad_layer",
            found=self.on_bad_layer,
            expected="'fallback' or 'refuse'",
        )

    @property
    def calibrated(self) -> bool:
        """Some scale or weight is chosen by a calibration pass at engine start."""
        return bool(self.activations or self.smoothing or self.calibration != "max")


@dataclass(frozen=True)
class AttentionPolicy:
    """What attention computes on and which positions it reads."""

    # attention operands (ops/attention_operands.py): "fp8_e4m3" computes Q·Kᵀ and P·V on FP8
    # Q, K, V and P (needs the FP8 KV cache); None: the engine dtype
    operands: str | None = None
    # StreamingLLM (Xiao et al. 2023): every attention layer reads only the last
    # `streaming_window` positions and the first `streaming_sinks`
    streaming_window: int | None = None
    streaming_sinks: int = 4

    def __post_init__(self) -> None:
        if self.streaming_window is not None:
            require(
                self.streaming_window > 0 and self.streaming_sinks >= 0,
                "streaming_window must be positive and streaming_sinks not negative",
                where="streaming_window",
                found=f"window {self.streaming_window}, sinks {self.streaming_sinks}",
                expected="window > 0, sinks >= 0",
            )


COMPILE_MODES = ("off", "eager", "jit")


@dataclass(frozen=True)
class CompileConfig:
    """The decoder layers through the compiler (compiler/runtime.py): "off" (the per-op path
    and the hand-written fused decode step), "eager" (the captured graph op by op), "jit"
    (fused groups as generated C kernels, cached on disk)."""

    mode: str = "off"
    # on a GPU, decode steps replay CUDA graphs captured per batch-size bucket
    # (models/cuda_graphs.py); True runs every step eagerly
    enforce_eager: bool = False
    # "jit": build and tune within this many seconds at engine start, the most expected gain
    # first (compiler/startup.py); what does not fit runs op by op. None: build everything
    budget_s: float | None = None
    # the traffic mix that plan weighs buckets by: "recorded" (the server's recent steps of
    # this model, compiler/traffic.py; a default mix when none) or "bucket=share,..."
    traffic: str = "recorded"

    def __post_init__(self) -> None:
        require(
            self.mode in COMPILE_MODES,
            f"unknown compile mode {self.mode!r}",
            where="compile",
            found=self.mode,
            expected="'off', 'eager' or 'jit'",
        )
        require(
            self.budget_s is None or self.budget_s >= 0,
            "the compile budget must not be negative",
            where="compile_budget_s",
            found=self.budget_s,
            expected="seconds >= 0",
        )


@dataclass(frozen=True)
class ParallelConfig:
    """Tensor parallelism (engine/workers.py): the model split over `tensor_parallel_size`
    processes — this one (rank 0: it schedules and samples) and that many − 1 workers.
    `expert_parallel_size`: 1 (every rank holds a slice of every routed expert) or the
    tensor_parallel_size (each rank holds a run of whole experts; models/sharding.py)."""

    tensor_parallel_size: int = 1
    expert_parallel_size: int = 1

    def __post_init__(self) -> None:
        tp, ep = self.tensor_parallel_size, self.expert_parallel_size
        require(
            isinstance(tp, int) and tp >= 1,
            "tensor_parallel_size must be a whole number of processes, at least 1",
            where="tensor_parallel_size",
            found=tp,
            expected=">= 1",
        )
        require(
            isinstance(ep, int) and ep in (1, tp),
            "expert parallelism splits the experts over the tensor-parallel ranks: "
            "expert_parallel_size is 1 or the tensor_parallel_size",
            where="expert_parallel_size",
            found=f"{ep} with tensor_parallel_size {tp}",
            expected="1" if tp == 1 else f"1 or {tp}",
        )
