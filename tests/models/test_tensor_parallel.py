"""Tensor parallelism (issue 26), the model's part: two gloo ranks, each holding its shard
(models/sharding.py: heads by KV group, MLP features, vocabulary rows) and all-reducing its
sublayers' partial sums, generate what one process does — greedy tokens identical, every
sampled token's log-probability within 1e-4 — for tiny Llama (GQA, MQA with tied embeddings,
biases), Qwen3 (QK norms), Gemma-3 (sandwich norms, sliding window), Mistral (sliding
window), GPT-OSS (MoE with fused, biased experts, attention sinks) and DeepSeek-V2/V3 (latent
attention, MoE with shared experts) checkpoints and the default model (9 query / 3 KV heads:
3 + 6 on two ranks); the MoE models also with expert parallelism (whole experts per rank).

Each rank here runs the whole engine on the same requests (its scheduler decides alike, and
every rank gathers the same full logits, so each samples the same tokens); the worker
processes of `tensor_parallel_size`, where rank 0 alone schedules, build on this."""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from infergen.engine.engine import Engine
from infergen.engine.export import EXPORTS, export
from infergen.engine.options import engine_config
from infergen.engine.sampling_params import SamplingParams
from infergen.engine.workers import free_port
from infergen.errors import ConfigError
from infergen.formats.block_weight import BlockWeight
from infergen.formats.quant_weight import QuantWeight
from infergen.io.checkpoint import load_checkpoint
from infergen.io.default_model import default_model_path
from infergen.io.model_config import read_model_config
from infergen.layers.tensor_parallel import TPGroup
from infergen.models.sharding import plan
from infergen.ops.stored_weights import cut, dense
from tests.hf_models import build_hf_model

PROMPTS = [[5, 9, 13, 2, 7, 11, 3, 8, 1, 4, 6, 12, 10, 14, 15, 16, 17, 18, 19, 20, 21, 22], [3, 1]]
NEW_TOKENS = 8


def _generate(model: str, tp: TPGroup | None, **options) -> list[dict]:
    """Greedy tokens and their log-probabilities for PROMPTS (block size 4: several blocks)."""
    engine = Engine(engine_config(model=model, block_size=4, num_threads=1, **options), tp=tp)
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0, logprobs=0, ignore_eos=True)
    ids = [engine.add_request(prompt, params) for prompt in PROMPTS]
    while engine.has_unfinished():
        engine.step()
    outputs = [engine.output(i) for i in ids]
    return [{"tokens": o.token_ids, "logprobs": [x.logprob for x in o.logprobs]} for o in outputs]


def _rank(rank: int, size: int, port: int, model: str, out: str, options: dict) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=size)  # fmt: skip
    try:
        result = _generate(model, TPGroup(rank, size), **options)
        with open(f"{out}.{rank}", "w") as f:
            json.dump(result, f)
    finally:
        dist.destroy_process_group()


def _tensor_parallel(model: str, tmp_path, size: int = 2, **options) -> list[list[dict]]:
    out = str(tmp_path / "tp")
    mp.start_processes(_rank, args=(size, free_port(), model, out, options), nprocs=size,
                       join=True, start_method="spawn")  # fmt: skip
    results = []
    for rank in range(size):
        with open(f"{out}.{rank}") as f:
            results.append(json.load(f))
        os.remove(f"{out}.{rank}")
    return results


def _assert_same(single: list[dict], ranks: list[list[dict]]) -> None:
    for result in ranks:
        for want, got in zip(single, result, strict=True):
            assert got["tokens"] == want["tokens"]
            assert got["logprobs"] == pytest.approx(want["logprobs"], abs=1e-4)


@pytest.mark.parametrize(
    "name",
    [
        "llama_gqa",
        "llama_mqa_tied",
        "llama_bias",
        "qwen3_qk_norm",
        "gemma3",
        "mistral_window",
        "gpt_oss",
        "deepseek_v3",
    ],  # fmt: skip
)
def test_two_ranks_generate_what_one_process_does(name, tmp_path):
    build_hf_model(name, tmp_path / "model")
    model = str(tmp_path / "model")
    _assert_same(_generate(model, None), _tensor_parallel(model, tmp_path))


# 3 latent-attention heads (1 + 2 on two ranks), q_proj without a LoRA, interleaved RoPE
DEEPSEEK_UNEVEN = dict(hidden_size=48, num_attention_heads=3, num_key_value_heads=3)


def test_uneven_latent_attention_heads_on_two_ranks(tmp_path):
    build_hf_model("deepseek_v2", tmp_path / "model", **DEEPSEEK_UNEVEN)
    model = str(tmp_path / "model")
    _assert_same(_generate(model, None), _tensor_parallel(model, tmp_path))


