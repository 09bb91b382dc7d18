"""Tensor-parallel worker processes (issue 26): `tensor_parallel_size` N runs the engine in
this process as rank 0 and N − 1 worker processes as ranks 1 … N − 1, one torch.distributed
process group over them (gloo on the CPU).

- **Start.** Rank 0 picks a free localhost port, starts each worker as a fresh interpreter
  (`_ENTRY`; its arguments pickled on stdin: the caller's script is never re-run, so it
  needs no `if __name__ == "__main__"` guard) and joins the group with them. Every rank
  builds the same engine config's model as its shard (models/sharding.py: its heads, MLP
  features and vocabulary rows) and its own KV cache, holding its heads only.
- **Each step.** Rank 0 alone schedules and samples. Before each forward it broadcasts the
  step's ForwardBatch (token ids, positions, slots, attention plans — built from its block
  tables, which the workers' caches mirror); every rank then runs the same forward, whose
  all-reduces and the logits' gather line up across the ranks.
- **Faults.** A worker that exits, or does not answer a collective within `timeout_s`, fails
  the step with a `WorkerError` naming the rank and its exit code (or that it hung); the
  others are stopped, none is left behind. `close()` (also at interpreter exit) stops them.
- One tensor-parallel engine per process (torch.distributed's default group is the
  process's).
"""

from __future__ import annotations

import atexit
import datetime
import pathlib
import pickle
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any

import torch
import torch.distributed as dist

from infergen.engine.build import build
from infergen.engine.config import EngineConfig
from infergen.layers.forward_batch import ForwardBatch
from infergen.layers.tensor_parallel import TPGroup

DEFAULT_TIMEOUT_S = 30.0  # a collective no rank answers within this fails the step


class WorkerError(RuntimeError):
    """A tensor-parallel worker died or hung; the engine cannot step any more."""


def free_port() -> int:
    """A localhost TCP port free now (the group's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _join(rank: int, size: int, port: int, timeout_s: float) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=size,
                            timeout=datetime.timedelta(seconds=timeout_s))  # fmt: skip


BUILD_TIMEOUT_S = 900.0  # every rank's build done within this (a large checkpoint's load)


def _built() -> None:
    """Every rank has built its shard (a rank that failed, or is still building after
    BUILD_TIMEOUT_S, is named by the barrier's error)."""
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=BUILD_TIMEOUT_S))


def _receive() -> Any:
    message = [None]
    dist.broadcast_object_list(message, src=0)
    return message[0]


def _worker(rank: int, size: int, port: int, timeout_s: float, config: EngineConfig,
            errors: pathlib.Path) -> None:  # fmt: skip
    """A worker's life: join, build its shard, then run each forward rank 0 sends; on a
    failure its traceback goes to `errors` (rank 0 reads it) and it exits non-zero."""
    _join(rank, size, port, timeout_s)
    try:
        built = build(config, tp=TPGroup(rank, size))
        model, kv_cache = built.model, built.kv_cache
        _built()
        while (message := _receive()) is not None:
            batch, num_layers = message
            if batch.slot_mappings:
                kv_cache.begin_step(batch.slot_mappings[0])
            model(batch, kv_cache, num_layers=num_layers)
    except Exception:
        errors.write_text(traceback.format_exc())
        raise
    finally:
        dist.destroy_process_group()


_ENTRY = "from infergen.engine.workers import main; main()"


def main() -> None:
    """A worker process (`python -c _ENTRY`), its arguments pickled on stdin (a fresh
    interpreter: unlike multiprocessing's spawn, it never re-runs the caller's script)."""
    _worker(*pickle.load(sys.stdin.buffer))


class Workers:
    """Rank 0's handle on ranks 1 … size − 1: `tp` is rank 0's place in the group."""

    def __init__(self, config: EngineConfig, size: int, timeout_s: float | None = None):
        if dist.is_initialized():
            raise WorkerError(
                "a tensor-parallel engine already runs in this process: close it first "
                "(one per process)"
            )
        self.timeout_s = timeout_s = timeout_s or DEFAULT_TIMEOUT_S
        port = free_port()
        # each worker's traceback, should it fail
        self._dir = tempfile.TemporaryDirectory(prefix="infergen-tp-")
        self._errors = [pathlib.Path(self._dir.name, f"rank{r}.txt") for r in range(1, size)]
        self.processes = []
        for rank, errors in enumerate(self._errors, start=1):
            process = subprocess.Popen([sys.executable, "-c", _ENTRY],
                                       stdin=subprocess.PIPE)  # fmt: skip
            process.stdin.write(pickle.dumps((rank, size, port, timeout_s, config, errors)))
            process.stdin.close()
            self.processes.append(process)
        self.tp = TPGroup(0, size)
        self._closed = False
        try:
            _join(0, size, port, timeout_s)
        except Exception as error:
            failure = self._failure(error)
            self.stop()
            raise failure from error
        atexit.register(self.close)

    def built(self) -> None:
        """Rank 0 has built its shard: wait for the workers' (their failure: WorkerError)."""
        try:
            _built()
        except Exception as error:
            failure = self._failure(error)
            self.stop()
            raise failure from error

    def forward(self, batch: ForwardBatch, num_layers: int | None, run) -> torch.Tensor:
        """Send the step to the workers, then `run()` rank 0's forward (the ranks' collectives
        meet inside it); a worker's death or silence becomes a WorkerError."""
        if self._closed:
            raise WorkerError("the tensor-parallel workers were stopped")
        try:
            began = time.perf_counter()
            dist.broadcast_object_list([(batch, num_layers)], src=0)
            self.tp.count("broadcast", 0, began)  # (the step's inputs, pickled)
            return run()
        except Exception as error:
            failure = self._failure(error)
            self.stop()
            raise failure from error

    def _failure(self, error: Exception) -> WorkerError:
        """Which rank failed and how: its exit code, its own traceback, or silence."""
        for process in self.processes:  # (a dead one's exit code, a hung one's None)
            try:
                process.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                pass
        reported = {r: e.read_text() for r, e in enumerate(self._errors, start=1) if e.exists()}
        causes = []
        for rank, process in enumerate(self.processes, start=1):
            if rank in reported:
                last = reported[rank].strip().splitlines()[-1]
                causes.append(f"rank {rank} failed: {last}")
            elif process.returncode not in (None, 0):
                causes.append(f"rank {rank} exited with code {process.returncode}")
        if not causes:  # (every worker alive: one hung, or rank 0's own step failed)
            causes.append(f"no worker exited; the step failed after waiting at most "
                          f"{self.timeout_s:g} s per collective: {error}")  # fmt: skip
        return WorkerError(f"tensor parallelism stopped: {'; '.join(causes)}")

    def stop(self) -> None:
        """Every worker gone (terminated, then killed); the group left."""
        self._closed = True
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if dist.is_initialized():
            dist.destroy_process_group()
        self._dir.cleanup()

    def close(self) -> None:
        """Stop the workers (they leave their loop when told; killed if they do not)."""
        if self._closed:
            return
        try:
            dist.broadcast_object_list([None], src=0)
        except Exception:  # (a worker already gone: stopped below all the same)
            pass
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass  # (stopped below)
        self.stop()
        atexit.unregister(self.close)
