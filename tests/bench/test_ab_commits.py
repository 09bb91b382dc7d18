"""benchmarks/ab_commits.compare: per metric the best value of each side over the rounds, and
the median of the rounds' own head / base ratios (a side's lucky round moves the first, not
the second)."""

from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))

from ab_commits import compare  # noqa: E402


def _line(metric: str, value: float, unit: str) -> dict:
    return {"kind": "result", "bench": "b", "metric": metric, "engine": "infergen",
            "value": value, "unit": unit}  # fmt: skip


def test_best_of_each_side_and_the_paired_median():
    # step times (lower is better): the base's second round met a fast minute
    base = [[_line("step", 17.0, "ms")], [_line("step", 11.7, "ms")], [_line("step", 16.8, "ms")]]
    head = [[_line("step", 16.0, "ms")], [_line("step", 16.9, "ms")], [_line("step", 15.5, "ms")]]
    [row] = compare(base, head)
    assert (row["base"], row["head"]) == (11.7, 15.5)
    assert row["head_speedup"] == 11.7 / 15.5  # the best of each side: the lucky round wins
    assert row["paired_rounds"] == [17.0 / 16.0, 11.7 / 16.9, 16.8 / 15.5]
    assert row["paired_median"] == 17.0 / 16.0  # the head faster in two rounds of three


def test_rates_and_metrics_one_side_lacks():
    base = [[_line("tok_s", 50.0, "tok/s"), _line("only_base", 1.0, "tok/s")]]
    head = [[_line("tok_s", 60.0, "tok/s")]]
    [row] = compare(base, head)  # (a metric of one side only: no row)
    assert row["metric"] == "tok_s" and row["head_speedup"] == 60.0 / 50.0
    assert row["paired_rounds"] == [60.0 / 50.0]
