"""Triton, an optional extra (`pip install 'infergen[triton]'`), imported once for the op
modules that hold Triton rows: `triton` and `tl` (None without it) and `jit` (`triton.jit`, or
the identity: the kernels then stay plain, uncalled functions and the modules still import).
Triton's interpreter reads TRITON_INTERPRET=1 as kernels are defined, so it is set before
this module is first imported (tests/conftest.py)."""

from __future__ import annotations

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = None
    tl = None

jit = triton.jit if triton is not None else (lambda fn: fn)

__all__ = ["jit", "tl", "triton"]
