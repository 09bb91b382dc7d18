"""`BackgroundLoader`: tier blocks brought back into pool blocks off the engine thread (issue
23, item 2: loads off the critical path).

One worker thread takes `LoadJob`s in order: for each (key, pool block) of a job it reads the
block from the KV tiers (`read`: the tier's `get` — a file read and its checksum for the disk
tier, which release the GIL, so the engine thread keeps stepping the running sequences
meanwhile) and places it into the pool page (`place`: decoded from the offload format and
copied). A job stops at its first block that no tier serves (absent, corrupt): its blocks form
a prefix chain, and a chain is usable only up to its first hole. A job whose `cancelled` flag
is set (its request was aborted) stops before its next block.

Where the placing runs, by device:
- CPU: on the engine thread, when it settles the job (KVTiers.settle); the worker only reads
  (`LoadJob.read` holds the blocks read meanwhile). A torch copy or decode of a block runs an
  OpenMP parallel region, and a second thread that has entered one keeps a thread team of its
  own alive: libgomp then has more threads than cores and stops spinning between parallel
  regions, so every small region of every later step pays a futex wake-up. Measured on 2 cores
  (SmolLM2-135M): decode steps 19 ms → 27–37 ms for the rest of the process after the first
  background load placed its blocks itself; a placing is a 0.04 ms memcpy per 737 KB block.
- CUDA: in the worker, the copies on a side stream of the loader's own, synchronized before
  the job is marked done: a step that reads a loaded block is launched after its copy
  completed.

The scheduler owns the pool blocks a job writes (held, unregistered: no step reads them and no
one else gets them) until it sees the job done (engine/tier_moves.py). The worker thread ends
with the loader (ThreadPoolExecutor's workers exit when it is collected).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

import torch

Read = Callable[[bytes], torch.Tensor | None]  # key → a tier's copy (None: no tier serves it)
Place = Callable[[int, torch.Tensor], None]  # (pool block, what `Read` returned) → written


@dataclass(eq=False)
class LoadJob:
    keys: list[bytes]
    blocks: list[int]  # pool blocks, one per key
    loaded: int = 0  # leading blocks read (written by the worker; final once done)
    read: list[torch.Tensor] = field(default_factory=list)  # read, placed when settled (CPU)
    failed: bool = False  # stopped at a block no tier served
    cancelled: bool = False  # set by the engine thread: skip the blocks not started
    seconds: float = 0.0  # the worker's time on the job (overlapped with engine steps)
    future: Future = field(default_factory=Future)

    @property
    def done(self) -> bool:
        return self.future.done()

    def result(self) -> None:
        """Once done: re-raise an error the worker met (a bug: it must not pass silently)."""
        self.future.result()


class BackgroundLoader:
    def __init__(self, read: Read, place: Place, device: torch.device):
        self._read = read
        self._place = place
        self._device = device
        self.places = device.type == "cuda"  # the worker places too (else: the engine thread)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kv-tier-load")
        self._stream: torch.cuda.Stream | None = None  # created by the worker, on a GPU

    def submit(self, keys: list[bytes], blocks: list[int]) -> LoadJob:
        job = LoadJob(list(keys), list(blocks))
        job.future = self._executor.submit(self._run, job)
        return job

    @staticmethod
    def wait_any(jobs: Iterable[LoadJob], timeout: float) -> bool:
        """Block until one of `jobs` is done (at most `timeout` s); whether one is."""
        futures = [job.future for job in jobs]
        if not futures:
            return False
        done, _ = wait(futures, timeout=timeout, return_when=FIRST_COMPLETED)
        return bool(done)

    def _run(self, job: LoadJob) -> None:
        start = time.perf_counter()
        try:
            with self._side_stream():
                for key, block in zip(job.keys, job.blocks, strict=True):
                    if job.cancelled:
                        break
                    data = self._read(key)
                    if data is None:
                        job.failed = True
                        break
                    if self.places:
                        self._place(block, data)
                    else:
                        job.read.append(data)
                    job.loaded += 1
            if self._stream is not None:
                self._stream.synchronize()  # the copies are in the pool before `done`
        finally:
            job.seconds = time.perf_counter() - start

    def _side_stream(self) -> contextlib.AbstractContextManager:
        if self._device.type != "cuda":
            return contextlib.nullcontext()
        if self._stream is None:
            self._stream = torch.cuda.Stream(self._device)
        return torch.cuda.stream(self._stream)
