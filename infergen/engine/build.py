"""The build step: checkpoint → model with its options applied → KV cache. Run once, before
any request; the engine (engine.py) then keeps requests and the step loop, and nothing
changes the model option by option afterwards.

In order: the checkpoint (GGUF blocks kept for the "gguf" scheme), the model (StreamingLLM's
windows, attention operands, weight schemes applied as the weights load), calibrated
quantization (activation scales, smoothing, clipping: quant/apply.py, given a scratch
runner), the load-time check's verdicts, the KV format's scales (the checkpoint's, or
calibrated), the cache sized from the memory budget, sparse decode, and the compiled layers.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import os
import sys
import warnings
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from infergen.compiler import runtime  # (registers the compiled fast paths; its JitCache)
from infergen.compiler.budget import parse_traffic
from infergen.compiler.startup import plan_lines, plan_startup
from infergen.compiler.traffic import DEFAULT_TRAFFIC, TrafficRecord
from infergen.config import ModelConfig
from infergen.config.sections import QuantConfig
from infergen.engine.config import EngineConfig
from infergen.engine.device import gpu_kv_budget, has_triton, resolve
from infergen.engine.scoring import scratch_runner
from infergen.engine.spec.draft import SELF
from infergen.engine.spec.proposer import DraftContext
from infergen.engine.spec.rollback import StateRollback
from infergen.engine.spec.rows import PROPOSERS
from infergen.engine.spec.speculator import Speculator
from infergen.errors import ConfigError
from infergen.formats.block_weight import BlockWeight
from infergen.io.checkpoint import Checkpoint, load_checkpoint
from infergen.io.model_config import read_model_config
from infergen.kernels.build import build_all
from infergen.kvcache.calibrate import calibrate_kv_scales
from infergen.kvcache.groups import cache_groups, page_bytes
from infergen.kvcache.kv_format import kv_format_of
from infergen.kvcache.paged_cache import PagedKVCache
from infergen.kvcache.presses import PRESSES
from infergen.kvcache.sizing import blocks_for, bytes_per_token
from infergen.kvcache.state_cache import StateCache, slots_for
from infergen.kvcache.state_checkpoints import StateCheckpoints
from infergen.kvcache.tiers.compact import offload_format_of
from infergen.kvcache.tiers.copies import host_copies
from infergen.kvcache.tiers.disk import DiskTier
from infergen.kvcache.tiers.host import HostTier
from infergen.kvcache.tiers.tiered import KVTiers
from infergen.layers.probe import check_kv_scales
from infergen.layers.tensor_parallel import TPGroup
from infergen.models.cuda_graphs import buckets
from infergen.models.fast_paths import FAST_PATHS
from infergen.models.mtp import mtp_cache_config, mtp_layers
from infergen.models.transformer import Transformer
from infergen.ops.triton_modules import TRITON_MODULES
from infergen.process import configure_process
from infergen.quant.activations import load_activation_scales
from infergen.quant.apply import CalibrationResult, quantize_calibrated, rewrites_weights
from infergen.quant.calibrate import calibration_sequences
from infergen.quant.schemes import WEIGHT_SCHEMES, apply_weight_scheme

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class Built:
    """What the engine runs: `config` as applied (a checkpoint's own activation scheme or KV
    format filled in), the model on its cache, and what the build measured on the way."""

    config: EngineConfig
    model_config: ModelConfig
    model: Transformer
    kv_cache: PagedKVCache
    tokenizer: object
    checkpoint_path: object
    max_model_len: int
    calibration: CalibrationResult | None = None
    fallback_layers: dict[str, tuple[float, float]] = field(default_factory=dict)
    compile_report: object = None
    compile_plan: list | None = None  # compile_budget_s: the startup plan's items
    graph_capture: GraphCapture | None = None  # on a GPU: the decode graphs recorded at start
    kv_tiers: KVTiers | None = None  # host / disk tiers below the KV pool (kv_offload_*)
    # recurrent layers' state checkpoints for prefix reuse (state_checkpoint_memory)
    state_checkpoints: StateCheckpoints | None = None
    speculator: Speculator | None = None  # speculative decoding (engine/spec/speculator.py)
    # why no KV press can run on this engine (empty: presses can, engine-wide or per request)
    press_blockers: list[str] = field(default_factory=list)


class GraphCapture(NamedTuple):
    sizes: tuple[int, ...]  # the batch-size buckets
    seconds: float  # time to record them


def _triton_rows(device: str) -> None:
    """kernels="triton": register the Triton rows of the op registries, importing Triton only
    then (it takes about a second). On a GPU they compile for it; on the CPU they run in
    Triton's interpreter, which reads TRITON_INTERPRET=1 as the kernels are defined: it must
    be set before the process imports infergen."""
    if not has_triton():
        raise ConfigError("kernels='triton' needs Triton: pip install 'infergen[triton]'",
                          where="kernels")  # fmt: skip
    if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ConfigError(
            "kernels='triton' runs on the CPU only in Triton's interpreter: set "
            "TRITON_INTERPRET=1 in the environment (slow: for testing)",
            where="kernels",
        )
    for module in TRITON_MODULES:  # each registers its rows as it is imported
        importlib.import_module(module)


def build(
    config: EngineConfig,
    checkpoint: Checkpoint | None = None,
    progress: bool = False,
    keep_dense: bool = False,  # keep calibration's rewritten fp32 weights (engine/export.py)
    tp: TPGroup | None = None,  # a tensor-parallel rank: the model is its shard (sharding.py)
) -> Built:
    config = resolve(config)  # "auto" device, kernels and dtype made concrete (device.py)
    threads = config.num_threads
    if tp is not None and threads is None:  # the ranks share this machine's cores
        threads = max(1, torch.get_num_threads() // tp.size)
    configure_process(threads)
    if config.device != "cpu":
        torch.cuda.set_device(torch.device(config.device))
    if config.kernels == "native":
        build_all()  # compile (or load cached) C kernels now, not during the first request
    if config.kernels == "triton":
        _triton_rows(config.device)
    checkpoint = _checkpoint(config, checkpoint)
    model_config = _streaming(checkpoint.config, config)
    dtype = DTYPES[config.dtype]
    press = config.cache.kv_press  # (per-layer budgets: smaller cache groups, PyramidKV)
    if tp is not None:
        _check_tensor_parallel(config, tp)
    model = Transformer(model_config, dtype, config.kernels,
                        None if press is None else PRESSES.get(press).group_layers, tp,
                        config.parallel.expert_parallel_size)  # fmt: skip
    model_config = model.config  # (a rank's: its own heads, which its KV cache holds)
    if config.scheduler.speculative == "mtp":  # its layers load with the weights
        model.mtp = mtp_layers(model_config, dtype, config.kernels)
    if config.attention.operands is not None:
        for layer in model.layers:
            layer.attn.set_operands(config.attention.operands)
    quant = config.quant
    if quant.weights is not None and not rewrites_weights(quant):
        apply_weight_scheme(model, quant.weights, keep=quant.keep)  # quantized as loaded
    model.load_weights(checkpoint.tensors)
    checkpoint.tensors.clear()  # the model holds its own (fused) copies
    max_model_len = min(  # the model's context, or less when the config caps it
        model_config.max_position_embeddings,
        config.max_model_len or model_config.max_position_embeddings,
    )
    run = scratch_runner(model, model_config, config.cache.block_size, dtype, config.scheduler)
    built = Built(
        config, model_config, model, None, checkpoint.tokenizer, checkpoint.path, max_model_len
    )
    _quantize(built, checkpoint, run, progress, keep_dense)
    built.fallback_layers = _check_fallbacks(model, built.config)
    scales = _kv_scales(built, checkpoint, run)
    _to_device(built)
    built.kv_cache = _cache(built, dtype, scales)
    built.kv_tiers = _tiers(built)
    built.state_checkpoints = _state_checkpoints(built)
    built.speculator = _speculator(built)
    built.press_blockers = press_blockers(built)
    _check_press(built)
    _compile(built)
    _capture(built)
    return built


def _check_tensor_parallel(config: EngineConfig, tp: TPGroup) -> None:
    """What a tensor-parallel rank does not run yet: a clear error naming it."""
    sched, cache = config.scheduler, config.cache
    refused = [
        name
        for name, used in (
            ("kv_press", cache.kv_press is not None),
            ("speculative", sched.speculative is not None),
            ("KV offload tiers", cache.offload_memory_bytes is not None or cache.offload_dir),
            ("compile", config.compile.mode != "off"),
            (
                "calibrated quantization (activation schemes, smoothing, clipping)",
                config.quant.activations is not None or rewrites_weights(config.quant),
            ),
            (f"device {config.device}", config.device != "cpu"),
        )
        if used
    ]
    if refused:
        raise ConfigError(
            f"tensor parallelism does not run with {', '.join(refused)} yet",
            where="tensor_parallel_size",
            found=tp.size,
            expected=f"1 with {', '.join(refused)}",
        )


def _speculator(built: Built) -> Speculator | None:
    """speculative: the proposer's row, with num_speculative_tokens drafts a step (at most,
    or "auto": the cost model's choice); with recurrent layers, their states rolled back
    after a rejection."""
    sched = built.config.scheduler
    if sched.speculative is None:
        return None
    context = DraftContext(built.model, built.kv_cache, sched.draft_layers, sched.draft_model,
                           functools.partial(_draft_engine, built))  # fmt: skip
    proposer = PROPOSERS.get(sched.speculative, where="speculative")(context)
    riding = getattr(proposer, "riding_cache", None)  # (mtp's KV: with the pool's blocks)
    if riding is not None and built.kv_tiers is not None:
        built.kv_tiers.carry(riding)
    states = built.kv_cache.states  # recurrent layers: their state rolled back on rejection
    rollback = StateRollback(states) if states is not None else None
    return Speculator(proposer, sched.max_drafts, sched.num_speculative_tokens == "auto", rollback)


def press_blockers(built: Built, press: str | None = None) -> list[str]:
    """Why a KV press (`press`: that row, a budgeted one's rule too) cannot run on this
    engine: the cache it compacts must hold per-head K and V pages it can move (not a latent
    MLA entry, not a block-quantized format's own stores), no recurrent states, no
    sparse-decode summaries, no draft cache following the target's positions, and no
    speculation under a press that evicts during decode (rejected drafts' queries would
    count). Empty: it can."""
    cache, kv_cache, speculator = built.config.cache, built.kv_cache, built.speculator
    budgeted = press is not None and PRESSES.get(press, where="kv_press").budgeted
    return [
        what
        for what, bad in (
            ("recurrent layers", kv_cache.states is not None),
            ("tensor parallelism", built.model.tp is not None),
            ("a latent (MLA) cache", built.model_config.cache_shape[0] == 1),
            (f"kv_format {cache.kv_format!r} (its own block stores)", not kv_cache.pages_movable),
            ("sparse_decode_blocks", cache.sparse_decode_blocks is not None),
            (
                f"speculative={built.config.scheduler.speculative!r} (a draft KV cache)",
                speculator is not None and speculator.proposer.own_cache,
            ),
            (
                "speculative decoding (a press that evicts during decode)",
                speculator is not None and budgeted,
            ),
        )
        if bad
    ]


def _check_press(built: Built) -> None:
    """kv_press set engine-wide: a clear error when it cannot run (press_blockers)."""
    cache = built.config.cache
    if cache.kv_press is None:
        return
    problems = press_blockers(built, cache.kv_press)
    if problems:
        raise ConfigError(
            "the KV press cannot run with " + ", ".join(problems),
            where="kv_press",
            found=cache.kv_press,
            expected="an attention model (MHA / GQA / MQA) with the engine dtype's or "
            "fp8_e4m3 KV cache, dense decode, and no draft model or MTP speculation; or "
            "kv_press None",
        )


def _draft_block_bytes(built: Built, dtype_bytes: int) -> float:
    """A draft model's or MTP layer's KV bytes per block (draft_model, speculative="mtp":
    its cache has the target's blocks, inside the same budget), 0 without one."""
    sched, cache = built.config.scheduler, built.config.cache
    if sched.speculative == "mtp":
        draft = mtp_cache_config(built.model_config)
    elif sched.draft_model is None:
        return 0.0
    elif sched.draft_model.startswith(SELF):
        draft = built.model_config
    else:
        draft = read_model_config(sched.draft_model)
    plain = dataclasses.replace(cache, kv_format=None)  # (the draft's cache: the dtype's)
    return page_bytes(cache_groups(draft), bytes_per_token(plain, draft, dtype_bytes),
                      cache.block_size)  # fmt: skip


def _draft_engine(built: Built, name: str) -> tuple[Transformer, PagedKVCache]:
    """The `draft` proposer's model and KV cache (engine/spec/draft.py): the checkpoint
    `name`, or the target's own in the weight scheme after "self:", built as an engine is,
    with the target's number of blocks and no tiers, speculation or quantization of its own
    beyond the scheme."""
    config = built.config
    path, weights = name, None
    if name.startswith(SELF):
        path, weights = str(built.checkpoint_path), name[len(SELF) :]
    cache = dataclasses.replace(
        config.cache, num_blocks=built.kv_cache.num_blocks, offload_memory_bytes=None,
        offload_dir=None, kv_format=None, sparse_decode_blocks=None,
    )  # fmt: skip
    draft = build(
        dataclasses.replace(
            config,
            model=path,
            cache=cache,
            scheduler=dataclasses.replace(config.scheduler, speculative=None, draft_model=None),
            quant=QuantConfig(weights=weights),
        )
    )
    return draft.model, draft.kv_cache


def _capture(built: Built) -> None:
    """On a GPU: decode steps recorded as CUDA graphs per batch-size bucket (models/
    cuda_graphs.py); the time it took is reported now, and kept in `graph_capture`."""
    model = built.model
    if model.fast_path != "cuda_graphs":
        return
    runner = model.fast_path_for(built.kv_cache)
    if runner is None:  # layers the graphs cannot run (experts, recurrent states, ...)
        model.fast_path = None
        return
    sizes = buckets(built.config.scheduler.max_num_seqs)
    seconds = runner.capture(sizes, built.max_model_len)
    built.graph_capture = GraphCapture(tuple(sizes), seconds)
    print(
        f"infergen: captured CUDA graphs for decode batches {sizes[0]}..{sizes[-1]} "
        f"({len(sizes)} sizes) in {seconds:.1f} s",
        file=sys.stderr,
    )


def records_graphs(config: EngineConfig) -> bool:
    """Decode steps replay CUDA graphs: on a GPU, unless enforce_eager or compiled layers."""
    return (
        config.device != "cpu" and not config.compile.enforce_eager and config.compile.mode == "off"
    )


def _to_device(built: Built) -> None:
    """On a GPU: the model, built and quantized on the host, moves there (the host copies
    go), its KV budget is what gpu_memory_utilization leaves (unless kv_cache_memory is
    given), and decode steps take the CUDA-graph path unless enforce_eager."""
    config = built.config
    if config.device == "cpu":
        return
    built.model.to(torch.device(config.device))
    built.model.fast_path = "cuda_graphs" if records_graphs(config) else None
    if config.cache.memory_bytes is None and config.cache.num_blocks is None:
        dtype_bytes = torch.finfo(DTYPES[config.dtype]).bits // 8
        budget = gpu_kv_budget(config, built.model_config, dtype_bytes)
        cache = dataclasses.replace(config.cache, memory_bytes=budget)
        built.config = dataclasses.replace(config, cache=cache)


def _checkpoint(config: EngineConfig, checkpoint: Checkpoint | None) -> Checkpoint:
    weights = config.quant.weights
    keep_blocks = weights is not None and WEIGHT_SCHEMES.get(weights).keep_blocks
    checkpoint = checkpoint or load_checkpoint(config.model, keep_blocks=keep_blocks)
    if keep_blocks and not any(isinstance(t, BlockWeight) for t in checkpoint.tensors.values()):
        raise ConfigError(
            f"weights {weights!r} runs a GGUF file's Q4_0 / Q4_1 / Q8_0 blocks as "
            "loaded, and this checkpoint has none",
            where=str(checkpoint.path),
            expected="a GGUF file with Q4_0 / Q4_1 / Q8_0 tensors, or a scheme that "
            "quantizes (e.g. 'q4_1', 'int4', 'int8')",
        )
    return checkpoint


def _streaming(model: ModelConfig, config: EngineConfig) -> ModelConfig:
    """With `streaming_window` (StreamingLLM): every attention layer reads the last
    `streaming_window` positions and the first `streaming_sinks`; blocks in between go back
    to the pool, so a sequence's cache stays bounded however long it runs. Positions are not
    re-numbered (RoPE sees the true distance; the context stays capped at the model's)."""
    policy = config.attention
    if policy.streaming_window is None:
        return model
    if model.sliding_window is not None:
        raise ConfigError(
            "streaming_window applies to models without their own sliding windows",
            where="streaming_window",
            found=f"{model.architecture} with sliding_window {model.sliding_window}",
            expected="None for this model",
        )
    return model.replace(
        sliding_window=policy.streaming_window,
        layer_types=tuple(
            "sliding_attention" if model.has_kv(i) else model.layer_type(i)
            for i in range(model.num_hidden_layers)
        ),
        sink_tokens=policy.streaming_sinks,
    )


def _quantize(built: Built, checkpoint: Checkpoint, run, progress: bool, keep_dense: bool):
    """The checkpoint's own activation scheme and static scales, or calibrated quantization."""
    quant, model = built.config.quant, built.model
    if checkpoint.activations is not None:
        if quant.activations not in (None, checkpoint.activations):
            raise ConfigError(
                "the checkpoint's input activations are quantized by another scheme",
                where="activations",
                found=quant.activations,
                expected=f"{checkpoint.activations!r} or None (the checkpoint's)",
            )
        quant = dataclasses.replace(quant, activations=checkpoint.activations)
        built.config = dataclasses.replace(built.config, quant=quant)
        load_activation_scales(
            model, quant.activations, checkpoint.input_scales, str(checkpoint.path)
        )
    elif quant.activations is not None or rewrites_weights(quant):
        sequences = calibration_sequences(
            built.tokenizer,
            built.model_config.vocab_size,
            built.max_model_len,
            text=quant.calibration_text,
        )
        built.calibration = quantize_calibrated(
            run, model, quant, sequences, progress, keep_dense=keep_dense
        )


def _check_fallbacks(model: Transformer, config: EngineConfig) -> dict[str, tuple[float, float]]:
    """The load-time check's verdicts (layers/probe.py): {projection: (error, limit)} of those
    kept at full precision; with on_bad_layer="refuse", an error naming them instead."""
    bad = {name: m.fallback for name, m in model.named_modules() if getattr(m, "fallback", None)}
    if not bad:
        return bad
    weights = config.quant.weights
    listing = ", ".join(f"{name} ({err:.3g} > {limit:.3g})" for name, (err, limit) in bad.items())
    if config.quant.on_bad_layer == "refuse":
        raise ConfigError(
            f"weights {weights!r}: the load-time probe of some projections is far above "
            "the scheme's error level",
            found=listing,
            expected="probe error (mean per-channel relative error) within the limit",
            hint="on_bad_layer='fallback' keeps those projections at full precision",
        )
    warnings.warn(
        f"weights {weights!r}: kept at full precision (load-time probe error above the "
        f"scheme's limit): {listing}",
        stacklevel=4,
    )
    return bad


def _kv_scales(built: Built, checkpoint: Checkpoint, run) -> tuple | None:
    """(scales, key shift) of a scaled KV format: the checkpoint's (keys unshifted) or
    calibrated on the model's own K / V; None for other formats."""
    cache = built.config.cache
    if checkpoint.kv_scales is not None:
        if cache.kv_format not in (None, "fp8_e4m3"):
            raise ConfigError(
                "the checkpoint carries FP8 KV cache scales",
                where="kv_format",
                found=cache.kv_format,
                expected="fp8_e4m3 or None (the checkpoint's scheme)",
            )
        cache = dataclasses.replace(cache, kv_format="fp8_e4m3")
        built.config = dataclasses.replace(built.config, cache=cache)
        scales = checkpoint.kv_scales  # [layers, K / V, KV heads]
        shard = built.model.shard
        if shard is not None:  # a tensor-parallel rank: its own KV heads' scales
            scales = scales[:, :, shard.kv_heads[0] : shard.kv_heads[1]].contiguous()
        layers, _, heads = scales.shape
        return scales, torch.zeros(layers, heads, built.model_config.head_dim)
    fmt = kv_format_of(cache.kv_format)
    if fmt.calibrate:  # per-head scales from the model's own K / V: a model the format takes
        model_config = built.model_config
        windowed = any(group.window for group in cache_groups(model_config))
        fmt.check(model_config, windowed, bool(built.model.state_layers))
        return calibrate_kv_scales(
            run,
            built.tokenizer,
            built.model_config.vocab_size,
            built.max_model_len,
            cache.kv_format,
        )
    return None


def _cache(built: Built, dtype: torch.dtype, scales: tuple | None) -> PagedKVCache:
    """The KV pool, as many blocks as the budget holds after the recurrent layers' state slots
    (one per running sequence, + one for scoring) and, for a block-quantized format, fp32
    tails for every block a step writes (each running sequence's last block, the blocks a
    prefill chunk completes, + one for scoring); sparse decode's summaries wired in."""
    config, model = built.config, built.model
    cache, sched = config.cache, config.scheduler
    tails = sched.max_num_seqs + sched.max_num_batched_tokens // cache.block_size + 2
    slots = slots_for(sched.max_num_seqs) if model.state_layers else 0
    state_bytes = slots * StateCache.bytes_per_slot(model.state_layers)
    dtype_bytes = torch.finfo(dtype).bits // 8
    num_blocks = blocks_for(
        cache, built.model_config, dtype_bytes, tails, reserved_bytes=state_bytes,
        extra_block_bytes=_draft_block_bytes(built, dtype_bytes), groups=model.cache_groups,
    )  # fmt: skip
    if model.tp is not None:  # (the ranks hold different heads: every rank's pool has as
        num_blocks = model.tp.minimum(num_blocks)  # many blocks as the fullest one's budget)
    spare = records_graphs(config)  # a block for the padded rows of captured steps
    if spare and cache.num_blocks is None:
        num_blocks -= 1  # ... inside the budget
    kv_cache = PagedKVCache(
        built.model_config,
        num_blocks,
        cache.block_size,
        dtype,
        cache.kv_format,
        tails,
        model.state_layers,
        slots,
        cache.sparse_decode_blocks is not None,
        config.device,
        spare,
        model.cache_groups,
    )  # fmt: skip
    if cache.sparse_decode_blocks is not None:
        for i, layer in enumerate(model.layers):
            summary = kv_cache.layer(i).summary
            layer.attn.use_sparse_decode(
                summary, cache.sparse_decode_blocks, cache.sparse_keep_first
            )
    if scales is not None:
        check_kv_scales(scales[0], where=f"kv_format {cache.kv_format!r} scales")
        kv_cache.scales.copy_(scales[0])
        kv_cache.k_shift.copy_(scales[1])
    return kv_cache


def _tiers(built: Built) -> KVTiers | None:
    """The KV tiers below the pool (kv_offload_memory, kv_offload_dir): None without them;
    blocks stored as kv_offload_format says (tiers/compact.py). Recurrent layers' state
    checkpoints spill there too (`_state_checkpoints`)."""
    cache = built.config.cache
    if cache.offload_memory_bytes is None and cache.offload_dir is None:
        if cache.offload_format is not None:
            raise ConfigError(
                "kv_offload_format says how the KV tiers store blocks, and there are none",
                where="kv_offload_format",
                found=cache.offload_format,
                expected="kv_offload_memory and / or kv_offload_dir with it",
            )
        return None
    codec = offload_format_of(cache.offload_format)  # an unknown name: the error now
    built.kv_cache.block_data(0)  # a KV format the tiers cannot move: the error now
    codec.check(built.kv_cache)  # before a disk tier is opened
    disk = None
    if cache.offload_dir is not None:
        disk = DiskTier(cache.offload_dir, cache.offload_disk_bytes, fingerprint(built))
    tiers: list = []
    copies = host_copies(built.kv_cache.device)  # one side stream on a GPU (tiers/copies.py)
    if cache.offload_memory_bytes is not None:
        spill = disk.put if disk is not None else None
        tiers.append(HostTier(cache.offload_memory_bytes, spill, copies))
    if disk is not None:
        tiers.append(disk)
    return KVTiers(built.kv_cache, tiers, cache.offload_write_through, codec, copies)


def _state_checkpoints(built: Built) -> StateCheckpoints | None:
    """The prefix checkpoints (kvcache/state_checkpoints.py): recurrent layers' states, and
    partial blocks (an attention-only model's tails). With prefix caching on, a budget, and a
    KV format whose blocks can be copied (the partial block goes with a checkpoint); tails
    also not with per-block key summaries (sparse decode: a restored block's would be empty).
    Their evictions spill to the KV tiers."""
    cache, kv_cache = built.config.cache, built.kv_cache
    if not cache.enable_prefix_caching or not cache.state_checkpoint_bytes:
        return None
    if kv_cache.groups and not kv_cache.pages_movable:
        return None
    if kv_cache.states is None and kv_cache.summaries:
        return None
    if built.model.tp is not None:  # (a tail is restored into rank 0's pages only: not yet)
        return None
    tiers = built.kv_tiers
    return StateCheckpoints(
        kv_cache,
        cache.state_checkpoint_bytes,
        spill=tiers.save_state if tiers is not None else None,
        fetch=tiers.load_state if tiers is not None else None,
        through=tiers.save_state_through if tiers is not None and tiers.write_through else None,
    )


def fingerprint(built: Built) -> str:
    """What a stored block's contents depend on: the model (its config and a sample of every
    weight), the KV format and dtype, the block layout, the offload format. Blocks of another
    fingerprint are never served."""
    digest = hashlib.blake2b(digest_size=16)
    config = built.config
    digest.update(repr(dataclasses.replace(built.model_config, source="")).encode())
    digest.update(repr((config.dtype, config.cache.kv_format, config.cache.block_size,
                        config.quant, config.attention)).encode())  # fmt: skip
    if config.cache.offload_format is not None:  # how the blocks are stored (none: as before)
        digest.update(f"offload_format={config.cache.offload_format}".encode())
    if config.scheduler.speculative == "mtp":  # its layer's KV rides with each block (riders)
        digest.update(b"riders=mtp")
    for name, tensor in built.model.state_dict().items():
        sample = tensor.detach().flatten()[:64].to("cpu").contiguous()
        digest.update(name.encode() + sample.view(torch.uint8).numpy().tobytes())
    scales = built.kv_cache.scales
    if scales is not None:
        digest.update(scales.to("cpu").numpy().tobytes())
    return digest.hexdigest()


def _compile(built: Built) -> None:
    """The decoder layers through the compiler (compile != "off": the FAST_PATHS row of that
    name, built now on the real cache; calibration ran on the default fast path). It replaces
    the fast path `_to_device` chose: on a GPU the compiled layers run every step (fused
    groups as Triton kernels with kernels="triton"), and no CUDA graphs are captured."""
    mode, model = built.config.compile.mode, built.model
    if mode == "off":
        return
    if built.config.cache.sparse_decode_blocks is not None:
        raise ConfigError(
            "the compiled layers do not run sparse decode",
            where="compile",
            found=f"compile={mode!r} with sparse_decode_blocks",
            expected="compile='off' with sparse decode",
        )
    path = FAST_PATHS.get(mode)
    if not path.supports(model):
        # layers with features the compiler has no ops or fallback for run the per-op path,
        # and the compile report says so and why (the fast path _to_device chose stays)
        layers = len(model.layers)
        built.compile_report = runtime.CompileReport(
            groups_op_by_op=[
                f"all {layers} layers of {built.model_config.architecture}: the per-op path "
                f"(the compiler has no ops for their {', '.join(path.missing(model))})"
            ]
        )
        return
    if mode == "jit" and built.config.compile.budget_s is not None:
        built.compile_plan = _startup_plan(built)
        model.jit_cached_only = True  # the rest runs op by op
    model.fast_path = mode
    built.compile_report = model.fast_path_for(built.kv_cache).report


def _startup_plan(built: Built) -> list:
    """compile_budget_s: build and tune within the budget under the traffic mix (recorded by a
    server for this checkpoint, or given), and log the plan."""
    config = built.config.compile
    if getattr(built.model, "kernels", "native") == "triton":
        raise ConfigError(
            "compile_budget_s plans the C kernels; the Triton ones compile at their first launch",
            where="compile_budget_s",
            found="kernels='triton'",
            expected="compile_budget_s unset with kernels='triton'",
        )
    if config.traffic == "recorded":
        recorded = TrafficRecord.for_model(str(built.checkpoint_path)).mix()
        traffic, source = (recorded, "recorded") if recorded else (DEFAULT_TRAFFIC, "default")
    else:
        try:
            traffic, source = parse_traffic(config.traffic), "given"
        except ValueError as error:
            raise ConfigError(str(error), where="compile_traffic") from None
    items = plan_startup(built.model, built.kv_cache, traffic, config.budget_s, runtime.JitCache())
    mix = ",".join(f"{b}={w:.2g}" for b, w in traffic.items())
    print(f"infergen: startup compile plan (budget {config.budget_s:g} s, {source} traffic "
          f"{mix})", *plan_lines(items), sep="\n  ", file=sys.stderr)  # fmt: skip
    return items
