"""One engine step as it ran: when it started, how long scheduling, the forward and the rest
(sampling, detokenizing, stop checks) took, and the batch as (new tokens, context after the
step) per sequence — the `Chunk`s the performance model predicts a step from, so a trace
replays through `perf.roofline` step by step (`infergen serve --step-trace FILE`)."""

from __future__ import annotations

import json
import pathlib
import threading
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class StepRecord:
    start: float  # time.perf_counter() when the step began
    schedule_s: float
    forward_s: float
    after_s: float  # sampling, detokenizing, stop checks
    chunks: list[tuple[int, int]]  # per sequence: (new tokens, context after the step)


class StepTraceWriter:
    """Appends each StepRecord to a file as a JSON line (an Engine's `on_step`)."""

    def __init__(self, path: str | pathlib.Path):
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 - open for the server's life
        self._lock = threading.Lock()

    def __call__(self, record: StepRecord) -> None:
        with self._lock:
            self._file.write(json.dumps(asdict(record)) + "\n")

    def close(self) -> None:
        self._file.close()


def read(path: str | pathlib.Path) -> list[StepRecord]:
    rows = [json.loads(line) for line in pathlib.Path(path).read_text().splitlines() if line]
    return [StepRecord(**{**r, "chunks": [tuple(c) for c in r["chunks"]]}) for r in rows]
