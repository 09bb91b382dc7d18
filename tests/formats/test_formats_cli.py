"""`infergen formats`: the table, its JSON rows (checked against the codec), the plot file."""

from __future__ import annotations

import json

import pytest
import torch

from infergen.cli import main
from infergen.formats import FORMATS, dequantize, quantize, sqnr_db


def test_formats_table_json_and_plot(tmp_path, capsys):
    out_json, out_png = tmp_path / "rows.json", tmp_path / "sqnr.png"
    code = main(
        [
            "formats",
            "--no-weights",
            "--size",
            "256",
            "--json",
            str(out_json),
            "--plot",
            str(out_png),
        ]
    )
    assert code == 0
    text = capsys.readouterr().out
    rows = json.loads(out_json.read_text())
    assert [r["format"] for r in rows] == list(FORMATS)
    for name in FORMATS:
        assert name in text
    normal = torch.randn(1024, 1024, generator=torch.Generator().manual_seed(0))
    by_name = {r["format"]: r for r in rows}
    for name in ("mxfp4", "int8", "nvfp4"):
        want = sqnr_db(normal, dequantize(quantize(normal, name)))
        assert by_name[name]["sqnr_normal_db"] == pytest.approx(want, abs=1e-9)
        assert by_name[name]["bits_per_value"] == FORMATS.get(name).bits_per_value()
        assert by_name[name]["quantize_gb_s"] > 0
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_formats_rejects_bad_size(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["formats", "--size", "100"])
    assert exc.value.code == 2
    assert "positive multiple of 128" in capsys.readouterr().err
