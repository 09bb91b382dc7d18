"""Shared fixtures: tiny random Hugging Face models (built offline) and the default model."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_flush_denormal(True)


@pytest.fixture(scope="session")
def default_model_path():
    from infergen.io.default_model import default_model_path

    return default_model_path()
