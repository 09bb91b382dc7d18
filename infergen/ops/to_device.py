"""`to_device`: a step's inputs (ForwardBatch, AttentionPlan, their lists and tensors) moved
to the engine's device in one walk. The runner builds them on the host (from the scheduler's
Python lists) and moves them once per step; nothing is moved when the engine runs on the CPU."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import torch

T = TypeVar("T")


def to_device(value: T, device: torch.device) -> T:
    """`value` with every tensor in it on `device`: tensors, dataclass instances (field by
    field), lists, tuples (NamedTuples too) and dicts; anything else as it is."""
    return _moved(value, device)


def _moved(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {
            f.name: _moved(getattr(value, f.name), device)
            for f in dataclasses.fields(value)
            if f.init
        }
        return dataclasses.replace(value, **changes)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a NamedTuple
        return type(value)(*(_moved(v, device) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_moved(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _moved(v, device) for k, v in value.items()}
    return value
