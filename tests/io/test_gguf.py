"""GGUF loading: a tiny random Llama written as GGUF (llama.cpp's q/k row permutation, several
tensor types) must give the logits transformers computes from the same (dequantized) weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from infergen.io.checkpoint import load_checkpoint
from infergen.models.transformer import Transformer


def _permute_like_llama_cpp(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter: interleave rotary pairs (the loader must undo this)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _write_gguf(path, hf_model, qtype):
    import gguf

    cfg = hf_model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    names = {
        "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
        "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }  # fmt: skip
    effective = {}  # what the file really holds, dequantized, in Hugging Face layout
    for name, tensor in hf_model.state_dict().items():
        w = tensor.float().numpy()
        if name == "model.embed_tokens.weight":
            gname = "token_embd.weight"
        elif name == "model.norm.weight":
            gname = "output_norm.weight"
        elif name == "lm_head.weight":
            gname = "output.weight"
        else:
            layer, rest = name.split(".")[2], ".".join(name.split(".")[3:-1])
            gname = f"blk.{layer}.{names[rest]}.weight"
        heads = {"attn_q": cfg.num_attention_heads, "attn_k": cfg.num_key_value_heads}
        kind = gname.split(".")[-2]
        stored = _permute_like_llama_cpp(w, heads[kind]) if kind in heads else w
        t = qtype if w.ndim == 2 else gguf.GGMLQuantizationType.F32
        data = gguf.quants.quantize(stored, t)
        writer.add_tensor(gname, data, raw_shape=data.shape, raw_dtype=t)
        # Blocks run along rows and the permutation moves whole rows, so the weights the file
        # holds, in Hugging Face layout, are simply dequantize(quantize(w)).
        plain = gguf.quants.quantize(w, t)
        effective[name] = gguf.quants.dequantize(plain, t).reshape(w.shape)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return effective


def tiny_llama(seed: int = 0, **overrides):
    """A random 2-layer GQA Llama (transformers) small enough to write as GGUF in a test."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = dict(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        rms_norm_eps=1e-5, initializer_range=0.2,
    )  # fmt: skip
    return LlamaForCausalLM(LlamaConfig(**{**config, **overrides})).eval()


@pytest.mark.parametrize("qtype_name", ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0"])
def test_gguf_logits_match_transformers(tmp_path, qtype_name):
    import gguf

    hf = tiny_llama()
    path = tmp_path / f"tiny-{qtype_name}.gguf"
    effective = _write_gguf(path, hf, getattr(gguf.GGMLQuantizationType, qtype_name))
    hf.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in effective.items()})

    ckpt = load_checkpoint(path)
    assert ckpt.config.num_key_value_heads == 2 and not ckpt.config.tie_word_embeddings
    for name, value in effective.items():  # q/k unpermuted, every tensor decoded right
        assert torch.equal(ckpt.tensors[name], torch.from_numpy(value)), name

    from infergen import LLM

    llm = LLM(checkpoint=ckpt, kv_cache_memory="8MiB")
    tokens = torch.randint(0, 96, (30,)).tolist()
    with torch.no_grad():
        expected = hf(torch.tensor([tokens])).logits[0]
    got = llm.engine.prompt_logits(tokens)
    assert (got - expected).abs().max() <= 1e-4 * expected.abs().max()
    assert isinstance(llm.engine.runner.model, Transformer)
