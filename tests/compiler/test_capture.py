"""Capture (compiler/capture.py) against the model code it traces: for every architecture of
tests/hf_models.py, the captured decoder-layer graph, run with the ops' plain references
(compiler/interpret.py), reproduces what the layer computed inside the engine — its delta,
the residual stream it updated in place and the KV cache it wrote — on real prefill, chunked
prefill, decode and mixed batches."""

from __future__ import annotations

import pytest
import torch

from infergen import LLM
from infergen.compiler.capture import CaptureError
from infergen.compiler.decoder import capture_head, capture_kinds, capture_layer, capture_layers
from infergen.compiler.interpret import run
from infergen.compiler.ir import Op
from infergen.compiler.verify import verify
from infergen.kvcache.kv_protocol import KVLayer, attention_part
from tests.compiler.layer_calls import cache_tensors, clone_cache, record_layer_calls
from tests.hf_models import COMPILED_VARIANTS, MIXER_VARIANTS, build_hf_model


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool((a - b).abs().max() <= 1e-5 * max(1.0, float(b.abs().max())))


@pytest.mark.parametrize("name", COMPILED_VARIANTS)
def test_captured_layer_reproduces_the_engine(name, tmp_path):
    build_hf_model(name, tmp_path)
    llm = LLM(str(tmp_path), kv_cache_memory="4MiB")
    engine = llm.engine
    model = engine.runner.model
    model.fast_path = None  # decode steps through the layers' forward (the per-op path)
    captured = capture_layer(model, engine.kv_cache, index=1)
    verify(captured.graph)
    calls = record_layer_calls(llm, model.layers[1])
    assert len(calls) >= 6
    for call in calls:
        env = captured.bind(model.layers[1], **{k: call[k] for k in ("h", "delta", "batch", "kv")})
        out, h_after, k_after, v_after = run(captured.graph, env)
        assert captured.outputs == ["return", "h", "kv.k", "kv.v"]
        assert _close(out, call["out"]), name
        assert _close(h_after, call["h_after"]), name
        assert _close(k_after, call["k_after"]) and _close(v_after, call["v_after"]), name


@pytest.mark.parametrize("name", MIXER_VARIANTS)
def test_mixer_layers_reproduce_the_engine(name, tmp_path):
    """A mixer capture has no ops for (a recurrent state mixer, latent attention) is one MIXER
    node that runs the module: the graph of the first layer of each kind, run by the
    interpreter on a copy of the cache, reproduces the layer's output, the residual stream and
    the cache (KV or recurrent states) it left, on every recorded call; the norms and MLP
    around it, Falcon-H1's attention beside its Mamba2 mixer and Qwen3-Next's gated attention
    with partial RoPE are captured ops."""
    build_hf_model(name, tmp_path)
    llm = LLM(str(tmp_path), kv_cache_memory="4MiB")
    model = llm.engine.runner.model
    model.fast_path = None
    for index in sorted({kind.layers[0] for kind in capture_kinds(model, llm.engine.kv_cache)}):
        _reproduces_the_engine(llm, model, index, name)


def _reproduces_the_engine(llm, model, index: int, name: str) -> None:
    layer = model.layers[index]
    captured = capture_layer(model, llm.engine.kv_cache, index=index)
    verify(captured.graph)
    mixers = [n for n in captured.graph.nodes if n.op is Op.MIXER]
    attends = captured.graph.count().get("attention", 0)
    if name == "falcon_h1":  # (its attention captured, the Mamba2 mixer beside it whole)
        assert [m.attrs["mixer"] for m in mixers] == ["mamba"] and attends == 1
    elif model.config.layer_type(index) == "full_attention" and name == "qwen3_next":
        assert not mixers and attends == 1  # (gated, partial RoPE: captured as ops)
    else:
        assert [m.attrs["mixer"] for m in mixers] == [model.config.layer_type(index)]
        assert attends == 0
    assert captured.graph.count()["add_rms_norm"] == (1 if layer.mlp is None else 2)
    calls = record_layer_calls(llm, layer)
    assert len(calls) >= 6
    for call in calls:
        cache = clone_cache(call["kv"])  # (the module updates it in place)
        delta = torch.zeros_like(call["h"]) if call["delta"] is None else call["delta"]
        args = dict(h=call["h"], delta=delta, batch=call["batch"], kv=cache)
        out, h_after, *kv_after = run(captured.graph, captured.bind(layer, **args))
        assert _close(out, call["out"]) and _close(h_after, call["h_after"]), (name, index)
        after = call["cache_after"]
        if kv_after:  # (a captured attention: the graph returns its new K / V; a module
            k, v = kv_after  # beside it updates its states in place)
            kv_part = attention_part(after)
            assert _close(k, kv_part.k) and _close(v, kv_part.v), (name, index)
            if isinstance(after, KVLayer):
                continue
            cache, after = cache[1], after[1]
        for got, expected in zip(cache_tensors(cache), cache_tensors(after), strict=True):
            assert _close(got.float(), expected.float()), (name, index)


