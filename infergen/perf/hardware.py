"""Hardware descriptions for the performance model: a table read from data (hardware.json,
REFERENCES §4), plus any the user adds from a JSON or YAML file (`--hardware-file`).

A row holds peaks: memory capacity and bandwidth (bytes, bytes/s), dense FLOP/s per format
class ("fp32", "bf16", "fp8", "fp4", ...), L2 size, SM count, the interconnect bandwidth
between devices and optionally `host_bandwidth`, the rate a copy from host memory into the
device's memory reaches (bytes/s: the KV host tier's loads, perf/kv_tiers.py; `infergen perf
calibrate` measures it for cpu-local); and its efficiency factors, what a calibration
measured (or fitted):

  fractions of the row's own peaks, in (0, 1]
    compute_efficiency          of the dense FLOP/s, per compute format ({"bf16": 0.8, ...})
    memory_efficiency           of the bandwidth
    compute_efficiency_by_kind  of the FLOP/s, per op kind where it differs ({"attention": ..})
    memory_efficiency_by_kind   of the bandwidth, per op kind where it differs
    gemm_efficiency             of the FLOP/s, a GEMM's by row count ({rows: fraction})
    gemm_efficiency_large       the same for one large weight streaming from memory, with
                                gemm_weight_bytes = [the first curve's weight bytes, this
                                one's]: a GEMM's curve is interpolated between the two by its
                                weight's size (cpu-local: a small weight streams slower)
  absolute seconds, >= 0
    launch_overhead_s                     per op launch
    step_overhead_s, sequence_overhead_s  host time per step / per sequence of a step
    link_latency_s                        per collective over the interconnect
    eager_layer_s                         per layer part of a step the engine runs op by op,
                                          {part: [decode, prefill]} (perf/eager.py; cpu-local:
                                          measured by `infergen perf calibrate`; never borrowed)

A row that gives none of the fractions is uncalibrated: it borrows every factor it does not
give from a calibrated row (`efficiencies_from`, default DEFAULT_DONOR), and a row may name a
donor for the factors it leaves out even when it gives some. A borrowed fraction multiplies
the target's own peak (an A100 decode streams at its 2.039 TB/s x the H200's 0.9, never at
the H200's 4.3 TB/s); a compute fraction is the donor's for the nearest format it calibrated
(fp4 on a B200: the H200's fp8 fraction); seconds are taken as they are. `efficiency_note`
says which row the factors came from and when that row was calibrated; every prediction
carries it (`infergen predict`, `perf step`).
"""

from __future__ import annotations

import json
import math
import pathlib
from dataclasses import dataclass, field, fields, replace

from infergen.config.stored import format_bits
from infergen.errors import ConfigError
from infergen.kernels.build import cache_dir
from infergen.registry import Registry

TABLE = pathlib.Path(__file__).with_name("hardware.json")


@dataclass(frozen=True)
class FileCosts:
    """What a tier of one file per block costs a block: a fixed time per file (open, header,
    checksum setup, rename) plus its bytes at a bandwidth, reading and writing (the KV disk
    tier, as `infergen perf calibrate` measures it through the engine's own DiskTier)."""

    read_file_s: float
    read_bandwidth: float  # bytes/s
    write_file_s: float
    write_bandwidth: float  # bytes/s

    def read_seconds(self, nbytes: float) -> float:
        return self.read_file_s + nbytes / self.read_bandwidth

    def write_seconds(self, nbytes: float) -> float:
        return self.write_file_s + nbytes / self.write_bandwidth

    @classmethod
    def from_dict(cls, row: dict, name: str, where: str) -> FileCosts:
        keys = [f.name for f in fields(cls)]
        if not isinstance(row, dict) or sorted(row) != sorted(keys):
            raise ConfigError(f"hardware {name!r}: disk must map exactly {keys} to numbers",
                              where=where, found=row)  # fmt: skip
        for key, value in row.items():
            low = 0 if key.endswith("_s") else None
            if not _number(value) or value < 0 or (low is None and value <= 0):
                raise ConfigError(f"hardware {name!r}: disk {key} must be a number "
                                  f"{'>= 0' if low == 0 else '> 0'}", where=where,
                                  found=value)  # fmt: skip
        return cls(**{key: float(row[key]) for key in keys})


