"""GGUF tokenizer metadata (`tokenizer.ggml.*`) → a Hugging Face `tokenizers.Tokenizer`.

Names and enums follow llama.cpp (`llama-vocab.cpp`, `gguf-py/gguf/constants.py`):

- `tokenizer.ggml.model = "gpt2"`: byte-level BPE. `tokens` are spelled in GPT-2's byte
  alphabet, `merges` are `"left right"` strings. How text is split before BPE is named by
  `tokenizer.ggml.pre` and looked up in `GGUF_PRE_TOKENIZERS` (e.g. `smollm` isolates every
  digit, then applies the GPT-2 regex — what SmolLM2's own `tokenizer.json` does with
  `Digits(individual_digits=True)` + `ByteLevel`).
- `tokenizer.ggml.model = "llama"`: SentencePiece-style BPE with `scores`; merges are derived
  from the scores (a merge ranks by its merged piece's score), `<0xNN>` byte fallback, `▁` for
  spaces, a prefix space unless `tokenizer.ggml.add_space_prefix` is false. Gemma files
  (`GGUF_GEMMA_ARCHITECTURES`) differ in two ways, as in transformers' GGUF route: merges rank
  by vocabulary position (the scores agree for normal pieces, but the user-defined ones carry a
  placeholder -1000 while they merge first), and the whitespace-run pieces (ids 138-167) that
  llama.cpp's converter spelled with spaces are spelled back with `▁` and built by BPE
  (a run of 32+ spaces becomes 16-space pieces, not a 31-space piece and the rest).
- `token_type` 3 (control) become special tokens (dropped by `decode(skip_special_tokens=True)`),
  4 (user-defined) become added tokens that are matched whole but are not special (unless
  respelled above: those are built by BPE).

An unknown `model` or `pre` is a `CheckpointError` naming the field (as in llama.cpp): guessing
would silently change every token id.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as BackendTokenizer

from infergen.errors import CheckpointError
from infergen.registry import Registry

if TYPE_CHECKING:
    import gguf

# llama.cpp `llama_token_type` values stored in `tokenizer.ggml.token_type`.
TOKEN_TYPE_NORMAL, TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED = 1, 3, 4

T = TypeVar("T")

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _byte_level() -> pre_tokenizers.PreTokenizer:
    """GPT-2: the GPT-2 regex, then bytes → the byte alphabet."""
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _digits_then_byte_level() -> pre_tokenizers.PreTokenizer:
    """llama.cpp `\\p{N}` then the GPT-2 regex (StarCoder, SmolLM, Command-R...)."""
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _byte_level()])


def _split_then_bytes(pattern: str) -> Callable[[], pre_tokenizers.PreTokenizer]:
    def build() -> pre_tokenizers.PreTokenizer:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )

    return build


# `tokenizer.ggml.pre` → pre-tokenizer factory. An unknown value is an error (as in llama.cpp):
# guessing would silently change every token id.
GGUF_PRE_TOKENIZERS: Registry[Callable[[], pre_tokenizers.PreTokenizer]] = Registry(
    "GGUF pre-tokenizer (tokenizer.ggml.pre)"
)
for _name in ("default", "gpt2", "gpt-2", "mpt", "olmo", "jais"):
    GGUF_PRE_TOKENIZERS.register(_name, _byte_level)
for _name in ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"):
    GGUF_PRE_TOKENIZERS.register(_name, _digits_then_byte_level)
for _name in ("llama3", "llama-v3", "llama-bpe", "falcon3", "dbrx", "smaug-bpe", "pixtral"):
    GGUF_PRE_TOKENIZERS.register(_name, _split_then_bytes(_LLAMA3_SPLIT))
for _name in ("qwen2", "deepseek-r1-qwen", "stablelm2"):
    GGUF_PRE_TOKENIZERS.register(_name, _split_then_bytes(_QWEN2_SPLIT))


def _gpt2_byte_alphabet() -> dict[int, str]:
    """GPT-2's byte → printable character table (printable Latin-1 bytes map to themselves)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table = {byte: chr(byte) for byte in printable}
    extra = 0
    for byte in range(256):
        if byte not in table:
            table[byte] = chr(256 + extra)
            extra += 1
    return table


def _lookup(registry: Registry[T], name: str, source: str, key: str) -> T:
    """`registry[name]`, or a CheckpointError naming the metadata field and what is supported."""
    if name not in registry:
        raise CheckpointError(
            f"unsupported {key} {name!r}",
            where=f"{source}: {key}",
            expected=f"one of {registry.names()}",
        )
    return registry.get(name)


