"""What the performance model predicts for bench_kv_tiers.py's own runs (issue 23, item 7):
`infergen.perf.offload.predicted_tier_gain` on the benchmark's workload sizes and host + disk's
options (pool blocks, host budget, write-through; the disk tier at the engine's default
budget), on the `cpu-local` hardware row (`infergen perf calibrate` first), in the
benchmark's loop: `concurrency` turns in flight, a session re-queued behind the waiting ones
(the simulator's `rotate`), or with `--lockstep` every session's turn k submitted together.
bench_kv_tiers.py writes its "predicted vs measured TTFT gain" line from it (target: within
25 %).
"""

from __future__ import annotations

import sys


def predicted_ttft_gain(sizes, model: str | None, options: dict) -> float | None:
    """The predicted p50 TTFT gain from turn 2 of host + disk (`options`) over no tiers; None,
    with the reason printed, when the perf model cannot predict it here (no calibrated
    hardware row, a model it does not describe)."""
    from infergen.engine.options import BY_NAME
    from infergen.perf.offload import predicted_tier_gain

    disk_default = BY_NAME["kv_offload_disk"]
    try:
        gain = predicted_tier_gain(
            sessions=sizes.sessions, turns=sizes.turns, system=sizes.system, tool=sizes.tool,
            answer=sizes.answers, pool_blocks=options["num_kv_blocks"],
            host_bytes=options.get("kv_offload_memory"),
            disk_bytes=disk_default.value(disk_default.default), model=model,
            write_through=bool(options.get("kv_offload_write_through")),
            concurrency=None if sizes.lockstep else sizes.concurrency,
        )  # fmt: skip
    except Exception as error:  # noqa: BLE001 - reported, the measurement goes on
        print(f"predicted TTFT gain: not predicted ({type(error).__name__}: {error})",
              file=sys.stderr)  # fmt: skip
        return None
    print(f"predicted gains [host + disk]: TTFT from turn 2 {gain['ttft_p50_turn2on']:.2f}x, "
          f"throughput {gain['output_tok_s']:.2f}x")  # fmt: skip
    return gain["ttft_p50_turn2on"]
