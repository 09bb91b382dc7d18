"""The compiled decoder layers in the engine (compile="eager" | "jit", compiler/runtime.py and
the generated layer program, program.py) against the per-op path (compile="off"): logits over
prefill, chunked prefill and decode steps within float tolerance, and greedy generation
token-identical, for every architecture; the JIT cache makes the second engine start compile
nothing."""

from __future__ import annotations

import pytest
import torch

from infergen import LLM, SamplingParams
from infergen.compiler import runtime
from infergen.compiler.jit_cache import JitCache
from infergen.compiler.program import NATIVE_MIXERS
from infergen.errors import ConfigError
from infergen.layers.mla import MLAttention
from infergen.layers.ssm import Mamba2Mixer
from tests.hf_models import COMPILED_VARIANTS, MIXER_VARIANTS, build_hf_model

PROMPTS = [[3, 17, 42], [5, 8, 150, 23, 77, 9, 11], [99], [7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7]]
# variant → the per-layer fallbacks the compile report names
MODULE_MIXERS: dict[str, list[str]] = {
    "mamba2": ["layers 0-2 (mamba StateMixer no MLP): the mamba mixer (StateMixer)"],
    "falcon_h1": [  # (its attention captured, the Mamba2 mixer beside it kept whole)
        "layers 0-2 (attention_mamba ParallelMixer GatedMLP): the mamba mixer beside the "
        "attention (StateMixer)"
    ],
    "qwen3_next": [
        "layers 0, 2 (linear_attention StateMixer MoE): the linear_attention mixer",
        "layer 1 (linear_attention StateMixer GatedMLP)",  # (its gated attention: captured)
    ],
    "deepseek_v2": ["layer 0 (full_attention MLAttention GatedMLP)", "layers 1-2"],
    "deepseek_v3": ["layer 0 (full_attention MLAttention GatedMLP)", "layers 1-2"],
}


@pytest.fixture(autouse=True)
def private_jit_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(runtime, "JitCache", lambda: JitCache(tmp_path / "jit"))


@pytest.mark.parametrize("name", COMPILED_VARIANTS + MIXER_VARIANTS)
@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_compiled_layers_equal_the_per_op_path(name, mode, tmp_path):
    hf_model = build_hf_model(name, tmp_path / "model")
    reference = LLM(str(tmp_path / "model"), kv_cache_memory="4MiB")
    compiled = LLM(str(tmp_path / "model"), kv_cache_memory="4MiB", compile=mode)
    layers = compiled.engine.runner.model.fast_path_for(compiled.engine.kv_cache)
    assert layers is not None
    fallbacks = [why for why in layers.report.groups_op_by_op if "runs as its module" in why]
    assert len(fallbacks) == len(MODULE_MIXERS.get(name, [])), fallbacks
    for why, expected in zip(fallbacks, MODULE_MIXERS.get(name, []), strict=False):
        assert why.startswith(expected), (why, expected)
    calls = {"decode": 0, "prefill": 0}  # program calls per phase (every kind's, every run)
    if mode == "jit":  # decode steps run the generated layer programs, one per kind
        assert all(layers.programs["decode"]), layers.report.groups_op_by_op
        for phase, programs in layers.programs.items():
            for program in filter(None, programs):
                program.run = _counting(program.run, calls, phase)
        if not all(layers.programs["prefill"]):  # (the prefill kernel's vector width)
            assert any(
                "prefill layer program" in w and "head dim" in w
                for w in layers.report.groups_op_by_op
            )
    torch.manual_seed(0)
    tokens = torch.randint(0, hf_model.config.vocab_size, (40,)).tolist()
    for chunk in (40, 7, 1):
        expected = reference.engine.prompt_logits(tokens, chunk=chunk)
        got = compiled.engine.prompt_logits(tokens, chunk=chunk)
        assert (got - expected).abs().max() <= 1e-4 * expected.abs().max(), (name, chunk)
    if mode == "jit":  # (each step: every kind's program at least once)
        assert calls["decode"] >= 39 * len(layers.kinds), calls
    if mode == "jit" and any(layers.programs["prefill"]):  # the 40-token and 7-token chunks
        assert calls["prefill"] >= 1 + 40 // 7
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    for a, b in zip(
        reference.generate(PROMPTS, params), compiled.generate(PROMPTS, params), strict=True
    ):
        assert a.token_ids == b.token_ids, name