def _field(reader: gguf.GGUFReader, key: str, source: str, *, required: bool = True) -> Any:
    """The decoded value of metadata `key` (None if absent and not required)."""
    field = reader.fields.get(key)
    if field is None:
        if required:
            raise CheckpointError(
                f"missing tokenizer metadata field {key!r}",
                where=source,
                hint="the GGUF was written without a tokenizer; convert it again with llama.cpp",
            )
        return None
    return field.contents()


def _build_gpt2(meta: dict[str, Any], source: str) -> BackendTokenizer:
    """Byte-level BPE from `tokens` + `merges`, split by the `pre` pre-tokenizer."""
    alphabet = _gpt2_byte_alphabet()
    letters = set(alphabet.values())
    vocab: dict[str, int] = {}
    for token_id, (token, token_type) in enumerate(
        zip(meta["tokens"], meta["token_type"], strict=True)
    ):
        # Control / user-defined tokens stay verbatim so the added token maps to this id.
        if token_type not in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED) and not (
            set(token) <= letters
        ):
            token = "".join(alphabet[byte] for byte in token.encode("utf-8"))
        vocab.setdefault(token, token_id)
    merges = []
    for index, merge in enumerate(meta["merges"] or ()):
        parts = merge.split(" ")
        if len(parts) != 2:
            raise CheckpointError(
                "malformed merge",
                where=f"{source}: tokenizer.ggml.merges[{index}]",
                found=repr(merge),
                expected="'left right'",
            )
        merges.append((parts[0], parts[1]))
    backend = BackendTokenizer(models.BPE(vocab, merges, fuse_unk=False, byte_fallback=False))
    pre = meta["pre"] or "default"
    backend.pre_tokenizer = _lookup(GGUF_PRE_TOKENIZERS, pre, source, "tokenizer.ggml.pre")()
    backend.decoder = decoders.ByteLevel()
    return backend


# `general.architecture` values built like transformers' `gemma_tokenizer`: merges in vocabulary
# order, user-defined spaces spelled `▁` (see the module docstring).
GGUF_GEMMA_ARCHITECTURES = frozenset({"gemma", "gemma2", "gemma3"})


def _merges_from_scores(tokens: Sequence[str], scores: Sequence[float]) -> list[tuple[str, str]]:
    """SentencePiece BPE merges: every split of a piece into two pieces, best score first."""
    vocab = {token: index for index, token in enumerate(tokens)}
    candidates: list[tuple[float, str, str]] = []
    for piece, score in zip(tokens, scores, strict=True):
        local = [
            (piece[:cut], piece[cut:])
            for cut in range(1, len(piece))
            if piece[:cut] in vocab and piece[cut:] in vocab
        ]
        local.sort(key=lambda pair: (vocab[pair[0]], vocab[pair[1]]))
        candidates.extend((score, left, right) for left, right in local)
    candidates.sort(key=lambda c: (-c[0], -len(c[1]), -len(c[2])))
    return [(left, right) for _, left, right in candidates]


def _build_llama(meta: dict[str, Any], source: str) -> BackendTokenizer:
    """SentencePiece-style BPE: `▁` for spaces, `<0xNN>` byte fallback, merges from scores."""
    tokens, scores = meta["tokens"], meta["scores"]
    if scores is None or len(scores) != len(tokens):
        raise CheckpointError(
            "a 'llama' tokenizer needs one score per token",
            where=f"{source}: tokenizer.ggml.scores",
            found=None if scores is None else len(scores),
            expected=len(tokens),
        )
    if meta["architecture"] in GGUF_GEMMA_ARCHITECTURES:
        # Undo llama.cpp's "pre-normalize user-defined spaces" (`▁` → " "): BPE builds them.
        tokens = [
            token.replace(" ", "▁") if kind == TOKEN_TYPE_USER_DEFINED else token
            for token, kind in zip(tokens, meta["token_type"], strict=True)
        ]
        scores = [-float(token_id) for token_id in range(len(tokens))]
    vocab: dict[str, int] = {}
    for token_id, token in enumerate(tokens):
        vocab.setdefault(token, token_id)
    unk_id = meta["unk_id"]
    model = models.BPE(
        vocab,
        _merges_from_scores(tokens, scores),
        unk_token=tokens[unk_id] if unk_id is not None else None,
        fuse_unk=True,
        byte_fallback=True,
    )
    backend = BackendTokenizer(model)
    add_prefix = meta["add_space_prefix"] is not False  # llama.cpp default: True
    backend.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="▁", prepend_scheme="first" if add_prefix else "never", split=False
    )
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_prefix:
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    backend.decoder = decoders.Sequence(steps)
    return backend


