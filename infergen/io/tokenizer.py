"""Tokenizers for real checkpoints: text ⇄ token ids, chat templates, streaming detokenization.

`Tokenizer` wraps a Hugging Face `tokenizers.Tokenizer` (Rust) built either from a GGUF file's
`tokenizer.ggml.*` metadata (see `infergen.io.gguf_tokenizer`) or from a Hugging Face directory
(`tokenizer.json`, `tokenizer_config.json`, `chat_template.jinja`, `generation_config.json`).
`IncrementalDetokenizer` turns a stream of generated ids into text deltas without ever emitting
half a UTF-8 character.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tokenizers import Tokenizer as BackendTokenizer

from infergen.errors import CheckpointError, RequestError
from infergen.io.chat_template import ChatTemplate
from infergen.io.gguf_tokenizer import read_gguf_tokenizer

if TYPE_CHECKING:
    import gguf

# Special tokens that end an assistant turn in common chat formats (the list llama.cpp uses to
# find end-of-generation tokens). Those present as special tokens join `eos_token_ids`.
END_OF_TURN_TOKENS = (
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|return|>",
    "<EOT>",
    "<｜end▁of▁sentence｜>",
)


def _read_json(path: pathlib.Path, *, required: bool) -> dict[str, Any] | None:
    if not path.is_file():
        if required:
            raise CheckpointError("file is missing", where=str(path))
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"cannot read JSON: {error}", where=str(path)) from None
    if not isinstance(data, dict):
        raise CheckpointError("expected a JSON object", where=str(path), found=type(data).__name__)
    return data


def _token_content(value: Any) -> str | None:
    """A special token as `tokenizer_config.json` spells it: a string or `{"content": ...}`."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _hf_chat_template(path: pathlib.Path, config: dict[str, Any]) -> str | None:
    """The chat template: `chat_template.jinja`, else `tokenizer_config.json`, else
    `chat_template.json` (a list of named templates → the one named "default")."""
    jinja_file = path / "chat_template.jinja"
    if jinja_file.is_file():
        try:
            return jinja_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise CheckpointError(f"cannot read: {error}", where=str(jinja_file)) from None
    template = config.get("chat_template")
    if template is None and (path / "chat_template.json").is_file():
        template = (_read_json(path / "chat_template.json", required=True) or {}).get(
            "chat_template"
        )
    if isinstance(template, list):  # [{"name": "default", "template": ...}, {"name": "tool_use"...
        named = {entry.get("name"): entry.get("template") for entry in template}
        template = named.get("default")
    return template if isinstance(template, str) else None


