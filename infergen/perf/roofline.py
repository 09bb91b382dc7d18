"""Time of a step's ops on a device: each op is bound by compute, memory or the interconnect,
whichever takes longest at the device's peak scaled by an efficiency, plus a fixed overhead per
op launch (a kernel launch on a GPU, a parallel region on a CPU) and per step (the host's
scheduling and sampling).

Efficiencies come from the hardware row: one compute and one memory fraction per device (its
global calibration, e.g. an H200's measured 790 of 989 TFLOP/s and 4.3 of 4.8 TB/s, or, on a
GPU nobody calibrated, those borrowed from one that was: hardware.py), and for GEMMs a curve by
row count where one was measured (`infergen perf calibrate`). Every fraction is at most 1, so
no op runs faster than the row's peaks (tests/perf/test_peak_invariant.py). `explain` shows
which bound each op hits, so a reader sees where a prediction can be wrong.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from infergen.config.description import ModelDesc
from infergen.errors import ConfigError
from infergen.perf.eager import eager_seconds, fused_decode_covers
from infergen.perf.hardware import Hardware
from infergen.perf.step_cost import (
    VERIFY_ATTENTION,
    Chunk,
    Formats,
    OpCost,
    Parallel,
    step_ops,
)

FALLBACK = {VERIFY_ATTENTION: "attention"}  # an op kind's efficiency where its own is absent


@dataclass(frozen=True)
class Efficiency:
    """Fraction of peak FLOP/s and of peak bandwidth an op kind reaches."""

    compute: dict[str, float] = field(default_factory=dict)
    memory: dict[str, float] = field(default_factory=dict)
    overhead_s: float = 0.0  # per launch
    default_compute: float = 1.0  # kinds not in `compute`
    default_memory: float = 1.0

    def of(self, kind: str) -> tuple[float, float]:
        """(compute, memory) fractions of `kind`: its own, else its FALLBACK kind's (a
        verifying decode's attention where only decode attention was measured), else the
        defaults."""
        near = FALLBACK.get(kind, kind)
        return (
            self.compute.get(kind, self.compute.get(near, self.default_compute)),
            self.memory.get(kind, self.memory.get(near, self.default_memory)),
        )

    @classmethod
    def of_hardware(cls, hw: Hardware, compute_format: str) -> Efficiency:
        return cls(
            compute=dict(hw.compute_efficiency_by_kind),
            memory=dict(hw.memory_efficiency_by_kind),
            overhead_s=hw.launch_overhead_s,
            default_compute=hw.compute_efficiency_for(compute_format),
            default_memory=hw.memory_efficiency,
        )


@dataclass(frozen=True)
class OpTime:
    name: str
    kind: str
    compute_s: float
    memory_s: float
    overhead_s: float
    link_s: float = 0.0

    @property
    def seconds(self) -> float:
        return max(self.compute_s, self.memory_s, self.link_s) + self.overhead_s

    @property
    def bound(self) -> str:
        if self.overhead_s > max(self.compute_s, self.memory_s, self.link_s):
            return "overhead"
        if self.link_s > max(self.compute_s, self.memory_s):
            return "interconnect"
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
        if o.kind == "comm":
            times.append(OpTime(o.name, o.kind, 0.0, 0.0, 0.0, _link_seconds(o, hw)))
            continue
        if o.kind == "gemm":
            ce *= hw.gemm_efficiency_at(o.rows, o.call_weight_bytes)
        times.append(
            OpTime(o.name, o.kind, o.flops / (peak * ce), o.bytes / (hw.bandwidth * me), 0.0)
        )
    if launches and eff.overhead_s > 0:
        times.append(OpTime("launch overhead", "overhead", 0.0, 0.0, launches * eff.overhead_s))
    return times


def _link_seconds(o: OpCost, hw: Hardware) -> float:
    """Bytes over one direction of the link (the table's NVLink figure is both directions
    together) plus a latency per collective."""
    if not o.bytes:
        return 0.0
    if not hw.interconnect:
        raise ConfigError(
            f"{hw.name} has no interconnect for {o.name}",
            where=f"hardware.{hw.name}.interconnect",
            expected="a device with NVLink for --tp/--ep > 1 (cpu-local: `infergen perf "
            "calibrate` measures its link between processes)",
        )
    return collective_seconds(hw, o.bytes, o.calls)


def collective_seconds(hw: Hardware, nbytes: float, calls: int = 1) -> float:
    """`calls` collectives moving `nbytes` in all over `hw`'s link: on its measured curve
    (each call's share of the bytes), else a latency each plus the bytes at its bandwidth."""
    if hw.link_curve and calls:
        return calls * curve_seconds(hw.link_curve, nbytes / calls, hw.interconnect)
    return nbytes / (hw.interconnect / 2) + calls * hw.link_latency_s


def curve_seconds(curve: dict[int, float], nbytes: float, interconnect: float) -> float:
    """A collective of `nbytes` on a measured curve ({bytes: seconds}): linear between its
    points, the smallest point's time below it, and beyond the largest, that point's time
    plus the rest of the bytes at the link's bandwidth."""
    points = sorted(curve.items())
    if nbytes <= points[0][0]:
        return points[0][1]
    for (b0, t0), (b1, t1) in zip(points, points[1:], strict=False):
        if nbytes <= b1:
            return t0 + (t1 - t0) * (nbytes - b0) / (b1 - b0)
    last_bytes, last_s = points[-1]
    return last_s + (nbytes - last_bytes) / (interconnect / 2)


def link_seconds(
    desc: ModelDesc, hw: Hardware, chunks: list[Chunk], fmt: Formats, par: Parallel
) -> float:
    """The step's communication on `hw`'s link alone: its collectives' bytes and calls."""
    ops = step_ops(desc, chunks, fmt, par)
    return sum(_link_seconds(o, hw) for o in ops if o.kind == "comm")


HEAD_LAUNCHES = 2  # embedding and LM head


def launches(desc: ModelDesc) -> int:
    """Op launches of a step: one per op of each layer (norm, qkv, attention, o, norm, up,
    activation, down: the fused decode's parallel regions are about six), plus embedding and
    LM head."""
    return 6 * len(desc.layers) + HEAD_LAUNCHES


def predict_step(
    desc: ModelDesc,
    hw: Hardware,
    chunks: list[Chunk],
    fmt: Formats,
    compute_format: str,
    par: Parallel | None = None,
) -> list[OpTime]:
    """Op times of one step of `desc` on `hw` (per device of `par`) for the batch `chunks`,
    with the engine's host time (per step, plus per sequence) as a last line. A step with a
    chunk of several tokens (prefill; not a speculative verification, whose tokens are
    decode rows), or a decode the fused decode does not cover, runs op by op: where `hw`
    measured that (eager_layer_s), its layers cost that time ("op by op" line:
    perf/eager.py) plus the head's launches, instead of a launch count."""
    ops = step_ops(desc, chunks, fmt, par or Parallel())
    decode = all(c.new == 1 or c.verify for c in chunks)
    eff = Efficiency.of_hardware(hw, compute_format)
    if hw.eager_layer_s and not (decode and fused_decode_covers(desc)):
        times = op_times(ops, hw, compute_format, eff, HEAD_LAUNCHES)
        seconds = eager_seconds(desc, hw.eager_layer_s, decode)
        times.append(OpTime("op by op", "overhead", 0.0, 0.0, seconds))
    else:
        times = op_times(ops, hw, compute_format, eff, launches(desc))
    host = hw.step_overhead_s + hw.sequence_overhead_s * len(chunks)
    if host:
        times.append(OpTime("host overhead", "overhead", 0.0, 0.0, host))
    return times


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
