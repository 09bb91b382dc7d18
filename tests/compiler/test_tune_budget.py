"""The tuner (compiler/tune.py), the runtime's use of its winners, and the startup budget
(compiler/budget.py, `infergen compile --budget-seconds`)."""

from __future__ import annotations

import re

import pytest
import torch

from infergen import LLM
from infergen.cli import main
from infergen.compiler import runtime
from infergen.compiler.budget import parse_traffic, plan_and_build
from infergen.compiler.codegen_c import VARIANTS, variants_for
from infergen.compiler.ir import TOKENS, Graph, Node, Op, Value
from infergen.compiler.jit_cache import JitCache
from infergen.compiler.kernel import compile_group
from infergen.compiler.runtime import jit_graph, pointwise_groups
from infergen.compiler.tune import TuningRecord, group_key, random_inputs, tune_group
from tests.hf_models import build_hf_model

F32 = torch.float32


def _graph() -> Graph:
    x, w = Value("x", (TOKENS, 64), F32, "input"), Value("w", (64,), F32, "weight")
    y, z = Value("y", (TOKENS, 64), F32), Value("z", (TOKENS, 64), F32)
    nodes = [Node(Op.MUL, (x, w), (y,)), Node(Op.SIGMOID, (y,), (z,))]
    return Graph("g", [x, w], nodes, [z])


def test_every_variant_computes_the_same(tmp_path):
    cache = JitCache(tmp_path)
    inputs = random_inputs(_graph(), 300)
    results = [compile_group(_graph(), cache, v)(*inputs)[0] for v in VARIANTS]
    for other in results[1:]:
        assert torch.equal(results[0], other)


def test_tuner_picks_a_variant_per_bucket_and_records_it(tmp_path):
    cache = JitCache(tmp_path)
    found = tune_group(_graph(), cache, ["1", "65-512"], seconds=0.05)
    record = TuningRecord(cache)
    key = group_key(_graph(), cache)
    record.store(key, found)
    for bucket in ("1", "65-512"):
        assert found[bucket].winner in VARIANTS
        assert set(found[bucket].seconds) == set(variants_for(_graph()))  # (64 columns: no tile)
        assert found[bucket].seconds[found[bucket].winner] == min(found[bucket].seconds.values())
    assert record.winners(key) == {b: r.winner for b, r in found.items()}
    record.path.write_text("{garbled")
    assert record.winners(key) == {}  # unreadable: untuned, not an error


def test_runtime_runs_the_recorded_winner(tmp_path, monkeypatch):
    build_hf_model("llama_gqa", tmp_path / "model")
    cache = JitCache(tmp_path / "jit")
    monkeypatch.setattr(runtime, "JitCache", lambda: cache)
    llm = LLM(str(tmp_path / "model"), kv_cache_memory="4MiB")
    model, kv = llm.engine.runner.model, llm.engine.kv_cache
    groups = [n.attrs["graph"] for n in pointwise_groups(jit_graph(model, kv))]
    record = TuningRecord(cache)
    for group in groups:
        found = tune_group(group, cache, ["1"], seconds=0.01)
        found["1"].winner = "serial"  # whichever won, the runtime must take what is recorded
        record.store(group_key(group, cache), found)
    compiled = LLM(str(tmp_path / "model"), kv_cache_memory="4MiB", compile="jit")
    report = compiled.engine.compile_report
    assert report.tuned_buckets == len(groups)
    layers = compiled.engine.runner.model.fast_path_for(compiled.engine.kv_cache)
    for variants in layers.kernels.values():
        assert variants["1"] is not variants["default"]
    reference = llm.engine.prompt_logits(list(range(3, 30)), chunk=1)
    got = compiled.engine.prompt_logits(list(range(3, 30)), chunk=1)
    assert (got - reference).abs().max() <= 1e-4 * reference.abs().max()


def test_budget_skips_then_takes_cached_kernels(tmp_path):
    build_hf_model("llama_gqa", tmp_path / "model")
    llm = LLM(str(tmp_path / "model"), kv_cache_memory="4MiB")
    graph = jit_graph(llm.engine.runner.model, llm.engine.kv_cache)
    groups = [(f"g{i}", n.attrs["graph"]) for i, n in enumerate(pointwise_groups(graph))]
    cache = JitCache(tmp_path / "jit")
    traffic = parse_traffic("1=3,65-512=1")
    assert traffic == {"1": 0.75, "65-512": 0.25}
    nothing = plan_and_build(groups, traffic, 3, 0.0, cache)
    assert all(i.status == "skipped" for i in nothing)
    assert all(i.gain_ms > 0 for i in nothing if i.kind == "compile")
    everything = plan_and_build(groups, traffic, 3, 60.0, cache)
    compiles = [i for i in everything if i.kind == "compile"]
    statuses = [i.status for i in compiles]
    assert "built" in statuses and all(s == "built" or s.startswith("= g") for s in statuses)
    tuned = [i for i in everything if i.kind.startswith("tune")]
    assert tuned and all(i.status == "tuned" and i.gain_ms is not None for i in tuned)
    again = plan_and_build(groups, traffic, 3, 0.0, cache)  # no budget, but all cached
    statuses = [i.status for i in again if i.kind == "compile"]
    assert "cached" in statuses and all(s == "cached" or s.startswith("= g") for s in statuses)


def test_bad_traffic_is_refused():
    with pytest.raises(ValueError, match="traffic bucket '3'"):
        parse_traffic("3=1")
    with pytest.raises(ValueError, match="not a number"):
        parse_traffic("1=lots")


def test_cli_budget_report(tmp_path, capsys):
    build_hf_model("llama_gqa", tmp_path / "model")
    code = main(
        [
            "compile",
            "-m",
            str(tmp_path / "model"),
            "--kv-cache-memory",
            "4MiB",
            "--budget-seconds",
            "30",
            "--jit-cache",
            str(tmp_path / "jit"),
            "--traffic",
            "1=1",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "compile: group 0" in out and "built" in out and "tune 1: group 0" in out
    assert re.search(r"compile: layer program +built", out)
    assert re.search(r"tune 1: layer program +skipped", out)  # (its search takes ~30 s)
    assert "skipped 1 items" in out
    assert (
        main(
            [
                "compile",
                "-m",
                str(tmp_path / "model"),
                "--budget-seconds",
                "1",
                "--traffic",
                "decode=1",
            ]
        )
        == 2
    )
    assert "traffic bucket 'decode'" in capsys.readouterr().err
