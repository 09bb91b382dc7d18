"""Tokenizer tests against an independent oracle: Hugging Face transformers.

transformers builds its own tokenizer from the same GGUF metadata (`AutoTokenizer` with
`gguf_file=`); our ids, decoded text and rendered chat prompts must equal its output on real
text from `data/` and on hand-picked hard cases (digits, unicode, whitespace runs, special
tokens). The same is checked for the Hugging Face directory route (`save_pretrained` output)
and for a tiny SentencePiece-style ("llama") GGUF written here.

One known difference: transformers 5.24 ignores `tokenizer.ggml.pre = "smollm"` and splits with
the plain GPT-2 regex, while SmolLM2's published `tokenizer.json` (and llama.cpp) first isolate
every numeric character (`Digits(individual_digits=True)`), so a whitespace run before a number
stays whole: "a    1" is `a ĠĠĠĠ 1` for SmolLM2 and `a ĠĠĠ Ġ 1` in transformers' GGUF route
(also " ²": `Ġ Â²` vs `ĠÂ ²`). The ids the model was trained on are SmolLM2's. So the oracle for
the GGUF route is transformers' tokenizer with SmolLM2's published pre-tokenizer put back
(`smollm_oracle`), and plain transformers is compared wherever the two cannot differ.
"""

from __future__ import annotations

import json
import pathlib

import gguf
import numpy as np
import pytest
import tokenizers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infergen.errors import CheckpointError, RequestError
from infergen.io.chat_template import ChatTemplate, ChatTemplateError
from infergen.io.tokenizer import IncrementalDetokenizer, Tokenizer

DATA = pathlib.Path(__file__).resolve().parents[2] / "data"

HARD_CASES = [
    "Hello world",
    "",
    " ",
    "Digits: 3.14159, 2024-01-01, 1,000,000, 0x1F, 1e-9, ½ ² ٣٤ ５６, v1.2.3rc4, 007",
    "Unicode: 日本語のテキスト 中文 한국어 Ελληνικά русский текст עברית العربية",
    "Emoji: 🙂👍🏽 👨‍👩‍👧 🏳️‍🌈 ❤️ — “quotes” ‘single’ … naïve café e\u0301",
    "Whitespace:  two   three    four\t\ttabs\n\n\nnewlines\r\n\r\ncrlf   \n  trailing   ",
    "    indented code\n        more\n\tdef f(x):\n\t\treturn x ** 2  # comment\n",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n",
    "text<|endoftext|>more<jupyter_code>print(1)<|im_start|<im_start|>",
    "don't can't I'm we'll they've she'd it's 'S 'LL",
    'URL https://example.com/a?b=c&d=e#f and e-mail a.b@c.de {"json": [1, 2.5, null]}',
]

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are a pirate."},
        {"role": "user", "content": "Hello!"},
    ],
    [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "2 + 2 = ?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "Und auf Deutsch? 日本語でも 🙂"},
    ],
]


def _samples() -> list[str]:
    python_docs = (DATA / "python_docs.txt").read_text(encoding="utf-8")
    shakespeare = (DATA / "shakespeare.txt").read_text(encoding="utf-8")
    chunks = [python_docs[i : i + 3000] for i in range(0, 30000, 3000)]
    chunks += [shakespeare[i : i + 3000] for i in range(0, 15000, 3000)]
    return HARD_CASES + chunks


@pytest.fixture(scope="module")
def hf_gguf(default_model_path):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(
        str(default_model_path.parent), gguf_file=default_model_path.name
    )


