"""The link row of `cpu-local` (issue 26): what one tensor-parallel collective costs between
processes of this machine, measured through the engine's own collectives.

`ranks` fresh interpreters (one thread each where the cores allow, as the engine's workers
run) join a gloo group over localhost and time `TPGroup.all_reduce` — the operation a
sharded layer pays twice per step — on tensors from a decode step's few KB to a long
prefill's MB, as the engine meets it: after a layer's GEMMs on the tensor's tokens, the ranks
arriving at different times (one more GEMM on alternate ranks). A collective's cost is the
shorter of the ranks' waits in it — the rank that arrived last waited for the transfer alone,
the other also for its peer — and the mean over the collectives of a size is its time (the
mean, not the median: a step's communication is a sum, and here a few collectives in a
hundred wait several milliseconds for the scheduler, doubling the mean of the rest).
(Started together after a barrier, the same all-reduce measured about half as long here: a
collective between computations pays for waking the threads gloo runs it on.)

The perf model counts a collective's bytes as those of a ring all-reduce, 2 (n − 1) / n of
the tensor (perf/step_cost.py). The row keeps the measured points as its `link_curve`
({those bytes: seconds}, interpolated: perf/roofline.py), and `fit` finds the latency and
bandwidth that reproduce them with the least relative error (`link_latency_s`,
`interconnect`: beyond the curve's largest point, and the prose's two numbers). Either way
what the row predicts for a tensor size is gloo's measured time, whichever algorithm TPGroup
picked for it.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

from infergen.engine.workers import free_port
from infergen.errors import ConfigError
from infergen.layers.tensor_parallel import TPGroup

SIZES = (2 << 10, 16 << 10, 128 << 10, 1 << 20, 2 << 20, 4 << 20)  # bytes of the all-reduced tensor
TIMEOUT_S = 120.0  # the whole measurement, every rank


@dataclass(frozen=True)
class Link:
    """A fitted link: `bandwidth` as the hardware row's `interconnect` (bytes/s, both
    directions together), `latency_s` per collective, and the measured points
    {tensor bytes: mean seconds} it was fitted to."""

    bandwidth: float
    latency_s: float
    measured: dict[int, float]
    ranks: int = 2

    def curve(self) -> dict[int, float]:
        """The measured points as the hardware row's link_curve: {ring bytes: seconds}."""
        return {round(ring_bytes(b, self.ranks)): t for b, t in sorted(self.measured.items())}


def ring_bytes(tensor_bytes: float, ranks: int) -> float:
    """Bytes a ring all-reduce moves per rank (the perf model's count)."""
    return 2 * (ranks - 1) / ranks * tensor_bytes


def fit(measured: dict[int, float], ranks: int) -> Link:
    """Latency and bandwidth with the least squared relative error over `measured`
    ({tensor bytes: seconds}); the latency at least 0, the bandwidth finite."""
    xs = [ring_bytes(b, ranks) for b in measured]
    ts = list(measured.values())
    # minimize sum ((a + b x - t) / t)^2: weighted least squares with weights 1 / t^2
    w = [1 / t**2 for t in ts]
    sw, sx, st = (
        sum(w),
        sum(wi * x for wi, x in zip(w, xs, strict=True)),
        sum(wi * t for wi, t in zip(w, ts, strict=True)),
    )
    sxx = sum(wi * x * x for wi, x in zip(w, xs, strict=True))
    sxt = sum(wi * x * t for wi, x, t in zip(w, xs, ts, strict=True))
    det = sw * sxx - sx * sx
    slope = (sw * sxt - sx * st) / det if det else 0.0
    latency = (st - slope * sx) / sw
    if latency < 0 or slope <= 0:  # (noise: fall back to the ends of the range)
        small, large = min(measured), max(measured)
        slope = max((measured[large] - measured[small]) / (ring_bytes(large - small, ranks)),
                    1e-15)  # fmt: skip
        latency = max(0.0, measured[small] - slope * ring_bytes(small, ranks))
    return Link(bandwidth=2 / slope, latency_s=latency, measured=dict(measured), ranks=ranks)


def measure(ranks: int = 2, repeats: int = 60, sizes=SIZES) -> Link:
    """Time the engine's all-reduce over `ranks` gloo processes on this machine and fit it."""
    port = free_port()
    args = json.dumps({"ranks": ranks, "port": port, "repeats": repeats, "sizes": list(sizes)})
    procs = [
        subprocess.Popen([sys.executable, "-c", _ENTRY, str(rank), args],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for rank in range(ranks)
    ]  # fmt: skip
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=TIMEOUT_S))
    except subprocess.TimeoutExpired:
        raise ConfigError("the link measurement did not finish", where="perf calibrate",
                          expected=f"{ranks} gloo ranks over localhost within {TIMEOUT_S:g} s"
                          ) from None  # fmt: skip
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    results = enumerate(zip(procs, outputs, strict=True))
    failed = [(r, p.returncode, err) for r, (p, (_, err)) in results if p.returncode]
    if failed:
        rank, code, err = failed[0]
        last = (err.strip().splitlines() or ["no output"])[-1]
        raise ConfigError(f"the link measurement's rank {rank} exited with code {code}: {last}",
                          where="perf calibrate", expected="gloo over localhost")  # fmt: skip
    measured = {int(k): v for k, v in json.loads(outputs[0][0].strip().splitlines()[-1]).items()}
    return fit(measured, ranks)


HIDDEN, FEATURES = 576, 1536  # the GEMMs between collectives: a small model's layer
WARM = 5  # collectives per size not timed (buffers, connections)


def _rank() -> None:
    """One rank of `measure` (`python -c _ENTRY rank json`); rank 0 prints, per size, the
    mean over collectives of the shorter wait of the ranks."""
    rank, args = int(sys.argv[1]), json.loads(sys.argv[2])
    ranks = args["ranks"]
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // ranks))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args['port']}", rank=rank,
                            world_size=ranks)  # fmt: skip
    try:
        tp = TPGroup(rank, ranks, trace=[])
        weights = [torch.randn(FEATURES, HIDDEN) for _ in range(4)]
        for nbytes in args["sizes"]:
            x = torch.ones(nbytes // 4)
            rows = torch.randn(max(1, nbytes // (4 * HIDDEN)), HIDDEN)  # the tensor's tokens
            for call in range(WARM + args["repeats"]):
                # a layer's GEMMs on the tensor's tokens first, one more on alternate ranks
                # (who arrives last changes, as between the engine's ranks)
                for w in weights[: 2 + (call + rank) % 2]:
                    rows @ w.T
                x.fill_(1.0)
                tp.all_reduce(x)
        waits: list = [None] * ranks
        dist.gather_object(tp.trace, waits if rank == 0 else None, dst=0)
        if rank == 0:
            per_size = WARM + args["repeats"]
            shorter = [min(w) for w in zip(*waits, strict=True)]
            means = {
                nbytes: statistics.fmean(shorter[i * per_size + WARM : (i + 1) * per_size])
                for i, nbytes in enumerate(args["sizes"])
            }
            print(json.dumps(means), flush=True)
    finally:
        dist.destroy_process_group()


_ENTRY = "from infergen.perf.link import _rank; _rank()"
