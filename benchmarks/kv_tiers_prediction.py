"""What the performance model predicts for bench_kv_tiers.py's own runs (issue 23, item 7):
`infergen.perf.offload.predicted_tier_gain` on the benchmark's workload sizes and each tier
configuration's options (pool blocks, host budget, write-through; the disk tier at the engine's
default budget), on the `cpu-local` hardware row (`infergen perf calibrate` first). One line
per configuration: predicted vs measured p50 TTFT gain from turn 2 (target: within 25 %) and
throughput gain. Printed, not written to the results file.
"""

from __future__ import annotations

from kv_tiers_lines import DISK, HOST


def print_prediction(lines: list[dict], sizes) -> None:
    from infergen.engine.options import BY_NAME
    from infergen.errors import ConfigError
    from infergen.perf.offload import predicted_tier_gain

    measured = {
        (line["config"], line["metric"].split(" [")[0]): line["value"]
        for line in lines
        if line.get("kind") == "ratio"
    }
    options = {
        line["config"]: line["options"]
        for line in lines
        if line.get("kind") == "result" and "options" in line
    }
    disk_default = BY_NAME["kv_offload_disk"]
    for config in (HOST, DISK):
        opts = options[config]
        try:
            gain = predicted_tier_gain(
                sessions=sizes.sessions, turns=sizes.turns, system=sizes.system,
                tool=sizes.tool, answer=sizes.answer, pool_blocks=opts["num_kv_blocks"],
                host_bytes=opts.get("kv_offload_memory"),
                disk_bytes=disk_default.value(disk_default.default) if config == DISK else None,
                write_through=bool(opts.get("kv_offload_write_through")),
            )  # fmt: skip
        except ConfigError as err:
            print(f"predicted vs measured TTFT gain: not predicted ({err})")
            return
        ttft, tput = gain["ttft_p50_turn2on"], gain["output_tok_s"]
        seen = measured[config, "ttft_p50_s_turn2on"]
        seen_tput = measured[config, "throughput_tok_s"]
        print(
            f"predicted vs measured TTFT gain [{config}]: {ttft:.2f}x vs {seen:.2f}x "
            f"({ttft / seen - 1:+.0%}, target within 25 %); throughput gain {tput:.2f}x vs "
            f"{seen_tput:.2f}x"
        )
