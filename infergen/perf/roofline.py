"""Time of a step's ops on a device: each op is bound by compute or by memory, whichever takes
longer at the device's peak scaled by an efficiency for the op's kind, plus a fixed overhead
per op launch (a kernel launch on a GPU, a parallel region on a CPU).

The efficiencies here are one number per op kind (first step of issue 5). Per-shape efficiency
curves fitted to measurements replace them next; until then `explain` shows which bound each
op hits, so a reader sees where a prediction can be wrong.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from infergen.perf.hardware import Hardware
from infergen.perf.model_desc import ModelDesc
from infergen.perf.step_cost import Chunk, Formats, OpCost, step_ops


@dataclass(frozen=True)
class Efficiency:
    """Fraction of peak FLOP/s and of peak bandwidth an op kind reaches."""

    compute: dict[str, float] = field(default_factory=dict)
    memory: dict[str, float] = field(default_factory=dict)
    overhead_s: float = 0.0  # per launch

    def of(self, kind: str) -> tuple[float, float]:
        return self.compute.get(kind, 1.0), self.memory.get(kind, 1.0)


@dataclass(frozen=True)
class OpTime:
    name: str
    kind: str
    compute_s: float
    memory_s: float
    overhead_s: float

    @property
    def seconds(self) -> float:
        return max(self.compute_s, self.memory_s) + self.overhead_s

    @property
    def bound(self) -> str:
        if self.overhead_s > max(self.compute_s, self.memory_s):
            return "overhead"
        return "compute" if self.compute_s >= self.memory_s else "memory"


def op_times(
    ops: list[OpCost],
    hw: Hardware,
    compute_format: str,
    eff: Efficiency = Efficiency(),
    launches: int = 0,
) -> list[OpTime]:
    """Per-op times, plus one "launch overhead" line for the step's `launches` op launches."""
    peak = hw.peak_flops(compute_format)
    times = []
    for o in ops:
        ce, me = eff.of(o.kind)
        if o.kind == "gemm":
            ce *= hw.gemm_efficiency_at(o.rows)
        times.append(
            OpTime(o.name, o.kind, o.flops / (peak * ce), o.bytes / (hw.bandwidth * me), 0.0)
        )
    if launches and eff.overhead_s > 0:
        times.append(OpTime("launch overhead", "overhead", 0.0, 0.0, launches * eff.overhead_s))
    return times


def launches(desc: ModelDesc) -> int:
    """Op launches of a step: one per op of each layer (norm, qkv, attention, o, norm, up,
    activation, down: the fused decode's parallel regions are about six), plus embedding and
    LM head."""
    return 6 * len(desc.layers) + 2


def predict_step(
    desc: ModelDesc, hw: Hardware, chunks: list[Chunk], fmt: Formats, compute_format: str
) -> list[OpTime]:
    """Op times of one step of `desc` on `hw` for the batch `chunks`."""
    eff = Efficiency(overhead_s=hw.launch_overhead_s)
    return op_times(step_ops(desc, chunks, fmt), hw, compute_format, eff, launches(desc))


def step_seconds(times: list[OpTime]) -> float:
    return sum(t.seconds for t in times)


def explain(times: list[OpTime]) -> str:
    total = step_seconds(times) or 1.0
    rows = [f"{'op':<16} {'kind':<10} {'ms':>9} {'share':>6}  bound"]
    for t in sorted(times, key=lambda t: -t.seconds):
        rows.append(
            f"{t.name:<16} {t.kind:<10} {t.seconds * 1e3:9.3f} {100 * t.seconds / total:5.1f}%  "
            f"{t.bound}"
        )
    rows.append(f"{'step':<16} {'':<10} {total * 1e3:9.3f}")
    return "\n".join(rows)
