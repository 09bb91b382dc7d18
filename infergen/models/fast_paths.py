"""Fast paths: ways to run all decoder layers of a step at once instead of op by op. One row
per path (FAST_PATHS), each with `supports(model)` — the layers it can run: the layer
features it names, and its own test — and
`build(model, kv_cache)` — a runner bound to one cache whose `run(h, batch)` returns the
residual stream and the last layer's pending delta, or None for a step it does not cover
(the per-op path runs those).

Rows: "fused" (models/fused_decode.py: the hand-written native decode step; the default),
"eager" and "jit" (compiler/runtime.py: the captured layer graph op by op, or its fused
groups as generated C kernels and decode steps as the generated layer program — with
kernels="triton", the fused groups as generated Triton kernels). The engine
build picks the row (engine option `compile`); `model.fast_path = None` runs every step op by
op (tests compare the two).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from infergen.kvcache.paged_cache import PagedKVCache
from infergen.layers.forward_batch import ForwardBatch
from infergen.registry import Registry


class FastPathRunner(Protocol):
    kv_cache: PagedKVCache

    def run(
        self, h: torch.Tensor, batch: ForwardBatch
    ) -> tuple[torch.Tensor, torch.Tensor] | None: ...


@dataclass(frozen=True)
class FastPath:
    build: Callable[[Any, PagedKVCache], FastPathRunner]
    description: str = ""
    # the layer features (Transformer.layer_features) it runs beyond the Llama-shaped layer
    # (None: whichever; `applies` decides)
    features: frozenset[str] | None = frozenset()
    # model → whether this path runs it at all (beside the features: a kernel set, a device)
    applies: Callable[[Any], bool] = lambda model: True

    def missing(self, model) -> list[str]:
        """The model's layer features this path does not run, described (none: it runs
        them)."""
        if self.features is None:
            return []
        return [name for key, name in model.layer_features().items() if key not in self.features]

    def supports(self, model) -> bool:
        """Whether this path runs the model's layers."""
        return self.applies(model) and not self.missing(model)


FAST_PATHS: Registry[FastPath] = Registry("fast path")