@pytest.fixture(scope="module")
def smollm_oracle(hf_gguf) -> tokenizers.Tokenizer:
    """transformers' tokenizer with the pre-tokenizer of SmolLM2's published tokenizer.json."""
    oracle = tokenizers.Tokenizer.from_str(hf_gguf.backend_tokenizer.to_str())
    oracle.pre_tokenizer = tokenizers.pre_tokenizers.Sequence(
        [
            tokenizers.pre_tokenizers.Digits(individual_digits=True),
            tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    return oracle


def _pre_tokenizers_may_differ(text: str) -> bool:
    """True where Digits+ByteLevel and the GPT-2 regex alone can split differently."""
    return any(
        ch.isnumeric() and (not ch.isascii() or (i > 0 and text[i - 1].isspace()))
        for i, ch in enumerate(text)
    )


@pytest.fixture(scope="module")
def ours(default_model_path) -> Tokenizer:
    reader = gguf.GGUFReader(str(default_model_path))
    return Tokenizer.from_gguf(reader, str(default_model_path))


@pytest.fixture(scope="module")
def hf_dir(hf_gguf, tmp_path_factory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("hf_tokenizer")
    hf_gguf.save_pretrained(str(path))
    return path


@pytest.fixture(scope="module")
def ours_dir(hf_dir) -> Tokenizer:
    return Tokenizer.from_hf_dir(hf_dir)


# --- the default model (GGUF) --------------------------------------------------------------


def test_default_model_metadata(ours):
    assert ours.vocab_size == 49152
    assert ours.bos_token_id == 1  # <|im_start|>
    assert ours.eos_token_ids == (2, 0)  # <|im_end|> (eos), <|endoftext|> (end of text)
    assert ours.add_bos_token is False
    assert ours.is_special(1) and ours.is_special(16) and not ours.is_special(17)
    assert ours.chat_template is not None and "<|im_start|>" in ours.chat_template


def test_encode_matches_transformers(ours, hf_gguf, smollm_oracle):
    for text in _samples():
        ids = ours.encode(text)
        assert ids == smollm_oracle.encode(text).ids, repr(text[:80])
        if not _pre_tokenizers_may_differ(text):
            assert ids == hf_gguf.encode(text), repr(text[:80])
        assert ours.encode(text, add_special_tokens=False) == ids  # add_bos_token is False


def test_smollm_pre_tokenizer_isolates_numbers(ours, hf_gguf, smollm_oracle):
    for text in [" ²", "½ ² ٣٤ ５６", "x 1 22 333", "a    1", "\n    0\n"]:
        assert ours.encode(text) == smollm_oracle.encode(text).ids
    # the two differences the module docstring describes
    assert hf_gguf.convert_ids_to_tokens(ours.encode("a    1")) == ["a", "ĠĠĠĠ", "1"]
    assert hf_gguf.convert_ids_to_tokens(hf_gguf.encode("a    1")) == ["a", "ĠĠĠ", "Ġ", "1"]
    assert hf_gguf.convert_ids_to_tokens(ours.encode(" ²")) == ["Ġ", "Â²"]
    assert hf_gguf.convert_ids_to_tokens(hf_gguf.encode(" ²")) == ["ĠÂ", "²"]


def test_hf_dir_matches_transformers(ours_dir, hf_gguf):
    """`save_pretrained` wrote transformers' own pre-tokenizer: from_hf_dir reproduces it all."""
    for text in _samples():
        assert ours_dir.encode(text) == hf_gguf.encode(text), repr(text[:80])
        ids = hf_gguf.encode(text)
        for skip in (True, False):
            assert ours_dir.decode(ids, skip) == hf_gguf.decode(ids, skip_special_tokens=skip)
    assert ours_dir.eos_token_ids == (2, 0) and ours_dir.bos_token_id == 1
    assert not ours_dir.add_bos_token and ours_dir.vocab_size == 49152


@pytest.mark.parametrize("name", ["python_docs.txt", "shakespeare.txt"])
def test_encode_whole_files_matches_transformers(name, ours, smollm_oracle):
    text = (DATA / name).read_text(encoding="utf-8")
    ids = ours.encode(text)
    assert ids == smollm_oracle.encode(text).ids
    assert len(text) / len(ids) > 3.0  # sanity: real text compresses to several chars/token
    assert ours.decode(ids) == text


def test_decode_matches_transformers_and_round_trips(ours, hf_gguf):
    for text in _samples():
        ids = ours.encode(text)
        assert ours.decode(ids, skip_special_tokens=False) == text
        for skip in (True, False):
            expected = hf_gguf.decode(ids, skip_special_tokens=skip)
            assert ours.decode(ids, skip_special_tokens=skip) == expected
    chat = ours.encode("<|im_start|>user\nhi<|im_end|>")
    assert chat == [1, 4093, 198, 6004, 2]
    assert ours.decode(chat) == "user\nhi"


@pytest.mark.parametrize("which", ["gguf", "hf_dir"])
@pytest.mark.parametrize("conversation", CONVERSATIONS, ids=["user", "system", "multi_turn"])
def test_chat_template_matches_transformers(which, conversation, ours, ours_dir, hf_gguf):
    tokenizer = ours if which == "gguf" else ours_dir
    for add_generation_prompt in (True, False):
        expected = hf_gguf.apply_chat_template(
            conversation, tokenize=False, add_generation_prompt=add_generation_prompt
        )
        text = tokenizer.apply_chat_template(
            conversation, add_generation_prompt=add_generation_prompt
        )
        assert text == expected
    expected_ids = hf_gguf.apply_chat_template(
        conversation, tokenize=True, add_generation_prompt=True, return_dict=False
    )
    prompt = tokenizer.apply_chat_template(conversation)
    assert tokenizer.encode(prompt, add_special_tokens=False) == expected_ids
    assert prompt.endswith("<|im_start|>assistant\n")


def test_chat_template_environment_matches_transformers(hf_gguf):
    source = (
        "{{ bos_token }}{% for m in messages %}"
        "{% if m.role not in ['user', 'assistant'] %}{{ raise_exception('bad role') }}{% endif %}"
        "  {{ m | tojson }}\n"
        "{% endfor %}{{ extra | default('none') }}{% if add_generation_prompt %}>{% endif %}"
    )
    messages = [
        {"role": "user", "content": 'héllo "q" <b>'},
        {"role": "assistant", "content": "ok"},
    ]
    template = ChatTemplate(source, where="test")
    special = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}
    for kwargs in ({}, {"extra": "x"}):
        ours = template.render(
            messages, add_generation_prompt=True, special_tokens=special, **kwargs
        )
        theirs = hf_gguf.apply_chat_template(
            messages, chat_template=source, tokenize=False, add_generation_prompt=True, **kwargs
        )
        assert ours == theirs
    with pytest.raises(ChatTemplateError, match="bad role"):
        template.render([{"role": "tool", "content": "x"}])
    assert ChatTemplate("{{ strftime_now('%Y') }}", where="t").render([]).isdigit()
    with pytest.raises(CheckpointError, match="does not compile"):
        ChatTemplate("{% for %}", where="broken.jinja")


def test_no_chat_template_is_a_clear_error(hf_dir, tmp_path):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((hf_dir / name).read_bytes())
    tokenizer = Tokenizer.from_hf_dir(tmp_path)  # no chat_template.jinja
    assert tokenizer.chat_template is None
    with pytest.raises(RequestError, match="no chat template"):
        tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])


