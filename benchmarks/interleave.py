"""Two engines decoding the same requests with their steps interleaved, so that both runs see
the same moments of the host.

Why: these VMs' decode speed switches between two states from one few seconds to the next
(measured on an AMD EPYC Zen 4, the default model at batch 1: a median step of ~12 ms for
6-20 s, then ~18 ms for as long, 2-second medians over a minute). A ratio of two runs made
one after the other, each a few seconds long, then compares two states about as often as
one: rounds of 0.7 and 1.4 where the configurations are equal. Interleaved step by step,
each run's time is a sum over the same stretch of wall time.

How: both engines get the requests; then, until both are done, the engine whose run is
less far along (output tokens so far / tokens it will make) takes the next step, so that the
two finish together however different their step times and tokens per step (a speculating
engine makes several tokens a step). Each run's time is the sum of its own `engine.step()`
calls. A batch-1 rate counts the tokens after the first over the steps after the one that
returned it (a decode rate: the prompt's prefill left out, as `decode_rate` does); a batch's
rate counts every output token over all its steps.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass
class Run:
    """One engine's requests and the time of its steps so far."""

    engine: object
    ids: list[str]
    total: int  # output tokens it will make (requests x max_tokens)
    single: bool
    seconds: float = 0.0  # all its steps
    decode_seconds: float = 0.0  # its steps after the one that returned the first token
    first: bool = False  # the first token came
    outputs: list[list[int]] | None = None  # once done: each request's output tokens

    @property
    def made(self) -> int:
        return sum(len(self.engine.output(i).token_ids) for i in self.ids)

    @property
    def done(self) -> bool:
        return not self.engine.has_unfinished()

    @property
    def progress(self) -> float:
        return self.made / self.total

    def step(self) -> None:
        start = time.perf_counter()
        deltas = self.engine.step()
        seconds = time.perf_counter() - start
        self.seconds += seconds
        if self.first:
            self.decode_seconds += seconds
        elif any(d.token_ids for d in deltas):
            self.first = True

    def finish(self) -> None:
        """Keep the outputs and release the requests."""
        self.outputs = [list(self.engine.output(i).token_ids) for i in self.ids]
        for i in self.ids:
            self.engine.release(i)

    @property
    def rate(self) -> float:
        """Tokens per second (module docstring), once finished."""
        if self.single:
            return (len(self.outputs[0]) - 1) / self.decode_seconds
        return sum(len(o) for o in self.outputs) / self.seconds


def interleaved(engines: list, prompts: list[list[int]], params, single: bool) -> list[Run]:
    """Each of `engines` (infergen Engines, none with requests of its own) decodes `prompts`
    with `params`, their steps interleaved by progress (module docstring). The runs, in the
    order of `engines`, finished (their outputs kept, their requests released)."""
    runs = []
    for engine in engines:
        ids = [engine.add_request(p, params) for p in prompts]
        runs.append(Run(engine, ids, params.max_tokens * len(prompts), single))
    step_by_progress(runs)
    for run in runs:
        run.finish()
    return runs


def step_by_progress(runs: list) -> None:
    """Step `runs` (anything with `done`, `progress` in [0, 1] and `step()`: a Run, a
    kv_tiers_workload.ClosedLoop) until all are done, the one least far along next."""
    while True:
        going = [run for run in runs if not run.done]
        if not going:
            return
        min(going, key=lambda run: run.progress).step()