@dataclass(frozen=True)
class Hardware:
    name: str
    description: str
    memory_bytes: float
    bandwidth: float  # bytes/s
    flops: dict[str, float] = field(default_factory=dict)  # format class -> dense FLOP/s
    # cpu-local: the FLOP/s `infergen perf calibrate` measured for the CPU's low-precision
    # products ("bf16": the bf16 products, AMX tiles where the CPU has them; "int8": W8A8's
    # integers). `infergen profile` measures those products' rows against them; the cost
    # model's peaks stay `flops` (the CPU engine computes in fp32 unless its weights say so)
    product_flops: dict[str, float] = field(default_factory=dict)
    l2_bytes: float | None = None
    sms: int | None = None
    # bytes/s between devices, both directions together (NVLink; cpu-local: gloo between the
    # engine's processes, measured by `infergen perf calibrate`), None = none
    interconnect: float | None = None
    # bytes/s of a copy from host memory into the device's memory (the KV host tier's loads);
    # None: not known, perf/kv_tiers.py's documented default
    host_bandwidth: float | None = None
    # the KV disk tier's per-block costs on this machine (cpu-local: calibrated); None: not
    # known, perf/kv_tiers.py's documented default bandwidth and no per-file cost
    disk: FileCosts | None = None
    launch_overhead_s: float = 0.0  # fixed cost per op launch (kernel / parallel region)
    # seconds of one layer part (a mixer kind, a feed-forward kind or "norm") in a step the
    # engine runs op by op — one with a chunk of several tokens, or a decode its fast path
    # does not cover (perf/eager.py) — as (decode step, prefill step); empty: such a step
    # costs launches x launch_overhead_s like any other
    eager_layer_s: dict[str, tuple[float, float]] = field(default_factory=dict)
    step_overhead_s: float = 0.0  # host time per engine step (scheduling, sampling)
    sequence_overhead_s: float = 0.0  # host time per sequence of a step (sampling, streaming)
    link_latency_s: float = 0.0  # per collective over the interconnect
    # measured collectives (cpu-local: `infergen perf calibrate`, perf/link.py): {bytes one
    # moves per device, as a ring all-reduce counts them: seconds}; a collective's time is
    # interpolated between them (empty: link_latency_s + bytes / (interconnect / 2))
    link_curve: dict[int, float] = field(default_factory=dict)
    # the device's global calibration: the fraction of peak FLOP/s (per compute format, or
    # "default") and of peak bandwidth its kernels reach (absent: 1.0, uncalibrated peaks)
    compute_efficiency: dict[str, float] = field(default_factory=dict)
    memory_efficiency: float = 1.0
    # measured per op kind where it differs from memory_efficiency (cpu-local: "attention")
    memory_efficiency_by_kind: dict[str, float] = field(default_factory=dict)
    # measured per op kind where it differs from compute_efficiency (cpu-local: "attention",
    # the prefill attention kernel's fraction of the GEMM peak)
    compute_efficiency_by_kind: dict[str, float] = field(default_factory=dict)
    # provenance: the row's own calibration (when and how; None: it has none of its own), the
    # row its borrowed factors came from, which factors, and when that row was calibrated
    calibrated: str | None = None
    efficiencies_from: str | None = None
    borrowed: tuple[str, ...] = ()
    donor_calibrated: str | None = None

    def efficiency_note(self) -> str:
        """Where the efficiencies come from, in words (shown with every prediction)."""
        own = f"calibrated {self.calibrated}" if self.calibrated else "no calibration of its own"
        if not self.borrowed:
            return f"efficiencies of {self.name} itself ({own})"
        note = (
            f"efficiencies borrowed from {self.efficiencies_from} (calibrated "
            f"{self.donor_calibrated}): {', '.join(self.borrowed)}"
        )
        return note + (f"; {self.name}'s own: {own}" if self.calibrated else "")

    def efficiency_source(self) -> dict:
        """The provenance as JSON: the row, its donor, the borrowed factors, both dates."""
        return {
            "gpu": self.name,
            "calibrated": self.calibrated,
            "borrowed_from": self.efficiencies_from if self.borrowed else None,
            "borrowed": list(self.borrowed),
            "donor_calibrated": self.donor_calibrated if self.borrowed else None,
            "note": self.efficiency_note(),
        }

    def compute_efficiency_for(self, fmt: str) -> float:
        fmt = self.runs_as(fmt)
        return self.compute_efficiency.get(fmt, self.compute_efficiency.get("default", 1.0))

    # measured GEMM efficiency by row count: {rows: achieved / peak FLOP/s} on a weight that
    # streams from memory (empty: no curve, efficiency 1)
    gemm_efficiency: dict[int, float] = field(default_factory=dict)
    # the same curve for one large weight, and the two curves' weight sizes in bytes
    # (gemm_efficiency's, this one's); empty: gemm_efficiency serves every weight. Measured
    # on an AMD EPYC Zen 4 at one row, 3.5 MB layers streamed one after another at 42 GB/s
    # where one 150 MB weight streamed at 70 (33 and 37 while the host was slow): an LM head
    # of 670 MB at the small layers' rate took 1.4x its time, and its verifying step's
    # extra rows seemed the cheaper for it.
    gemm_efficiency_large: dict[int, float] = field(default_factory=dict)
    gemm_weight_bytes: tuple[float, ...] = ()

    def gemm_efficiency_at(self, rows: int, weight_bytes: float | None = None) -> float:
        """The curve interpolated in log2(rows), flat beyond its ends, and bounded so that a
        GEMM over more rows never takes less time than over fewer (rows / efficiency never
        falls): it reads the same weights and computes more. A measured point faster than a
        smaller one is a faster moment of the host, not of the kernel — a calibration here
        had 5 rows at 0.90x the time of 1 row where the kernel, timed with the two
        interleaved, takes 1.08x; and best_of takes each point from whichever round was
        fastest. With a large weight's curve and `weight_bytes` (one call's weight), the
        two curves' values mixed by where the weight's size lies between theirs, in log
        (clamped to the ends)."""
        if not self.gemm_efficiency or rows <= 0:
            return 1.0
        small = _capped(self.gemm_efficiency, rows)
        if not self.gemm_efficiency_large or not weight_bytes or not self.gemm_weight_bytes:
            return small
        low, high = self.gemm_weight_bytes
        t = (math.log(weight_bytes) - math.log(low)) / (math.log(high) - math.log(low))
        t = min(1.0, max(0.0, t))
        return small + t * (_capped(self.gemm_efficiency_large, rows) - small)

    def peak_flops(self, fmt: str) -> float:
        """Dense FLOP/s for a compute format (see `runs_as`)."""
        return self.flops[self.runs_as(fmt)]

    def runs_as(self, fmt: str) -> str:
        """The format a compute format runs in: a format the device lacks runs at the nearest
        wider one it has (fp4 on an H100 runs as fp8, fp8 on an A100 as bf16)."""
        for candidate in _WIDER.get(fmt, (fmt,)):
            if candidate in self.flops:
                return candidate
        raise ConfigError(
            f"{self.name} has no peak for compute format {fmt!r}",
            where=f"hardware.{self.name}.flops",
            expected=f"one of {sorted(self.flops)}",
        )