@pytest.mark.parametrize(
    "name, overrides",
    [("gpt_oss", dict(num_local_experts=5)), ("deepseek_v2", DEEPSEEK_UNEVEN)],  # 2 + 3 experts
)
def test_expert_parallel_ranks_generate_what_one_process_does(name, overrides, tmp_path):
    """Whole experts per rank (4 + 4 of DeepSeek's 8, 2 + 3 of 5 GPT-OSS experts), shared
    experts and attention split as under tensor parallelism."""
    build_hf_model(name, tmp_path / "model", **overrides)
    model = str(tmp_path / "model")
    parallel = dict(tensor_parallel_size=2, expert_parallel_size=2)
    _assert_same(_generate(model, None), _tensor_parallel(model, tmp_path, **parallel))


@pytest.mark.slow
def test_the_default_model_on_two_ranks(tmp_path):
    model = str(default_model_path())
    _assert_same(_generate(model, None), _tensor_parallel(model, tmp_path))


def test_heads_split_by_kv_group():
    """9 query / 3 KV heads on 2 ranks: whole KV groups (1 + 2); one KV head on 2 ranks: a copy
    on each, its query heads split; every head and MLP feature held exactly once."""
    config = read_model_config(str(default_model_path()))
    shards = [plan(config, r, 2) for r in range(2)]
    assert [s.kv_heads for s in shards] == [(0, 1), (1, 3)]  # (rank 0 also schedules)
    assert [s.q_heads for s in shards] == [(0, 3), (3, 9)]
    assert shards[0].intermediate[1] == shards[1].intermediate[0]
    assert sum(s.vocab_widths[s.rank] for s in shards) == config.vocab_size
    assert shards[0].vocab == (0, shards[1].vocab[0]) and shards[1].vocab[1] == config.vocab_size
    mqa = config.replace(num_key_value_heads=1)
    shards = [plan(mqa, r, 2) for r in range(2)]
    assert [s.kv_heads for s in shards] == [(0, 1), (0, 1)]
    assert [s.q_heads for s in shards] == [(0, 4), (4, 9)]
    with pytest.raises(ConfigError, match="do not split over 4 ranks"):
        plan(config, 0, 4)


def test_what_it_cannot_split_yet_is_refused(tmp_path):
    build_hf_model("mamba2", tmp_path / "mamba")
    with pytest.raises(ConfigError, match="recurrent layers"):
        plan(read_model_config(str(tmp_path / "mamba")), 0, 2)


def test_experts_split_by_features_or_whole(tmp_path):
    """Without expert parallelism every rank holds every expert, half of each one's features;
    with it, a run of whole experts (every expert held exactly once); shared experts split by
    features either way; MLA heads split unevenly (1 + 2 of 3)."""
    build_hf_model("deepseek_v2", tmp_path / "model", **DEEPSEEK_UNEVEN)
    config = read_model_config(str(tmp_path / "model"))
    moe = config.moe
    tp = [plan(config, r, 2) for r in range(2)]
    assert [s.experts for s in tp] == [(0, moe.num_experts)] * 2
    assert [s.expert_features for s in tp] == [(0, 12), (12, 24)]
    assert [s.q_heads for s in tp] == [(0, 1), (1, 3)]
    local = tp[1].local_config(config)
    assert (local.num_attention_heads, local.moe.intermediate_size) == (2, 12)
    assert local.moe.num_experts == moe.num_experts  # (the router scores every expert)
    ep = [plan(config, r, 2, expert_parallel_size=2) for r in range(2)]
    assert [s.experts for s in ep] == [(0, 4), (4, 8)]
    assert [s.expert_features for s in ep] == [(0, 24)] * 2
    assert [s.shared_features for s in ep] == [s.shared_features for s in tp] == [(0, 12), (12, 24)]
    # GPT-OSS's fused experts: the rank's experts, its (gate, up) column pairs kept together
    gate_up = torch.arange(8 * 2 * 48).view(8, 2, 48)  # [experts, hidden, 2 · 24 features]
    name = "model.layers.1.mlp.experts.gate_up_proj"
    assert tp[1].tensor(name, gate_up).tolist() == gate_up[:, :, 24:].tolist()
    assert ep[1].tensor(name, gate_up).tolist() == gate_up[4:].tolist()
    bias = "model.layers.1.mlp.experts.down_proj_bias"
    assert not tp[1].tensor(bias, torch.ones(8, 2)).any()  # (added once: on rank 0)
    assert ep[1].tensor(bias, torch.ones(8, 2)).tolist() == torch.ones(4, 2).tolist()


