"""Passkey retrieval prompts and scoring (eval/passkey.py), the eval matrix's table and plot
(eval/matrix.py) and `infergen eval --matrix`, on the default model."""

from __future__ import annotations

import pytest

from infergen.cli import main
from infergen.eval.passkey import FILLER, NEEDLE, passkey_prompt
from infergen.io.checkpoint import load_checkpoint


@pytest.fixture(scope="module")
def tokenizer():
    return load_checkpoint(None, load_weights=False).tokenizer


@pytest.mark.parametrize("length", [256, 1024, 4096])
@pytest.mark.parametrize("depth", [0.1, 0.5, 0.9])
def test_passkey_prompt_length_and_depth(tokenizer, length, depth):
    ids = passkey_prompt(tokenizer, length, depth, 31415)
    assert length * 0.9 <= len(ids) <= length
    text = tokenizer.decode(ids)
    needle = NEEDLE.format(key=31415)
    assert text.count(needle) == 1 and text.rstrip().endswith("The pass key is")
    repeats = text.count(FILLER)  # the needle sits after round(depth · repeats) of them
    assert text[: text.index(needle)].count(FILLER) == round(depth * repeats)


@pytest.mark.slow
def test_eval_matrix_cli(tmp_path, capsys):
    prefix = tmp_path / "m"
    argv = ["eval", "--weights", "int8", "--kv-format", "fp8_e4m3", "--tokens", "64"]
    argv += ["--task", "all", "--passkey-lengths", "256", "--passkey-samples", "2"]
    assert main([*argv, "--matrix", str(prefix)]) == 0
    table = (tmp_path / "m.md").read_text().splitlines()
    assert (
        table[0].startswith("| config | bits/weight | KV bytes/token") and "passkey 256" in table[0]
    )
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in table[2:]}
    assert set(rows) == {"none", "int8", "kv fp8_e4m3"}
    assert float(rows["none"][1]) == pytest.approx(32.0, rel=0.01)  # fp32 projections
    assert 8.0 < float(rows["int8"][1]) < 8.5  # codes + a scale per channel
    assert int(rows["kv fp8_e4m3"][2]) * 4 == int(rows["none"][2])
    # the fp32 model finds a key in 256 tokens: the row reads 100 %
    assert rows["none"][-1].strip(" |") == "100 %"
    assert (tmp_path / "m.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_eval_rejects_bad_passkey_lengths(capsys):
    with pytest.raises(SystemExit):
        main(["eval", "--task", "passkey", "--passkey-lengths", "1k"])
    assert "expected prompt lengths like 1024,4096" in capsys.readouterr().err