@pytest.mark.parametrize(
    "name", ["mamba2", "falcon_h1", "qwen3_next", "deepseek_v2", "deepseek_v3"]
)
def test_decode_steps_run_the_native_mixers(name, tmp_path):
    """Decode programs run each Mamba2 / gated DeltaNet / latent attention mixer's native step
    (lk_mixer_decode: program_ssm.py, program_deltanet.py, program_mla.py) instead of calling
    the module back, fresh sequences (a one-token prompt's first step) included; prefill
    programs run them too for steps of up to their prefill_rows (the recurrent ones row after
    row, fresh prompts too; MLA each row as a one-query sequence) and call the modules back
    for longer ones: greedy tokens and every step's logits equal the per-op path's."""
    build_hf_model(name, tmp_path / "model")
    reference = LLM(str(tmp_path / "model"), kv_cache_memory="4MiB")
    compiled = LLM(str(tmp_path / "model"), kv_cache_memory="4MiB", compile="jit")
    layers = compiled.engine.runner.model.fast_path_for(compiled.engine.kv_cache)
    model, cache = compiled.engine.runner.model, compiled.engine.kv_cache
    stepped = sum(len(p._stepped) for p in layers.programs["decode"] if p)  # (natives bound)
    mla = [type(layer.attn).__name__ == "MLAttention" for layer in model.layers]
    natives = [i for i in range(len(model.layers)) if _states_of(cache.layer(i)) or mla[i]]
    assert stepped == len(natives)
    assert sum(len(p._stepped) for p in layers.programs["prefill"] if p) == len(natives)
    # chunks of 7 rows run the native steps; 40 rows are over Mamba2's and MLA's prefill_rows
    tokens = list(range(3, 43))
    assert max(NATIVE_MIXERS[t].prefill_rows for t in (Mamba2Mixer, MLAttention)) < len(tokens)
    for chunk in (1, 7, len(tokens)):
        expected = reference.engine.prompt_logits(tokens, chunk=chunk)
        got = compiled.engine.prompt_logits(tokens, chunk=chunk)
        assert (got - expected).abs().max() <= 1e-4 * expected.abs().max(), chunk
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    expected = [o.token_ids for o in reference.generate(PROMPTS, params)]
    assert [o.token_ids for o in compiled.generate(PROMPTS, params)] == expected
    # steps of at most 8 tokens: prompts in chunks beside other sequences' decode rows (mixed
    # steps of few rows: the prefill program's native steps)
    mixed = LLM(str(tmp_path / "model"), kv_cache_memory="4MiB", compile="jit",
                max_num_batched_tokens=8)  # fmt: skip
    assert [o.token_ids for o in mixed.generate(PROMPTS, params)] == expected
    # a fresh sequence's first step (one token) is a decode-shaped step: the native step must
    # start from zero states, whatever its slot holds (here NaN in every slot of both engines)
    for llm in (reference, compiled):
        cache = llm.engine.kv_cache
        for index in range(len(llm.engine.runner.model.layers)):
            for tensor in _states_of(cache.layer(index)).values():
                tensor.fill_(float("nan"))
    for prompt, chunk in (([9, 10, 11], 1), ([200, 7], 1), ([5, 6, 7, 8, 9], 5)):
        expected = reference.engine.prompt_logits(prompt, chunk=chunk)
        got = compiled.engine.prompt_logits(prompt, chunk=chunk)
        assert (got - expected).abs().max() <= 1e-4 * expected.abs().max(), prompt


def _states_of(cache) -> dict:
    """A layer cache's recurrent states (a recurrent layer's, or the pair's), or {}."""
    if isinstance(cache, dict):
        return cache
    if isinstance(cache, tuple) and not hasattr(cache, "k"):
        return next((part for part in cache if isinstance(part, dict)), {})
    return {}


def _counting(run, calls: dict[str, int], phase: str):
    def counted(*args, **kwargs):
        calls[phase] += 1
        return run(*args, **kwargs)

    return counted


