"""Chat templates: render a list of messages into the prompt text a chat model was trained on.

A chat template is a Jinja2 program shipped with the checkpoint (`tokenizer.chat_template` in a
GGUF, `chat_template` in `tokenizer_config.json` or a `chat_template.jinja` file in a Hugging
Face directory). Templates come from the internet, so they run in Jinja's immutable sandbox.
The environment matches the one Hugging Face transformers renders with, so the same template
gives the same text:

- `trim_blocks=True`, `lstrip_blocks=True`, the `loopcontrols` extension;
- globals `raise_exception(message)` and `strftime_now(format)`;
- a `tojson` filter that does not HTML-escape (`ensure_ascii=False` by default);
- variables `messages`, `add_generation_prompt`, `tools`, `documents`, the special-token
  strings (`bos_token`, `eos_token`, `unk_token`, `pad_token`) and any extra keyword.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from infergen.errors import CheckpointError, RequestError


class ChatTemplateError(RequestError):
    """The chat template rejected the conversation (`raise_exception`, an undefined value)."""


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class ChatTemplate:
    """A compiled chat template.

    Args:
        source: the Jinja2 template text.
        where: where the template came from (file or metadata key), for error messages.

    Raises:
        CheckpointError: the template is not valid Jinja2.
    """

    def __init__(self, source: str, *, where: str) -> None:
        self.source = source
        self.where = where
        try:
            self._template = _environment().from_string(source)
        except jinja2.exceptions.TemplateSyntaxError as error:
            raise CheckpointError(
                f"chat template does not compile: {error.message} (line {error.lineno})",
                where=where,
            ) from None

    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        special_tokens: dict[str, str | None] | None = None,
        **kwargs: Any,
    ) -> str:
        """Render `messages` (dicts with at least `role` and `content`) to prompt text.

        `special_tokens` (e.g. `{"bos_token": "<s>"}`) become template variables; `kwargs`
        override them and are passed through (e.g. `tools=[...]`, `enable_thinking=False`).
        """
        for index, message in enumerate(messages):
            if not isinstance(message, dict):
                raise RequestError(
                    "a chat message must be a dict",
                    where=f"messages[{index}]",
                    found=type(message).__name__,
                    expected="{'role': ..., 'content': ...}",
                )
        # Like transformers: keys whose value is None are dropped, so `is defined` checks work.
        plain = [{key: value for key, value in m.items() if value is not None} for m in messages]
        variables: dict[str, Any] = {"tools": None, "documents": None}
        variables.update(special_tokens or {})
        variables.update(kwargs)
        try:
            return self._template.render(
                messages=plain, add_generation_prompt=add_generation_prompt, **variables
            )
        except jinja2.exceptions.TemplateError as error:
            raise ChatTemplateError(
                f"chat template rejected the conversation: {error}", where=self.where
            ) from None
