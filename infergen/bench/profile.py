"""`infergen profile`'s run: engine steps of a workload, timed plainly and under
torch.profiler, per phase (prefill, decode).

The workload: `batch` prompts of `prompt_tokens` random token ids each. Prefill: the prompts
with one output token each, every step until they are done a prefill step (a prompt longer than
the step's token budget takes several); one warm-up run, then `prefill_runs` timed runs and as
many profiled ones. Decode: fresh prompts prefilled (not measured), `warmup` decode steps, then
`decode_steps` timed steps and `decode_steps` profiled ones, every sequence decoding in each.
Prefix caching does not hit (the prompts are fresh each run), unless `cached_tokens` > 0: then
every prompt starts with one shared prefix of that many random ids, computed once before the
runs, so each prefill computes only its own `prompt_tokens` after a prefix hit (a conversation's
next turn: the new tokens attend to the cached ones); the table's tokens per step count what was
computed.

Timed and profiled steps take turns, in blocks (ABBA: timed-profiled, profiled-timed, ...), so
a slower stretch of a shared machine, or the decode contexts growing, weigh on both alike. A
timed step's wall time (`engine.step()` returning; on a GPU synchronized) with nothing recording
is the measured step time. Each profiled block is a torch.profiler session (CPU activity, and
CUDA activity on a GPU), each step inside the region "step:<phase>" that the table (bench/
profile_table.py) and the Chrome / Perfetto trace (`write_trace`: the sessions merged) find.
While steps record, the C timers of a native call that runs every layer run too (`CTimers`:
the generated layer program's per call site with compile="jit", the hand-written fused decode
step's per phase otherwise — models/fused_decode.py PhaseProfile), summed over layers.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import pathlib
import random
import re
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from infergen.bench.profile_table import STEP, PhaseResult, Roofline, aggregate
from infergen.engine.engine import Engine
from infergen.engine.sampling_params import SamplingParams
from infergen.layers.linear import Linear
from infergen.models.fused_decode import PhaseProfile

PHASES = ("prefill", "decode")
DECODE_BLOCKS = 4  # the decode steps of each kind come in this many blocks


@dataclass(frozen=True)
class ProfileWorkload:
    prompt_tokens: int = 512
    batch: int = 1
    decode_steps: int = 32  # timed, and as many profiled
    warmup: int = 2  # decode steps before the measured ones (>= 1); prefill: one warm-up run
    prefill_runs: int = 2  # prefills of the whole batch timed, and as many profiled
    phases: tuple[str, ...] = PHASES
    seed: int = 0
    cached_tokens: int = 0  # a shared prefix every prompt starts with, cached before the runs


@dataclass
class Profile:
    """What `profile_engine` returns: a PhaseResult per phase run, and the profiler sessions
    (`write_trace`)."""

    phases: dict[str, PhaseResult] = field(default_factory=dict)
    sessions: list[profile] = field(default_factory=list)


def profile_engine(
    engine: Engine,
    workload: ProfileWorkload,
    roofline: Roofline | None = None,
    say: Callable[[str], None] | None = None,
) -> Profile:
    """Run the workload's phases on `engine` (timed and profiled steps in turn) and tabulate
    them."""
    say = say or (lambda text: print(text, file=sys.stderr, flush=True))
    run = _Runner(engine, workload)
    device = engine.kv_cache.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device else [])
    result, events = Profile(), []
    measured: dict[str, list[float]] = {phase: [] for phase in workload.phases}

    def recorded(block: Callable[[], object]) -> None:
        session = profile(activities=activities)
        with _quiet_stderr():  # (the profiler's C++ side prints a line at start and stop)
            session.start()
        try:
            block()
        finally:
            with _quiet_stderr():
                session.stop()
        events.extend(session.events())
        result.sessions.append(session)

    timers = {phase: CTimers(engine, phase) for phase in workload.phases}
    if "prefill" in workload.phases:
        say(f"prefill: a warm-up run, then {workload.prefill_runs} timed and as many profiled")
        run.prefill()
        for turn in range(workload.prefill_runs):
            for record in _order(turn):
                if record:
                    with timers["prefill"]:
                        recorded(lambda: run.prefill(record=True))
                else:
                    measured["prefill"] += run.prefill()
    if "decode" in workload.phases:
        say(f"decode: {workload.warmup} warm-up steps, then {workload.decode_steps} timed and "
            "as many profiled")  # fmt: skip
        ids = run.start_decode()
        for turn, steps in enumerate(_blocks(workload.decode_steps)):
            for record in _order(turn):
                if not record:
                    measured["decode"] += run.decode(steps)
                    continue
                with timers["decode"]:
                    recorded(lambda steps=steps: run.decode(steps, record=True))
        run.finish(ids)
    roles = linear_roles(engine.runner.model)
    for phase in workload.phases:
        tokens = run.tokens_per_step[phase]
        result.phases[phase] = aggregate(events, phase, measured[phase], tokens, roles,
                                         roofline, device)  # fmt: skip
        steps, found = result.phases[phase].steps, timers[phase]
        if steps and sum(found.seconds.values()) > 0:
            result.phases[phase].c_timers = {k: v / steps for k, v in found.seconds.items()}
            result.phases[phase].c_timers_of = found.of
    return result


class CTimers:
    """The C timers of whatever runs a phase's layers in one native call, on while the context
    is open (seconds summed in `seconds` over the times it was): with compile="jit" the
    generated layer program of the phase (per call site: compiler/program.py `timed`);
    otherwise, for decode, the hand-written fused decode step (per phase: `PhaseProfile`).
    `of` says which; nothing is timed (seconds stay empty) when neither runs."""

    def __init__(self, engine: Engine, phase: str):
        self.seconds: dict[str, float] = {}
        path = engine.runner.model.fast_path_for(engine.kv_cache)
        programs = getattr(path, "programs", {}).get(phase, [])
        if any(programs):  # (every kind of layer's program: CompiledLayers.timed)
            self._open = functools.partial(path.timed, phase)
            self.of = f"the generated {phase} layer program by call site"
        elif phase == "decode":
            self._open = _fused_phases
            self.of = "the fused decode call by phase"
        else:
            self._open, self.of = (lambda: contextlib.nullcontext({})), ""

    def __enter__(self) -> CTimers:
        self._context = self._open()  # (yields a dict of seconds, filled when it closes)
        self._found = self._context.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._context.__exit__(*exc)
        for name, seconds in self._found.items():
            self.seconds[name] = self.seconds.get(name, 0.0) + seconds


@contextlib.contextmanager
def _fused_phases():
    """The fused decode step's phase timers (PhaseProfile) as the layer programs' are read: a
    dict of seconds per phase, filled when the block ends."""
    seconds: dict[str, float] = {}
    with PhaseProfile() as timers:
        yield seconds
    seconds.update(timers.seconds)


@contextlib.contextmanager
def _quiet_stderr():
    """File descriptor 2 to /dev/null while the block runs (C++ writes there directly)."""
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _order(turn: int) -> tuple[bool, bool]:
    """(record?) of the two blocks of a turn: timed first on even turns (ABBA)."""
    return (False, True) if turn % 2 == 0 else (True, False)


def _blocks(steps: int) -> list[int]:
    """`steps` split into DECODE_BLOCKS blocks (fewer for fewer steps), as even as can be."""
    count = min(DECODE_BLOCKS, steps)
    return [steps // count + (i < steps % count) for i in range(count)]


def write_trace(result: Profile, path: str | pathlib.Path) -> None:
    """The profiled steps as one Chrome / Perfetto trace: each session's export, merged (their
    timestamps share a clock; metadata events once)."""
    merged: dict | None = None
    seen: set[str] = set()
    for session in result.sessions:
        with tempfile.TemporaryDirectory() as tmp:
            file = pathlib.Path(tmp) / "trace.json"
            session.export_chrome_trace(str(file))
            document = json.loads(file.read_text())
        events = document.get("traceEvents", [])
        if merged is None:
            merged, document["traceEvents"] = document, []
        for event in events:
            if event.get("ph") == "M":  # (process / thread names: the same in every session)
                key = json.dumps(event, sort_keys=True)
                if key in seen:
                    continue
                seen.add(key)
            merged["traceEvents"].append(event)
    pathlib.Path(path).write_text(json.dumps(merged or {"traceEvents": []}))


class _Runner:
    """Steps the engine through the workload's requests, timing each step."""

    def __init__(self, engine: Engine, workload: ProfileWorkload):
        self.engine, self.workload = engine, workload
        self.rng = random.Random(workload.seed)
        self.tokens_per_step: dict[str, float] = {}
        self.cuda = engine.kv_cache.device.type == "cuda"
        self.prefix = self._ids(workload.cached_tokens)
        if self.prefix:  # computed once: every prompt's prefix hit
            self._finish_all(self._add_prompts([self.prefix], max_tokens=1))

    def _ids(self, count: int) -> list[int]:
        vocab = self.engine.model_config.vocab_size
        low = min(100, vocab // 2)  # (past the special tokens of most vocabularies)
        return [self.rng.randrange(low, vocab) for _ in range(count)]

    def _prompts(self) -> list[list[int]]:
        return [
            self.prefix + self._ids(self.workload.prompt_tokens) for _ in range(self.workload.batch)
        ]

    def _add_prompts(self, prompts: list[list[int]], max_tokens: int) -> list[str]:
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        return [self.engine.add_request(prompt, params) for prompt in prompts]

    def _finish_all(self, ids: list[str]) -> None:
        while self.engine.has_unfinished():
            self.engine.step()
        self._finish(ids)

    def _add(self, max_tokens: int) -> list[str]:
        return self._add_prompts(self._prompts(), max_tokens)

    def _finish(self, ids: list[str]) -> None:
        """Stop what is left of the requests and forget them (their blocks freed)."""
        for request_id in ids:
            self.engine.abort(request_id)
            self.engine.release(request_id)

    def _step(self, phase: str | None) -> tuple[float, list[int]]:
        """One step (inside its region when `phase`): (seconds, new tokens per sequence)."""
        seen: list[list[int]] = []
        previous, self.engine.on_step = self.engine.on_step, lambda r: seen.append(r.chunks)
        try:
            with record_function(f"{STEP}{phase}") if phase else contextlib.nullcontext():
                start = time.perf_counter()
                self.engine.step()
                if self.cuda:
                    torch.cuda.synchronize()
                seconds = time.perf_counter() - start
        finally:
            self.engine.on_step = previous
        return seconds, [n for n, _ in seen[0]] if seen else []

    def prefill(self, record: bool = False) -> list[float]:
        """The batch's prompts prefilled (one token each): each step's seconds."""
        ids = self._add(max_tokens=1)
        times, tokens = [], 0
        while self.engine.has_unfinished():
            seconds, new = self._step("prefill" if record else None)
            if new:
                times.append(seconds)
                tokens += sum(new)
        self._finish(ids)
        self.tokens_per_step["prefill"] = tokens / max(1, len(times))
        return times

    def start_decode(self) -> list[str]:
        """Fresh prompts prefilled, then decode steps until every sequence decodes and
        `warmup` of them (at least that first one) have run: the requests' ids (room for
        2 x `decode_steps` more: timed and profiled)."""
        workload = self.workload
        budget = self.engine.config.scheduler.max_num_batched_tokens
        # (a prompt prefilled early decodes while the later ones prefill: room for that)
        spare = -(-workload.batch * workload.prompt_tokens // budget)
        ids = self._add(max_tokens=workload.warmup + 2 * workload.decode_steps + spare + 2)
        while True:
            _, new = self._step(None)
            if len(new) == workload.batch and all(n == 1 for n in new):
                break
        for _ in range(workload.warmup - 1):
            self._step(None)
        self.tokens_per_step["decode"] = float(workload.batch)
        return ids

    def decode(self, steps: int, record: bool = False) -> list[float]:
        """`steps` decode steps of the sequences `start_decode` started: each one's seconds."""
        return [self._step("decode" if record else None)[0] for _ in range(steps)]

    def finish(self, ids: list[str]) -> None:
        self._finish(ids)


def linear_roles(model) -> dict[str, str]:
    """{"<in>-><out>": the projections of that shape, by module name without the layer index
    ("attn.qkv", "lm_head")}: what names a linear row of the table."""
    roles: dict[str, set[str]] = {}
    for name, module in model.named_modules():
        if isinstance(module, Linear):
            shape = f"{module.in_features}->{module.out_features}"
            roles.setdefault(shape, set()).add(re.sub(r"^(layers|mtp)\.\d+\.", "", name))
    return {shape: "/".join(sorted(names)) for shape, names in roles.items()}