def test_hf_dir_template_inside_tokenizer_config(hf_dir, tmp_path):
    (tmp_path / "tokenizer.json").write_bytes((hf_dir / "tokenizer.json").read_bytes())
    config = json.loads((hf_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "default", "template": "[{{ messages[0].content }}]"}]
    config["add_bos_token"] = True
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    tokenizer = Tokenizer.from_hf_dir(tmp_path)
    assert tokenizer.apply_chat_template([{"role": "user", "content": "x"}]) == "[x]"
    assert (
        tokenizer.encode("hi")[0] == 1 and tokenizer.encode("hi", add_special_tokens=False)[0] != 1
    )
    assert tokenizer.eos_token_ids == (2, 7, 0)


# SmolLM2's byte alphabet lacks the bytes 0x04 0x06 0x13 0x14 0x16 0x1D and the UTF-8 lead
# bytes 0xF1+ (code points from U+40000): such characters have no token and are dropped.
UNCOVERED_CONTROLS = "\x04\x06\x13\x14\x16\x1d"
UNCOVERED_FROM = 0x40000


def test_characters_without_tokens_are_dropped_like_transformers(ours, hf_gguf):
    text = f"a{UNCOVERED_CONTROLS}b"
    assert ours.encode(text) == hf_gguf.encode(text) == [ours.encode("a")[0], ours.encode("b")[0]]
    text = f"x{chr(UNCOVERED_FROM)}y"  # lead byte dropped, continuation bytes kept
    ids = ours.encode(text)
    assert ids == hf_gguf.encode(text)
    assert ours.decode(ids) == hf_gguf.decode(ids) == "x\ufffd\ufffd\ufffdy"


