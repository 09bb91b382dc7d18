"""Builds side by side (compiler/concurrent_builds.py): outcomes in the order asked, errors
handed back in order, builds really overlapping, the ones named first started first; and an
engine start with the jit mode's kernels built side by side gives the same compile report, the
same JIT cache entries and the same logits as one building them one after the other."""

from __future__ import annotations

import threading

import pytest
import torch

from infergen import LLM
from infergen.compiler import concurrent_builds, runtime
from infergen.compiler.concurrent_builds import run_builds
from infergen.compiler.jit_cache import JitCache
from infergen.kernels.build import KernelUnavailable
from tests.hf_models import build_hf_model


@pytest.fixture(autouse=True)
def two_workers(monkeypatch):
    monkeypatch.setattr(concurrent_builds, "workers", lambda: 2)  # (whatever the cores here)


def test_outcomes_in_order_and_errors_kept():
    def failing():
        raise KernelUnavailable("no compiler")

    outcomes = run_builds([lambda: 1, failing, lambda: 3])
    assert [o.value for o in outcomes] == [1, None, 3]
    assert outcomes[0].get() == 1 and outcomes[2].get() == 3
    with pytest.raises(KernelUnavailable, match="no compiler"):
        outcomes[1].get()


def test_builds_overlap():
    """Two builds that each wait for the other: one after the other, the barrier times out."""
    barrier = threading.Barrier(2, timeout=10)
    outcomes = run_builds([barrier.wait, barrier.wait])
    assert all(o.error is None for o in outcomes), [o.error for o in outcomes]
    serial = run_builds([threading.Barrier(2, timeout=0.2).wait] * 2, parallel=False)
    assert all(isinstance(o.error, threading.BrokenBarrierError) for o in serial)


def test_named_builds_start_first():
    started, lock = [], threading.Lock()

    def build(i):
        def run():
            with lock:
                started.append(i)
            return i

        return run

    outcomes = run_builds([build(i) for i in range(6)], first=[4, 5])
    assert [o.get() for o in outcomes] == list(range(6))
    assert set(started[:2]) == {4, 5}, started


@pytest.mark.parametrize("name", ["llama_gqa", "qwen3_next"])
def test_engine_start_side_by_side_equals_one_by_one(name, tmp_path, monkeypatch):
    """From empty JIT caches: the same report (kernels built, fallbacks and their order), the
    same entries, the same logits; qwen3_next has two kinds of layer (a program per kind)."""
    build_hf_model(name, tmp_path / "model")
    starts = {}
    for mode in ("one_by_one", "side_by_side"):
        cache = tmp_path / mode
        monkeypatch.setattr(runtime, "JitCache", lambda cache=cache: JitCache(cache))
        if mode == "one_by_one":
            monkeypatch.setattr(runtime, "run_builds", lambda b, p, f=(): run_builds(b, False))
        else:
            monkeypatch.setattr(runtime, "run_builds", run_builds)
        llm = LLM(str(tmp_path / "model"), kv_cache_memory="4MiB", compile="jit")
        starts[mode] = llm, sorted(e["key"] for e in JitCache(cache).entries())
    (one, one_keys), (side, side_keys) = starts["one_by_one"], starts["side_by_side"]
    a, b = one.engine.compile_report, side.engine.compile_report
    assert a.kernels_built == b.kernels_built >= 2 and a.kernels_cached == b.kernels_cached
    assert a.groups_op_by_op == b.groups_op_by_op
    assert a.epilogues_unfused == b.epilogues_unfused
    assert one_keys == side_keys
    layers = side.engine.runner.model.fast_path_for(side.engine.kv_cache)
    assert all(layers.programs["decode"]), a.groups_op_by_op
    tokens = [3, 17, 42, 5, 8, 150, 23, 1, 2]
    for chunk in (9, 4, 1):  # (prefill programs, then decode programs)
        expected = one.engine.prompt_logits(tokens, chunk=chunk)
        assert torch.equal(side.engine.prompt_logits(tokens, chunk=chunk), expected), chunk


def test_an_entry_another_builder_is_writing_is_left_to_it(tmp_path):
    """Its library in place, its record not yet: a second `get` of the same key (two layer kinds
    sharing one program) leaves both alone until it holds the key's lock — evicting them there
    took the library from under the builder about to load it — and then takes the built entry."""
    import ctypes
    import fcntl

    cache = JitCache(tmp_path)
    key, function = "k" * 24, "seven"
    render = lambda: "int seven(void) { return 7; }"  # noqa: E731
    tmp_path.mkdir(exist_ok=True)
    library = tmp_path / f"{key}.so"
    library.write_bytes(b"being written")  # (the other builder's, before its .json)
    looked = threading.Event()
    load = cache._load

    def observed(*args, **kwargs):
        try:
            return load(*args, **kwargs)
        finally:
            looked.set()

    cache._load = observed
    got = {}
    with open(tmp_path / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # (the other builder holds the key)
        thread = threading.Thread(target=lambda: got.update(built=cache.get(key, function, render)))
        thread.start()
        assert looked.wait(30)
        assert library.read_bytes() == b"being written"  # not evicted from under its builder
    thread.join(60)
    built = got["built"]  # (the lock released with the record never written: built anew)
    built.fn.restype = ctypes.c_int
    assert built.fn() == 7
