"""What the performance model predicts for bench_kv_tiers.py's own runs (issue 23, item 7):
`infergen.perf.offload.predicted_tier_gain` on the benchmark's workload sizes and host + disk's
options (pool blocks, host budget, write-through; the disk tier at the engine's default
budget), in the benchmark's loop: `concurrency` turns in flight, a session re-queued behind
the waiting ones (the simulator's `rotate`), or with `--lockstep` every session's turn k
submitted together.

The host's rates drift by up to 1.5x from one minute to the next on these VMs (GEMM speed,
bandwidths, the layers' cost op by op: perf/calibrate.measure_rates), and the runs without
tiers and with host + disk are minutes apart. So each side is predicted on the rates taken
right after its own run (`InRunRates`: `measure_rates` on top of the `cpu-local` row of
`infergen perf calibrate`, ~6 s a time): no tiers' TTFT on those taken after no tiers' run,
host + disk's on those taken after host + disk's. The gain on the cached row alone is
reported beside it. bench_kv_tiers.py writes its "predicted vs measured TTFT gain" line from
it (target: within 25 %).
"""

from __future__ import annotations

import sys


class InRunRates:
    """The host's drifting rates taken after a configuration's run, by configuration; none
    when `cpu-local` is not calibrated (then nothing is predicted, with the reason)."""

    def __init__(self):
        from infergen.errors import ConfigError
        from infergen.perf.hardware import CPU_LOCAL, resolve

        try:
            self.base = resolve(CPU_LOCAL)
        except ConfigError as error:
            print(f"predicted TTFT gain: not predicted ({error})", file=sys.stderr)
            self.base = None
        self.taken: dict = {}  # configuration -> Hardware

    def take(self, config: str) -> None:
        from infergen.perf.calibrate import measure_rates

        if self.base is not None:
            self.taken[config] = measure_rates(self.base, threads=2)


def _ttft_ms(section: dict, side: str) -> float | None:
    return section[side]["ttft_p50_ms_turn2on"]


def predicted_ttft_gain(
    sizes, model: str | None, options: dict, rates: InRunRates, without: str, with_tiers: str
) -> dict | None:
    """The predicted p50 TTFT gain from turn 2 of host + disk (`options`) over no tiers:
    {"value": the gain with each side on its own run's rates (`rates.taken[without]`,
    `rates.taken[with_tiers]`), "cached_row": the gain on the calibration alone, "ttft_ms":
    each side's predicted p50}; None, with the reason printed, when the perf model cannot
    predict it here (no calibrated hardware row, a model it does not describe)."""
    from infergen.engine.options import BY_NAME
    from infergen.perf.offload import predicted_tier_gain

    if rates.base is None:
        return None
    disk_default = BY_NAME["kv_offload_disk"]

    def predict(hardware) -> dict:
        return predicted_tier_gain(
            sessions=sizes.sessions, turns=sizes.turns, system=sizes.system, tool=sizes.tool,
            answer=sizes.answers, pool_blocks=options["num_kv_blocks"],
            host_bytes=options.get("kv_offload_memory"),
            disk_bytes=disk_default.value(disk_default.default), model=model,
            write_through=bool(options.get("kv_offload_write_through")),
            concurrency=None if sizes.lockstep else sizes.concurrency, hardware=hardware,
        )["kv_offload"]  # fmt: skip

    try:
        cached = predict(rates.base)
        # (a side whose rates were not taken: the cached row's prediction, not run again)
        off = _ttft_ms(predict(rates.taken[without]) if without in rates.taken else cached,
                       "without_tiers")  # fmt: skip
        on = _ttft_ms(predict(rates.taken[with_tiers]) if with_tiers in rates.taken else cached,
                      "with_tiers")  # fmt: skip
    except Exception as error:  # noqa: BLE001 - reported, the measurement goes on
        print(f"predicted TTFT gain: not predicted ({type(error).__name__}: {error})",
              file=sys.stderr)  # fmt: skip
        return None
    if not (off and on):
        return None
    gain = off / on
    in_run = with_tiers in rates.taken and without in rates.taken
    print(f"predicted TTFT gain from turn 2 [host + disk]: {gain:.2f}x "
          f"({'in-run rates' if in_run else 'the cached row'}; "
          f"{cached['gain']['ttft_p50_turn2on']:.2f}x on the cached row)")  # fmt: skip
    return {"value": gain, "cached_row": cached["gain"]["ttft_p50_turn2on"],
            "rates": "in-run" if in_run else "cached row",
            "ttft_ms": {without: off, with_tiers: on}}  # fmt: skip
