"""Calibration (quant/calibrate.py, clipping.py, smoothing.py, apply.py) and weight +
activation schemes end to end.

Oracles: statistics equal the projection inputs transformers computes on the same sequences;
the percentile clip equals numpy's percentile; searches pick their grid's minimum; smoothing
leaves the fp32 model's function unchanged (transformers' logits); an engine with quantized
activations equals transformers with fake-quantized weights and the reference activation
quantizer on every projection input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors import safe_open

from infergen import LLM
from infergen.errors import InfergenError
from infergen.ops.quantize_activation import reference as act_reference
from infergen.quant import clipping
from infergen.quant.activations import ACTIVATION_SCHEMES
from infergen.quant.calibrate import InputStats, calibration_sequences
from infergen.quant.schemes import WEIGHT_SCHEMES, dequantized_weight
from infergen.quant.smoothing import AWQ_GRID, SmoothGroup, _awq
from tests.hf_models import build_hf_model, fake_quantize

# transformers module → (our projection, its input); q/k/v and gate/up share theirs
PROJECTIONS = {"self_attn.q_proj": "attn.qkv", "self_attn.o_proj": "attn.o",
               "mlp.gate_proj": "mlp.gate_up", "mlp.down_proj": "mlp.down"}  # fmt: skip


# every transformers projection → ours (q/k/v and gate/up share one input, so one quantizer)
ALL_PROJECTIONS = {**PROJECTIONS, "self_attn.k_proj": "attn.qkv", "self_attn.v_proj": "attn.qkv",
                   "mlp.up_proj": "mlp.gate_up"}  # fmt: skip


def _pre_hooks(hf_model, projections, make_hook) -> list:
    """make_hook(our name) as a forward pre-hook on each listed projection of every layer."""
    hooks = []
    for i, layer in enumerate(hf_model.model.layers):
        for hf_name, ours in projections.items():
            hook = make_hook(f"layers.{i}.{ours}")
            hooks.append(layer.get_submodule(hf_name).register_forward_pre_hook(hook))
    return hooks


def _hf_inputs(hf_model, sequences) -> dict[str, torch.Tensor]:
    """Every projection's input rows over `sequences` (each its own forward), by our names."""
    seen: dict[str, list[torch.Tensor]] = {}

    def record(name):
        return lambda module, args: seen.setdefault(name, []).append(args[0][0])

    hooks = _pre_hooks(hf_model, PROJECTIONS, record)
    hooks.append(hf_model.lm_head.register_forward_pre_hook(record("lm_head")))
    with torch.no_grad():
        for seq in sequences:
            hf_model(torch.tensor([seq]))
    for h in hooks:
        h.remove()
    return {k: torch.cat(v) for k, v in seen.items()}


def test_statistics_equal_transformers_inputs(tmp_path):
    hf_model = build_hf_model("llama_gqa", tmp_path / "m")
    path = tmp_path / "stats.safetensors"
    llm = LLM(str(tmp_path / "m"), kv_cache_memory="16MiB", activations="int8_static",
              calibration_stats=str(path))  # fmt: skip
    sequences = calibration_sequences(None, hf_model.config.vocab_size, llm.engine.max_model_len)
    inputs = _hf_inputs(hf_model, sequences)
    with safe_open(str(path), "pt") as f:
        assert f.metadata()["tokens"] == str(sum(len(s) for s in sequences))
        assert f.metadata()["activations"] == '"int8_static"'
        for name, x in inputs.items():
            close = dict(rtol=1e-4, atol=1e-6)
            torch.testing.assert_close(f.get_tensor(f"{name}.amax"), x.abs().amax(0), **close)
            torch.testing.assert_close(f.get_tensor(f"{name}.mean_abs"), x.abs().mean(0), **close)
            torch.testing.assert_close(f.get_tensor(f"{name}.sq_mean"), x.square().mean(0), **close)
            if name != "lm_head":  # the LM head's input stays full precision
                scale = f.get_tensor(f"{name}.input_scale")
                torch.testing.assert_close(scale, x.abs().max().reshape(1) / 127, rtol=1e-4, atol=0)


def _stats(x: torch.Tensor) -> InputStats:
    s = InputStats.empty(x.shape[1], stride=1)
    s.update(x)
    return s


def test_percentile_clip_equals_numpy():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(256, 64, generator=gen) * torch.rand(64, generator=gen) * 3
    act = ACTIVATION_SCHEMES.get("int8_static").act
    got = clipping.CLIP_METHODS.get("percentile").activation_clip(_stats(x), act)
    values = np.sort(x.abs().flatten().numpy())
    expected = np.percentile(values, clipping.PERCENTILE, method="nearest")
    k = np.searchsorted(values, expected)
    assert values[max(k - 1, 0)] <= got <= values[min(k + 1, len(values) - 1)]
    assert got < float(x.abs().max())


