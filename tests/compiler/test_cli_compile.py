"""`infergen compile` on a tiny checkpoint: the report and the dumped graphs, and a clear
error for an unknown pipeline."""

from __future__ import annotations

from infergen.cli import main
from tests.hf_models import build_hf_model


def test_compile_reports_and_dumps(tmp_path, capsys):
    build_hf_model("llama_gqa", tmp_path / "model")
    dump = tmp_path / "graphs"
    code = main(
        [
            "compile",
            "-m",
            str(tmp_path / "model"),
            "--kv-cache-memory",
            "4MiB",
            "--dump-dir",
            str(dump),
            "--log",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "decoder_layer (x3): 17 nodes, 10 kernels -> 8 kernels after 'jit'" in out
    assert "gemm_silu_mul" in out and "rope_kv_store" in out
    assert "fuse_pointwise/pointwise" in out  # --log
    captured = (dump / "decoder_layer.captured.txt").read_text()
    compiled = (dump / "decoder_layer.jit.txt").read_text()
    assert "add_rms_norm(" in captured and "add_rms_norm(" not in compiled
    assert "kernel=gemm_silu_mul" in compiled and "buffers (floats per token)" in compiled
    assert (dump / "head.captured.txt").exists()


def test_compile_unknown_pipeline(tmp_path, capsys):
    build_hf_model("llama_gqa", tmp_path)
    assert main(["compile", "-m", str(tmp_path), "--pipeline", "fastest"]) == 2
    err = capsys.readouterr().err
    assert "unknown compiler pipeline 'fastest'" in err and "['fuse', 'jit']" in err
