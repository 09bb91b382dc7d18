"""`infergen perf calibrate`: measure this machine's peaks for the `cpu-local` hardware row.

Measured, in fp32 on the engine's own kernels and thread count: GEMM FLOP/s (the native packed
GEMM at a compute-bound shape, or torch's matmul if faster), memory read bandwidth (a sum over
a buffer far larger than the caches), the host-copy bandwidth (a copy between two such buffers,
in bytes copied per second: what the KV host tier's loads reach here, where host and device
memory are one), the fixed cost of one parallel op launch (a native op on a tiny tensor), the
GEMM's efficiency by row count on a stack of model-sized weights and on one large weight (an
LM head's size), timed in turn (a one-row pass, streaming from memory through the kernel's
prefetches, may read faster than the sum: the read bandwidth is the fastest of the three; the
large weight streams faster than the stack of small ones, and a GEMM's curve is mixed from the
two by its weight's size), the fraction of the bandwidth the decode-attention kernel
reaches (on decode rows, and on a verifying decode's rows, which find much of their prefix in
cache: for those also the fraction of the GEMM peak, from the same time) and the fraction of
the GEMM peak the prefill attention reaches, and the KV disk tier's costs per block (the
engine's own DiskTier writing then reading blocks of two sizes in a temporary directory — on
the filesystem of `disk_dir`, default the system's temporary directory: a fixed time per file
and a bandwidth, each way; the reads come from the page cache, as a tier's reads of blocks it
wrote recently do), the engine's layers run op by op, part by part, on tiny models
(perf/eager_measure.py: what a step the fused decode does not cover costs on the host), and the
link between two tensor-parallel ranks (perf/link.py: the engine's all-reduce over two gloo
processes at sizes from 2 KB to 4 MB: the row's `link_curve`, and fitted to them a latency per
collective and a bandwidth, its `link_latency_s` and `interconnect`). Best of several repeats:
the peaks a careful kernel reaches, which is what a roofline divides by. Written as a hardware
JSON row (`load_file` reads it).
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import tempfile
import time
from dataclasses import asdict, replace

import torch

from infergen.kvcache.tiers.disk import DiskTier
from infergen.ops import linear, linear_bf16, linear_w8a8  # noqa: F401 (bf16, W8A8 rows)
from infergen.ops.paged_attention import DECODE_BACKENDS, PREFILL_BACKENDS, paged_attention, plan
from infergen.ops.paged_prefill_native import prefill_attention_native  # noqa: F401 - its row
from infergen.ops.ssd_scan import SSD_SCAN_BACKENDS
from infergen.perf import link
from infergen.perf.eager_measure import measure_eager_layers
from infergen.perf.hardware import CPU_LOCAL, FileCosts, Hardware
from infergen.perf.roofline import collective_seconds
from infergen.perf.step_cost import (
    SCAN,
    VERIFY_ATTENTION,
    Chunk,
    attended_keys,
    keys_read,
    scan_flops,
)
from infergen.process import configure_process
from infergen.timing import best_seconds, best_seconds_each


def measure(
    threads: int | None = None, quick: bool = False, disk_dir: str | None = None
) -> Hardware:

    configure_process(threads)
    repeats = 3 if quick else 7
    row = linear.LINEAR_BACKENDS.get("native")
    # one parallel region on almost no data: the launch cost (from Python, so an upper bound)
    small_w = row.prepare(torch.randn(512, 64))
    small_x, calls = torch.randn(1, 64), 200
    overhead = (
        best_seconds(
            lambda: [row.apply(small_x, small_w, None, 512) for _ in range(calls)], repeats
        )
        / calls
    )
    rates = _rates(repeats, quick)
    disk = _disk_costs(repeats, 16 if quick else 48, disk_dir)
    wire = link.measure(ranks=2, repeats=10 if quick else 30)
    total_ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return Hardware(
        name=CPU_LOCAL,
        description=f"this machine, measured ({torch.get_num_threads()} threads, fp32)",
        memory_bytes=float(total_ram),
        disk=disk,
        launch_overhead_s=overhead,
        interconnect=wire.bandwidth,
        link_latency_s=wire.latency_s,
        link_curve=wire.curve(),
        **rates,
        calibrated=f"{datetime.date.today().isoformat()}: measured by infergen perf calibrate",
    )


def measure_rates(base: Hardware, threads: int | None = None, quick: bool = False) -> Hardware:
    """`base` (a calibration) with the rates that drift with what else the host runs measured
    again: the GEMM peak and its curve by rows, the read and copy bandwidths, the attention
    kernels' fractions, the layers' cost op by op. On a shared VM these change by up to 1.5x
    from one minute to the next (the op-by-op parts too: a Llama attention layer's 78 us at
    one hour here, 136 the next); a benchmark that predicts what it measures takes them in
    the same run (benchmarks/bench_spec.py), ~5 s a time (`quick`: ~2)."""
    configure_process(threads)
    return replace(base, **_rates(3 if quick else 7, quick))


def _rates(repeats: int, quick: bool) -> dict:
    """Hardware fields: the GEMM peak (the native packed GEMM at a compute-bound shape, torch's
    matmul, or any point of the curve, whichever is fastest) and its efficiency by rows, the
    read bandwidth, the host-copy bandwidth, the attention kernels' fractions and the layers'
    cost op by op (perf/eager_measure.py)."""
    m, k, n = (64, 576, 1536) if quick else (128, 576, 3072)
    row = linear.LINEAR_BACKENDS.get("native")
    packed, x = row.prepare(torch.randn(n, k)), torch.randn(m, k)
    native = 2 * m * k * n / best_seconds(lambda: row.apply(x, packed, None, n), repeats)
    a, b = torch.randn(512, 512), torch.randn(512, 512)
    torch_mm = 2 * 512**3 / best_seconds(lambda: a @ b, repeats)
    buf = torch.ones((64 if quick else 256) << 18)  # 64 / 256 MiB of fp32
    bandwidth = buf.numel() * 4 / best_seconds(lambda: buf.sum(), repeats)
    copy_to = torch.empty_like(buf)
    host_copy = buf.numel() * 4 / best_seconds(lambda: copy_to.copy_(buf), repeats)
    large_bytes = None if quick else _large_weight_bytes()
    achieved, large = _gemm_achieved(
        row, repeats, layers=8 if quick else _streaming_layers(), large_bytes=large_bytes
    )
    # the peak is the best any measurement reached (one contended window cannot lower it
    # below the others), and the curve is relative to it
    peak = max(native, torch_mm, *achieved.values(), *large.values())
    # likewise the read bandwidth: the packed GEMM streaming a weight at one row (2 FLOPs
    # per 4-byte weight, from DRAM) reads faster than the sum, through its own prefetching
    # (here 48-54 GB/s against 35, the large weight up to 70), and the engine's decode
    # reads its weights that way (`quick`'s stack of 8 may fit in the last-level cache: not
    # a DRAM rate)
    if not quick:
        bandwidth = max(bandwidth, achieved[1] * 2, large[1] * 2)
    layers = 4 if quick else 16
    decode = _attention_efficiency(bandwidth, repeats, layers)
    verify, verify_compute = _verify_attention_efficiency(bandwidth, peak, repeats, layers)
    prefill = _prefill_attention_efficiency(peak, repeats, 256 if quick else 512)
    scan = _scan_efficiency(peak, repeats, 64 if quick else 256)
    return dict(
        bandwidth=bandwidth,
        host_bandwidth=host_copy,
        flops={"fp32": peak},
        product_flops=_product_peaks(repeats, quick),
        gemm_efficiency={rows: flops / peak for rows, flops in achieved.items()},
        gemm_efficiency_large={rows: flops / peak for rows, flops in large.items()},
        gemm_weight_bytes=(LAYER_BYTES, large_bytes) if large else (),
        memory_efficiency_by_kind={"attention": decode, VERIFY_ATTENTION: verify},
        compute_efficiency_by_kind={
            "attention": prefill,
            VERIFY_ATTENTION: verify_compute,
            SCAN: scan,
        },  # fmt: skip
        eager_layer_s=measure_eager_layers(repeats),
    )


def _product_peaks(repeats: int, quick: bool) -> dict[str, float]:
    """FLOP/s of the CPU's other compute classes at a compute-bound shape (the projections'
    gate_up, 512 tokens; 128 quick): "bf16", the bf16 products (AMX-BF16 tiles, vdpbf16ps or
    widened pairs: whatever this machine builds), and "int8", W8A8's integer products (AMX-INT8,
    vpdpbusd, AVX2 byte multiplies) counted as 2 operations a multiply-add: Hardware's
    product_flops, `infergen profile`'s roofline for those products."""
    m, k, n = (128 if quick else 512), 576, 3072
    x, flops = torch.randn(m, k), 2 * m * k * n
    peaks = {}
    for compute, backend, apply in (("bf16", "bf16", None), ("int8", "int8", ("int8", "token"))):
        row = linear.LINEAR_BACKENDS.get(backend)
        packed = row.prepare(torch.randn(n, k))
        run = row.apply if apply is None else row.quantized_inputs[apply]
        seconds = best_seconds(lambda run=run, packed=packed: run(x, packed, None, n), repeats)
        peaks[compute] = flops / seconds
    return peaks