def _capped(curve: dict[int, float], rows: int) -> float:
    """A GEMM curve at `rows`: interpolated, and no higher than a smaller row count's
    efficiency per row (see Hardware.gemm_efficiency_at)."""
    points = sorted(curve.items())
    per_row = min((e / m for m, e in points if m <= rows), default=math.inf)
    return min(_interpolated(points, rows), rows * per_row)


def _interpolated(points: list[tuple[int, float]], rows: int) -> float:
    """A curve of (rows, efficiency) points interpolated in log2(rows), flat beyond its ends."""
    if rows <= points[0][0]:
        return points[0][1]
    for (m0, e0), (m1, e1) in zip(points, points[1:], strict=False):
        if rows <= m1:
            t = (math.log2(rows) - math.log2(m0)) / (math.log2(m1) - math.log2(m0))
            return e0 + t * (e1 - e0)
    return points[-1][1]


# a format falls back to the next wider one the device supports
_WIDER = {
    "fp4": ("fp4", "fp8", "bf16", "fp32"),
    "fp8": ("fp8", "bf16", "fp32"),
    "int8": ("int8", "fp8", "bf16", "fp32"),
    "int4": ("int4", "fp4", "int8", "fp8", "bf16", "fp32"),
    "bf16": ("bf16", "fp32"),
    "fp16": ("fp16", "bf16", "fp32"),
    "fp32": ("fp32", "bf16"),
}

