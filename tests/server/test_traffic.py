"""The traffic record (compiler/traffic.py): a server saves how many steps ran per token-count
bucket, and the next engine start with compile_budget_s plans for that mix."""

from __future__ import annotations

import openai

from infergen import LLM
from infergen.compiler import runtime, traffic
from infergen.compiler.jit_cache import JitCache
from infergen.compiler.traffic import HALF_LIFE_STEPS, TrafficRecord
from tests.hf_models import build_hf_model
from tests.server.conftest import API_KEY, MODEL, own_server


def test_record_counts_decays_and_survives_garbage(tmp_path):
    record = TrafficRecord.for_model("m", tmp_path)
    assert record.mix() is None  # nothing yet
    for tokens in [1] * 6 + [5, 40, 300, 2000]:
        record.add(tokens)
    mix = record.mix()
    assert set(mix) == {"1", "2-8", "9-64", "65-512", ">512"}
    assert abs(sum(mix.values()) - 1) < 1e-9 and abs(mix["1"] - 0.6) < 1e-3
    record.save()
    again = TrafficRecord.for_model("m", tmp_path)
    assert again.mix() == mix and again.steps == 0
    for _ in range(HALF_LIFE_STEPS):  # a half-life of decode steps: the old ones weigh half
        again.add(1)
    assert abs(again.counts["2-8"] - 0.5) < 1e-3
    assert TrafficRecord.for_model("other", tmp_path).mix() is None  # per model
    record.path.write_text("{not json")
    assert TrafficRecord.for_model("m", tmp_path).mix() is None  # unreadable: start over


def test_server_records_its_traffic_and_the_next_start_plans_for_it(tmp_path, monkeypatch):
    build_hf_model("llama_gqa", tmp_path / "model")
    monkeypatch.setattr(traffic, "default_root", lambda: tmp_path / "jit")
    monkeypatch.setattr(runtime, "JitCache", lambda: JitCache(tmp_path / "jit"))
    with own_server(tmp_path / "model") as (server, llm):
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)
        client.completions.create(model=MODEL, prompt=[5, 8, 150, 23, 77], max_tokens=6)
        path = str(llm.engine.checkpoint_path)
    mix = TrafficRecord.for_model(path).mix()  # saved at shutdown
    assert mix is not None and set(mix) == {"1", "2-8"}  # 5 decode steps, 1 prefill of 5
    assert abs(mix["1"] - 5 / 6) < 1e-3
    planned = LLM(str(tmp_path / "model"), kv_cache_memory="4MiB", compile="jit",
                  compile_budget_s=0)  # fmt: skip
    tuned = {i.kind for i in planned.engine.compile_plan if i.group == "layer program"}
    assert tuned == {"compile", "tune 1", "tune 2-8"}  # the recorded buckets