def test_layer_graph_has_the_architecture_ops(tmp_path):
    """QK-norm and biases show up as graph nodes / inputs; the dump names them."""
    build_hf_model("qwen3_qk_norm", tmp_path / "qk")
    engine = LLM(str(tmp_path / "qk"), kv_cache_memory="4MiB").engine
    graph = capture_layer(engine.runner.model, engine.kv_cache).graph
    counts = graph.count()
    assert counts["rms_norm"] == 2 and counts["add_rms_norm"] == 2 and counts["rope"] == 2
    assert counts["linear"] == 4 and counts["attention"] == 1 and counts["kv_store"] == 1
    assert "attn.q_norm.weight" in graph.dump()
    build_hf_model("llama_bias", tmp_path / "bias")
    engine = LLM(str(tmp_path / "bias"), kv_cache_memory="4MiB").engine
    graph = capture_layer(engine.runner.model, engine.kv_cache).graph
    linears = [n for n in graph.nodes if n.op is Op.LINEAR]
    assert all(n.inputs[2] is not None for n in linears)
    assert graph.count()["rope"] == 1  # q and k rotated as one tensor


def test_captured_head_equals_model_logits(tmp_path):
    build_hf_model("llama_mqa_tied", tmp_path)
    model = LLM(str(tmp_path), kv_cache_memory="4MiB").engine.runner.model
    captured = capture_head(model)
    torch.manual_seed(0)
    h, delta = torch.randn(3, 64), torch.randn(3, 64)
    expected = model.head(h.clone(), delta)
    logits, _ = run(captured.graph, captured.bind(model, h=h, delta=delta))
    assert _close(logits, expected)


def test_quantized_weights_keep_their_format(tmp_path):
    build_hf_model("llama_gqa", tmp_path)
    engine = LLM(str(tmp_path), kv_cache_memory="4MiB", weights="int8").engine
    graph = capture_layer(engine.runner.model, engine.kv_cache).graph
    formats = {n.attrs["format"] for n in graph.nodes if n.op is Op.LINEAR}
    assert formats == {"int8"}


def test_unsupported_kv_format_is_refused_clearly(tmp_path):
    build_hf_model("llama_gqa", tmp_path)
    engine = LLM(str(tmp_path), kv_cache_memory="4MiB", kv_format="int4_kivi").engine
    with pytest.raises(CaptureError, match="KV format 'int4_kivi'"):
        capture_layer(engine.runner.model, engine.kv_cache)


def test_fp8_kv_cache_is_captured_with_its_scales(tmp_path):
    """An FP8 E4M3 cache: the KV store and attention take the per-head scales and key shift;
    the interpreter (encode → codes → attention over codes · scales) reproduces the engine."""
    build_hf_model("llama_gqa", tmp_path)
    llm = LLM(str(tmp_path), kv_cache_memory="4MiB", kv_format="fp8_e4m3")
    model = llm.engine.runner.model
    model.fast_path = None
    captured = capture_layer(model, llm.engine.kv_cache, index=1)
    store = next(n for n in captured.graph.nodes if n.op is Op.KV_STORE)
    assert store.attrs["format"] == "fp8_e4m3"
    assert [v.name for v in store.inputs[5:]] == ["k_scale", "v_scale", "k_shift"]
    assert "f8e4m3[B,16,2,16]:fp8_e4m3" in captured.graph.dump()
    calls = record_layer_calls(llm, model.layers[1])
    for call in calls:
        env = captured.bind(
            model.layers[1],
            **{k: call[k] for k in ("h", "delta", "batch")},
            kv=llm.engine.kv_cache.layer(1)._replace(k=call["kv"].k, v=call["kv"].v),
        )
        out, _, k_after, _ = run(captured.graph, env)
        assert _close(out, call["out"])
        assert torch.equal(k_after.view(torch.uint8), call["k_after"].view(torch.uint8))


def test_layers_of_another_kind_get_their_own_graph(tmp_path):
    """capture_kinds captures the first layer of each kind: a layer typed otherwise that
    computes the same graph shares it (Gemma-3's sliding and full layers); one that computes
    something else (here the full layers' norms with another epsilon) gets its own graph (layers
    of one kind are built from one config: the first one's graph serves all), and capture_layers
    (one graph for every layer) refuses the model, naming the kinds."""
    build_hf_model("gemma3", tmp_path)  # layers: sliding, sliding, full, sliding, sliding, full
    engine = LLM(str(tmp_path), kv_cache_memory="4MiB").engine
    model = engine.runner.model
    (kind,) = capture_kinds(model, engine.kv_cache)  # (the same graph: one kind)
    assert kind.layers == list(range(len(model.layers)))
    assert "sliding_attention" in kind.label and "full_attention" in kind.label
    capture_layers(model, engine.kv_cache)
    for index in (2, 5):
        model.layers[index].mlp_norm.eps *= 2
    kinds = capture_kinds(model, engine.kv_cache)
    assert [k.layers for k in kinds] == [[0, 1, 3, 4], [2, 5]]
    assert kinds[1].describe() == "layers 2, 5 (full_attention Attention GatedMLP)"
    with pytest.raises(CaptureError, match="of 2 kinds: layers 0-1, 3-4 .*; layers 2, 5"):
        capture_layers(model, engine.kv_cache)
