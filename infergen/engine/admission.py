"""Admission policies: how many KV blocks a waiting sequence reserves when the scheduler
admits it. The scheduler admits a sequence only while the running sequences' reservations and
its own fit in the pool (engine/scheduler.py); the same rows drive the performance model's
simulator (perf/simulate.py), which runs the engine's Scheduler.

- "optimistic" (the default; vLLM's rule too): nothing reserved. KV blocks are taken as
  tokens are computed; when the pool runs out, the most recently admitted sequence is
  preempted and recomputed later.
- "reserve" (TensorRT-LLM's GUARANTEED_NO_EVICT): the most blocks the request can ever hold
  (prompt + max_tokens, capped by the model's context; a windowed group only its window) are
  reserved up front, so a running sequence is never preempted; fewer run at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from infergen.registry import Registry

if TYPE_CHECKING:  # annotations only
    from infergen.engine.request import Sequence
    from infergen.engine.scheduler import Scheduler

Admission = Callable[["Scheduler", "Sequence"], int]
ADMISSION: Registry[Admission] = Registry("admission policy")


@ADMISSION.decorator("optimistic")
def optimistic(scheduler: Scheduler, seq: Sequence) -> int:
    return 0


@ADMISSION.decorator("reserve")
def reserve(scheduler: Scheduler, seq: Sequence) -> int:
    return scheduler.blocks_for_tokens(scheduler.longest(seq))