class Tokenizer:
    """Text ⇄ token ids for one model, plus its chat template.

    Attributes:
        vocab_size: number of token ids the tokenizer knows (ids are `0 .. vocab_size-1`).
        bos_token_id: the beginning-of-sequence id, or None.
        eos_token_ids: every id that ends generation: the eos token first, then end-of-turn
            special tokens of the vocabulary (`END_OF_TURN_TOKENS`) and ids the checkpoint
            names (`tokenizer.ggml.eot_token_id`, `generation_config.json` `eos_token_id`).
        add_bos_token: whether `encode(..., add_special_tokens=True)` prepends BOS.
        chat_template: the Jinja2 chat template text, or None.
    """

    def __init__(
        self,
        backend: BackendTokenizer,
        *,
        vocab_size: int,
        special_tokens: dict[str, str | None],
        bos_token_id: int | None,
        eos_token_ids: Sequence[int],
        add_bos_token: bool,
        chat_template: str | None,
        source: str,
    ) -> None:
        """Use `from_gguf` / `from_hf_dir`; `eos_token_ids` are the ids the checkpoint names,
        end-of-turn special tokens of the vocabulary are added here."""
        self._backend = backend
        self.source = source
        self.vocab_size = vocab_size
        self.special_tokens = special_tokens
        added = backend.get_added_tokens_decoder()
        self._special_ids = frozenset(i for i, token in added.items() if token.special)
        if not eos_token_ids:
            raise CheckpointError(
                "the tokenizer names no end-of-sequence token",
                where=source,
                expected="tokenizer.ggml.eos_token_id (GGUF) or eos_token in tokenizer_config.json",
            )
        turn_ends = (backend.token_to_id(token) for token in END_OF_TURN_TOKENS)
        candidates = [*eos_token_ids, *(i for i in turn_ends if i in self._special_ids)]
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(candidates))
        self.bos_token_id = bos_token_id
        self.add_bos_token = add_bos_token and bos_token_id is not None
        self.chat_template = chat_template
        self._compiled_template: ChatTemplate | None = None

    def save(self, directory: pathlib.Path | str) -> None:
        """Write `tokenizer.json` and `tokenizer_config.json` (what `from_hf_dir` reads)."""
        import json

        directory = pathlib.Path(directory)
        self._backend.save(str(directory / "tokenizer.json"))
        config = {name: token for name, token in self.special_tokens.items() if token is not None}
        config.update(add_bos_token=self.add_bos_token, chat_template=self.chat_template)
        (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
        eos = list(self.eos_token_ids)
        (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))

    @classmethod
    def from_gguf(cls, reader: gguf.GGUFReader, source: str) -> Tokenizer:
        """Build from a GGUF file's `tokenizer.*` metadata; `source` names the file in errors."""
        parts = read_gguf_tokenizer(reader, source)
        return cls(
            parts.backend,
            vocab_size=parts.vocab_size,
            special_tokens=parts.special_tokens,
            bos_token_id=parts.bos_token_id,
            eos_token_ids=parts.eos_token_ids,
            add_bos_token=parts.add_bos_token,
            chat_template=parts.chat_template,
            source=source,
        )

    @classmethod
    def from_hf_dir(cls, path: pathlib.Path | str) -> Tokenizer:
        """Build from a Hugging Face directory (`tokenizer.json` + `tokenizer_config.json`)."""
        path = pathlib.Path(path)
        tokenizer_file = path / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise CheckpointError("file is missing", where=str(tokenizer_file))
        try:
            backend = BackendTokenizer.from_file(str(tokenizer_file))
        except Exception as error:  # the Rust loader raises a bare Exception
            raise CheckpointError(
                f"not a valid tokenizers file: {error}", where=str(tokenizer_file)
            ) from None
        config = _read_json(path / "tokenizer_config.json", required=True) or {}
        special = {
            name: _token_content(config.get(name))
            for name in ("bos_token", "eos_token", "unk_token", "pad_token")
        }
        generation = _read_json(path / "generation_config.json", required=False) or {}
        extra_eos = generation.get("eos_token_id")
        extra_eos = [extra_eos] if isinstance(extra_eos, int) else list(extra_eos or [])
        ids = {}
        for name in ("bos_token", "eos_token"):
            token = special[name]
            ids[name] = None if token is None else backend.token_to_id(token)
            if token is not None and ids[name] is None:
                raise CheckpointError(
                    f"{name} is not in the vocabulary of tokenizer.json",
                    where=str(path / "tokenizer_config.json"),
                    found=repr(token),
                )
        add_bos = config.get("add_bos_token")
        if add_bos is None:  # not stated: follow tokenizer.json's post-processor
            add_bos = ids["bos_token"] is not None and backend.encode("").ids[:1] == [
                ids["bos_token"]
            ]
        eos_ids = [i for i in (ids["eos_token"], *extra_eos) if isinstance(i, int)]
        return cls(
            backend,
            vocab_size=backend.get_vocab_size(with_added_tokens=True),
            special_tokens=special,
            bos_token_id=ids["bos_token"],
            eos_token_ids=eos_ids,
            add_bos_token=bool(add_bos),
            chat_template=_hf_chat_template(path, config),
            source=str(path),
        )

    def save_hf(self, directory: pathlib.Path | str) -> pathlib.Path:
        """Write `tokenizer.json` and `tokenizer_config.json` into `directory`, so Hugging Face
        tools (transformers' AutoTokenizer, load generators) read this tokenizer, GGUF ones
        included. Returns the directory."""
        out = pathlib.Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        self._backend.save(str(out / "tokenizer.json"))
        token = self._backend.id_to_token
        config: dict[str, Any] = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": token(self.bos_token_id) if self.bos_token_id is not None else None,
            "eos_token": token(self.eos_token_ids[0]),
            "add_bos_token": self.add_bos_token,
            "chat_template": self.chat_template,
        }
        (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
        return out

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; BOS is prepended iff `add_bos_token and add_special_tokens`.

        Special tokens written in the text (e.g. `<|im_start|>`) map to their ids. Characters
        whose bytes have no token in a byte-level vocabulary are dropped, as in transformers
        (SmolLM2 lacks e.g. the bytes 0x04, 0x06, 0x13, 0x14, 0x16, 0x1D).
        """
        ids = self._backend.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self.add_bos_token:
            return [self.bos_token_id, *ids]  # type: ignore[list-item]
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids`; special tokens are dropped when `skip_special_tokens`."""
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def is_special(self, token_id: int) -> bool:
        """True for control tokens (`<|im_start|>`, eos...), which decode drops by default."""
        return token_id in self._special_ids

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        """Render a conversation to prompt text with the checkpoint's chat template.

        Encode the result with `encode(text, add_special_tokens=False)` when the template
        writes the BOS token itself.
        """
        if self.chat_template is None:
            raise RequestError(
                "this model has no chat template; send plain text (a completion request) instead",
                where=self.source,
            )
        if self._compiled_template is None:
            self._compiled_template = ChatTemplate(self.chat_template, where=self.source)
        return self._compiled_template.render(
            messages,
            add_generation_prompt=add_generation_prompt,
            special_tokens=self.special_tokens,
            **kwargs,
        )


class IncrementalDetokenizer:
    """Streaming detokenization: push token ids one at a time, get the new text delta.

    Text is decoded over a small window (from the last point where the text was complete) so
    each push costs O(window), not O(sequence). A delta ending in U+FFFD means a UTF-8
    character is split across tokens: it is held back until a later token completes it.
    `"".join(deltas) + flush()` equals `tokenizer.decode(all_ids)`.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._ids: list[int] = []
        self._prefix_offset = 0  # window start: text before it is final
        self._read_offset = 0  # ids before this have been emitted
        self._parts: list[str] = []

    def _delta(self, *, final: bool) -> str:
        decode = self._tokenizer.decode
        window = decode(self._ids[self._prefix_offset :], self._skip_special_tokens)
        emitted = decode(
            self._ids[self._prefix_offset : self._read_offset], self._skip_special_tokens
        )
        if len(window) <= len(emitted) or (window.endswith("\ufffd") and not final):
            return ""
        delta = window[len(emitted) :]
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        self._parts.append(delta)
        return delta

    def push(self, token_id: int) -> str:
        """Add one generated id; return the text it completes (possibly "")."""
        self._ids.append(token_id)
        return self._delta(final=False)

    def flush(self) -> str:
        """At the end of the stream: return held-back text (an incomplete character → U+FFFD)."""
        return self._delta(final=True)

    @property
    def token_ids(self) -> list[int]:
        """All ids pushed so far."""
        return list(self._ids)

    @property
    def text(self) -> str:
        """All text emitted so far."""
        return "".join(self._parts)
