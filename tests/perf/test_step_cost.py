"""Per-step FLOPs and bytes (infergen/perf/step_cost.py). Oracles: torch's FlopCounterMode on a
transformers forward (projection FLOPs), brute-force loops over positions (attention), and the
model description's own totals (weights and KV read once per step)."""

from __future__ import annotations

import random

import pytest
import torch

from infergen.config import ModelConfig
from infergen.io.model_config import read_model_config
from infergen.perf.step_cost import (
    VERIFY_ATTENTION,
    Chunk,
    Formats,
    attended_keys,
    expected_experts,
    step_ops,
)

LLAMA_8B = "tests/perf/configs/llama-3.1-8b.json"


def describe_dict(config: dict):
    return ModelConfig.from_hf_dict(config, source="config.json").describe()


TINY = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 211,
    "tie_word_embeddings": False,
}


@pytest.mark.parametrize(
    "name", ["llama", "gemma3", "gpt_oss", "mamba2", "qwen3_next", "falcon_h1"]
)
def test_projection_flops_equal_torch_flop_counter(name):
    """Every projection of the layer kinds (output-gated attention, SSM and DeltaNet in/out
    projections, attention beside an SSM, shared experts): the routed experts aside, which
    transformers runs as grouped ops (their FLOPs: test_moe_step_counts_only_routed_flops)."""
    transformers = pytest.importorskip("transformers")
    from torch.utils.flop_counter import FlopCounterMode

    from tests.hf_models import ARCH_VARIANTS, BASE

    tokens = 37
    if name == "llama":
        cfg = transformers.AutoConfig.for_model(**TINY)
    else:
        cls_name, extra = ARCH_VARIANTS[name]
        cfg = getattr(transformers, cls_name)(**{**BASE, **extra})
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(torch.randint(0, cfg.vocab_size, (1, tokens)))
    counts = counter.get_flop_counts()["Global"]
    measured = sum(v for k, v in counts.items() if str(k).split(".")[1] in ("mm", "addmm"))
    desc = describe_dict(cfg.to_dict())
    ops = step_ops(desc, [Chunk(tokens, tokens)])
    grouped = ("lm_head", "experts_up", "experts_down")
    ours = sum(o.flops for o in ops if o.kind == "gemm" and o.name not in grouped)
    ours += 2 * tokens * desc.hidden * desc.vocab  # transformers: every row
    assert ours == measured


def test_elementwise_bytes_equal_the_tensors_transformers_moves():
    """RoPE reads and writes q and k (the q/k projections' outputs); the gated activation
    reads gate and up and writes the down projection's input: counted on a transformers
    forward with hooks, in fp32."""
    transformers = pytest.importorskip("transformers")
    tokens, numel = 23, {"rope": 0, "activation": 0}
    cfg = transformers.AutoConfig.for_model(**TINY)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()

    def count(kind, times, of_input=False):
        def hook(module, args, out):
            numel[kind] += times * (args[0] if of_input else out).numel()

        return hook

    for layer in model.model.layers:
        layer.self_attn.q_proj.register_forward_hook(count("rope", 2))
        layer.self_attn.k_proj.register_forward_hook(count("rope", 2))
        layer.mlp.gate_proj.register_forward_hook(count("activation", 1))
        layer.mlp.up_proj.register_forward_hook(count("activation", 1))
        layer.mlp.down_proj.register_forward_hook(count("activation", 1, of_input=True))
    with torch.no_grad():
        model(torch.randint(0, TINY["vocab_size"], (1, tokens)))
    ops = {o.name: o for o in step_ops(describe_dict(TINY), [Chunk(tokens, tokens)])}
    assert ops["rope"].kind == ops["activation"].kind == "elementwise"
    assert ops["rope"].bytes == 2 * numel["rope"]  # bf16 activations by default
    assert ops["activation"].bytes == 2 * numel["activation"]


@pytest.mark.parametrize("seed", range(20))
def test_attended_keys_equal_a_loop_over_positions(seed):
    rng = random.Random(seed)
    context = rng.randint(1, 300)
    new = rng.randint(1, context)
    window = rng.choice([None, 1, 7, 64, 500])
    first = context - new
    expected = sum(min(p + 1, window or p + 1) for p in range(first, context))
    assert attended_keys(Chunk(new, context), window) == expected