_REQUIRED = ("memory_bytes", "bandwidth", "flops")
_BY_KIND = ("memory_efficiency_by_kind", "compute_efficiency_by_kind")
# the efficiency factors (module docstring): fractions of the row's own peaks, and seconds
FRACTIONS = (
    "compute_efficiency",
    "memory_efficiency",
    *_BY_KIND,
    "gemm_efficiency",
    "gemm_efficiency_large",
)  # (the large curve travels with gemm_weight_bytes)
SECONDS = (
    "launch_overhead_s",
    "step_overhead_s",
    "sequence_overhead_s",
    "link_latency_s",
)
DEFAULT_DONOR = "h200"  # the calibrated row an uncalibrated one borrows its efficiencies from


def from_dict(name: str, row: dict, where: str) -> Hardware:
    """A row as read from a file; an uncalibrated one (or one naming `efficiencies_from`)
    borrows the factors it omits from that registered row (see `borrow`)."""
    missing = [key for key in _REQUIRED if key not in row]
    if missing:
        raise ConfigError(
            f"hardware {name!r} lacks {', '.join(missing)}",
            where=where,
            expected=f"keys {list(_REQUIRED)} (plus optional l2_bytes, sms, interconnect, "
            "host_bandwidth)",
        )
    known = {"description", "l2_bytes", "sms", "interconnect", "host_bandwidth", "calibrated",
             "disk", "eager_layer_s", "link_curve", "gemm_weight_bytes",
             "product_flops"}  # fmt: skip
    known |= {"efficiencies_from", *FRACTIONS, *SECONDS, *_REQUIRED}
    unknown = sorted(set(row) - known)
    if unknown:
        raise ConfigError(
            f"hardware {name!r} has unknown keys {unknown}", where=where, expected=sorted(known)
        )
    numbers = {k: row[k] for k in ("memory_bytes", "bandwidth") if k in row}
    for key in ("interconnect", "host_bandwidth"):
        if row.get(key) is not None:
            numbers[key] = row[key]
    products = row.get("product_flops", {})
    for key, value in [*numbers.items(), *row["flops"].items(), *products.items()]:
        if not _number(value) or value <= 0:
            raise ConfigError(
                f"hardware {name!r}: {key} must be a positive number",
                where=where,
                found=value,
                expected="bytes, bytes/s or FLOP/s as a number",
            )
    for key in SECONDS:
        if key in row and (not _number(row[key]) or row[key] < 0):
            raise ConfigError(
                f"hardware {name!r}: {key} must be seconds >= 0", where=where, found=row[key]
            )
    for key in ("calibrated", "efficiencies_from"):
        if key in row and not isinstance(row[key], str):
            raise ConfigError(f"hardware {name!r}: {key} must be a string", where=where)
    own = [key for key in FRACTIONS if key in row]
    memory = row.get("memory_efficiency", 1.0)
    if not _number(memory) or not 0 < memory <= 1:
        what = "memory_efficiency must be a fraction in (0, 1]"
        raise ConfigError(f"hardware {name!r}: {what}", where=where, found=memory, expected="0.9")
    curves = {key: _gemm_curve(row, key, name, where)
              for key in ("gemm_efficiency", "gemm_efficiency_large")}  # fmt: skip
    weight_bytes = _gemm_weight_bytes(row, bool(curves["gemm_efficiency_large"]), name, where)
    hw = Hardware(
        name=name,
        description=row.get("description", name),
        memory_bytes=float(row["memory_bytes"]),
        bandwidth=float(row["bandwidth"]),
        flops={k: float(v) for k, v in row["flops"].items()},
        product_flops={k: float(v) for k, v in products.items()},
        l2_bytes=row.get("l2_bytes"),
        sms=row.get("sms"),
        interconnect=row.get("interconnect"),
        host_bandwidth=float(numbers["host_bandwidth"]) if "host_bandwidth" in numbers else None,
        disk=FileCosts.from_dict(row["disk"], name, where) if row.get("disk") else None,
        **{key: float(row[key]) for key in SECONDS if key in row},
        memory_efficiency=float(memory),
        **curves,
        gemm_weight_bytes=weight_bytes,
        compute_efficiency=_per_format(row.get("compute_efficiency", {}), name, where),
        **{key: _by_kind(row, key, name, where) for key in _BY_KIND},
        eager_layer_s=_eager_layers(row.get("eager_layer_s", {}), name, where),
        link_curve=_link_curve(row.get("link_curve", {}), name, where),
        calibrated=row.get("calibrated") or ("undated (the row's own factors)" if own else None),
    )
    donor = row.get("efficiencies_from") or (None if own else DEFAULT_DONOR)
    if donor is None:
        return hw
    if donor not in HARDWARE:
        raise ConfigError(
            f"hardware {name!r} borrows its efficiencies from {donor!r}, which is not defined",
            where=f"{where}.efficiencies_from",
            expected=f"a calibrated row defined before it: one of {_calibrated_rows()}",
        )
    return borrow(hw, HARDWARE.get(donor), [k for k in (*FRACTIONS, *SECONDS) if k not in row])


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _calibrated_rows() -> list[str]:
    return [n for n, hw in HARDWARE.items() if hw.calibrated and not hw.borrowed]


