"""Shared fixtures: tiny random Hugging Face models (built offline) and the default model."""

from __future__ import annotations

import gc
import os
import pathlib

# Triton reads its interpreter switch once, when first imported (torchao imports it too):
# set it before anything else so the GPU kernels run in the CPU interpreter. A GPU run sets
# TRITON_INTERPRET=0 explicitly (benchmarks/device_check.sh).
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_flush_denormal(True)
# the tests name repository files (tests/perf/configs/*.json, data/) from the repository root,
# as the README's commands do: run from any directory, they still find them
os.chdir(pathlib.Path(__file__).resolve().parent.parent)


# An engine's KV pool is 1 GiB of touched memory on the CPU by default. Without collections
# between tests, memory of finished tests piled up: tests/kvcache/test_state_checkpoints.py
# alone peaked at 19.7 GB RSS, and the full suite was OOM-killed on a 24 GiB host. After a
# test that leaves the process above this much resident memory, Python's cyclic collector
# runs (that module's peak: 8.0 GB; the rest is its module fixtures' live engines). The Engine
# object itself goes with its last reference, but its PagedKVCache (the pool) sits in
# reference cycles — the BlockPool's `block_freed` callback, the Scheduler's bound methods
# held by TierMoves / StateCheckpoints — that only the collector frees.
_COLLECT_ABOVE_BYTES = 4 << 30


def _resident_bytes() -> int:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


@pytest.fixture(autouse=True)
def _collect_finished_engines():
    yield
    if _resident_bytes() > _COLLECT_ABOVE_BYTES:
        gc.collect()


@pytest.fixture(scope="session")
def default_model_path():
    from infergen.io.default_model import default_model_path

    return default_model_path()