def test_a_decode_step_reads_every_weight_and_the_kv_once(default_model_path):
    desc = read_model_config(default_model_path).describe()
    fmt = Formats(weight_bits=32, kv_bits=32, act_bytes=4)
    ops = step_ops(desc, [Chunk(1, 200)], fmt)
    by_name = {o.name: o for o in ops}
    norms = (2 * len(desc.layers) + 1) * desc.hidden
    gemm_weights = sum(o.weight_bytes for o in ops if o.kind == "gemm")
    assert gemm_weights == (desc.params_total() - norms) * 4  # tied: the LM head is the table
    assert by_name["attention"].bytes - 2 * 9 * 64 * 4 * len(desc.layers) == pytest.approx(
        desc.kv_bytes_for_context(200, 4)
    )
    flops = sum(o.flops for o in ops)
    active = desc.params_active() - norms
    attention = 4 * 9 * 64 * 200 * len(desc.layers)
    assert flops == 2 * active + attention


def test_sliding_window_caps_the_keys_read():
    windowed = {**TINY, "model_type": "mistral", "sliding_window": 16}
    desc = describe_dict(windowed)
    (attn,) = [
        o for o in step_ops(desc, [Chunk(1, 1000)], Formats(kv_bits=8)) if o.name == "attention"
    ]
    kv = attn.bytes - 2 * 4 * 16 * 2 * 2  # minus q and output activations (2 layers)
    assert kv == desc.kv_bytes_for_context(1000, 1) == 2 * 2 * 2 * 16 * 16


def test_a_verifying_decode_reads_each_rows_prefix():
    """A decode verifying drafts attends as decode rows (engine runner.py): row j of n reads
    the positions up to its own, the KV read is the attended keys', not the context once —
    in its own op ("verify attention", kind verify_attention: calibrated apart), beside a
    plain decode's in the same step."""
    desc = describe_dict(TINY)

    def attention_ops(chunks):
        ops = step_ops(desc, chunks, Formats(kv_bits=8))
        return {o.name: (o.kind, o.bytes, o.flops) for o in ops if "attention" in o.name}

    prefill, verify = Chunk(5, 100), Chunk(5, 100, verify=True)
    plain, verifying = attention_ops([prefill]), attention_ops([verify])
    assert set(plain) == {"attention"} and set(verifying) == {"verify attention"}
    assert verifying["verify attention"][0] == VERIFY_ATTENTION
    per_key = desc.kv_bytes_for_context(1, 1)
    extra = per_key * (attended_keys(prefill, None) - 100)
    assert verifying["verify attention"][1] - plain["attention"][1] == pytest.approx(extra)
    assert verifying["verify attention"][2] == plain["attention"][2]  # the same scores
    both = attention_ops([Chunk(1, 40), verify])  # a decode beside it: two ops
    assert both["verify attention"] == verifying["verify attention"]
    assert both["attention"] == attention_ops([Chunk(1, 40)])["attention"]


def test_expected_distinct_experts():
    assert expected_experts(256, 8, 1) == pytest.approx(8)
    assert expected_experts(256, 8, 10_000) == pytest.approx(256)
    values = [expected_experts(32, 4, t) for t in (1, 2, 4, 16, 64)]
    assert values == sorted(values)
    rng = random.Random(0)  # Monte Carlo check of the closed form
    draws = [len({e for _ in range(6) for e in rng.sample(range(32), 4)}) for _ in range(4000)]
    assert sum(draws) / len(draws) == pytest.approx(expected_experts(32, 4, 6), rel=0.02)


def test_moe_step_counts_only_routed_flops():
    cfg = {
        "model_type": "gpt_oss",
        "hidden_size": 64,
        "intermediate_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": 100,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "sliding_window": 8,
        "layer_types": ["sliding_attention", "full_attention"],
    }
    desc = describe_dict(cfg)
    ops = {o.name: o for o in step_ops(desc, [Chunk(1, 10)])}
    assert ops["experts_up"].flops == 2 * 2 * 64 * 64 * 2  # 2 experts x (64 -> 2x32) x 2 layers
    assert ops["experts_up"].weight_bytes == pytest.approx(2 * 64 * 64 * 2 * 2)  # 2 touched