def borrow(hw: Hardware, donor: Hardware, factors: list[str] | None = None) -> Hardware:
    """`hw` with `factors` (default: all, FRACTIONS and SECONDS) taken from `donor`, a row
    calibrated on its own. A fraction stays a fraction of `hw`'s own peak; a compute fraction
    is the donor's for the format it calibrated nearest to each of `hw`'s formats (the same
    format, else the next wider one, as `runs_as`); seconds are copied. Factors the donor
    leaves at their default (1.0, none, 0 s) are not listed as borrowed."""
    if not donor.calibrated or donor.borrowed or donor.name == hw.name:
        raise ConfigError(
            f"hardware {hw.name!r} cannot borrow efficiencies from {donor.name!r}: it is not "
            "calibrated on its own",
            where=f"hardware.{hw.name}.efficiencies_from",
            expected=f"one of {_calibrated_rows()}",
        )
    values = {key: getattr(donor, key) for key in factors or (*FRACTIONS, *SECONDS)}
    if values.get("gemm_efficiency_large"):
        values["gemm_weight_bytes"] = donor.gemm_weight_bytes
    if "compute_efficiency" in values:
        values["compute_efficiency"] = _nearest_formats(hw, donor.compute_efficiency)
    defaults = _defaults()
    values = {key: value for key, value in values.items() if value != defaults[key]}
    if not hw.interconnect:  # no link, no latency per collective
        values.pop("link_latency_s", None)
    return replace(
        hw,
        **values,
        efficiencies_from=donor.name,
        borrowed=tuple(values),
        donor_calibrated=donor.calibrated,
    )


