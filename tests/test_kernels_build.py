"""Every shipped C kernel compiles here (a compile error would otherwise only show as a quiet
fallback to the torch path and a slow engine)."""

from __future__ import annotations

import shutil

import pytest

from infergen.kernels.build import build_all


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no cc")
def test_every_kernel_compiles():
    assert build_all() == []
