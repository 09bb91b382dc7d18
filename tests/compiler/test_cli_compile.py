"""`infergen compile` on a tiny checkpoint: the report, the dumped graphs and generated
sources, the kernels pre-built into the JIT cache, and a clear error for an unknown
pipeline."""

from __future__ import annotations

import re

from infergen.cli import main
from tests.hf_models import build_hf_model


def test_compile_reports_and_dumps(tmp_path, capsys):
    build_hf_model("llama_gqa", tmp_path / "model", intermediate_size=144)  # (panels: 6 x 24)
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
            "--jit-cache",
            str(tmp_path / "jit"),
            "--buckets",
            "1",
            "--budget-seconds",
            "20",  # (the layer program's search, ~30 s, is skipped)
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert re.search(r"compile: layer program +built", out)  # pre-built into the JIT cache
    assert re.search(r"tune 1: layer program +skipped", out)
    assert "compile: group 0" in out and "tune 1: group 0" in out
    assert "int main" not in (dump / "layer_program.c").read_text()
    assert "gemm_any(" in (dump / "layer_program.c").read_text()
    assert "#pragma omp parallel for" in (dump / "group0.c").read_text()
    assert "@triton.jit" in (dump / "group0.triton.py").read_text()
    assert '#include "gemm_epilogue_f32.h"' in (dump / "gemm0.c").read_text()
    assert "tl.dot(" in (dump / "gemm0.triton.py").read_text()
    assert "paged_prefill_attention_f32(" in (dump / "prefill_program.c").read_text()
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
    assert main(["compile", "-m", str(tmp_path), "--pipeline", "fastest", "--no-build"]) == 2
    err = capsys.readouterr().err
    assert "unknown compiler pipeline 'fastest'" in err and "['fuse', 'jit']" in err
