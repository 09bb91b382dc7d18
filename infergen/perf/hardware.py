"""Hardware descriptions for the performance model: a table read from data (hardware.json,
REFERENCES §4), plus any the user adds from a JSON or YAML file.

A row holds peaks, not achieved rates: memory capacity and bandwidth (bytes, bytes/s), dense
FLOP/s per format class ("fp32", "bf16", "fp8", "fp4", ...), L2 size, SM count and the
interconnect bandwidth between devices. What fraction of a peak an op reaches is the cost
model's business (per-op-class efficiency curves), not the table's.
"""

from __future__ import annotations

import json
import math
import pathlib
from dataclasses import dataclass, field

from infergen.config.stored import PLAIN_BITS, format_bits
from infergen.errors import ConfigError
from infergen.formats import FORMATS
from infergen.kernels.build import cache_dir
from infergen.registry import Registry

TABLE = pathlib.Path(__file__).with_name("hardware.json")


@dataclass(frozen=True)
class Hardware:
    name: str
    description: str
    memory_bytes: float
    bandwidth: float  # bytes/s
    flops: dict[str, float] = field(default_factory=dict)  # format class -> dense FLOP/s
    l2_bytes: float | None = None
    sms: int | None = None
    interconnect: float | None = None  # bytes/s between devices (NVLink), None = none
    launch_overhead_s: float = 0.0  # fixed cost per op launch (kernel / parallel region)
    # per op launch of a step that runs op by op (one with a chunk of several tokens: the
    # engine's fused decode, like a GPU's captured graph, covers decode-only steps); 0: the
    # same as launch_overhead_s
    eager_launch_overhead_s: float = 0.0
    step_overhead_s: float = 0.0  # host time per engine step (scheduling, sampling)
    sequence_overhead_s: float = 0.0  # host time per sequence of a step (sampling, streaming)
    link_latency_s: float = 0.0  # per collective over the interconnect
    # the device's global calibration: the fraction of peak FLOP/s (per compute format, or
    # "default") and of peak bandwidth its kernels reach (absent: 1.0, uncalibrated peaks)
    compute_efficiency: dict[str, float] = field(default_factory=dict)
    memory_efficiency: float = 1.0
    # measured per op kind where it differs from memory_efficiency (cpu-local: "attention")
    memory_efficiency_by_kind: dict[str, float] = field(default_factory=dict)
    # measured per op kind where it differs from compute_efficiency (cpu-local: "attention",
    # the prefill attention kernel's fraction of the GEMM peak)
    compute_efficiency_by_kind: dict[str, float] = field(default_factory=dict)

    def compute_efficiency_for(self, fmt: str) -> float:
        fmt = self.runs_as(fmt)
        return self.compute_efficiency.get(fmt, self.compute_efficiency.get("default", 1.0))

    # measured GEMM efficiency by row count: {rows: achieved / peak FLOP/s} on a weight that
    # streams from memory (empty: no curve, efficiency 1)
    gemm_efficiency: dict[int, float] = field(default_factory=dict)

    def gemm_efficiency_at(self, rows: int) -> float:
        """The curve interpolated in log2(rows), flat beyond its ends."""
        if not self.gemm_efficiency or rows <= 0:
            return 1.0
        points = sorted(self.gemm_efficiency.items())
        if rows <= points[0][0]:
            return points[0][1]
        for (m0, e0), (m1, e1) in zip(points, points[1:], strict=False):
            if rows <= m1:
                t = (math.log2(rows) - math.log2(m0)) / (math.log2(m1) - math.log2(m0))
                return e0 + t * (e1 - e0)
        return points[-1][1]

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
_OPTIONAL_FLOATS = (
    "launch_overhead_s",
    "eager_launch_overhead_s",
    "step_overhead_s",
    "sequence_overhead_s",
    "link_latency_s",
    "memory_efficiency",
)


