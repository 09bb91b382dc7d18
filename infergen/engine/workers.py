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
- **Messages.** Rank 0's messages (a step, `trace` / `waits`, stop) travel on a control group
  of their own (`_send` / `_receive`): a worker waits for the next one as long as the engine
  idles, while rank 0's sends give up after `timeout_s` like any collective.
- **Faults.** A worker that exits, or does not answer a collective within `timeout_s`, fails
  the step with a `WorkerError` naming the rank and its exit code (or that it hung); the
  others are stopped, none is left behind. `close()` (also at interpreter exit) stops them.
- **Several nodes.** Under torchrun (`torchrun --nnodes 2 --nproc-per-node 1 … -m infergen
  serve …`: its environment names RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT), nothing
  is spawned: every rank is a process torchrun started, on its own node or this one. Rank 0
  runs the command (the engine, the server); each other rank joins the group from the
  environment and serves rank 0 (`serve_rank`) until it stops. The world size is the
  tensor-parallel size.
- One tensor-parallel engine per process (torch.distributed's default group is the
  process's).
"""

from __future__ import annotations

import atexit
import datetime
import os
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
from infergen.errors import ConfigError
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


def _join(rank: int, size: int, port: int | None, timeout_s: float) -> Any:
    """Join the group — at a localhost port, or (None) where torchrun's environment says —
    and return the control group rank 0's messages travel on (`_send`, `_receive`)."""
    where = "env://" if port is None else f"tcp://127.0.0.1:{port}"
    dist.init_process_group("gloo", init_method=where, rank=rank, world_size=size,
                            timeout=datetime.timedelta(seconds=timeout_s))  # fmt: skip
    return dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)


# A worker waits for rank 0's next message as long as the engine idles: on a group of its own
# whose timeout is this (a collective of the main group times out after timeout_s, and a
# worker that waited 30 s for a request would die). Rank 0's sends still wait at most
# timeout_s (Work.wait), so a hung worker is found as fast as in a forward.
IDLE_TIMEOUT = datetime.timedelta(days=30)


def _send(control: Any, message: Any, timeout_s: float) -> None:
    """Rank 0: `message` (pickled) to every worker, each part waiting at most timeout_s."""
    payload = torch.frombuffer(bytearray(pickle.dumps(message)), dtype=torch.uint8)
    wait = datetime.timedelta(seconds=timeout_s)
    for part in (torch.tensor([payload.numel()], dtype=torch.int64), payload):
        dist.broadcast(part, src=0, group=control, async_op=True).wait(timeout=wait)


def _receive(control: Any, timeout_s: float) -> Any:
    """A worker: rank 0's next message (its size waited for as long as the engine idles)."""
    size = torch.empty(1, dtype=torch.int64)
    dist.broadcast(size, src=0, group=control)
    payload = torch.empty(int(size.item()), dtype=torch.uint8)
    wait = datetime.timedelta(seconds=timeout_s)
    dist.broadcast(payload, src=0, group=control, async_op=True).wait(timeout=wait)
    return pickle.loads(payload.numpy().tobytes())


def launched() -> tuple[int, int] | None:
    """(rank, world size) when torchrun started this process as one of several (its
    environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); None otherwise."""
    env = os.environ
    if not all(k in env for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
        return None
    rank, size = int(env["RANK"]), int(env["WORLD_SIZE"])
    return (rank, size) if size > 1 else None


def launched_size(tensor_parallel_size: int) -> int:
    """The tensor-parallel size under torchrun: its world size (a -tp of 1, the default,
    takes it; any other must equal it), or `tensor_parallel_size` without torchrun."""
    found = launched()
    if found is None or tensor_parallel_size == found[1]:
        return tensor_parallel_size
    if tensor_parallel_size != 1:
        raise ConfigError(
            "under torchrun the tensor-parallel group is torchrun's world: every process it "
            "started is one rank",
            where="tensor_parallel_size",
            found=f"{tensor_parallel_size} with a torchrun world of {found[1]}",
            expected=f"{found[1]} (or leave it out)",
        )
    return found[1]


def serve_rank(config: EngineConfig) -> int:
    """A rank > 0 that torchrun started (on this node or another): join the group from the
    environment, build the shard of `config`, and run what rank 0 sends until it says stop
    (0) — or fail (the error propagates; torchrun reports it and stops the others)."""
    rank, size = launched()
    _worker(rank, size, None, DEFAULT_TIMEOUT_S, config, None)
    return 0


BUILD_TIMEOUT_S = 900.0  # every rank's build done within this (a large checkpoint's load)


def _built() -> None:
    """Every rank has built its shard (a rank that failed, or is still building after
    BUILD_TIMEOUT_S, is named by the barrier's error)."""
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=BUILD_TIMEOUT_S))


