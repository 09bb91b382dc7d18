"""Run a check in a fresh interpreter whose native kernels are built for another ISA
(INFERGEN_KERNEL_ISA: "generic" the portable scalar paths, "avx2" no AVX-512, "avx512vnni" no
VBMI, "avx512" no AMX tiles — kernels/build.py), in a kernel cache of its own. The check prints
"ok"."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def assert_ok_with_isa(isa: str, code: str, cache) -> None:
    env = {**os.environ, "INFERGEN_KERNEL_ISA": isa, "XDG_CACHE_HOME": str(cache)}
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True,
                          text=True)  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