def test_runs_of_layer_kinds():
    """A model whose kinds of layer alternate runs each kind's program per run of its layers
    (the positions are in the kind's own list of layers)."""
    assert runtime._runs([0, 0, 1, 0, 0, 2]) == [
        (0, range(0, 2)), (1, range(0, 1)), (0, range(2, 4)), (2, range(0, 1))
    ]  # fmt: skip
    assert runtime._runs([0, 0, 0]) == [(0, range(0, 3))]


def test_second_start_compiles_nothing(tmp_path):
    build_hf_model("llama_gqa", tmp_path / "model")
    first = LLM(str(tmp_path / "model"), kv_cache_memory="4MiB", compile="jit")
    report = first.engine.compile_report
    assert report.kernels_built >= 2 and report.compile_seconds > 0
    second = LLM(str(tmp_path / "model"), kv_cache_memory="4MiB", compile="jit").engine
    assert second.compile_report.kernels_built == 0
    assert second.compile_report.kernels_cached == report.kernels_built + report.kernels_cached


def test_unknown_mode_is_refused(tmp_path):
    build_hf_model("llama_gqa", tmp_path / "model")
    with pytest.raises(ConfigError, match="unknown compile mode 'fast'"):
        LLM(str(tmp_path / "model"), compile="fast")


def test_activation_quantized_layers_run_integer_kernels(tmp_path):
    """W8A8: the input quantizers join their GEMMs (fuse_input_quantizers), so the layer
    programs run (the integer kernel, weight format 11, quantizes each token itself) and the
    walker calls the Linear's integer product; logits equal the per-op path's."""
    build_hf_model("llama_gqa", tmp_path / "model")
    options = dict(kv_cache_memory="4MiB", weights="int8", activations="int8")
    reference = LLM(str(tmp_path / "model"), **options)
    compiled = LLM(str(tmp_path / "model"), compile="jit", **options)
    layers = compiled.engine.runner.model.fast_path_for(compiled.engine.kv_cache)
    assert layers.report.groups_op_by_op == []
    for program in (layers.program, layers.prefill_program):
        assert set(program.formats) == {11}  # gemm_w8a8_i8 for every projection
    tokens = list(range(5, 40))
    prefill_program = layers.prefill_program
    for walked in (False, True):
        layers.prefill_program = None if walked else prefill_program
        for chunk in (4, 1):
            expected = reference.engine.prompt_logits(tokens, chunk=chunk)
            got = compiled.engine.prompt_logits(tokens, chunk=chunk)
            assert (got - expected).abs().max() <= 1e-4 * expected.abs().max(), (walked, chunk)


@pytest.mark.parametrize("name", ["qwen2_qkv_bias", "gemma3", "gpt_oss"])
@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_fp8_kv_cache(mode, name, tmp_path):
    """The FP8 E4M3 cache (codes, per-head scales, key shift) through the compiled layers:
    logits equal the per-op path's (which stores and reads the same codes); with Gemma-3's
    cache groups and GPT-OSS's sinks too (the decode kernel merges the sink into FP8 codes'
    softmax as into fp32's)."""
    build_hf_model(name, tmp_path / "model")
    options = dict(kv_cache_memory="4MiB", kv_format="fp8_e4m3")
    reference = LLM(str(tmp_path / "model"), **options)
    compiled = LLM(str(tmp_path / "model"), compile=mode, **options)
    layers = compiled.engine.runner.model.fast_path_for(compiled.engine.kv_cache)
    assert (layers.program is not None) == (mode == "jit"), layers.report.groups_op_by_op
    tokens = list(range(5, 45))
    for chunk in (40, 6, 1):
        expected = reference.engine.prompt_logits(tokens, chunk=chunk)
        got = compiled.engine.prompt_logits(tokens, chunk=chunk)
        assert (got - expected).abs().max() <= 1e-4 * expected.abs().max(), chunk


def test_layers_the_compiler_has_no_fallback_for_run_the_per_op_path(tmp_path):
    """StreamingLLM's sink tokens (a window that also reads the first positions): the compiler
    neither captures nor falls back for them; the report says so, the per-op path runs."""
    build_hf_model("llama_gqa", tmp_path / "model")
    options = dict(kv_cache_memory="4MiB", streaming_window=8, streaming_sinks=2)
    reference = LLM(str(tmp_path / "model"), **options)
    compiled = LLM(str(tmp_path / "model"), compile="jit", **options)
    (why,) = compiled.engine.compile_report.groups_op_by_op
    assert why.startswith("all ") and "the per-op path" in why and "sink tokens" in why, why
    assert compiled.engine.compile_report.kernels_built == 0
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    for a, b in zip(
        reference.generate(PROMPTS, params), compiled.generate(PROMPTS, params), strict=True
    ):
        assert a.token_ids == b.token_ids


