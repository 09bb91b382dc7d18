"""`ThroughWriter`: write-through blocks stored in the persistent tiers off the engine thread
(issue 23, item 2: tier traffic off the critical path).

With `kv_offload_write_through`, every block the pool registers is copied to the disk tier so
that whole prefixes outlive a restart. Written on the engine thread, a prefill step paid for
its blocks' files before it returned its tokens: on Gemma-3-270M (six cache groups, 45
blocks a turn) ~0.6 ms a block here, 0.025 s of every turn's TTFT. Here the engine thread only
copies the block (the pool may reuse its page before the write) and queues it; one worker
thread puts it into the tiers (a disk tier's put: checksum, file write, rename — no torch op
that would start an OpenMP team in that thread: tiers/loader.py says why that matters).

- A key queued and not yet written is `pending`: a second save of it is not queued again.
- At most `max_pending` blocks wait; past that a save is written on the calling thread
  (backpressure: nothing is dropped).
- `flush()` returns once everything queued before it is written (LLM.generate's end, a
  server's shutdown, a benchmark's restart); at interpreter exit the queue is drained too
  (ThreadPoolExecutor's exit hook).
- What a tier refuses (full, disabled by a write error) is what its synchronous put refuses:
  counted by the tier, the block simply not stored.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch

MAX_PENDING = 256  # blocks queued at most (a 737 KB block: ~190 MB)

Write = Callable[[bytes, bytes | None, torch.Tensor], None]  # (key, parent, host copy)


class ThroughWriter:
    def __init__(self, write: Write | None = None, max_pending: int = MAX_PENDING):
        self._write = write
        self.max_pending = max_pending
        self._pending: set[bytes] = set()
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kv-tier-write")
        self.queued = self.inline = 0  # saves written by the worker / on the calling thread
        self._error: BaseException | None = None  # what the worker met, raised by flush

    def pending(self, key: bytes) -> bool:
        with self._lock:
            return key in self._pending

    def save(
        self, key: bytes, parent: bytes | None, data: torch.Tensor, write: Write | None = None
    ) -> None:
        """Write `data` (a view the caller may overwrite after this returns) under `key`: a
        host copy queued for the worker, or written now when `max_pending` are waiting.
        `write`: this save's writer (default: the one the writer was made with; one of them
        must be given).
        """
        write = write or self._write
        if write is None:
            raise TypeError("ThroughWriter.save needs a writer: none given, none made with")
        with self._lock:
            if key in self._pending:
                return
            full = len(self._pending) >= self.max_pending
            if not full:
                self._pending.add(key)
        copy = data.detach().to("cpu", copy=True, memory_format=torch.contiguous_format)
        if full:
            self.inline += 1
            write(key, parent, copy)
            return
        self.queued += 1
        self._executor.submit(self._run, key, parent, copy, write)

    def _run(self, key: bytes, parent: bytes | None, copy: torch.Tensor, write: Write) -> None:
        try:
            write(key, parent, copy)
        except BaseException as error:  # noqa: BLE001 - re-raised by flush
            self._error = error
        finally:
            with self._lock:
                self._pending.discard(key)

    def flush(self) -> None:
        """Return once every save queued before this call is written (one worker, in order);
        re-raise an error the worker met (a bug: it must not pass silently)."""
        if self.queued:  # (else no worker was ever started)
            self._executor.submit(lambda: None).result()
        error, self._error = self._error, None
        if error is not None:
            raise error
