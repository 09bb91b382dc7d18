"""kvcache/zeroed.py against torch.zeros: the same shape, dtype and values (zeros), writable,
for every storage dtype a KV pool uses; a large buffer costs no resident memory until written
(the point of it: an engine start no longer writes the whole pool), and the background
population faults it in without changing a value, written ones included."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from infergen.kvcache.zeroed import LAZY_BYTES, zeroed


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.uint8]
)
@pytest.mark.parametrize("shape", [(2, 3, 5), (4, 2, 64, 16, 3, 64)])
def test_equals_torch_zeros(dtype, shape):
    got, expected = zeroed(shape, dtype), torch.zeros(shape, dtype=dtype)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    assert got.is_contiguous() and torch.equal(got.view(torch.uint8), expected.view(torch.uint8))
    got.view(-1)[7] = 1  # writable
    assert got.view(-1)[7].float() == 1


# (both probes: a fresh process, its resident bytes, a 256 MB buffer)
PRELUDE = """
import os, torch
from infergen.kvcache.zeroed import populate_in_background, zeroed
def resident():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
size = 256 << 20
before = resident()
"""
PROBE = (
    PRELUDE
    + """
buffer = zeroed((size // 4,), torch.float32, populate=False)
untouched = resident() - before
buffer[: size // 8].fill_(1.0)  # half of it written
print(untouched, resident() - before, float(buffer[size // 8 :].abs().sum()))
"""
)


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="no /proc (not Linux)")
def test_a_large_buffer_is_not_resident_until_written():
    """In a fresh process (in a long one the allocator may hand back memory already
    resident: still zeros, just not lazily)."""
    size = 256 << 20
    assert size > LAZY_BYTES
    run = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         check=True)  # fmt: skip
    untouched, written, rest = (float(x) for x in run.stdout.split())
    assert untouched < size // 16, untouched
    assert written > size // 4, written
    assert rest == 0.0


POPULATE = (
    PRELUDE
    + """
buffer = zeroed((size // 4,), torch.float32, populate=False)
buffer[: size // 16].fill_(2.0)  # written before the population
thread = populate_in_background(buffer)
if thread is None:
    print("unavailable")
else:
    thread.join()
    print(resident() - before, float(buffer[: size // 16].min()), float(buffer[: size // 16].max()),
          float(buffer[size // 16 :].abs().sum()))
"""
)


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="no /proc (not Linux)")
def test_the_background_population_makes_the_buffer_resident_and_keeps_its_values():
    size = 256 << 20
    run = subprocess.run([sys.executable, "-c", POPULATE], capture_output=True, text=True,
                         check=True)  # fmt: skip
    if run.stdout.strip() == "unavailable":
        pytest.skip("madvise not available here")
    resident, low, high, rest = (float(x) for x in run.stdout.split())
    assert resident > size * 0.9, resident  # (MADV_POPULATE_WRITE needs Linux 5.14+)
    assert low == high == 2.0 and rest == 0.0
