"""Where a deployment's device memory goes: weights, an activation workspace, and the KV cache
that takes the rest; and what one sequence's KV costs on a device.

Per device of a tensor/expert-parallel group: non-expert weights split tp ways, routed
experts ep ways (tp ways without expert parallelism); KV heads split tp ways (fewer KV heads
than devices are replicated; MLA's latent is replicated on every device). The activation
workspace is an estimate: the widest intermediate of a full token budget (two live buffers)
plus fp32 logits for every sequence of a step. The KV cache gets what remains of
`utilization` x memory, as vLLM's gpu_memory_utilization.
"""

from __future__ import annotations

from dataclasses import dataclass

from infergen.config.description import MLA, Attention, Dense, ModelDesc, MoE, mixer_parts
from infergen.errors import ConfigError
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


def sequence_bytes(desc: ModelDesc, fmt: Formats, par: Parallel):
    """tokens -> KV (+ recurrent state) bytes one sequence holds on one device."""
    share = kv_share(desc, par)
    state = desc.state_bytes_per_sequence(4.0) / par.tp
    kv_bytes = fmt.kv_bits / 8

    def of(tokens: int) -> float:
        if tokens <= 0:
            return 0.0
        return desc.kv_bytes_for_context(tokens, kv_bytes) * share + state

    return of


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
