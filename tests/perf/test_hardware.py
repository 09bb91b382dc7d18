"""The hardware table (data from REFERENCES §4) and user-supplied rows."""

from __future__ import annotations

import json

import pytest

from infergen.errors import ConfigError
from infergen.perf.hardware import HARDWARE, load_file


def test_table_has_the_reference_gpus():
    assert {"h100", "h200", "b200", "gb200", "l40s", "a100"} <= set(HARDWARE)
    h200 = HARDWARE.get("h200")
    assert (h200.memory_bytes, h200.bandwidth, h200.sms) == (141e9, 4.8e12, 132)
    assert h200.peak_flops("bf16") == 989e12 and h200.peak_flops("fp8") == 1979e12
    # a format the device lacks runs at the next wider one
    assert h200.peak_flops("fp4") == h200.peak_flops("fp8")
    assert HARDWARE.get("a100").peak_flops("fp8") == 312e12
    assert HARDWARE.get("b200").peak_flops("fp4") == 9000e12


def test_user_file_adds_a_gpu(tmp_path):
    path = tmp_path / "mine.json"
    row = {"memory_bytes": 24e9, "bandwidth": 1.0e12, "flops": {"bf16": 165e12}, "sms": 128}
    path.write_text(json.dumps({"my-gpu": row, "my-gpu-2": {**row, "host_bandwidth": 50e9}}))
    gpu, linked = load_file(path)
    assert HARDWARE.get("my-gpu") is gpu and gpu.peak_flops("fp16") == 165e12
    assert gpu.host_bandwidth is None and linked.host_bandwidth == 50e9  # KV host tier copies


@pytest.mark.parametrize(
    "content,message",
    [
        ({"bad": {"memory_bytes": 1e9, "flops": {"bf16": 1e12}}}, "lacks bandwidth"),
        ({"bad2": {"memory_bytes": 1e9, "bandwidth": -1, "flops": {}}}, "positive number"),
        ({"bad3": {"memory_bytes": 1e9, "bandwidth": 1, "flops": {}, "clock": 3}}, "unknown keys"),
        ({"bad4": {"memory_bytes": 1, "bandwidth": 1, "flops": {}, "host_bandwidth": 0}}, "host_b"),
        ({"h200": {"memory_bytes": 1e9, "bandwidth": 1, "flops": {"bf16": 1}}}, "already defined"),
        (
            {"bad5": {"memory_bytes": 1, "bandwidth": 1, "flops": {}, "disk": {"read_file_s": 1}}},
            "disk must map exactly",
        ),
        (
            {
                "bad6": {
                    "memory_bytes": 1,
                    "bandwidth": 1,
                    "flops": {},
                    "disk": dict(
                        read_file_s=-1, read_bandwidth=1, write_file_s=0, write_bandwidth=1
                    ),
                }
            },
            "disk read_file_s must be a number >= 0",
        ),
        (
            {
                "bad7": {
                    "memory_bytes": 1,
                    "bandwidth": 1,
                    "flops": {},
                    "disk": dict(
                        read_file_s=0, read_bandwidth=0, write_file_s=0, write_bandwidth=1
                    ),
                }
            },
            "disk read_bandwidth must be a number > 0",
        ),
    ],
)
def test_bad_hardware_files_name_the_problem(tmp_path, content, message):
    path = tmp_path / "hw.json"
    path.write_text(json.dumps(content))
    with pytest.raises(ConfigError, match=message):
        load_file(path)
