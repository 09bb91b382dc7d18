"""Steps the engine runs op by op (perf/eager.py, perf/eager_measure.py): which decodes the
fused decode covers, against the engine's own fast path on every tiny family; the measured
table's parts; the roofline's "op by op" line."""

from __future__ import annotations

import dataclasses

import pytest

from infergen.engine.engine import Engine
from infergen.engine.options import engine_config
from infergen.io.random_checkpoint import CONFIGS, random_checkpoint
from infergen.perf.calibrate import best_of, save
from infergen.perf.eager import eager_seconds, fused_decode_covers, mixer_part
from infergen.perf.eager_measure import measure_eager_layers
from infergen.perf.hardware import Hardware, load_file
from infergen.perf.roofline import HEAD_LAUNCHES, launches, predict_step
from infergen.perf.step_cost import Chunk, Formats

MIXERS = {"attention", "attention+ssm", "linear_attention", "mla", "ssm"}
TABLE = {
    "attention": (3e-4, 4e-4),
    "attention+ssm": (9e-4, 1e-3),
    "dense": (9e-5, 8e-5),
    "mla": (6e-4, 8e-4),
    "moe": (1e-3, 9e-4),
    "norm": (4e-5, 3e-5),
}
HW = Hardware(
    "toy", "toy", memory_bytes=1e9, bandwidth=1e10, flops={"fp32": 1e11}, launch_overhead_s=1e-5
)


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_fused_decode_covers_the_models_the_engine_fuses(family):
    engine = Engine(engine_config(block_size=4, num_kv_blocks=16), random_checkpoint(family))
    model = engine.runner.model
    runner = model.fast_path_for(engine.kv_cache)
    fused = runner is not None and getattr(runner, "available", True)
    assert fused_decode_covers(model.config.describe()) == fused


def test_eager_seconds_adds_each_layers_mixer_feed_forward_and_norms():
    desc = random_checkpoint("deepseek_v2").config.describe()  # layer 0 dense, then experts
    layers = len(desc.layers)
    dense, moe = TABLE["dense"], TABLE["moe"]
    for column, decode in ((0, True), (1, False)):
        want = layers * (TABLE["mla"][column] + 2 * TABLE["norm"][column])
        want += dense[column] + (layers - 1) * moe[column] + TABLE["norm"][column]
        assert eager_seconds(desc, TABLE, decode) == pytest.approx(want)
    gemma = random_checkpoint("gemma3").config.describe()  # sandwich norms: four a layer
    want = len(gemma.layers) * (3e-4 + 9e-5 + 4 * 4e-5) + 4e-5
    assert eager_seconds(gemma, TABLE, True) == pytest.approx(want)


def _line(desc, hw, chunks, name):
    times = predict_step(desc, hw, chunks, Formats(), "fp32")
    return sum(t.seconds for t in times if t.name == name)


def test_steps_run_op_by_op_cost_their_measured_layers():
    hw = dataclasses.replace(HW, eager_layer_s=TABLE)
    llama = random_checkpoint("llama_gqa").config.describe()
    hybrid = random_checkpoint("falcon_h1").config.describe()
    decode, prefill = [Chunk(1, 10)] * 2, [Chunk(1, 10), Chunk(5, 5)]
    # a fused decode: launches; the same model's prefill: its layers op by op
    assert _line(llama, hw, decode, "op by op") == 0
    assert _line(llama, hw, decode, "launch overhead") == pytest.approx(launches(llama) * 1e-5)
    assert _line(llama, hw, prefill, "op by op") == pytest.approx(
        eager_seconds(llama, TABLE, decode=False)
    )
    assert _line(llama, hw, prefill, "launch overhead") == pytest.approx(HEAD_LAUNCHES * 1e-5)
    # a decode verifying drafts: decode rows, the fused decode (engine runner.py), launches
    verify = [Chunk(1, 10), Chunk(5, 12, verify=True)]
    assert _line(llama, hw, verify, "op by op") == 0
    assert _line(llama, hw, verify, "launch overhead") == pytest.approx(launches(llama) * 1e-5)
    # a hybrid's decode runs op by op too
    assert _line(hybrid, hw, decode, "op by op") == pytest.approx(
        eager_seconds(hybrid, TABLE, decode=True)
    )
    # a row without the table (the GPUs'): launches either way
    assert _line(hybrid, HW, prefill, "op by op") == 0
    assert _line(hybrid, HW, prefill, "launch overhead") == pytest.approx(launches(hybrid) * 1e-5)


def test_the_measured_table_times_every_part_kind():
    table = measure_eager_layers(repeats=2)
    variants = {"attention+qk_norm", "attention+qk_norm+output_gate"}  # Gemma-3, Qwen3-Next
    assert set(table) == MIXERS | variants | {"dense", "moe", "norm"}
    assert all(decode > 0 and prefill > 0 for decode, prefill in table.values())


def test_an_attention_variant_costs_its_own_part_else_its_kind():
    gemma = random_checkpoint("gemma3").config.describe()  # q/k norms, sandwich norms
    assert {mixer_part(layer.mixer) for layer in gemma.layers} == {"attention+qk_norm"}
    llama = random_checkpoint("llama_gqa").config.describe()
    assert {mixer_part(layer.mixer) for layer in llama.layers} == {"attention"}
    table = {**TABLE, "attention+qk_norm": (7e-4, 8e-4)}
    per_layer = 9e-5 + 4 * 4e-5  # dense, four norms
    want = len(gemma.layers) * (7e-4 + per_layer) + 4e-5
    assert eager_seconds(gemma, table, True) == pytest.approx(want)
    # a table without the variant (calibrated before it): the kind's
    want = len(gemma.layers) * (3e-4 + per_layer) + 4e-5
    assert eager_seconds(gemma, TABLE, True) == pytest.approx(want)


def test_the_table_round_trips_through_the_row_file_and_best_of_keeps_the_faster(tmp_path):
    slow = dataclasses.replace(
        HW, name="cpu-eager-test", eager_layer_s={"norm": (2e-5, 3e-5), "moe": (1e-3, 1e-3)}
    )
    fast = dataclasses.replace(slow, eager_layer_s={"norm": (1e-5, 4e-5)})
    (row,) = load_file(save(slow, tmp_path / "row.json"))
    assert row.eager_layer_s == slow.eager_layer_s
    both = best_of(slow, fast)
    assert both.eager_layer_s == {"norm": (1e-5, 3e-5), "moe": (1e-3, 1e-3)}