def _nearest_formats(hw: Hardware, fractions: dict[str, float]) -> dict[str, float]:
    """{format of hw: the fraction `fractions` gives its format, else the nearest wider}."""
    table = {k: v for k, v in fractions.items() if k == "default"}
    for fmt in hw.flops:
        for candidate in _WIDER.get(fmt, (fmt,)):
            if candidate in fractions:
                table[fmt] = fractions[candidate]
                break
    return table


def peaks_only(hw: Hardware) -> Hardware:
    """`hw` without any efficiency factor or provenance: its peaks alone (every fraction 1,
    no overheads), e.g. to predict a calibrated GPU as if it were held out."""
    return replace(hw, **_defaults(), calibrated=None, efficiencies_from=None, borrowed=())


def _defaults() -> dict:
    """Every efficiency factor at its default: fractions 1 (none given), 0 seconds."""
    defaults = {f.name: f.default for f in fields(Hardware) if f.name in (*FRACTIONS, *SECONDS)}
    tables = ("compute_efficiency", *_BY_KIND, "gemm_efficiency", "gemm_efficiency_large",
              "eager_layer_s")  # fmt: skip
    return defaults | {key: {} for key in tables} | {"gemm_weight_bytes": ()}


def _gemm_curve(row: dict, key: str, name: str, where: str) -> dict[int, float]:
    """A GEMM efficiency curve ({rows: fraction}) of a row as read, checked."""
    what = f"{key} must map row counts (whole numbers >= 1) to fractions in (0, 1]"
    curve = _fractions(row.get(key, {}), name, where, what, '{"1": 0.1, ...}')
    if not all(str(rows).isdigit() and int(rows) >= 1 for rows in curve):
        raise ConfigError(f"hardware {name!r}: {what}", where=where, found=sorted(curve))
    return {int(m): e for m, e in curve.items()}


def _gemm_weight_bytes(row: dict, large: bool, name: str, where: str) -> tuple[float, ...]:
    """gemm_weight_bytes: [small, large] weight bytes of the two GEMM curves, given exactly
    when gemm_efficiency_large is."""
    value = row.get("gemm_weight_bytes")
    if value is None and not large:
        return ()
    ok = (large and isinstance(value, (list, tuple)) and len(value) == 2
          and all(_number(v) and v > 0 for v in value) and value[0] < value[1])  # fmt: skip
    if not ok:
        raise ConfigError(
            f"hardware {name!r}: gemm_weight_bytes and gemm_efficiency_large go together",
            where=where,
            found=value,
            expected="gemm_weight_bytes: [the gemm_efficiency curve's weight bytes, the larger "
            "gemm_efficiency_large one's] beside gemm_efficiency_large",
        )
    return (float(value[0]), float(value[1]))


def _fractions(table, name: str, where: str, what: str, expected: str) -> dict[str, float]:
    """{key: fraction in (0, 1]}, or a ConfigError saying `what` the field must be."""
    if not isinstance(table, dict) or not all(_number(v) and 0 < v <= 1 for v in table.values()):
        raise ConfigError(f"hardware {name!r}: {what}", where=where, found=table, expected=expected)
    return {k: float(v) for k, v in table.items()}


def _eager_layers(table, name: str, where: str) -> dict[str, tuple[float, float]]:
    """eager_layer_s: {part: [decode seconds, prefill seconds]}, each >= 0."""
    ok = isinstance(table, dict) and all(
        isinstance(v, (list, tuple)) and len(v) == 2 and all(_number(x) and x >= 0 for x in v)
        for v in table.values()
    )
    if not ok:
        raise ConfigError(
            f"hardware {name!r}: eager_layer_s must map layer parts to [decode, prefill] "
            "seconds >= 0",
            where=where,
            found=table,
            expected='{"attention": [0.0004, 0.0005], "dense": [...], "norm": [...]}',
        )
    return {k: (float(v[0]), float(v[1])) for k, v in table.items()}


