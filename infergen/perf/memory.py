"""Where a deployment's device memory goes: weights, an activation workspace, and the KV cache
that takes the rest; and what one sequence's KV costs on a device.

Per device of a tensor/expert-parallel group: non-expert weights split tp ways, routed
experts ep ways (tp ways without expert parallelism); KV heads split tp ways (fewer KV heads
than devices are replicated; MLA's latent is replicated on every device). The activation
workspace is an estimate: the widest intermediate of a full token budget (two live buffers)
plus fp32 logits for every sequence of a step. The KV cache gets what remains of
`utilization` x memory, as vLLM's gpu_memory_utilization, and is cut into the engine's pool
of blocks (`kv_pool`).
"""

from __future__ import annotations

from dataclasses import dataclass

from infergen.config.description import MLA, Attention, Dense, ModelDesc, MoE, mixer_parts
from infergen.errors import ConfigError
from infergen.kvcache.groups import CacheGroup, group_layers, page_bytes
from infergen.kvcache.state_cache import slots_for
from infergen.perf.hardware import Hardware
from infergen.perf.step_cost import Formats, Parallel


@dataclass(frozen=True)
class MemoryPlan:
    device_bytes: float
    usable_bytes: float
    weight_bytes: float  # per device
    activation_bytes: float
    kv_capacity_bytes: float

    def as_dict(self) -> dict:
        return {
            "device_bytes": self.device_bytes,
            "usable_bytes": self.usable_bytes,
            "weights": self.weight_bytes,
            "activations": self.activation_bytes,
            "kv_cache": self.kv_capacity_bytes,
        }


def weight_bytes_per_device(desc: ModelDesc, fmt: Formats, par: Parallel) -> float:
    expert_bits = fmt.expert_weight_bits or fmt.weight_bits
    experts = desc.routed_expert_params() * expert_bits / 8
    rest = desc.weight_bytes(fmt.weight_bits, expert_bits) - experts
    return rest / par.tp + experts / (par.ep if par.ep > 1 else par.tp)


def activation_bytes(desc: ModelDesc, fmt: Formats, par: Parallel, tokens: int, seqs: int):
    widest = desc.hidden
    for layer in desc.layers:
        f = layer.ffn
        for m in mixer_parts(layer.mixer):
            if isinstance(m, Attention):
                widest = max(widest, (m.q_proj_size + 2 * m.kv_heads * m.head_dim) // par.tp)
            elif isinstance(m, MLA):
                widest = max(widest, m.heads * (m.qk_nope_head_dim + m.v_head_dim) // par.tp)
        if isinstance(f, Dense):
            widest = max(widest, 2 * f.intermediate // par.tp)
        elif isinstance(f, MoE):
            widest = max(widest, 2 * f.intermediate * f.top_k)
    return 2 * tokens * widest * max(fmt.act_bytes, 2) + seqs * desc.vocab * 4 / par.tp


def kv_share(desc: ModelDesc, par: Parallel) -> float:
    """Fraction of a token's KV bytes that one device of the tp group holds."""
    total = per_device = 0.0
    for layer in desc.layers:
        for m in mixer_parts(layer.mixer):
            elements = m.kv_elements_per_token()
            total += elements
            if isinstance(m, Attention):
                per_device += elements * max(1, -(-m.kv_heads // par.tp)) / m.kv_heads
            else:
                per_device += elements
    return per_device / total if total else 1.0


@dataclass(frozen=True)
class PoolShape:
    """The engine's KV pool on one device (engine/build.py's rule): a recurrent-state slot
    per sequence the batch can hold is set aside first, the rest is pages of `block_size`
    tokens of one cache group's layers (kvcache/groups.py)."""

    num_blocks: int
    groups: tuple[CacheGroup, ...]
    block_size: int = 16
    state_slots: int | None = None  # None: no recurrent layers
    page_bytes: float = 0.0  # bytes of one page (what a KV tier stores per block)
    state_bytes: float = 0.0  # one sequence's recurrent state (fp32) on this device


def kv_pool(
    desc: ModelDesc,
    fmt: Formats,
    par: Parallel,
    capacity: float,
    block_size: int,
    max_num_seqs: int,
    num_blocks: int | None = None,
) -> PoolShape:
    """The pool `capacity` KV bytes per device buy, or of exactly `num_blocks` blocks (the
    engine's num_kv_blocks; `capacity` unused)."""
    windows = {
        i: layer.mixer.window
        for i, layer in enumerate(desc.layers)
        if layer.mixer.kv_elements_per_token()
    }
    groups = group_layers(windows)
    state = desc.state_bytes_per_sequence(4.0) / par.tp
    slots = slots_for(max_num_seqs) if state else None
    budget = capacity - (slots or 0) * state
    per_token = desc.kv_bytes_per_token(fmt.kv_bits / 8) * kv_share(desc, par)
    per_page = page_bytes(groups, per_token, block_size) if groups else 0.0
    if num_blocks is not None:
        return PoolShape(num_blocks, groups, block_size, slots, per_page, state)
    num_blocks = int(budget // per_page) if per_page else 1  # no attention: one unused block
    if budget <= 0 or num_blocks < 1:
        raise _no_block(capacity, per_page, state, slots)
    return PoolShape(num_blocks, groups, block_size, slots, per_page, state)


def _no_block(capacity: float, per_page: float, state: float, slots: int | None) -> ConfigError:
    """A KV budget without room for one block after the recurrent-state slots."""
    if not slots:
        return ConfigError(
            "the KV cache cannot hold one block",
            where="--kv-memory / --memory-util",
            found=f"{capacity / 2**20:.1f} MiB",
            expected=f">= {per_page / 2**20:.2f} MiB",
        )
    most = int((capacity - per_page) // state) - slots_for(0)  # slots_for(n) = n + slots_for(0)
    return ConfigError(
        "the KV cache cannot hold one block after the recurrent-state slots (one per sequence "
        "the batch may hold, set aside first as the engine does)",
        where="--max-num-seqs / --kv-memory",
        found=f"{capacity / 2**20:.1f} MiB of KV cache, {slots} slots of {state / 2**20:.1f} MiB",
        expected=f"--max-num-seqs <= {max(0, most)} or a larger KV cache",
    )


def plan(
    desc: ModelDesc,
    hw: Hardware,
    fmt: Formats,
    par: Parallel,
    max_tokens: int,
    max_seqs: int,
    utilization: float = 0.9,
    kv_capacity: float | None = None,
) -> MemoryPlan:
    """The memory plan of one device; `kv_capacity` overrides the KV cache size (bytes)."""
    if not 0 < utilization <= 1:
        raise ConfigError(
            "memory utilization must be in (0, 1]", found=utilization, where="--memory-util"
        )
    usable = hw.memory_bytes * utilization
    weights = weight_bytes_per_device(desc, fmt, par)
    activations = activation_bytes(desc, fmt, par, max_tokens, max_seqs)
    kv = usable - weights - activations if kv_capacity is None else kv_capacity
    if kv <= 0:
        raise ConfigError(
            f"{desc.name} does not fit on {hw.name}: {weights / 1e9:.1f} GB of weights and "
            f"{activations / 1e9:.1f} GB of activations per device leave no KV cache in "
            f"{usable / 1e9:.1f} GB",
            where="--gpu / --tp / --weights",
            expected="more devices (--tp), a narrower weight format or a larger GPU",
        )
    return MemoryPlan(hw.memory_bytes, usable, weights, activations, kv)