def _worker(rank: int, size: int, port: int | None, timeout_s: float, config: EngineConfig,
            errors: pathlib.Path | None) -> None:  # fmt: skip
    """A worker's life: join, build its shard, then run each forward rank 0 sends; on a
    failure its traceback goes to `errors` (rank 0 reads it; None: torchrun's rank, whose
    traceback torchrun shows) and it exits non-zero."""
    control = _join(rank, size, port, timeout_s)
    try:
        tp = TPGroup(rank, size)
        built = build(config, tp=tp)
        _built()
        while True:
            began = time.perf_counter()
            if (message := _receive(control, timeout_s)) is None:
                break
            kind, payload = message
            if kind == "forward":  # (timed as rank 0 times its send: the traces line up)
                tp.count("broadcast", 0, began)
            _COMMANDS[kind](built, tp, payload)
    except Exception:
        if errors is not None:
            errors.write_text(traceback.format_exc())
        raise
    finally:
        dist.destroy_process_group()


def _forward(built, tp: TPGroup, payload) -> None:
    batch, num_layers = payload
    if batch.slot_mappings:
        built.kv_cache.begin_step(batch.slot_mappings[0])
    built.model(batch, built.kv_cache, num_layers=num_layers)


def _trace(built, tp: TPGroup, on: bool) -> None:
    tp.trace = [] if on else None


def _send_waits(built, tp: TPGroup, payload) -> None:
    dist.gather_object(tp.trace or [], dst=0)
    tp.trace = [] if tp.trace is not None else None


# what a worker does with each message rank 0 broadcasts (None: leave the loop)
_COMMANDS = {"forward": _forward, "trace": _trace, "waits": _send_waits}

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
        # torchrun started every rank (on this node or others): join them where it says
        found = launched()
        self.torchrun = found is not None
        if self.torchrun and found != (0, size):
            raise ConfigError("under torchrun, rank 0 runs the engine; the other ranks serve it",
                              where="torchrun", found=found,
                              expected=f"rank 0 of a world of {size}")  # fmt: skip
        port = None if self.torchrun else free_port()
        # each worker's traceback, should it fail
        self._dir = tempfile.TemporaryDirectory(prefix="infergen-tp-")
        self._errors = [pathlib.Path(self._dir.name, f"rank{r}.txt") for r in range(1, size)]
        self.processes = []
        for rank, errors in enumerate([] if self.torchrun else self._errors, start=1):
            process = subprocess.Popen([sys.executable, "-c", _ENTRY],
                                       stdin=subprocess.PIPE)  # fmt: skip
            process.stdin.write(pickle.dumps((rank, size, port, timeout_s, config, errors)))
            process.stdin.close()
            self.processes.append(process)
        self.tp = TPGroup(0, size)
        self._closed = False
        self._control = self._guarded(lambda: _join(0, size, port, timeout_s))
        atexit.register(self.close)

    def built(self) -> None:
        """Rank 0 has built its shard: wait for the workers' (their failure: WorkerError)."""
        self._guarded(_built)

    def forward(self, batch: ForwardBatch, num_layers: int | None, run) -> torch.Tensor:
        """Send the step to the workers, then `run()` rank 0's forward (the ranks' collectives
        meet inside it); a worker's death or silence becomes a WorkerError."""
        began = time.perf_counter()

        def step() -> torch.Tensor:
            self.tp.count("broadcast", 0, began)  # (the step's inputs, pickled)
            return run()

        return self._command("forward", (batch, num_layers), step)

    def trace(self, on: bool = True) -> None:
        """Every rank starts (or stops) recording each collective's wait (TPGroup.trace)."""
        self._command("trace", on)
        self.tp.trace = [] if on else None

    def waits(self) -> list[list[float]]:
        """Every rank's recorded waits since `trace` (or the last call), rank order; the
        records restart empty."""
        ranks: list = [None] * self.tp.size
        self._command("waits", None, lambda: dist.gather_object(self.tp.trace or [], ranks, 0))
        self.tp.trace = [] if self.tp.trace is not None else None
        return ranks

    def _command(self, kind: str, payload, then=lambda: None):
        """Broadcast a command to the workers, then run `then` (its part on rank 0)."""
        if self._closed:
            raise WorkerError("the tensor-parallel workers were stopped")

        def send_then():
            _send(self._control, (kind, payload), self.timeout_s)
            return then()

        return self._guarded(send_then)

    def _guarded(self, run):
        """run(); should it fail, a WorkerError naming the failed rank, every worker stopped."""
        try:
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
        if self.torchrun:  # (its ranks are torchrun's: their exits are its to report)
            causes.append(f"a rank torchrun started failed or hung (waited at most "
                          f"{self.timeout_s:g} s per collective): {error}")  # fmt: skip
        elif not causes:  # (every worker alive: one hung, or rank 0's own step failed)
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
            _send(self._control, None, self.timeout_s)
        except Exception:  # (a worker already gone: stopped below all the same)
            pass
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass  # (stopped below)
        self.stop()
        atexit.unregister(self.close)
