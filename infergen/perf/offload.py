"""Does KV offload help? (issue 23, item 7). One workload predicted twice on the same
deployment — with its KV tiers below the pool (perf/kv_tiers.py) and without — and the gains:

- p50 TTFT, over every request and from the second turn on (multi-turn workloads), as
  without / with (> 1: the tiers answer sooner);
- output throughput, as with / without;
- where the reusable prompt tokens of turns 2+ came from in each run: the pool, the host
  tier, the disk tier, or recomputed (`SimStats.reuse`);
- the tiers' counters (KVTiers.stats: hits, bytes moved, load-or-recompute decisions).

`compare` serves `infergen predict --kv-offload-memory ...`; `predicted_tier_gain` predicts the
workload of benchmarks/bench_kv_tiers.py from its parameters, to set beside what it measures.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from infergen.bench.workloads import Shape
from infergen.config import SchedulerConfig
from infergen.perf.hardware import Hardware, resolve
from infergen.perf.kv_tiers import TierSpec
from infergen.perf.predict import Deployment, predict
from infergen.perf.step_cost import Formats


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def _p50(result: dict, key: str) -> float | None:
    stats = result[key]
    return stats["p50"] if stats is not None else None


def key_numbers(result: dict) -> dict:
    """What the comparison sets side by side from one `predict` result."""
    return {
        "ttft_p50_ms": _p50(result, "ttft_ms"),
        "ttft_p50_ms_turn2on": _p50(result, "ttft_ms_turn2on"),
        "output_tok_s": result["output_tok_s"],
        "total_tok_s": result["total_tok_s"],
        "failed": result["failed"],
        "reuse": result["simulation"]["reuse"],
        "kv_tiers": result["kv_tiers"],
    }


def compare(dep: Deployment, shapes: list[Shape], **load) -> dict:
    """`predict` of `dep` (which has tiers) with its `kv_offload` section: the tiers, both
    runs' key numbers and the gains. `load`: predict's keywords (concurrency, rate, seed, ...)."""
    if dep.tiers is None:
        raise ValueError("compare needs a deployment with KV tiers")
    with_tiers = predict(dep, shapes, **load)
    without = predict(dataclasses.replace(dep, tiers=None), shapes, **load)
    on, off = key_numbers(with_tiers), key_numbers(without)
    with_tiers["kv_offload"] = {
        **dep.tiers.for_hardware(dep.hw).as_dict(),
        "block_bytes": dep.kv_pool.page_bytes,
        "pool_blocks": dep.kv_pool.num_blocks,
        "without_tiers": off,
        "with_tiers": on,
        "gain": {
            "ttft_p50": _ratio(off["ttft_p50_ms"], on["ttft_p50_ms"]),
            "ttft_p50_turn2on": _ratio(off["ttft_p50_ms_turn2on"], on["ttft_p50_ms_turn2on"]),
            "output_tok_s": _ratio(on["output_tok_s"], off["output_tok_s"]),
        },
    }
    return with_tiers


def _gb(value: float) -> str:
    return f"{value / 1e9:.3g} GB"


def _share(value: float | None) -> str:
    return "  –" if value is None else f"{100 * value:3.0f} %"


def _x(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}x"


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def format_offload(section: dict) -> str:
    """The comparison as text: the tiers, a table without / with / gain, the reuse shares."""
    tiers = ", ".join(
        f"{name} {_gb(t['budget_bytes'])} at {t['bandwidth'] / 1e9:.3g} GB/s "
        f"({t['bandwidth_from']})"
        for name, t in section["tiers"].items()
    )
    write = ", write-through" if section["write_through"] else ""
    off, on, gain = section["without_tiers"], section["with_tiers"], section["gain"]
    lines = [
        f"KV offload: {tiers}{write}; pool {section['pool_blocks']} blocks of "
        f"{section['block_bytes'] / 2**20:.3g} MiB per device",
        f"{'':<24} {'no tiers':>10} {'tiers':>10} {'gain':>8}",
        f"{'TTFT p50 (ms)':<24} {_ms(off['ttft_p50_ms']):>10} {_ms(on['ttft_p50_ms']):>10} "
        f"{_x(gain['ttft_p50']):>8}",
    ]
    if on["ttft_p50_ms_turn2on"] is not None:
        lines.append(
            f"{'TTFT p50, turns 2+ (ms)':<24} {_ms(off['ttft_p50_ms_turn2on']):>10} "
            f"{_ms(on['ttft_p50_ms_turn2on']):>10} {_x(gain['ttft_p50_turn2on']):>8}"
        )
    lines.append(
        f"{'output tok/s':<24} {off['output_tok_s']:>10.1f} {on['output_tok_s']:>10.1f} "
        f"{_x(gain['output_tok_s']):>8}"
    )
    for label, run in (("no tiers", off), ("tiers", on)):
        reuse = run["reuse"]
        if reuse["reusable_tokens"]:
            lines.append(
                f"reusable prompt tokens of turns 2+ ({label}): pool {_share(reuse['pool'])}, "
                f"host {_share(reuse['host'])}, disk {_share(reuse['disk'])}, recomputed "
                f"{_share(reuse['recomputed'])} of {reuse['reusable_tokens']}"
            )
    stats = on["kv_tiers"]
    if stats is not None:
        moved = ", ".join(
            f"{name} {t['hits']} loaded / {t['puts']} saved" for name, t in stats["tiers"].items()
        )
        decisions = stats["decisions"]
        lines.append(
            f"blocks: {moved}; load vs recompute decisions {decisions['load']} / "
            f"{decisions['recompute']}"
        )
    return "\n".join(lines)


# the benchmark's engine: fp32 on the CPU (benchmarks/bench_kv_tiers.py)
FP32 = Formats(weight_bits=32, kv_bits=32, act_bytes=4)


def predicted_tier_gain(
    *,
    sessions: int,
    turns: int,
    system: int,
    tool: int,
    answer: int | Sequence[int],
    pool_blocks: int,
    host_bytes: int | None,
    disk_bytes: int | None = None,
    write_through: bool = False,
    model: str | None = None,
    hardware: str | Hardware = "cpu-local",
    block_size: int = 16,
    scheduler: SchedulerConfig | None = None,
    fmt: Formats = FP32,
    compute_format: str = "fp32",
    host_bandwidth: float | None = None,
    disk_bandwidth: float | None = None,
    concurrency: int | None = None,
) -> dict:
    """The predicted gains of KV tiers on benchmarks/bench_kv_tiers.py's workload: `sessions`
    sessions of `turns` turns, all opening with the same `system`-token prompt plus a
    `tool`-token output; each later turn resends the conversation + the `answer`-token answer
    (one length, or one per session) + a new tool output. `concurrency` turns in flight, a
    session whose turn finished queuing behind the waiting ones (the benchmark's closed
    loop); None: every session's turn k
    submitted together once turn k-1 has finished (its `--lockstep`). A pool of
    `pool_blocks` blocks of `block_size` tokens; a host tier of `host_bytes` (None: none), a
    disk tier of `disk_bytes` (None: none). `model`: a config / GGUF path (default: the
    default model); `hardware`: a row name or a Hardware (default cpu-local: run `infergen perf
    calibrate` first); the engine's default scheduler limits unless given.

    Returns {"ttft_p50_turn2on": gain, "output_tok_s": gain, "ttft_p50": gain, "kv_offload":
    the full comparison (both runs, reuse shares, tier counters)}."""
    from infergen.io.default_model import default_model_path
    from infergen.io.model_config import read_model_config

    desc = read_model_config(model or str(default_model_path())).describe()
    hw = resolve(hardware) if isinstance(hardware, str) else hardware
    dep = Deployment(
        desc=desc,
        hw=hw,
        fmt=fmt,
        compute_format=compute_format,
        scheduler=scheduler or SchedulerConfig(),
        block_size=block_size,
        kv_blocks=pool_blocks,
        tiers=TierSpec(host_bytes, disk_bytes, write_through, host_bandwidth, disk_bandwidth),
    )
    answers = [answer] * sessions if isinstance(answer, int) else list(answer)
    if len(answers) != sessions:
        raise ValueError(f"answer: one length per session ({sessions}), got {len(answers)}")
    shapes = [Shape(system + tool, answers[s], (tool,) * (turns - 1), f"s{s}")
              for s in range(sessions)]  # fmt: skip
    if concurrency is None:
        load = dict(concurrency=sessions, lockstep=True)
    else:
        load = dict(concurrency=concurrency, rotate=True)
    result = compare(dep, shapes, shared_prefix=system, **load)
    section = result["kv_offload"]
    return {**section["gain"], "kv_offload": section}