def best_of(a: Hardware, b: Hardware) -> Hardware:
    """Two calibrations of the same machine combined: each measured rate is the faster of
    the two (contention from other tenants only ever lowers a rate), launch costs the lower;
    the efficiencies are re-expressed against the combined peaks."""
    flops = {k: max(a.flops[k], b.flops.get(k, 0.0)) for k in a.flops}
    bandwidth = max(a.bandwidth, b.bandwidth)
    peak_a, peak_b, peak = a.flops["fp32"], b.flops["fp32"], flops["fp32"]
    copies = [hw.host_bandwidth for hw in (a, b) if hw.host_bandwidth is not None]
    disks = [hw.disk for hw in (a, b) if hw.disk is not None]
    disk = FileCosts(
        *(min(d.read_file_s for d in disks), max(d.read_bandwidth for d in disks),
          min(d.write_file_s for d in disks), max(d.write_bandwidth for d in disks))
    ) if disks else None  # fmt: skip
    return replace(
        a,
        flops=flops,
        product_flops={
            k: max(a.product_flops.get(k, 0.0), b.product_flops.get(k, 0.0))
            for k in a.product_flops.keys() | b.product_flops.keys()
        },  # fmt: skip
        bandwidth=bandwidth,
        host_bandwidth=max(copies) if copies else None,
        disk=disk,
        launch_overhead_s=min(a.launch_overhead_s, b.launch_overhead_s),
        **_faster_link(a, b),
        eager_layer_s=_faster_parts(a.eager_layer_s, b.eager_layer_s),
        gemm_efficiency=_faster_points(a.gemm_efficiency, b.gemm_efficiency, peak_a, peak_b, peak),
        **_large_curve(a, b, peak),
        memory_efficiency_by_kind=_faster_points(
            a.memory_efficiency_by_kind,
            b.memory_efficiency_by_kind,
            a.bandwidth,
            b.bandwidth,
            bandwidth,
        ),
        compute_efficiency_by_kind=_faster_points(
            a.compute_efficiency_by_kind, b.compute_efficiency_by_kind, peak_a, peak_b, peak
        ),
    )


