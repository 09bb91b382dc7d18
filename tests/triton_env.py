"""Where the Triton tests run: in Triton's interpreter on the CPU (TRITON_INTERPRET=1, set by
tests/conftest.py) or compiled for a GPU (TRITON_INTERPRET=0: benchmarks/device_check.sh).
`runnable` skips a test where neither is possible (no Triton, or no GPU without the
interpreter)."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

HAS_TRITON = importlib.util.find_spec("triton") is not None
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRETED else "cuda"
runnable = pytest.mark.skipif(
    not HAS_TRITON or (not INTERPRETED and not torch.cuda.is_available()),
    reason="needs Triton, and a GPU or the interpreter",
)