def _link_curve(table, name: str, where: str) -> dict[int, float]:
    """link_curve: {bytes (a whole number >= 1): seconds > 0}."""
    ok = isinstance(table, dict) and all(
        str(k).isdigit() and int(k) >= 1 and _number(v) and v > 0 for k, v in table.items()
    )
    if not ok:
        raise ConfigError(
            f"hardware {name!r}: link_curve must map bytes a collective moves (whole numbers "
            ">= 1) to seconds > 0",
            where=where,
            found=table,
            expected='{"2048": 0.0004, "4194304": 0.005}',
        )
    return {int(k): float(v) for k, v in table.items()}


def _by_kind(row: dict, key: str, name: str, where: str) -> dict[str, float]:
    what = f"{key} must map op kinds to fractions in (0, 1]"
    return _fractions(row.get(key, {}), name, where, what, '{"attention": 0.4, ...}')


def _per_format(value, name: str, where: str) -> dict[str, float]:
    """compute_efficiency: one number for every format, or {format: fraction}."""
    table = {"default": value} if _number(value) else value
    what = "compute_efficiency must be fractions in (0, 1]"
    return _fractions(table, name, where, what, 'a number or {"bf16": 0.8, "fp8": 0.5, ...}')


def load_file(path: str | pathlib.Path) -> list[Hardware]:
    """Rows of a user file: {"name": {memory_bytes, bandwidth, flops: {...}, ...}, ...} in JSON
    or YAML. They are returned, and registered so `--gpu name` finds them; a row may borrow
    from a table row or from one above it in the file."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise ConfigError("hardware file not found", where=str(path), expected="a JSON/YAML file")
    text = path.read_text()
    if path.suffix in (".yaml", ".yml"):
        import yaml

        data = yaml.safe_load(text)
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"not JSON: {exc.msg}", where=f"{path}:{exc.lineno}") from None
    if not isinstance(data, dict):
        raise ConfigError("hardware file must map names to rows", where=str(path))
    rows = []
    for name, row in data.items():
        if name.startswith("_"):
            continue
        if name in HARDWARE:
            raise ConfigError(f"hardware {name!r} is already defined", where=str(path))
        if not isinstance(row, dict):
            raise ConfigError(f"hardware {name!r} must be a mapping", where=f"{path}:{name}")
        rows.append(HARDWARE.register(name, from_dict(name, row, f"{path}:{name}")))
    return rows


HARDWARE: Registry[Hardware] = Registry("hardware")
_TABLE = json.loads(TABLE.read_text())
for _name, _row in _TABLE.items():  # a donor comes before the rows that borrow from it
    if not _name.startswith("_"):
        HARDWARE.register(_name, from_dict(_name, _row, str(TABLE)))
# the published rows (benchmarks/validate_perf_model.py) a number of the table was fitted to:
# they agree by construction, so they are not predictions
FITTED_ROWS = frozenset(_TABLE["_fitted_rows"])


def bits_of(fmt: str) -> float:
    """Stored bits per value of a weight / KV format: plain floats, or any row of the formats
    registry (scales included: mxfp4 4.25, nvfp4 4.5)."""
    return format_bits(fmt)


CPU_LOCAL = "cpu-local"  # this machine's row, written by `infergen perf calibrate`


def default_path() -> pathlib.Path:
    """Where `infergen perf calibrate` keeps the cpu-local row."""
    return cache_dir() / "perf" / f"{CPU_LOCAL}.json"


def resolve(name: str, hardware_file: str | None = None) -> Hardware:
    """`--gpu NAME [--hardware-file F]`: a table row, a row of F, or `cpu-local` from the
    last `infergen perf calibrate`."""
    if hardware_file:
        load_file(hardware_file)
    if name == CPU_LOCAL and name not in HARDWARE:
        if not default_path().exists():
            raise ConfigError(
                "cpu-local is not calibrated",
                where="--gpu",
                expected="run `infergen perf calibrate` first",
            )
        load_file(default_path())
    return HARDWARE.get(name, where="--gpu")