def _faster_points(ea: dict, eb: dict, ref_a: float, ref_b: float, ref: float) -> dict:
    """Two tables of fractions of their own references (ref_a, ref_b) combined point by point:
    the faster achieved rate, as a fraction of `ref` (at most 1)."""
    keys = ea.keys() | eb.keys()
    return {k: min(1.0, max(ea.get(k, 0.0) * ref_a, eb.get(k, 0.0) * ref_b) / ref) for k in keys}


def _large_curve(a: Hardware, b: Hardware, peak: float) -> dict:
    """best_of's large-weight GEMM curve: point by point the faster of the two where both
    measured it on the same weight size, else the one of whichever has one (b's, if both on
    different sizes)."""
    rows = [hw for hw in (a, b) if hw.gemm_efficiency_large]
    if not rows:
        return {}
    one = rows[-1]
    if len(rows) == 1 or a.gemm_weight_bytes != b.gemm_weight_bytes:
        curve = _faster_points(one.gemm_efficiency_large, {}, one.flops["fp32"], 0.0, peak)
    else:
        curve = _faster_points(a.gemm_efficiency_large, b.gemm_efficiency_large,
                               a.flops["fp32"], b.flops["fp32"], peak)  # fmt: skip
    return {"gemm_efficiency_large": curve, "gemm_weight_bytes": one.gemm_weight_bytes}