def test_expert_parallel_sizes_other_than_1_or_tp_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="expert_parallel_size is 1 or the tensor_parallel"):
        engine_config(tensor_parallel_size=2, expert_parallel_size=3)
    with pytest.raises(ConfigError, match="expert_parallel_size"):
        engine_config(expert_parallel_size=2)  # (tensor_parallel_size 1)
    build_hf_model("gpt_oss", tmp_path / "moe")
    config = read_model_config(str(tmp_path / "moe"))
    with pytest.raises(ConfigError, match="1 or 2") as error:
        plan(config, 0, 2, expert_parallel_size=4)
    assert "expert_parallel_size" in str(error.value)
    build_hf_model("llama_gqa", tmp_path / "dense")
    with pytest.raises(ConfigError, match="needs a mixture-of-experts model"):
        plan(read_model_config(str(tmp_path / "dense")), 0, 2, expert_parallel_size=2)


# ---- quantized weights, split as stored ----------------------------------------------------
QUANTIZED = dict(intermediate_size=128)  # (input features in whole blocks of 32 on each rank)


def _gguf(tmp_path, qtype: str) -> str:
    import gguf

    from tests.io.test_gguf import _write_gguf, tiny_llama

    path = tmp_path / f"tiny-{qtype}.gguf"
    _write_gguf(path, tiny_llama(), gguf.GGMLQuantizationType[qtype])
    return str(path)


def _exported(tmp_path, scheme: str, **kv) -> str:
    build_hf_model("llama_gqa", tmp_path / "src", **QUANTIZED)
    export(str(tmp_path / "src"), scheme, tmp_path / "out", **kv)
    return str(tmp_path / "out")


def test_quantized_weights_are_cut_as_stored(tmp_path):
    """Rows, and columns between blocks of 32, of GGUF blocks and compressed-tensors codes stay
    in their encoding, with the values of the dense slice; a cut inside a block is dense."""
    cases = [
        (load_checkpoint(_gguf(tmp_path, "Q4_1"), keep_blocks=True), BlockWeight),
        (load_checkpoint(_exported(tmp_path / "i4", "int4")), QuantWeight),
        (load_checkpoint(_exported(tmp_path / "i8", "int8")), QuantWeight),
    ]
    for checkpoint, kind in cases:
        config = checkpoint.config
        for rank in range(2):
            shard = plan(config, rank, 2)
            for name in ("q_proj", "o_proj"):
                key = f"model.layers.0.self_attn.{name}.weight"
                full, got = checkpoint.tensors[key], shard.tensor(key, checkpoint.tensors[key])
                assert isinstance(got, kind), (key, type(got))
                rows = slice(*_q_rows_of(shard)) if name == "q_proj" else slice(None)
                cols = slice(*_o_cols_of(shard)) if name == "o_proj" else slice(None)
                assert torch.equal(dense(got), dense(full)[rows, cols])
        key = "model.layers.0.mlp.down_proj.weight"  # a cut inside a block: dequantized
        inside = cut(checkpoint.tensors[key], columns=(0, 48))
        if kind is BlockWeight or checkpoint.tensors[key].fmt != "int8":
            assert isinstance(inside, torch.Tensor)
        assert torch.equal(dense(inside), dense(checkpoint.tensors[key])[:, :48])


def _q_rows_of(shard):
    return shard.q_heads[0] * shard.q_rows_per_head, shard.q_heads[1] * shard.q_rows_per_head


def _o_cols_of(shard):
    return shard.q_heads[0] * shard.o_columns_per_head, shard.q_heads[1] * shard.o_columns_per_head


@pytest.mark.parametrize("qtype", ["Q4_1", "Q8_0"])
def test_gguf_blocks_on_two_ranks(qtype, tmp_path):
    """A GGUF file computed on its blocks (weights='gguf'), split between blocks."""
    model = _gguf(tmp_path, qtype)
    _assert_same(_generate(model, None, weights="gguf"),
                 _tensor_parallel(model, tmp_path, weights="gguf"))  # fmt: skip


@pytest.mark.parametrize("scheme", sorted(EXPORTS))
def test_compressed_tensors_checkpoints_on_two_ranks(scheme, tmp_path):
    """A compressed-tensors checkpoint's codes and scales, split as stored."""
    model = _exported(tmp_path, scheme)
    _assert_same(_generate(model, None), _tensor_parallel(model, tmp_path))


def test_fp8_kv_scales_of_a_checkpoint_per_rank(tmp_path):
    """FP8 KV with the checkpoint's per-head scales: each rank takes its KV heads' scales."""
    model = _exported(tmp_path, "int8", kv_format="fp8_e4m3")
    _assert_same(_generate(model, None), _tensor_parallel(model, tmp_path))


@pytest.mark.parametrize("weights", ["int4", "q4_1"])
def test_a_group_scheme_quantized_at_load_on_two_ranks(weights, tmp_path):
    """Each rank quantizes its slice; cut between groups, its codes are one process's."""
    build_hf_model("llama_gqa", tmp_path / "model", **QUANTIZED)
    model = str(tmp_path / "model")
    _assert_same(_generate(model, None, weights=weights),
                 _tensor_parallel(model, tmp_path, weights=weights))  # fmt: skip
