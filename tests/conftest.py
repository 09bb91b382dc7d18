"""Shared fixtures: tiny random Hugging Face models (built offline) and the default model."""

from __future__ import annotations

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


@pytest.fixture(scope="session")
def default_model_path():
    from infergen.io.default_model import default_model_path

    return default_model_path()


@pytest.fixture
def fused_steps(monkeypatch):
    """Per decode step the fused decode path was asked to run: did it (it returns None where
    it declines and the per-op path runs). A step whose head it ran too (`run_logits`) counts
    once; where that declines, the model asks `run`."""
    from infergen.models.fused_decode import FusedDecode

    steps: list[bool] = []
    run, run_logits = FusedDecode.run, FusedDecode.run_logits

    def counting_run(self, h, batch, *args):
        delta = run(self, h, batch, *args)
        steps.append(delta is not None)
        return delta

    def counting_run_logits(self, batch):
        logits = run_logits(self, batch)
        if logits is not None:
            steps.append(True)
        return logits

    monkeypatch.setattr(FusedDecode, "run", counting_run)
    monkeypatch.setattr(FusedDecode, "run_logits", counting_run_logits)
    return steps