def _faster_link(a: Hardware, b: Hardware) -> dict:
    """The link of whichever calibration measured one with the shorter all-reduce of a decode
    step's hidden states (its curve, latency and bandwidth belong together: one measurement)."""
    rows = [hw for hw in (a, b) if hw.interconnect]
    if not rows:
        return {}
    best = min(rows, key=lambda hw: collective_seconds(hw, link.ring_bytes(DECODE_TENSOR_BYTES, 2)))
    return {"interconnect": best.interconnect, "link_latency_s": best.link_latency_s,
            "link_curve": best.link_curve}  # fmt: skip


DECODE_TENSOR_BYTES = 16 << 10  # a decode step's hidden states, a few sequences' worth


def _faster_parts(a: dict, b: dict) -> dict[str, tuple[float, float]]:
    """{part: the faster (decode, prefill) of two eager_layer_s tables}."""
    unset = (float("inf"), float("inf"))
    return {
        part: tuple(map(min, a.get(part, unset), b.get(part, unset)))
        for part in sorted(a.keys() | b.keys())
    }


LAYER_BYTES = 1536 * 576 * 4  # one weight of _gemm_achieved's stack


def _last_level_cache_bytes() -> int:
    """The largest CPU cache (sysfs; 0 when unknown)."""
    sizes = []
    for entry in pathlib.Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = entry.read_text().strip().upper()
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes, default=0)