# --- streaming detokenization --------------------------------------------------------------

STREAM_TEXTS = [
    "héllo 日本語のテキスト 🙂👍🏽 👨‍👩‍👧 naïve café 中文 한국어",
    "<|im_start|>assistant\nSure! 🎉🎉 Ünïcödé — 東京タワー<|im_end|>",
    "plain ascii text with numbers 12345",
]


@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize("text", STREAM_TEXTS)
def test_incremental_detokenizer_equals_decode(text, skip, ours):
    ids = ours.encode(text)
    stream = IncrementalDetokenizer(ours, skip_special_tokens=skip)
    deltas = [stream.push(token_id) for token_id in ids]
    assert all("\ufffd" not in delta for delta in deltas)
    assert "".join(deltas) + stream.flush() == ours.decode(ids, skip_special_tokens=skip)
    assert stream.text == ours.decode(ids, skip_special_tokens=skip)
    assert "" in deltas or "🙂" not in text  # multi-byte characters were held back at least once


def test_incremental_detokenizer_holds_back_split_character(ours):
    ids = ours.encode("語")  # one character, three byte tokens
    assert len(ids) == 3
    stream = IncrementalDetokenizer(ours)
    assert [stream.push(token_id) for token_id in ids[:2]] == ["", ""]
    assert stream.flush() == ours.decode(ids[:2]) == "\ufffd"  # incomplete at end of stream


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    text=st.text(
        st.characters(
            max_codepoint=UNCOVERED_FROM - 1,
            blacklist_categories=("Cs",),
            blacklist_characters=UNCOVERED_CONTROLS,
        ),
        max_size=40,
    )
)
def test_random_text_encode_decode_stream(text, ours, smollm_oracle):
    ids = ours.encode(text)
    assert ids == smollm_oracle.encode(text).ids
    assert ours.decode(ids, skip_special_tokens=False) == text
    stream = IncrementalDetokenizer(ours, skip_special_tokens=False)
    assert "".join(stream.push(i) for i in ids) + stream.flush() == text


# --- SentencePiece-style ("llama") GGUF vocabularies ---------------------------------------


