"""Stop conditions of one sequence: EOS, stop token ids, stop strings, max_tokens.

The engine calls `StopChecker.check` once per generated token, after the token's text has
been appended to the sequence's detokenized output. Checks, first match wins:

1. EOS (any of the model's eos ids; skipped when `ignore_eos`)  -> "stop"
2. a token in `stop_token_ids`                                  -> "stop"
3. a stop string completed by this token's text                  -> "stop"
4. `num_output_tokens >= max_tokens`                             -> "length"

Text kept (as vLLM): on an EOS / stop token the token's own text (the last `new_text_len`
characters) is dropped unless `include_stop_str_in_output`. On a stop string the text is cut
before the stop string, or right after it with `include_stop_str_in_output`. When several stop
strings match in the new text, the one that completes first wins (ties: the longest), which is
what character-by-character generation would have stopped at — so the result does not depend
on how the text was split into tokens.

Streaming: a streamer must hold back the last `max_stop_len` characters of unfinished text,
since they may turn out to be the start of a stop string that is then removed.
"""

from __future__ import annotations

from collections.abc import Sequence

from infergen.engine.sampling_params import SamplingParams

FINISH_STOP = "stop"
FINISH_LENGTH = "length"


class StopChecker:
    """Checks one sequence's stop conditions; see the module docstring for the rules.

    Args:
        params: the request's sampling parameters.
        eos_token_ids: the model's end-of-sequence token ids (from the tokenizer/config).
    """

    def __init__(self, params: SamplingParams, eos_token_ids: Sequence[int]) -> None:
        self.params = params
        self._eos_token_ids = frozenset() if params.ignore_eos else frozenset(eos_token_ids)
        self._stop_token_ids = frozenset(params.stop_token_ids)
        self._longest_stop = max((len(s) for s in params.stop), default=0)

    @property
    def max_stop_len(self) -> int:
        """Trailing characters a streamer must hold back so it never sends text that a stop
        string later removes: longest stop string - 1 (0 with no stop strings, or with
        `include_stop_str_in_output`, where matched text is kept)."""
        if self.params.include_stop_str_in_output or not self._longest_stop:
            return 0
        return self._longest_stop - 1

    def check(
        self, token_id: int, num_output_tokens: int, text: str, new_text_len: int
    ) -> tuple[str | None, str]:
        """Check whether the sequence stops at this token.

        Args:
            token_id: the token just generated.
            num_output_tokens: output tokens so far, this one included.
            text: the detokenized output so far, this token's text included.
            new_text_len: how many trailing characters of `text` this token added.
        Returns:
            (finish_reason, text to keep): finish_reason is "stop", "length" or None (then the
            text is returned unchanged).
        """
        include = self.params.include_stop_str_in_output
        if token_id in self._eos_token_ids or token_id in self._stop_token_ids:
            return FINISH_STOP, text if include else text[: len(text) - new_text_len]
        if self._longest_stop and new_text_len > 0:
            match = self._find_stop_string(text, new_text_len)
            if match is not None:
                start, end = match
                return FINISH_STOP, text[:end] if include else text[:start]
        if num_output_tokens >= self.params.max_tokens:
            return FINISH_LENGTH, text
        return None, text

    def _find_stop_string(self, text: str, new_text_len: int) -> tuple[int, int] | None:
        """(start, end) of the stop string that completes first within the new text."""
        best: tuple[int, int] | None = None
        new_start = len(text) - new_text_len
        for stop in self.params.stop:
            # only a match ending inside the new text is new: start at most len(stop)-1 earlier
            start = text.find(stop, max(0, new_start - len(stop) + 1))
            if start < 0:
                continue
            end = start + len(stop)
            if best is None or (end, start) < (best[1], best[0]):
                best = (start, end)
        return best