def _streaming_layers() -> int:
    """Weights in the GEMM stack: twice the last-level cache (some hosts have hundreds of MB:
    a stack that fits would time cached weights, not streamed ones), at least 24, at most
    1.5 GB."""
    wanted = -(-2 * _last_level_cache_bytes() // LAYER_BYTES)
    return int(min(max(24, wanted), (3 << 29) // LAYER_BYTES))


def _large_weight_bytes() -> int:
    """The large GEMM weight's bytes (K = 576): twice the last-level cache, at least 128 MiB
    (an LM head's size), at most 1.5 GB."""
    wanted = min(max(2 * _last_level_cache_bytes(), 128 << 20), 3 << 29)
    return wanted // (576 * 4) * 576 * 4


def _gemm_achieved(
    row, repeats: int, layers: int, large_bytes: int | None
) -> tuple[dict[int, float], dict[int, float]]:
    """FLOP/s by row count (1 .. 512) of a stack of `layers` model-sized weights (1536 x 576,
    3.5 MiB each, together larger than the caches) run one after another, as a forward pass
    streams its layers' weights; and of one weight of `large_bytes` (K = 576; None: not
    measured, {}), as an LM head streams, the two timed in turn (the same moments)."""
    k, n = 576, 1536
    stack = [row.prepare(torch.randn(n, k)) for _ in range(layers)]
    big_n = large_bytes // (4 * k) if large_bytes else 0
    big = row.prepare(torch.randn(big_n, k)) if big_n else None

    def pass_of(rows: int):
        x = torch.randn(rows, k)
        return lambda: [row.apply(x, w, None, n) for w in stack]

    def large_of(rows: int):
        x = torch.randn(rows, k)
        return lambda: row.apply(x, big, None, big_n)

    # every row count up to 9 (speculative verification: 1 + k rows a sequence; the micro-
    # kernels change at 4 and 8 rows, interpolating between them would be wrong)
    counts = (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 32, 64, 128, 512)
    runs = {("stack", rows): pass_of(rows) for rows in counts}
    if big is not None:
        runs |= {("large", rows): large_of(rows) for rows in counts}
    seconds = best_seconds_each(runs, repeats)
    flops = {"stack": 2 * k * n * layers, "large": 2 * k * big_n}
    curves: dict[str, dict[int, float]] = {"stack": {}, "large": {}}
    for (which, rows), s in seconds.items():
        curves[which][rows] = rows * flops[which] / s
    return curves["stack"], curves["large"]


HEADS, KV_HEADS, DIM, BLOCK = 8, 2, 64, 16  # the attention calibrations' shapes


def _attention_efficiency(bandwidth: float, repeats: int, layers: int) -> float:
    """Fraction of the read bandwidth the engine's decode attention reaches: 16 sequences of
    256 tokens (8 heads, 2 KV heads, head_dim 64) in scattered 16-token blocks, over `layers`
    separate caches (4 MiB each) so the KV comes from memory, as between a model's layers."""
    batch, context = 16, 256
    blocks = batch * context // BLOCK
    tables = torch.randperm(blocks).view(batch, -1)
    attn_plan = plan(list(range(batch + 1)), [context] * batch, tables, BLOCK, None)
    seconds = _decode_seconds(attn_plan, batch, blocks, layers, repeats)
    return min(1.0, _kv_bytes(layers, batch * context) / seconds / bandwidth)


VERIFY_ROWS, VERIFY_CONTEXT = 5, 512  # a decode verifying 4 drafts, at this context


def _verify_attention_efficiency(
    bandwidth: float, peak: float, repeats: int, layers: int
) -> tuple[float, float]:
    """Fractions of the read bandwidth and of the GEMM peak the engine's decode attention
    reaches on a verifying decode's rows (ops/paged_attention.plan `as_decodes`): one
    sequence, VERIFY_ROWS rows at VERIFY_CONTEXT positions (8 heads, 2 KV heads, head_dim 64,
    scattered 16-token blocks), over `layers` separate caches, bytes and FLOPs counted as the
    cost model counts them (each row's own prefix: perf/step_cost.keys_read; 4 x heads x
    head_dim per attended key). The rows after the first find most of the prefix in the
    caches the first filled, so the bytes' fraction is well above decode attention's; and
    each row's dot products are its own, so the work grows with the rows whatever the memory
    does. Both fractions come from one time: at that moment the op's compute and memory
    terms are equal, and where either rate later changes (bench_spec's rates taken again
    between rounds: the read bandwidth of this VM swings by 1.5x, a core's FLOP/s hardly) the
    slower part bounds it (perf/roofline.py)."""
    rows, context = VERIFY_ROWS, VERIFY_CONTEXT
    blocks = context // BLOCK
    tables = torch.randperm(blocks).view(1, -1)
    attn_plan = plan([0, rows], [context], tables, BLOCK, None, as_decodes={0})
    chunk = Chunk(rows, context, verify=True)
    seconds = _decode_seconds(attn_plan, rows, blocks, layers, repeats)
    flops = layers * _attention_flops(chunk)
    return (
        min(1.0, _kv_bytes(layers, keys_read(chunk, None)) / seconds / bandwidth),
        min(1.0, flops / seconds / peak),
    )


def _attention_flops(chunk: Chunk) -> float:
    """One layer's attention FLOPs for `chunk` at the calibrations' shapes, as the cost model
    counts them: 4 x heads x head_dim per attended key (perf/step_cost.py)."""
    return 4 * HEADS * DIM * attended_keys(chunk, None)


def _kv_bytes(layers: int, keys: int) -> int:
    """K and V bytes of `keys` positions read per layer (fp32, the calibrations' shapes)."""
    return layers * 2 * keys * KV_HEADS * DIM * 4


def _decode_seconds(attn_plan, rows: int, blocks: int, layers: int, repeats: int) -> float:
    """The native decode attention's best time for `rows` query rows of `attn_plan` over
    `layers` separate caches of `blocks` blocks."""
    caches = [
        (torch.randn(blocks, BLOCK, KV_HEADS, DIM), torch.randn(blocks, BLOCK, KV_HEADS, DIM))
        for _ in range(layers)
    ]
    q = torch.randn(rows, HEADS, DIM)
    decode = DECODE_BACKENDS.get("native")

    def run():
        for k_cache, v_cache in caches:
            decode(q, k_cache, v_cache, attn_plan, DIM**-0.5)

    return best_seconds(run, repeats)


def _prefill_attention_efficiency(peak: float, repeats: int, tokens: int) -> float:
    """Fraction of the GEMM peak the engine's prefill attention reaches: one cold causal
    prompt of `tokens` tokens (8 heads, 2 KV heads, head_dim 64) through `paged_attention`
    and the CPU's prefill row (the native kernel, reading K / V from the pool), FLOPs counted
    as the cost model counts them (4 x heads x head_dim per attended key)."""
    tables = torch.arange(tokens // BLOCK).view(1, -1)
    attn_plan = plan([0, tokens], [tokens], tables, BLOCK, None)
    q = torch.randn(tokens, HEADS, DIM)
    k_cache = torch.randn(tokens // BLOCK, BLOCK, KV_HEADS, DIM)
    v_cache = torch.randn(tokens // BLOCK, BLOCK, KV_HEADS, DIM)
    k, v = k_cache.view(tokens, KV_HEADS, DIM), v_cache.view(tokens, KV_HEADS, DIM)
    row = PREFILL_BACKENDS.get("native")
    seconds = best_seconds(
        lambda: paged_attention(
            q, k, v, k_cache, v_cache, attn_plan, DIM**-0.5, prefill_fn=row
        ),  # fmt: skip
        repeats,
    )
    return min(1.0, _attention_flops(Chunk(tokens, tokens)) / seconds / peak)


SSM_HEADS, SSM_DIM, SSM_STATE = 16, 64, 64  # the scan calibration's shape (Falcon-H1's small)


def _scan_efficiency(peak: float, repeats: int, tokens: int) -> float:
    """Fraction of the GEMM peak the engine's prefill SSD scan reaches (the native row of
    ops/ssd_scan.py: the per-token recurrence): one fresh sequence of `tokens` tokens, one
    B / C group, FLOPs as the cost model counts the recurrence (step_cost.scan_flops). The
    recurrence is a chain of small dependent updates per head, far from the GEMM's dense
    FMAs: 0.26 of the peak in a Falcon-H1 prefill here (`infergen profile`), which the GEMM
    peak had priced at ~0.3 of its time. This timing reads 0.29-0.30 in most processes and
    0.18 in some (a state that lasts the process: right after a large torch parallel op,
    for one), so a calibration may price the scan up to 1.6x slow."""
    h, p, n = SSM_HEADS, SSM_DIM, SSM_STATE
    x, dt = torch.randn(tokens, h, p), torch.rand(tokens, h)
    b, c = torch.randn(tokens, 1, n), torch.randn(tokens, 1, n)
    a, d, state = -torch.rand(h), torch.randn(h), torch.zeros(1, h, p, n)
    slots, fresh = torch.zeros(1, dtype=torch.int64), torch.ones(1, dtype=torch.bool)
    row = SSD_SCAN_BACKENDS.get("native")
    seconds = best_seconds(
        lambda: row(x, dt, a, b, c, d, state, [0, tokens], slots, fresh), repeats
    )  # fmt: skip
    return min(1.0, tokens * scan_flops(h, p, n) / seconds / peak)


SMALL, LARGE = 16 << 10, 1 << 20  # the two block sizes the disk tier is timed with


def _disk_costs(repeats: int, blocks: int, directory: str | None) -> FileCosts:
    """The KV disk tier's per-block costs: `blocks` blocks of SMALL and of LARGE bytes put
    and then got through a DiskTier in a fresh temporary directory, best of `repeats` rounds
    per size and way; the two sizes' seconds per block give a fixed time per file and a
    bandwidth (a line through both; the time per file at least 0)."""
    seconds: dict[tuple[str, int], float] = {}
    with tempfile.TemporaryDirectory(prefix="infergen-calibrate-", dir=directory) as tmp:
        for size in (SMALL, LARGE):
            data = torch.randint(0, 256, (size,), dtype=torch.uint8)
            for rnd in range(repeats):
                tier = DiskTier(pathlib.Path(tmp) / f"{size}-{rnd}", blocks * (size + 4096),
                                "calibrate")  # fmt: skip
                keys = [os.urandom(16) for _ in range(blocks)]
                start = time.perf_counter()
                for key in keys:
                    tier.put(key, None, data)
                wrote = time.perf_counter()
                for key in keys:
                    tier.get(key)
                read = time.perf_counter()
                for way, took in (("write", wrote - start), ("read", read - wrote)):
                    best = seconds.get((way, size), float("inf"))
                    seconds[way, size] = min(best, took / blocks)
    costs = {}
    for way in ("read", "write"):
        small, large = seconds[way, SMALL], seconds[way, LARGE]
        per_byte = max(large - small, 1e-12) / (LARGE - SMALL)
        costs[f"{way}_file_s"] = max(0.0, small - SMALL * per_byte)
        costs[f"{way}_bandwidth"] = 1 / per_byte
    return FileCosts(**costs)


def save(hw: Hardware, path: pathlib.Path) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(as_row(hw), indent=1))
    return path


def as_row(hw: Hardware) -> dict:
    """`hw` as a hardware file holds it ({name: fields}; hardware.load_file reads it back)."""
    row = {
        "description": hw.description,
        "memory_bytes": hw.memory_bytes,
        "bandwidth": hw.bandwidth,
        "flops": hw.flops,
        **({"product_flops": hw.product_flops} if hw.product_flops else {}),
        **({"host_bandwidth": hw.host_bandwidth} if hw.host_bandwidth else {}),
        **({"disk": asdict(hw.disk)} if hw.disk else {}),
        "launch_overhead_s": hw.launch_overhead_s,
        **(
            {
                "interconnect": hw.interconnect,
                "link_latency_s": hw.link_latency_s,
                "link_curve": {str(b): t for b, t in hw.link_curve.items()},
            }
            if hw.interconnect
            else {}
        ),
        "gemm_efficiency": hw.gemm_efficiency,
        **(
            {
                "gemm_efficiency_large": hw.gemm_efficiency_large,
                "gemm_weight_bytes": list(hw.gemm_weight_bytes),
            }
            if hw.gemm_efficiency_large
            else {}
        ),  # fmt: skip
        "memory_efficiency_by_kind": hw.memory_efficiency_by_kind,
        "compute_efficiency_by_kind": hw.compute_efficiency_by_kind,
        "eager_layer_s": {part: list(seconds) for part, seconds in hw.eager_layer_s.items()},
        **({"calibrated": hw.calibrated} if hw.calibrated else {}),
    }
    return {hw.name: row}