@pytest.mark.parametrize("name", ["int8_static", "fp8_e4m3_static", "nvfp4"])
def test_mse_clip_is_the_grid_minimum(name):
    x = torch.randn(256, 64, generator=torch.Generator().manual_seed(1))
    x[3, 5] = 20.0  # one isolated outlier: int8 codes spent on it cost the other 16383 values
    act = ACTIVATION_SCHEMES.get(name).act
    stats = _stats(x)
    clip = clipping.CLIP_METHODS.get("mse").activation_clip(stats, act)
    amax = float(x.abs().max())

    def error(c):
        from infergen.ops.quantize_activation import fake_quantize

        return float((fake_quantize(x, act, torch.tensor([c / act.max_code])) - x).square().sum())

    errors = [error(a * amax) for a in clipping.ACTIVATION_GRID]
    assert error(clip) == min(errors)
    if name == "int8_static":  # (FP8's error is relative; NVFP4's blocks have their own scales)
        assert clip < amax and error(clip) < error(amax), name


@pytest.mark.parametrize("scheme", ["int4", "int4_asym", "int8", "nvfp4", "q4_0", "fp8_e4m3"])
def test_weight_clip_lowers_each_groups_weighted_error(scheme):
    gen = torch.Generator().manual_seed(2)
    w = torch.randn(48, 64, generator=gen)
    w[5, 7] = 25.0  # an outlier in one group
    energy = torch.rand(64, generator=gen) + 0.1
    clipped, ratio = clipping.clip_weight(w, scheme, energy)
    grid = torch.tensor(clipping.WEIGHT_GRID)
    assert torch.isclose(ratio.flatten()[:, None], grid).any(dim=1).all()

    group = WEIGHT_SCHEMES.get(scheme).scale_group

    def group_error(q):
        diff = clipping._groups(q, group) - clipping._groups(w, group)
        return clipping._groups(energy.expand_as(w), group) * diff.square()

    before = group_error(dequantized_weight(scheme, w)).sum(-1)
    after = group_error(dequantized_weight(scheme, clipped)).sum(-1)
    if scheme != "nvfp4":  # independent groups (NVFP4's share the tensor's global scale)
        assert (after <= before * (1 + 1e-6)).all(), scheme
    assert after.sum() <= before.sum(), scheme
    if scheme not in ("int8", "fp8_e4m3"):  # 4-bit: clipping the outlier's group pays
        assert after.sum() < before.sum(), scheme


def test_awq_moves_salient_channels_and_lowers_error():
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(96, 128, generator=gen) * 0.05
    x = torch.randn(256, 128, generator=gen)
    x[:, :4] *= 30.0  # salient input channels
    group = SmoothGroup("p", _stats(x), lambda s: s, lambda s: None)
    s, alpha = _awq(weight, group, "int4", None)

    def error(scale):
        q = dequantized_weight("int4", weight * scale)
        return float(((x / scale) @ q.t() - x @ weight.t()).square().mean())

    assert alpha in AWQ_GRID and alpha > 0
    assert error(s) < error(torch.ones(128))
    assert s[:4].min() > s[4:].max()  # the salient channels are scaled up


@pytest.mark.parametrize("name", ["llama_gqa", "llama_bias", "llama_mqa_tied", "qwen3_qk_norm"])
def test_smoothing_keeps_the_fp32_function(name, tmp_path):
    hf_model = build_hf_model(name, tmp_path)
    llm = LLM(str(tmp_path), kv_cache_memory="16MiB", smoothing="smoothquant")
    chosen = llm.engine.calibration.chosen
    scales = [v for k, v in chosen.items() if k.endswith(".smooth_scale")]
    assert len(scales) == 4 * hf_model.config.num_hidden_layers
    assert max(float((s - 1).abs().max()) for s in scales) > 0.1  # weights really moved
    gen = torch.Generator().manual_seed(4)
    tokens = torch.randint(0, hf_model.config.vocab_size, (20,), generator=gen).tolist()
    got = llm.engine.prompt_logits(tokens)
    with torch.no_grad():
        expected = hf_model(torch.tensor([tokens])).logits[0]
    assert (got - expected).abs().max() <= 1e-4 * expected.abs().max(), name


