"""The cpu-local link row (issue 26, perf/link.py): the fit recovers a latency and a bandwidth
from times that follow the model exactly, keeps the least relative error on noisy ones, and
the measurement over two real gloo processes times the engine's all-reduce at every size."""

from __future__ import annotations

import pytest

from infergen.perf.hardware import Hardware
from infergen.perf.link import Link, fit, measure, ring_bytes
from infergen.perf.roofline import collective_seconds


def _line(link: Link) -> Hardware:
    """A row priced by the fitted line alone (no measured curve)."""
    return Hardware("line", "line", 1.0, 1.0, {"fp32": 1.0}, interconnect=link.bandwidth,
                    link_latency_s=link.latency_s)  # fmt: skip


@pytest.mark.parametrize("ranks", [2, 4])
def test_the_fit_recovers_an_exact_line(ranks):
    latency, bandwidth = 350e-6, 3e9
    sizes = (2 << 10, 128 << 10, 4 << 20)
    times = {b: latency + ring_bytes(b, ranks) / (bandwidth / 2) for b in sizes}
    got = fit(times, ranks)
    assert got.latency_s == pytest.approx(latency, rel=1e-9)
    assert got.bandwidth == pytest.approx(bandwidth, rel=1e-9)
    moved = ring_bytes(1 << 20, ranks)
    assert collective_seconds(_line(got), moved) == pytest.approx(latency + moved / 1.5e9)


def test_noisy_times_fit_within_their_spread_and_never_below_zero():
    times = {2 << 10: 400e-6, 16 << 10: 380e-6, 1 << 20: 1.2e-3, 4 << 20: 4.5e-3}
    got = fit(times, 2)
    assert got.latency_s >= 0 and got.bandwidth > 0
    for nbytes, seconds in times.items():
        assert collective_seconds(_line(got), nbytes) == pytest.approx(seconds, rel=0.35)
    flat = fit({2 << 10: 500e-6, 1 << 20: 400e-6}, 2)  # (noise: larger took less)
    assert flat.latency_s >= 0 and flat.bandwidth > 0


def test_two_gloo_processes_time_the_engines_all_reduce():
    sizes = (2 << 10, 256 << 10, 1 << 20)  # the gather path and gloo's own all-reduce
    got = measure(ranks=2, repeats=5, sizes=sizes)
    assert sorted(got.measured) == sorted(sizes)
    assert all(t > 0 for t in got.measured.values())
    assert isinstance(got, Link) and got.latency_s >= 0 and got.bandwidth > 0


def test_a_measured_curve_prices_collectives_between_its_points():
    link = fit({2048: 400e-6, 1 << 20: 2e-3}, 2)
    assert link.curve() == {2048: 400e-6, 1 << 20: 2e-3}  # (2 ranks: ring bytes = tensor)
    hw = Hardware("c", "c", 1.0, 1.0, {"fp32": 1.0}, interconnect=link.bandwidth,
                  link_latency_s=link.latency_s, link_curve=link.curve())  # fmt: skip
    assert collective_seconds(hw, 100) == 400e-6  # below the curve: its first point
    middle = 2048 + ((1 << 20) - 2048) / 4
    assert collective_seconds(hw, 3 * middle, calls=3) == pytest.approx(3 * (400e-6 + 0.4e-3))
    beyond = collective_seconds(hw, 2 << 20)  # past it: the last point + bytes at bandwidth
    assert beyond == pytest.approx(2e-3 + (1 << 20) / (link.bandwidth / 2))
    assert collective_seconds(_line(link), 2048) == pytest.approx(400e-6)  # (the fit through both)


def test_a_link_curve_must_be_bytes_to_seconds(tmp_path):
    import json

    from infergen.errors import ConfigError
    from infergen.perf.hardware import load_file

    row = {"memory_bytes": 1e9, "bandwidth": 1e9, "flops": {"fp32": 1e9}, "interconnect": 1e9,
           "link_curve": {"2048": -1.0}, "efficiencies_from": "h200"}  # fmt: skip
    path = tmp_path / "hw.json"
    path.write_text(json.dumps({"bad-link": row}))
    with pytest.raises(ConfigError, match="link_curve must map bytes"):
        load_file(path)
