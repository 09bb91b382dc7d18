"""The header every GPU benchmark line carries (benchmarks/bench_*_gpu.py, bench_linear_triton.py):
bench name, commit, the device and the torch / Triton versions, the time."""

from __future__ import annotations

import datetime
import pathlib
import subprocess

ROOT = pathlib.Path(__file__).resolve().parent.parent


def run_base(bench: str, gpu: str, sms: int) -> dict:
    import torch
    import triton

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    return {
        "bench": bench,
        "quick": False,
        "git": {"commit": commit or "?"},
        "machine": {
            "gpu": gpu,
            "sms": sms,
            "torch": torch.__version__,
            "triton": triton.__version__,
        },  # fmt: skip
        "peer_versions": {"torch": torch.__version__},
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
