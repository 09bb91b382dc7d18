"""`infergen profile`'s table: torch.profiler events of the profiled steps → one row per
(op, kernel) pair, with FLOPs, bytes, achieved rates and the roofline.

The events (bench/profile.py records them) are the steps' regions "step:<phase>", the op
regions of the engine ("op:<op>[<key>] flops=.. bytes=..", infergen/profiling.py) and inside
them the kernels: native C kernels ("native::<function>"), generated ones ("jit::<name>"),
torch's ops ("aten::..."). Every microsecond of a profiled step goes to exactly one row:

- a kernel's whole time (its inclusive time: an aten op with the ops it calls) to the row of
  (its nearest enclosing op, its name); outside every op, to the pseudo-op "engine" (the
  runner building the batch, the sampler, ...);
- an op region's own time, between its kernels (Python, dispatch, allocation), to (op,
  "(python)"); the step region's own time to ("engine", "(host)": scheduling, sampling,
  detokenizing in Python).

On a GPU the rows are the device kernels each region launched (their device time) and
("engine", "(device idle)"): the profiled step's time no kernel ran.

An op's FLOPs and bytes (from its calls' labels) go to its main kernel: the one its calls
spent the most time in. A row's bound (ROOFLINE RULE): with t_compute = FLOPs / peak FLOP/s and
t_memory = bytes / bandwidth (the calibrated roofline), the row is "overhead" when its time is
more than OVERHEAD_FACTOR x max(t_compute, t_memory) (rows with no FLOPs or bytes: always),
else "compute" when t_compute >= t_memory, else "memory"; "% roof" = max(t_compute,
t_memory) / time (100 %: at the roofline).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field
from statistics import mean

from torch.autograd import DeviceType

from infergen.config.stored import compute_class
from infergen.profiling import parse

STEP = "step:"  # a profiled step's region: STEP + its phase
ENGINE = "engine"  # the pseudo-op of the time outside every op region
PYTHON = "(python)"  # an op region's own time, between its kernels
HOST = "(host)"  # the step's own time outside every kernel and op
IDLE = "(device idle)"  # a GPU step's time no kernel ran
OVERHEAD_FACTOR = 3.0  # a row's time over this many times its roofline bound: "overhead"


@dataclass(frozen=True)
class Roofline:
    """The machine's peaks a row is measured against: FLOP/s, bytes/s, and where they come
    from (a calibration, a hardware table row); `by_compute`: the FLOP/s of other compute
    classes where the row has them ("bf16", "int8": a bf16 or W8A8 product's own peak, e.g.
    AMX tiles' on a Xeon), `flops` for the rest."""

    flops: float
    bandwidth: float
    source: str
    by_compute: dict[str, float] = field(default_factory=dict)

    def flops_for(self, compute: str) -> float:
        """The peak a product of compute class `compute` is measured against."""
        return self.by_compute.get(compute, self.flops)


def compute_of(op: str, key: str) -> str:
    """A row's compute class from its region key: a linear product's "bf16" backend runs bf16
    products, an input quantizer ("... a=int8") its format's class; "" (the engine's
    dtype) for the rest."""
    if op != "linear":
        return ""
    fmt = key.split(" ", 1)[1] if " " in key else ""
    if " a=" in f" {fmt}":
        return compute_class(fmt.split("a=", 1)[1])
    return "bf16" if fmt == "bf16" else ""


@dataclass
class Row:
    op: str  # the op of its region ("linear"), or ENGINE
    key: str  # the region's key ("576->1728 native"; ENGINE: "")
    kernel: str  # "native::gemm_packed_f32", "aten::mm", PYTHON, HOST, IDLE, ...
    role: str = ""  # a linear row: the projections of its shape ("attn.qkv")
    calls: int = 0
    seconds: float = 0.0  # over every profiled step
    flops: int = 0
    bytes: int = 0

    @property
    def name(self) -> str:
        """The op as the table shows it: "linear[576->1728 native] attn.qkv"."""
        name = f"{self.op}[{self.key}]" if self.key else self.op
        return f"{name} {self.role}" if self.role else name

    @property
    def host(self) -> bool:
        """Time outside the kernels (PYTHON, HOST, IDLE)."""
        return self.kernel.startswith("(")

    def bound(self, roofline: Roofline | None) -> tuple[str, float | None]:
        """(bound, % of the roofline) by the module's ROOFLINE RULE ("-", None: no roofline)."""
        if roofline is None:
            return "-", None
        peak = roofline.flops_for(compute_of(self.op, self.key))
        ideal = max(self.flops / peak, self.bytes / roofline.bandwidth)
        share = 100 * ideal / self.seconds if self.seconds > 0 else None
        if ideal == 0 or self.seconds > OVERHEAD_FACTOR * ideal:
            return "overhead", share
        compute = self.flops / peak >= self.bytes / roofline.bandwidth
        return ("compute" if compute else "memory"), share


@dataclass
class PhaseResult:
    phase: str
    measured_s: list[float]  # each timed step's wall time (nothing recording)
    profiled_s: list[float]  # each profiled step's region time
    tokens_per_step: float
    rows: list[Row]
    roofline: Roofline | None = None
    device: bool = False  # rows are GPU kernels' device time
    # the C timers of the native call that runs the layers, seconds per step by phase or call
    # site (bench/profile.py CTimers), or None; `c_timers_of` says whose
    c_timers: dict[str, float] | None = None
    c_timers_of: str = ""

    @property
    def steps(self) -> int:
        return len(self.profiled_s)

    @property
    def measured_step_s(self) -> float:
        return mean(self.measured_s) if self.measured_s else 0.0

    @property
    def kernel_step_s(self) -> float:
        """The kernel rows' time per profiled step (host rows left out)."""
        return sum(r.seconds for r in self.rows if not r.host) / max(1, self.steps)

    @property
    def coverage(self) -> float:
        """Per-kernel times per step over the measured step time (the profile's target: within
        10 % of 1; below 1 by the host time between kernels, above by profiler overhead)."""
        return self.kernel_step_s / self.measured_step_s if self.measured_step_s else 0.0

    @property
    def rows_coverage(self) -> float:
        """Every row (host rows too: the whole profiled step) over the measured step time."""
        total = sum(r.seconds for r in self.rows) / max(1, self.steps)
        return total / self.measured_step_s if self.measured_step_s else 0.0

    def as_dict(self) -> dict:
        per_step = max(1, self.steps)
        rows = []
        for row in self.rows:
            bound, roof = row.bound(self.roofline)
            rows.append({
                **asdict(row),
                "seconds_per_step": row.seconds / per_step,
                "share": row.seconds / max(1e-12, sum(r.seconds for r in self.rows)),
                "gflop_per_s": row.flops / row.seconds / 1e9 if row.seconds else None,
                "gb_per_s": row.bytes / row.seconds / 1e9 if row.seconds else None,
                "roofline_percent": roof,
                "bound": bound,
            })  # fmt: skip
        return {
            "phase": self.phase,
            "steps": self.steps,
            "tokens_per_step": self.tokens_per_step,
            "measured_step_s": self.measured_step_s,
            "measured_s": self.measured_s,
            "profiled_step_s": mean(self.profiled_s) if self.profiled_s else 0.0,
            "kernel_step_s": self.kernel_step_s,
            "coverage": self.coverage,
            "rows_coverage": self.rows_coverage,
            "device_time": self.device,
            "rows": rows,
            "c_timers_s": self.c_timers,
            "c_timers_of": self.c_timers_of,
        }


def aggregate(
    events,
    phase: str,
    measured_s: list[float],
    tokens_per_step: float,
    roles: dict[str, str] | None = None,
    roofline: Roofline | None = None,
    device: bool = False,
) -> PhaseResult:
    """The rows of the steps of `phase` among a profiler's `events` (prof.events());
    `measured_s`: the same steps timed without the profiler; `roles`: {"<in>-><out>": name}
    of the linear rows; `device`: rows from the GPU kernels' device time."""
    walker = _Walker(device)
    steps = [e for e in events if e.name == STEP + phase and e.device_type == DeviceType.CPU]
    for step in steps:
        walker.step(step)
    rows = walker.costed_rows()
    for row in rows:
        if row.op == "linear":
            row.role = (roles or {}).get(row.key.split()[0], "")
    profiled = [_seconds(s) for s in steps]
    return PhaseResult(phase, list(measured_s), profiled, tokens_per_step, rows, roofline,
                       device)  # fmt: skip


def _seconds(event) -> float:
    return (event.time_range.end - event.time_range.start) / 1e6


@dataclass
class _Call:
    """One op call's kernels: {kernel: [calls, seconds]} and its cost."""

    op: str
    key: str = ""
    flops: int = 0
    bytes: int = 0
    kernels: dict[str, list] = field(default_factory=lambda: defaultdict(lambda: [0, 0.0]))

    def add(self, kernel: str, seconds: float, calls: int = 1) -> None:
        entry = self.kernels[kernel]
        entry[0] += calls
        entry[1] += max(0.0, seconds)


class _Walker:
    def __init__(self, device: bool):
        self.device = device
        self.rows: dict[tuple[str, str, str], Row] = {}
        self.costs: dict[tuple[str, str], list[int]] = {}  # (op, key) → [FLOPs, bytes]
        self._holds: dict[int, bool] = {}

    def step(self, step) -> None:
        call = _Call(ENGINE)
        self._launched(step, call)
        self._children(step, call)
        if self.device:
            kernels = sum(seconds for _, seconds in call.kernels.values())
            call.add(IDLE, _seconds(step) - kernels)
        else:
            call.add(HOST, _own_seconds(step))
        self._close(call)

    def _children(self, event, call: _Call) -> None:
        for child in event.cpu_children:
            self._visit(child, call)

    def _visit(self, event, call: _Call) -> None:
        label = parse(event.name)
        if label is not None:  # an op call: its own row group
            inner = _Call(label.op, label.key, label.cost.flops, label.cost.bytes)
            self._launched(event, inner)
            self._children(event, inner)
            if not self.device:
                inner.add(PYTHON, _own_seconds(event))
            self._close(inner)
        elif self._holds_op(event):  # a region holding op calls: its own time is host time
            self._launched(event, call)
            self._children(event, call)
            if not self.device:
                call.add(PYTHON if call.op != ENGINE else HOST, _own_seconds(event), 0)
        elif self.device:  # a kernel: the device kernels it (and what it called) launched
            for kernel in _subtree(event):
                self._launched(kernel, call)
        else:  # a kernel: its whole time
            call.add(event.name, _seconds(event))

    def _launched(self, event, call: _Call) -> None:
        for kernel in event.kernels if self.device else ():
            call.add(kernel.name, kernel.duration / 1e6)

    def _holds_op(self, event) -> bool:
        key = id(event)
        if key not in self._holds:
            self._holds[key] = any(
                parse(child.name) is not None or self._holds_op(child)
                for child in event.cpu_children
            )
        return self._holds[key]

    def _close(self, call: _Call) -> None:
        """The call's kernels into the rows, its cost into its op's."""
        for kernel, (calls, seconds) in call.kernels.items():
            row = self.rows.setdefault((call.op, call.key, kernel), Row(call.op, call.key, kernel))
            row.calls += calls
            row.seconds += seconds
        cost = self.costs.setdefault((call.op, call.key), [0, 0])
        cost[0] += call.flops
        cost[1] += call.bytes

    def costed_rows(self) -> list[Row]:
        """The rows, each op's FLOPs and bytes on its main kernel: the kernel its calls spent
        the most time in (its PYTHON row when it has none), by time."""
        for (op, key), (flops, nbytes) in self.costs.items():
            if not (flops or nbytes):
                continue
            mine = [r for r in self.rows.values() if (r.op, r.key) == (op, key) and not r.host]
            if mine:
                main = max(mine, key=lambda r: r.seconds)
            else:
                main = self.rows.setdefault((op, key, PYTHON), Row(op, key, PYTHON))
            main.flops, main.bytes = flops, nbytes
        return sorted(self.rows.values(), key=lambda r: -r.seconds)


def _own_seconds(event) -> float:
    return _seconds(event) - sum(_seconds(c) for c in event.cpu_children)


def _subtree(event):
    yield event
    for child in event.cpu_children:
        yield from _subtree(child)


def format_phase(result: PhaseResult, top: int | None = 30) -> str:
    """The phase's table as text: a header (step times, coverage, roofline), then the rows by
    time, the first `top` of them (None: all) and one line for the rest."""
    per_step = max(1, result.steps)
    measured = result.measured_step_s
    profiled = mean(result.profiled_s) if result.profiled_s else 0.0
    what = "device kernels" if result.device else "kernels"
    lines = [
        f"{result.phase}: {result.steps} profiled step(s) of {result.tokens_per_step:g} "
        f"token(s); step time {measured * 1e3:.2f} ms measured without the profiler, "
        f"{profiled * 1e3:.2f} ms profiled",
        f"  per-kernel times add up to {result.kernel_step_s * 1e3:.2f} ms a step = "
        f"{100 * result.coverage:.1f} % of the measured step ({what}; every row, host time "
        f"between kernels too: {100 * result.rows_coverage:.1f} %)",
    ]
    if result.roofline is not None:
        roof = result.roofline
        lines.append(f"  roofline: {roof.flops / 1e9:.1f} GFLOP/s, {roof.bandwidth / 1e9:.1f} "
                     f"GB/s ({roof.source})")  # fmt: skip
    header = (f"{'op':<44} {'kernel':<32} {'calls':>6} {'ms/step':>8} {'share':>6} "
              f"{'GFLOP':>8} {'MB':>8} {'GFLOP/s':>8} {'GB/s':>7} {'%roof':>6} bound")  # fmt: skip
    lines += ["", header, "-" * len(header)]
    total = sum(r.seconds for r in result.rows) or 1e-12
    shown = result.rows if top is None else result.rows[:top]
    for row in shown:
        bound, roof = row.bound(result.roofline)
        seconds = row.seconds or 1e-12
        lines.append(
            f"{_cut(row.name, 44):<44} {_cut(row.kernel, 32):<32} {row.calls:>6} "
            f"{row.seconds / per_step * 1e3:>8.3f} {100 * row.seconds / total:>5.1f}% "
            f"{row.flops / per_step / 1e9:>8.3f} {row.bytes / per_step / 1e6:>8.2f} "
            f"{_rate(row.flops, seconds):>8} {_rate(row.bytes, seconds):>7} "
            f"{'-' if roof is None else f'{roof:.0f}':>6} {bound}"
        )
    rest = result.rows[len(shown) :]
    if rest:
        seconds = sum(r.seconds for r in rest)
        more = f"... {len(rest)} more rows (--all)"
        lines.append(f"{more:<84} {seconds / per_step * 1e3:>8.3f} {100 * seconds / total:>5.1f}%")
    if result.c_timers:
        timed = sum(result.c_timers.values())
        kinds: dict[str, list[str]] = {}  # a layer kind ("" for one kind) → its sites' parts
        for name, s in result.c_timers.items():
            kind, _, site = name.rpartition(": ")
            kinds.setdefault(kind, []).append(f"{site} {s * 1e3:.2f} ms ({100 * s / timed:.0f} %)")
        lines.append("")
        for kind, parts in kinds.items():
            whose = f"{result.c_timers_of} (its C timers, all layers)"
            if kind:
                whose = f"{result.c_timers_of}, {kind} (its C timers, these layers)"
            lines.append(f"  {whose}: {', '.join(parts)}")
    return "\n".join(lines)


def _rate(amount: int, seconds: float) -> str:
    return "-" if amount == 0 else f"{amount / seconds / 1e9:.1f}"


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "~"