@pytest.mark.parametrize(
    "weights,activations",
    [("fp8_e4m3", "fp8_e4m3"), ("fp8_e4m3", "fp8_e4m3_static"), ("int4", "int8"),
     ("int8", "int8_static"), ("nvfp4", "nvfp4"), ("mxfp4", "mxfp4"), (None, "mxfp8"),
     ("int8", "int8"), ("q4_1", "int8")],  # (int8 / int4 / q4_1 + int8: integer products)
)  # fmt: skip
def test_engine_equals_fake_quantized_transformers(weights, activations, tmp_path):
    hf_model = build_hf_model("llama_gqa", tmp_path, intermediate_size=128)  # whole groups
    llm = LLM(str(tmp_path), kv_cache_memory="16MiB", weights=weights, activations=activations)
    tokens = torch.randint(0, 211, (24,), generator=torch.Generator().manual_seed(5)).tolist()
    got = llm.engine.prompt_logits(tokens)
    with torch.no_grad():
        unquantized = hf_model(torch.tensor([tokens])).logits[0]
    if weights is not None:
        fake_quantize(hf_model, lambda w: dequantized_weight(weights, w.float()))
    act = ACTIVATION_SCHEMES.get(activations).act
    chosen = llm.engine.calibration.chosen

    def quantize_input(name):
        scale = chosen.get(f"{name}.input_scale")
        return lambda module, args: (act_reference(args[0][0], act, scale)[None],)

    hooks = _pre_hooks(hf_model, ALL_PROJECTIONS, quantize_input)
    with torch.no_grad():
        expected = hf_model(torch.tensor([tokens])).logits[0]
    for h in hooks:
        h.remove()
    tolerance = 1e-3 * expected.abs().max()
    assert (got - expected).abs().max() <= tolerance, (weights, activations)
    assert (got - unquantized).abs().max() > 10 * tolerance  # the test can tell them apart


def test_configuration_errors():
    with pytest.raises(InfergenError, match="unknown activation scheme 'fp6'"):
        LLM(activations="fp6")
    with pytest.raises(InfergenError, match="unknown calibration method 'kl'"):
        LLM(weights="int8", calibration="kl")
    with pytest.raises(InfergenError, match="unknown smoothing 'gptq'"):
        LLM(smoothing="gptq")
    with pytest.raises(InfergenError, match="float32"):
        LLM(activations="int8", dtype="bfloat16")
    with pytest.raises(InfergenError, match="nothing to smooth"):
        LLM(weights="gguf", smoothing="awq")


def test_keep_leaves_matching_projections_in_full_precision(tmp_path):
    from infergen.ops.linear import LINEAR_BACKENDS

    build_hf_model("llama_gqa", tmp_path)
    llm = LLM(str(tmp_path), kv_cache_memory="16MiB", weights="int8", activations="int8",
              keep=["layers.1.*"])  # fmt: skip
    model = llm.engine.runner.model
    assert model.layers[1].mlp.down.act is None and model.layers[1].attn.qkv.act is None
    assert model.layers[1].mlp.down.backend is LINEAR_BACKENDS.get("native")
    assert model.layers[0].mlp.down.act is not None and model.lm_head.act is None
    assert model.layers[2].attn.o.backend is LINEAR_BACKENDS.get("int8")
    with pytest.raises(InfergenError, match="calibration text file not found"):
        LLM(str(tmp_path), activations="int8_static", calibration_text=str(tmp_path / "nope"))


def test_smoothquant_w8a8_equals_transformers_smoothed_and_fake_quantized(tmp_path):
    """The engine's chosen scales applied to transformers' weights by hand (norms / V rows /
    up rows divided, consumer columns multiplied), then fake quantization: the same logits."""
    hf_model = build_hf_model("llama_gqa", tmp_path, intermediate_size=128)
    llm = LLM(str(tmp_path), kv_cache_memory="16MiB", weights="int8", activations="int8",
              smoothing="smoothquant")  # fmt: skip
    chosen = llm.engine.calibration.chosen
    config = hf_model.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    dim = config.hidden_size // heads
    with torch.no_grad():
        for i, layer in enumerate(hf_model.model.layers):
            a, m = layer.self_attn, layer.mlp
            s = chosen[f"layers.{i}.attn.o.smooth_scale"]
            a.v_proj.weight /= s.view(kv_heads, heads // kv_heads, dim)[:, 0].reshape(-1, 1)
            a.o_proj.weight *= s
            s = chosen[f"layers.{i}.mlp.down.smooth_scale"]
            m.up_proj.weight /= s[:, None]
            m.down_proj.weight *= s
            s = chosen[f"layers.{i}.attn.qkv.smooth_scale"]
            layer.input_layernorm.weight /= s
            for proj in (a.q_proj, a.k_proj, a.v_proj):
                proj.weight *= s
            s = chosen[f"layers.{i}.mlp.gate_up.smooth_scale"]
            layer.post_attention_layernorm.weight /= s
            for proj in (m.gate_proj, m.up_proj):
                proj.weight *= s
    fake_quantize(hf_model, lambda w: dequantized_weight("int8", w.float()))
    act = ACTIVATION_SCHEMES.get("int8").act

    def quantize_input(name):
        return lambda module, args: (act_reference(args[0][0], act)[None],)

    hooks = _pre_hooks(hf_model, ALL_PROJECTIONS, quantize_input)
    tokens = torch.randint(0, 211, (24,), generator=torch.Generator().manual_seed(9)).tolist()
    with torch.no_grad():
        expected = hf_model(torch.tensor([tokens])).logits[0]
    for h in hooks:
        h.remove()
    got = llm.engine.prompt_logits(tokens)
    assert (got - expected).abs().max() <= 1e-3 * expected.abs().max()