def test_mixed_steps_run_the_prefill_program(tmp_path):
    """A step with decode rows beside prefill chunks (a small token budget chunks the long
    prompt while the short ones decode) runs the prefill program, its decode rows as
    one-query sequences of the prefill kernel: greedy tokens equal the per-op path's."""
    build_hf_model("llama_gqa", tmp_path / "model")
    options = dict(kv_cache_memory="4MiB", max_num_batched_tokens=8)
    reference = LLM(str(tmp_path / "model"), **options)
    compiled = LLM(str(tmp_path / "model"), compile="jit", **options)
    layers = compiled.engine.runner.model.fast_path_for(compiled.engine.kv_cache)
    steps = {"mixed": 0}
    run = layers.prefill_program.run

    def counting(h, batch, **kwargs):
        steps["mixed"] += batch.attn_plan.decode_rows is not None
        return run(h, batch, **kwargs)

    layers.prefill_program.run = counting
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    prompts = [*PROMPTS, list(range(3, 40))]
    for a, b in zip(
        reference.generate(prompts, params), compiled.generate(prompts, params), strict=True
    ):
        assert a.token_ids == b.token_ids
    assert steps["mixed"] > 0


def test_a_mixer_that_raises_inside_the_layer_program_raises_its_error(tmp_path):
    """The layer program calls a mixer module back from C (the per-layer fallback); an error
    there cannot cross C, so the program keeps it and raises it when it returns — the step
    fails with the mixer's own error, and the next step runs normally."""
    build_hf_model("mamba2", tmp_path / "model")
    llm = LLM(str(tmp_path / "model"), kv_cache_memory="4MiB", compile="jit")
    layers = llm.engine.runner.model.fast_path_for(llm.engine.kv_cache)
    assert layers.prefill_program is not None
    prompt = list(range(5, 30))  # (a prefill over the native step's rows: the module runs)
    assert NATIVE_MIXERS[Mamba2Mixer].prefill_rows < len(prompt)
    mixer = llm.engine.runner.model.layers[1].attn
    forward = mixer.forward

    def broken(*args):
        raise RuntimeError("mixer broke")

    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    expected = llm.generate([[3, 17, 42]], params)[0].token_ids
    mixer.forward = broken
    with pytest.raises(RuntimeError, match="mixer broke"):  # (a prefill: the program)
        llm.engine.prompt_logits(prompt, chunk=len(prompt))
    mixer.forward = forward
    assert llm.generate([[3, 17, 42]], params)[0].token_ids == expected


@pytest.mark.parametrize("name", ["llama_mqa_tied", "gemma3"])
def test_jit_steps_run_the_head_in_one_c_call(name, tmp_path):
    """Steps that layer programs run end in the C head (models/fused_decode.FusedHead: the
    final norm, the LM head, a greedy batch's argmax): the same logits as Transformer.head,
    bit for bit, and the same greedy tokens."""
    build_hf_model(name, tmp_path / "model")
    llm = LLM(str(tmp_path / "model"), kv_cache_memory="4MiB", compile="jit")
    layers = llm.engine.runner.model.fast_path_for(llm.engine.kv_cache)
    head, calls = layers.head, []
    assert head is not None

    def counting(h, delta, batch):
        calls.append(batch.greedy)
        return head(h, delta, batch)

    layers.head = counting
    tokens = torch.randint(0, 200, (24,), generator=torch.Generator().manual_seed(5)).tolist()
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    got = llm.engine.prompt_logits(tokens, chunk=1)
    greedy = [o.token_ids for o in llm.generate(PROMPTS, params)]
    assert len(calls) >= 23 and any(calls), len(calls)  # (generate's decode steps: greedy)
    layers.head = None  # Transformer.head after the same programs
    assert torch.equal(got, llm.engine.prompt_logits(tokens, chunk=1))
    assert greedy == [o.token_ids for o in llm.generate(PROMPTS, params)]
