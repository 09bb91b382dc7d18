"""`infergen info` on a checkpoint: the per-layer mixers and the cache bytes, worked out from
the model's own numbers (layer counts, window, latent and state sizes)."""

from __future__ import annotations

from infergen.cli import main
from tests.hf_models import build_hf_model


def _info(capsys, directory) -> dict[str, str]:
    assert main(["info", "--model", str(directory)]) == 0
    rows = [line.split("  ", 1) for line in capsys.readouterr().out.splitlines()]
    return {key.strip(): value.strip() for key, value in rows}


def test_windowed_layers_and_their_cache(tmp_path, capsys):
    build_hf_model("gemma3", tmp_path)  # 6 layers: 2 local (window 8), 1 global, twice
    info = _info(capsys, tmp_path)
    window, full = "sliding_attention (window 8) ×2", "full_attention ×1"
    assert info["layers by mixer"] == ", ".join([window, full] * 2)
    per_token = 6 * 2 * 2 * 16 * 4  # layers · K/V · KV heads · head_dim · fp32
    assert info["KV bytes per token (fp32)"] == f"{per_token:,}"
    assert info["feed-forward"] == "gated MLP (gelu_pytorch_tanh), intermediate 136"


def test_latent_and_recurrent_caches(tmp_path, capsys):
    build_hf_model("deepseek_v3", tmp_path / "mla")  # latent 16 + RoPE 8, 4 heads of 16+8 / 16
    info = _info(capsys, tmp_path / "mla")
    assert info["layers by mixer"] == "mla ×3"
    latent, mha = 3 * (16 + 8) * 4, 3 * 4 * (16 + 8 + 16) * 4
    assert info["KV bytes per token (fp32)"].startswith(f"{latent:,} (latent + RoPE key")
    assert f"the equivalent MHA: {mha:,}" in info["KV bytes per token (fp32)"]
    assert "MoE: 8 experts" in info["feed-forward"]
    build_hf_model("mamba2", tmp_path / "ssm")  # 8 heads of 16, state 16, 2 groups, conv 4
    info = _info(capsys, tmp_path / "ssm")
    assert info["layers by mixer"] == "mamba ×3"
    conv_dim = 8 * 16 + 2 * 2 * 16
    state = 3 * (conv_dim * 3 + 8 * 16 * 16) * 4
    assert info["state bytes per sequence (fp32)"] == f"{state:,}"
    assert info["KV bytes per token (fp32)"] == "0"
