"""`SamplingParams`: how one request picks its next token and when it stops (vLLM semantics).

A frozen dataclass validated on construction: every bad value raises `RequestError` naming the
field, the value found and the allowed range. `stop` accepts a string or a list of strings and
is normalised to a tuple; `stop_token_ids` likewise.

Semantics (applied by `infergen.engine.sampler` and `infergen.engine.stopping`):

- `temperature` 0 means greedy (argmax). As in vLLM, any temperature below `GREEDY_EPS`
  (1e-5) is treated as greedy, and greedy decoding ignores `top_k` / `top_p` / `min_p` / `seed`
  (they cannot change the argmax).
- `top_k` 0 or -1 = off. `top_p` = 1 off. `min_p` = 0 off.
- `repetition_penalty` (HF/CTRL rule) applies to every token seen in the prompt or the output:
  logit > 0 -> logit / p, else logit * p.
- `presence_penalty`, `frequency_penalty` (OpenAI rule) apply over the output tokens only:
  logit -= frequency_penalty * count + presence_penalty * (count > 0).
- `logprobs` None = none; k >= 0 returns the chosen token's logprob and the top-k alternatives
  (k <= `MAX_LOGPROBS`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from infergen.errors import RequestError

GREEDY_EPS = 1e-5  # temperatures below this are greedy (vLLM's _SAMPLING_EPS)
MAX_LOGPROBS = 20  # most top-k alternatives a request may ask for (the OpenAI API's limit)


def _fail(field: str, value: object, expected: str) -> RequestError:
    return RequestError(
        f"invalid sampling parameter {field}={value!r}",
        where=f"sampling_params.{field}",
        found=repr(value),
        expected=expected,
    )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(
        value
    )


@dataclass(frozen=True)
class SamplingParams:
    """Sampling and stopping parameters of one request. See the module docstring for rules."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # this request's KV press (engine/kv_press.py): a PRESSES row and the share of its prompt's
    # tokens removed; None: the engine's kv_press / kv_press_ratio
    kv_press: str | None = None
    kv_press_ratio: float | None = None

    def __post_init__(self) -> None:
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise _fail("max_tokens", self.max_tokens, "an integer >= 1")
        self._check_float("temperature", lambda v: v >= 0, "a finite number >= 0 (0 = greedy)")
        if not _is_int(self.top_k) or self.top_k < -1:
            raise _fail("top_k", self.top_k, "an integer >= 1, or 0 / -1 to disable top-k")
        self._check_float("top_p", lambda v: 0 < v <= 1, "a number in (0, 1]")
        self._check_float("min_p", lambda v: 0 <= v <= 1, "a number in [0, 1]")
        self._check_float("repetition_penalty", lambda v: v > 0, "a finite number > 0")
        self._check_float("presence_penalty", lambda v: -2 <= v <= 2, "a number in [-2, 2]")
        self._check_float("frequency_penalty", lambda v: -2 <= v <= 2, "a number in [-2, 2]")
        if self.seed is not None and not _is_int(self.seed):
            raise _fail("seed", self.seed, "an integer or None")
        self._normalise_stop()
        self._normalise_stop_token_ids()
        for name in ("ignore_eos", "skip_special_tokens", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                raise _fail(name, getattr(self, name), "a bool")
        if self.logprobs is not None and (
            not _is_int(self.logprobs) or not 0 <= self.logprobs <= MAX_LOGPROBS
        ):
            raise _fail("logprobs", self.logprobs, f"None or an integer in [0, {MAX_LOGPROBS}]")
        if self.kv_press is not None and not isinstance(self.kv_press, str):
            raise _fail("kv_press", self.kv_press, "None or a KV press's name, e.g. 'snapkv'")
        if self.kv_press_ratio is not None:
            self._check_float("kv_press_ratio", lambda v: 0 <= v < 1, "None or a number in [0, 1)")

    def _check_float(self, name: str, in_range, expected: str) -> None:
        value = getattr(self, name)
        if not _is_number(value) or not in_range(value):
            raise _fail(name, value, expected)
        object.__setattr__(self, name, float(value))

    def _normalise_stop(self) -> None:
        stop = self.stop
        if isinstance(stop, str):
            stop = (stop,)
        if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
            raise _fail("stop", self.stop, "a non-empty string or a list of non-empty strings")
        object.__setattr__(self, "stop", tuple(stop))

    def _normalise_stop_token_ids(self) -> None:
        ids = self.stop_token_ids
        if not isinstance(ids, (list, tuple)) or not all(_is_int(t) and t >= 0 for t in ids):
            raise _fail("stop_token_ids", ids, "a list of integer token ids >= 0")
        object.__setattr__(self, "stop_token_ids", tuple(ids))

    @property
    def is_greedy(self) -> bool:
        """True when the next token is the argmax (temperature below `GREEDY_EPS`)."""
        return self.temperature < GREEDY_EPS

    @property
    def has_penalties(self) -> bool:
        """True when any of the repetition / presence / frequency penalties is active."""
        return (
            self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )

    @property
    def top_k_enabled(self) -> bool:
        """True when top-k truncation is on (top_k >= 1; 0 and -1 mean off)."""
        return self.top_k >= 1