def _by_name(ops):
    return {o.name: o for o in ops}


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_tensor_parallel_splits_the_work_and_adds_its_communication(tp):
    """Two all-reduces per layer plus the embedding's, the logits' gather (fp32, the
    vocabulary slices of the other devices) and the step's inputs broadcast (2 calls)."""
    from infergen.perf.step_cost import Parallel

    desc = read_model_config(LLAMA_8B).describe()  # 32 heads, 8 KV heads
    chunks = [Chunk(1, 300), Chunk(64, 64)]
    one = _by_name(step_ops(desc, chunks))
    split = _by_name(step_ops(desc, chunks, par=Parallel(tp=tp)))
    for name in ("qkv_proj", "o_proj", "mlp_up", "mlp_down", "lm_head", "attention"):
        assert split[name].flops * tp == pytest.approx(one[name].flops)
        assert split[name].weight_bytes * tp == pytest.approx(one[name].weight_bytes)
    assert split["kv_write"].bytes * tp == pytest.approx(one["kv_write"].bytes)
    tokens, layers = 65, 32
    ring = 2 * (tp - 1) / tp * tokens * desc.hidden * 2  # bf16 hidden states
    assert split["all_reduce"].bytes == pytest.approx((2 * layers + 1) * ring)
    assert split["all_reduce"].calls == 2 * layers + 1 and "all_reduce" not in one
    gathered = (tp - 1) / tp * len(chunks) * desc.vocab * 4
    assert split["gather_logits"].bytes == pytest.approx(gathered)
    assert split["gather_logits"].calls == 1 and split["broadcast"].calls == 2
    assert not {"gather_logits", "broadcast"} & one.keys()


def test_kv_heads_fewer_than_devices_are_replicated():
    from infergen.perf.memory import kv_share
    from infergen.perf.step_cost import Parallel

    desc = read_model_config(LLAMA_8B).describe()
    par = Parallel(tp=16)
    ops = _by_name(step_ops(desc, [Chunk(1, 10)], par=par))
    assert ops["kv_write"].bytes == 32 * 2 * 1 * 128 * 2  # one KV head per device
    assert kv_share(desc, par) == pytest.approx(1 / 8)


def test_expert_parallel_all_to_all_and_activation_quantize():
    from infergen.perf.step_cost import Parallel

    desc = read_model_config("tests/perf/configs/gpt-oss-20b.json").describe()
    moe = desc.layers[0].ffn
    tokens = 40
    ops = _by_name(step_ops(desc, [Chunk(tokens, tokens)], par=Parallel(ep=4)))
    a2a = 2 * 3 / 4 * tokens * moe.top_k * desc.hidden * 2
    assert ops["all_to_all"].bytes == pytest.approx(len(desc.layers) * a2a)
    whole = _by_name(step_ops(desc, [Chunk(tokens, tokens)]))
    assert ops["experts_up"].flops * 4 == pytest.approx(whole["experts_up"].flops)
    assert "quantize" not in whole
    llama = read_model_config(LLAMA_8B).describe()
    fp8 = _by_name(step_ops(llama, [Chunk(tokens, tokens)], Formats(8, 8, 1)))
    # every GEMM input is read in bf16 and written in fp8 once: per layer the qkv, o, up
    # and down inputs (hidden, heads x head_dim, hidden, intermediate), then the LM head's row
    per_layer = tokens * (4096 + 32 * 128 + 4096 + 14336) * 3
    assert fp8["quantize"].bytes == 32 * per_layer + 1 * 4096 * 3


def test_a_verifying_decode_computes_every_rows_logits():
    """The LM head of a verifying decode computes every row's logits (each checks the draft
    after it), as transformers' forward does for every token; a prefill chunk only its last
    row's. Oracle: torch's FlopCounterMode on transformers' lm_head."""
    transformers = pytest.importorskip("transformers")
    from torch.utils.flop_counter import FlopCounterMode

    tokens = 9
    cfg = transformers.AutoConfig.for_model(**TINY)
    model = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(torch.randint(0, cfg.vocab_size, (1, tokens)))
    (head,) = [v for k, v in counter.get_flop_counts().items() if k.endswith("lm_head")]
    measured = sum(head.values())
    desc = describe_dict(cfg.to_dict())

    def lm_head(chunk):
        (op,) = [o for o in step_ops(desc, [chunk]) if o.name == "lm_head"]
        return op.flops

    assert lm_head(Chunk(tokens, 100, verify=True)) == measured
    assert lm_head(Chunk(tokens, 100)) * tokens == measured