def from_dict(name: str, row: dict, where: str) -> Hardware:
    missing = [key for key in _REQUIRED if key not in row]
    if missing:
        raise ConfigError(
            f"hardware {name!r} lacks {', '.join(missing)}",
            where=where,
            expected=f"keys {list(_REQUIRED)} (plus optional l2_bytes, sms, interconnect)",
        )
    known = {"description", "l2_bytes", "sms", "interconnect", *_OPTIONAL_FLOATS}
    known |= {"gemm_efficiency", "compute_efficiency", *_BY_KIND, *_REQUIRED}
    unknown = sorted(set(row) - known)
    if unknown:
        raise ConfigError(
            f"hardware {name!r} has unknown keys {unknown}", where=where, expected=sorted(known)
        )
    numbers = {k: row[k] for k in ("memory_bytes", "bandwidth") if k in row}
    for key, value in [*numbers.items(), *row["flops"].items()]:
        if not isinstance(value, int | float) or value <= 0:
            raise ConfigError(
                f"hardware {name!r}: {key} must be a positive number",
                where=where,
                found=value,
                expected="bytes, bytes/s or FLOP/s as a number",
            )
    return Hardware(
        name=name,
        description=row.get("description", name),
        memory_bytes=float(row["memory_bytes"]),
        bandwidth=float(row["bandwidth"]),
        flops={k: float(v) for k, v in row["flops"].items()},
        l2_bytes=row.get("l2_bytes"),
        sms=row.get("sms"),
        interconnect=row.get("interconnect"),
        **{key: float(row[key]) for key in _OPTIONAL_FLOATS if key in row},
        gemm_efficiency={int(m): float(e) for m, e in row.get("gemm_efficiency", {}).items()},
        compute_efficiency=_per_format(row.get("compute_efficiency", {}), name, where),
        **{key: _by_kind(row, key, name, where) for key in _BY_KIND},
    )


def _fractions(table, name: str, where: str, what: str, expected: str) -> dict[str, float]:
    """{key: fraction in (0, 1]}, or a ConfigError saying `what` the field must be."""
    if not isinstance(table, dict) or not all(
        isinstance(v, int | float) and 0 < v <= 1 for v in table.values()
    ):
        raise ConfigError(f"hardware {name!r}: {what}", where=where, found=table, expected=expected)
    return {k: float(v) for k, v in table.items()}


def _by_kind(row: dict, key: str, name: str, where: str) -> dict[str, float]:
    what = f"{key} must map op kinds to fractions in (0, 1]"
    return _fractions(row.get(key, {}), name, where, what, '{"attention": 0.4, ...}')


def _per_format(value, name: str, where: str) -> dict[str, float]:
    """compute_efficiency: one number for every format, or {format: fraction}."""
    table = {"default": value} if isinstance(value, int | float) else value
    what = "compute_efficiency must be fractions in (0, 1]"
    return _fractions(table, name, where, what, 'a number or {"bf16": 0.8, "fp8": 0.5, ...}')


def load_file(path: str | pathlib.Path) -> list[Hardware]:
    """Rows of a user file: {"name": {memory_bytes, bandwidth, flops: {...}, ...}, ...} in JSON
    or YAML. They are returned, and registered so `--gpu name` finds them."""
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
    rows = [from_dict(n, r, f"{path}:{n}") for n, r in data.items() if not n.startswith("_")]
    for row in rows:
        if row.name in HARDWARE:
            raise ConfigError(f"hardware {row.name!r} is already defined", where=str(path))
        HARDWARE.register(row.name, row)
    return rows


HARDWARE: Registry[Hardware] = Registry("hardware")
_TABLE = json.loads(TABLE.read_text())
for _name, _row in _TABLE.items():
    if not _name.startswith("_"):
        HARDWARE.register(_name, from_dict(_name, _row, str(TABLE)))
# the published rows (benchmarks/validate_perf_model.py) a number of the table was fitted to:
# they agree by construction, so they are not predictions
FITTED_ROWS = frozenset(_TABLE["_fitted_rows"])


def bits_of(fmt: str) -> float:
    """Stored bits per value of a weight / KV format: plain floats, or any row of the formats
    registry (scales included: mxfp4 4.25, nvfp4 4.5)."""
    return format_bits(fmt)


def compute_class(activation_format: str) -> str:
    """The peak a GEMM runs at, from its activation (input) format: weight-only formats
    (W4A16) still multiply in the activation width. fp8/fp6 minifloats -> "fp8", 4-bit
    -> "fp4", integers -> "int8" / "int4", 16-bit -> "bf16"."""
    if activation_format in PLAIN_BITS:
        return "fp32" if activation_format == "fp32" else "bf16"

    spec = FORMATS.get(activation_format, where="activation format")
    bits = spec.element_bits
    if spec.element is None:
        return "int8" if bits > 4 else "int4"
    return "fp8" if bits > 4 else "fp4"


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
