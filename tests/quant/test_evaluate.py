"""eval/quality.py and `infergen eval` against transformers: perplexity from the logits of
the same model, KL / top-1 from transformers' logits of the unquantized and the
fake-quantized model (every projection's weight replaced by its dequantized value)."""

from __future__ import annotations

import math

import pytest
import torch

from infergen.cli import main
from infergen.eval.quality import divergence, evaluate
from infergen.formats import dequantize, quantize
from tests.hf_models import build_hf_model


def test_evaluate_matches_transformers(tmp_path):
    hf_model = build_hf_model("llama_bias", tmp_path)
    torch.manual_seed(4)
    ids = torch.randint(0, hf_model.config.vocab_size, (40,)).tolist()
    rows = evaluate(str(tmp_path), ["int8"], token_ids=ids, kv_cache_memory="16MiB")
    with torch.no_grad():
        ref = hf_model(torch.tensor([ids])).logits[0]
        for module in hf_model.modules():
            if isinstance(module, torch.nn.Linear):  # per channel: fusing changes nothing
                module.weight.copy_(dequantize(quantize(module.weight, "int8", axis=-1)))
        fake = hf_model(torch.tensor([ids])).logits[0]
    nll = torch.nn.functional.cross_entropy(ref[:-1].double(), torch.tensor(ids[1:]))
    assert [r["scheme"] for r in rows] == ["none", "int8"]
    assert rows[0]["perplexity"] == pytest.approx(math.exp(nll.item()), rel=1e-4)
    expected = divergence(ref, fake)
    assert expected["kl_nats"] > 0  # the scheme does change the distribution
    assert rows[1]["kl_nats"] == pytest.approx(expected["kl_nats"], rel=1e-2, abs=1e-7)
    assert rows[1]["top1_agreement"] == pytest.approx(expected["top1_agreement"], abs=1 / 40)
    assert rows[1]["weight_bytes"] < rows[0]["weight_bytes"] / 3.5  # a byte a weight (+ scales)


def test_divergence_of_known_distributions():
    p = torch.tensor([[0.0, 0.0]])  # uniform over two tokens
    q = torch.log(torch.tensor([[0.9, 0.1]]))
    got = divergence(p, q)
    assert got["kl_nats"] == pytest.approx(0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1))


def test_eval_cli_rejects_unknown_scheme(capsys):
    assert main(["eval", "--weights", "int9"]) == 2
    assert "unknown weight scheme 'int9'" in capsys.readouterr().err


def test_evaluate_kv_format_rows(tmp_path):
    """A KV format is scored over unquantized weights: same weight bytes, a quarter of the
    KV bytes per token for FP8 against fp32, a small nonzero KL."""
    build_hf_model("llama_gqa", tmp_path)
    ids = torch.randint(0, 211, (40,), generator=torch.Generator().manual_seed(5)).tolist()
    rows = evaluate(str(tmp_path), [], token_ids=ids, kv_formats=["fp8_e4m3"])
    assert [r["scheme"] for r in rows] == ["none", "kv fp8_e4m3"]
    assert rows[1]["weight_bytes"] == rows[0]["weight_bytes"]
    assert rows[1]["kv_bytes_per_token"] * 4 == rows[0]["kv_bytes_per_token"]
    assert 0 < rows[1]["kl_nats"] < 0.05


def test_eval_cli_rejects_unknown_kv_format(capsys):
    assert main(["eval", "--kv-format", "fp7"]) == 2
    assert "unknown KV cache format 'fp7'" in capsys.readouterr().err
