"""benchmarks/interleave.py: two engines' runs interleaved by progress give each engine's own
outputs (as each decodes alone), finish together, and time each run by its own steps."""

from __future__ import annotations

import pathlib
import sys
import time

import pytest

from infergen.engine.engine import Engine
from infergen.engine.options import engine_config
from infergen.engine.sampling_params import SamplingParams
from infergen.io.random_checkpoint import random_checkpoint

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))

from interleave import interleaved, step_by_progress  # noqa: E402

PROMPTS = [[3, 14, 15, 92, 65, 35, 89, 79], [2, 71, 82, 81, 82, 84, 59, 4]]


def _engine(**options) -> Engine:
    return Engine(engine_config(block_size=16, num_kv_blocks=64, **options),
                  random_checkpoint("llama_gqa"))  # fmt: skip


def _alone(engine: Engine, prompts, params) -> list[list[int]]:
    ids = [engine.add_request(p, params) for p in prompts]
    while engine.has_unfinished():
        engine.step()
    out = [list(engine.output(i).token_ids) for i in ids]
    for i in ids:
        engine.release(i)
    return out


@pytest.mark.parametrize("prompts", [PROMPTS[:1], PROMPTS], ids=["batch1", "batch2"])
def test_outputs_equal_each_engine_alone_and_runs_finish_together(prompts):
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    plain = _engine()
    spec = _engine(speculative="ngram", num_speculative_tokens=3)
    expected = [_alone(plain, prompts, params), _alone(spec, prompts, params)]
    start = time.perf_counter()
    runs = interleaved([spec, plain], prompts, params, single=len(prompts) == 1)
    wall = time.perf_counter() - start
    assert [runs[1].outputs, runs[0].outputs] == expected
    assert runs[0].seconds + runs[1].seconds <= wall  # each timed by its own steps only
    for run in runs:
        assert not run.engine.has_unfinished()
        assert 0 < run.decode_seconds <= run.seconds
        tokens = sum(len(o) for o in run.outputs)
        assert tokens == 12 * len(prompts)
        counted = tokens - 1 if run.single else tokens
        seconds = run.decode_seconds if run.single else run.seconds
        assert run.rate == pytest.approx(counted / seconds)


def test_the_run_behind_steps_next():
    """Progress-balanced: while both run, no step goes to the run further along, so the two
    are never more than one step's tokens apart in progress."""
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    a, b = _engine(), _engine()
    order: list[int] = []
    for index, engine in enumerate((a, b)):
        step = engine.step

        def counted(step=step, index=index):
            order.append(index)
            return step()

        engine.step = counted
    interleaved([a, b], PROMPTS[:1], params, single=True)
    # equal engines and equal token counts per step: the steps alternate a, b, a, b, ...
    assert order == [0, 1] * (len(order) // 2)


def test_closed_loops_interleaved_answer_as_alone():
    """benchmarks/kv_tiers_workload.py: two closed loops of unrelated prompts taking turns
    (the one less far along next) answer as each does alone, finish together (neither is
    more than one request ahead in progress when the other ends), and count their own
    seconds."""
    from kv_tiers_workload import ClosedLoop, Unrelated, run_closed_loop

    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[0][::-1], PROMPTS[1][::-1]]
    alone = [
        run_closed_loop(e, Unrelated(prompts, 6), 2, params)[0] for e in (_engine(), _engine())
    ]
    loops = [ClosedLoop(e, Unrelated(prompts, 6), 2, params) for e in (_engine(), _engine())]
    ends: list[float] = []
    step = loops[0].step

    def watched():
        step()
        if loops[0].done:
            ends.append(loops[1].progress)

    loops[0].step = watched
    step_by_progress(loops)
    assert ends and ends[0] >= 1 - 2 / len(prompts)  # (a step may finish both in flight)
    for loop, expected in zip(loops, alone, strict=True):
        got, engine = loop.result()
        assert sorted(r["answer"] for r in got) == sorted(r["answer"] for r in expected)
        assert loop.progress == 1.0 and engine["steps"] > 0
        assert 0 < engine["forward_s"] <= loop.seconds