def _write_gguf(path: pathlib.Path, *, tokenizer: dict | None) -> None:
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(64)
    writer.add_embedding_length(8)
    writer.add_block_count(1)
    writer.add_feed_forward_length(16)
    writer.add_head_count(2)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(4)
    rows = 4
    if tokenizer is not None:
        rows = len(tokenizer["tokens"])
        writer.add_vocab_size(rows)
        writer.add_tokenizer_model(tokenizer["model"])
        writer.add_token_list(tokenizer["tokens"])
        writer.add_token_types(tokenizer["types"])
        writer.add_token_scores(tokenizer["scores"])
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
        writer.add_unk_token_id(0)
        if "pre" in tokenizer:
            writer.add_tokenizer_pre(tokenizer["pre"])
    writer.add_tensor("token_embd.weight", np.zeros((rows, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _spm_vocab() -> dict:
    words = "▁ h e l o w r d t a n ! , é ▁t he ▁the ll llo ▁h ▁he ▁hello ▁w or ▁wor ld ▁world"
    words = list(dict.fromkeys((words + " an ▁an ▁and").split()))
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + words
    types = [2, 3, 3] + [6] * 256 + [1] * len(words)
    # distinct scores: longer, earlier pieces merge first; single characters score lowest
    scores = [0.0] * 259 + [-i - (100.0 if len(w) == 1 else 0.0) for i, w in enumerate(words)]
    return {"model": "llama", "tokens": tokens, "types": types, "scores": scores}


def test_sentencepiece_gguf_matches_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    _write_gguf(tmp_path / "spm.gguf", tokenizer=_spm_vocab())
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="spm.gguf")
    ours = Tokenizer.from_gguf(gguf.GGUFReader(str(tmp_path / "spm.gguf")), "spm.gguf")
    assert ours.add_bos_token and ours.bos_token_id == 1 and ours.eos_token_ids == (2,)
    for text in ["hello world", " the and   hello\nworld!", "héllo, 日本", "the</s>the<s>", ""]:
        ids = ours.encode(text)
        assert ids == hf.encode(text), text
        assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=True)
        assert ours.decode(ids, skip_special_tokens=False) == hf.decode(ids)


# --- bad inputs ----------------------------------------------------------------------------


def test_gguf_without_tokenizer_metadata(tmp_path):
    _write_gguf(tmp_path / "bare.gguf", tokenizer=None)
    reader = gguf.GGUFReader(str(tmp_path / "bare.gguf"))
    with pytest.raises(CheckpointError, match=r"bare\.gguf(.|\n)*tokenizer\.ggml\.model"):
        Tokenizer.from_gguf(reader, "bare.gguf")


@pytest.mark.parametrize(
    ("change", "field"),
    [({"model": "bert"}, "tokenizer.ggml.model"), ({"pre": "nonsense"}, "tokenizer.ggml.pre")],
)
def test_gguf_unsupported_tokenizer_names_the_field(change, field, tmp_path):
    vocab = _spm_vocab() | {"model": "gpt2", "merges": []} | change
    _write_gguf(tmp_path / "odd.gguf", tokenizer=vocab)
    with pytest.raises(CheckpointError, match=field.replace(".", r"\.")) as error:
        Tokenizer.from_gguf(gguf.GGUFReader(str(tmp_path / "odd.gguf")), "odd.gguf")
    assert repr(change.get("model", change.get("pre"))) in str(error.value)


def test_hf_dir_missing_or_corrupt_files(hf_dir, tmp_path):
    with pytest.raises(CheckpointError, match="tokenizer.json"):
        Tokenizer.from_hf_dir(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="tokenizer.json"):
        Tokenizer.from_hf_dir(tmp_path)
    (tmp_path / "tokenizer.json").write_bytes((hf_dir / "tokenizer.json").read_bytes())
    with pytest.raises(CheckpointError, match="tokenizer_config.json"):
        Tokenizer.from_hf_dir(tmp_path)  # missing
    (tmp_path / "tokenizer_config.json").write_text('{"eos_token": ')
    with pytest.raises(CheckpointError, match="tokenizer_config.json"):
        Tokenizer.from_hf_dir(tmp_path)  # corrupt
    (tmp_path / "tokenizer_config.json").write_text('{"eos_token": "<|no_such_token|>"}')
    with pytest.raises(CheckpointError, match="eos_token"):
        Tokenizer.from_hf_dir(tmp_path)


def test_save_hf_is_read_back_by_transformers(ours, tmp_path):
    """save_hf: transformers' AutoTokenizer (the oracle) and from_hf_dir both read the exported
    GGUF tokenizer and encode, decode and template exactly as the original."""
    transformers = pytest.importorskip("transformers")
    ours.save_hf(tmp_path)
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    again = Tokenizer.from_hf_dir(tmp_path)
    for text in _samples()[:12]:
        ids = ours.encode(text)
        assert hf.encode(text) == ids == again.encode(text), repr(text[:80])
        assert hf.decode(ids, skip_special_tokens=True) == ours.decode(ids)
    assert (hf.eos_token_id, hf.bos_token_id) == (2, 1)
    messages = [{"role": "user", "content": "Hi"}]
    rendered = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == ours.apply_chat_template(messages, add_generation_prompt=True)
    assert again.eos_token_ids == ours.eos_token_ids
