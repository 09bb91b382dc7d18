"""Long-context tasks (eval/longctx.py) and `infergen eval --task longctx` with KV presses
(eval/press_report.py), on the default model."""

from __future__ import annotations

import random

import pytest

from infergen.cli import main
from infergen.eval.longctx import DOORS, TASKS
from infergen.io.checkpoint import load_checkpoint


@pytest.fixture(scope="module")
def tokenizer():
    return load_checkpoint(None, load_weights=False).tokenizer


@pytest.mark.parametrize("name", ["passkey", "passkey_first", "multikey", "chain"])
@pytest.mark.parametrize("length", [512, 2048])
def test_task_prompts_hold_their_answer_at_the_length(tokenizer, name, length):
    """About `length` tokens; the answer's needle is in the text once; the
    question comes after the text, or before it for passkey_first; multikey holds all four
    doors' keys and asks for one of them; chain's B is assigned after A."""
    for depth in (0.1, 0.5, 0.9):
        ids, answer = TASKS.get(name).prompt(tokenizer, length, depth, random.Random(7))
        assert length * 0.85 <= len(ids) <= length + 8
        text = tokenizer.decode(ids)
        needles = 2 if name.startswith("passkey") else 1  # (the passkey needle says it twice)
        assert answer.isdigit() and len(answer) == 5 and text.count(answer) == needles
        question = text.find("?")
        if name == "passkey_first":
            assert question < text.index(answer) and text.endswith("The pass key is")
        else:
            assert text.index(answer) < question
        if name == "multikey":
            assert all(f"the {door} door is" in text for door in DOORS)
            asked = text[question - 30 : question]
            assert f"the {next(d for d in DOORS if d in asked)} door is {answer}" in text
        if name == "chain":
            assert text.index(f"VAR A = {answer}") < text.index("VAR B = A")


@pytest.mark.slow
def test_eval_longctx_cli(tmp_path):
    """The full cache and a press: a row each in the table, the JSON and the PNG; the full
    cache finds a key in 512 tokens (the fp32 default model: 100 %); the press gives back
    about half of each prompt's blocks."""
    prefix, rows_file = tmp_path / "p", tmp_path / "rows.json"
    argv = ["eval", "--task", "longctx", "--kv-press", "snapkv:0.5", "--longctx-tasks",
            "passkey,multikey", "--longctx-lengths", "512", "--passkey-samples", "2",
            "--matrix", str(prefix), "--json", str(rows_file)]  # fmt: skip
    assert main(argv) == 0
    table = (tmp_path / "p.md").read_text().splitlines()
    assert table[0].startswith("| config | passkey 512 | multikey 512 | mean | blocks freed")
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in table[2:]}
    assert set(rows) == {"full", "snapkv:0.5"}
    assert rows["full"][1] == "100 %"
    assert 45 <= int(rows["snapkv:0.5"][-1].strip(" |%")) <= 50
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert rows_file.exists()


def test_eval_longctx_rejects_bad_presses(capsys):
    assert main(["eval", "--task", "longctx", "--kv-press", "snapkv:1.5"]) == 2
    assert "ratio" in capsys.readouterr().err
    assert main(["eval", "--task", "longctx", "--kv-press", "nope:0.5"]) == 2
    assert "unknown KV press 'nope'" in capsys.readouterr().err