# `tokenizer.ggml.model` → builder of the backend tokenizer.
GGUF_TOKENIZER_MODELS: Registry[Callable[[dict[str, Any], str], BackendTokenizer]] = Registry(
    "GGUF tokenizer model (tokenizer.ggml.model)"
)
GGUF_TOKENIZER_MODELS.register("gpt2", _build_gpt2)
GGUF_TOKENIZER_MODELS.register("llama", _build_llama)


class GGUFTokenizerParts(NamedTuple):
    """What a GGUF says about its tokenizer, ready for `infergen.io.tokenizer.Tokenizer`."""

    backend: BackendTokenizer
    vocab_size: int
    special_tokens: dict[str, str | None]  # bos_token, eos_token, unk_token, pad_token
    bos_token_id: int | None
    eos_token_ids: list[int]  # eos, then eot / eom if the file names them
    add_bos_token: bool
    chat_template: str | None


def read_gguf_tokenizer(reader: gguf.GGUFReader, source: str) -> GGUFTokenizerParts:
    """Read `tokenizer.*` metadata and build the backend tokenizer; `source` names the file."""
    model = _field(reader, "tokenizer.ggml.model", source)
    tokens = list(_field(reader, "tokenizer.ggml.tokens", source))
    kinds = _field(reader, "tokenizer.ggml.token_type", source, required=False)
    kinds = [TOKEN_TYPE_NORMAL] * len(tokens) if kinds is None else [int(k) for k in kinds]
    if len(kinds) != len(tokens):
        raise CheckpointError(
            "one token type per token expected",
            where=f"{source}: tokenizer.ggml.token_type",
            found=len(kinds),
            expected=len(tokens),
        )
    ids: dict[str, int | None] = {}
    for name in ("bos", "eos", "unknown", "padding", "eot", "eom"):
        value = _field(reader, f"tokenizer.ggml.{name}_token_id", source, required=False)
        if value is not None and not 0 <= int(value) < len(tokens):
            raise CheckpointError(
                "token id out of range",
                where=f"{source}: tokenizer.ggml.{name}_token_id",
                found=value,
                expected=f"0 <= id < {len(tokens)}",
            )
        ids[name] = None if value is None else int(value)
    meta = {
        "tokens": tokens,
        "token_type": kinds,
        "merges": _field(reader, "tokenizer.ggml.merges", source, required=False),
        "scores": _field(reader, "tokenizer.ggml.scores", source, required=False),
        "pre": _field(reader, "tokenizer.ggml.pre", source, required=False),
        "add_space_prefix": _field(
            reader, "tokenizer.ggml.add_space_prefix", source, required=False
        ),
        "unk_id": ids["unknown"],
        "architecture": _field(reader, "general.architecture", source, required=False),
    }
    build = _lookup(GGUF_TOKENIZER_MODELS, str(model), source, "tokenizer.ggml.model")
    backend = build(meta, source)
    special_ids = {i for i, kind in enumerate(kinds) if kind == TOKEN_TYPE_CONTROL}
    special_ids |= {i for i in (ids["bos"], ids["eos"]) if i is not None}
    backend.add_special_tokens(
        [AddedToken(tokens[i], special=True, normalized=False) for i in sorted(special_ids)]
    )
    backend.add_tokens(  # except those the builder respelled (not in its vocabulary)
        [
            AddedToken(tokens[i], special=False, normalized=False)
            for i, kind in enumerate(kinds)
            if kind == TOKEN_TYPE_USER_DEFINED and backend.token_to_id(tokens[i]) == i
        ]
    )
    add_bos = _field(reader, "tokenizer.ggml.add_bos_token", source, required=False)
    if add_bos is None:
        add_bos = model == "llama"  # llama.cpp's default for SentencePiece vocabularies
    names = {"bos_token": "bos", "eos_token": "eos", "unk_token": "unknown", "pad_token": "padding"}
    return GGUFTokenizerParts(
        backend=backend,
        vocab_size=len(tokens),
        special_tokens={
            key: None if ids[name] is None else tokens[ids[name]] for key, name in names.items()
        },
        bos_token_id=ids["bos"],
        eos_token_ids=[i for i in (ids["eos"], ids["eot"], ids["eom"]) if i is not None],
        add_bos_token=bool(add_bos),
        chat_template=_field(reader, "tokenizer.chat_template", source, required=False),
    )
