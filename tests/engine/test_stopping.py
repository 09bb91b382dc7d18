"""StopChecker: eos, ignore_eos, stop token ids, stop strings (across tokens), max_tokens."""

from __future__ import annotations

from infergen.engine.sampling_params import SamplingParams
from infergen.engine.stopping import StopChecker

EOS = 2


def run(checker: StopChecker, pieces: list[tuple[int, str]]) -> tuple[str | None, str, int]:
    """Feed (token_id, token_text) pieces until a stop; return (reason, kept text, tokens)."""
    text = ""
    for n, (token_id, piece) in enumerate(pieces, start=1):
        text += piece
        reason, text = checker.check(token_id, n, text, len(piece))
        if reason is not None:
            return reason, text, n
    return None, text, len(pieces)


def test_eos_stops_and_drops_its_text():
    checker = StopChecker(SamplingParams(max_tokens=100), [EOS])
    assert run(checker, [(5, "Hi"), (6, " there"), (EOS, "</s>"), (7, "x")]) == (
        "stop",
        "Hi there",
        3,
    )


def test_eos_text_kept_with_include_stop_str():
    params = SamplingParams(max_tokens=100, include_stop_str_in_output=True)
    assert run(StopChecker(params, [EOS]), [(5, "Hi"), (EOS, "</s>")]) == ("stop", "Hi</s>", 2)


def test_any_of_several_eos_ids():
    checker = StopChecker(SamplingParams(), [EOS, 99])
    assert checker.check(99, 1, "a", 1)[0] == "stop"
    assert checker.check(3, 1, "a", 1) == (None, "a")


def test_ignore_eos_runs_to_max_tokens():
    checker = StopChecker(SamplingParams(max_tokens=3, ignore_eos=True), [EOS])
    assert run(checker, [(5, "a"), (EOS, "</s>"), (6, "b"), (7, "c")]) == ("length", "a</s>b", 3)


def test_stop_token_ids():
    checker = StopChecker(SamplingParams(stop_token_ids=[42], ignore_eos=True), [EOS])
    assert run(checker, [(5, "a"), (42, "<|end|>"), (6, "b")]) == ("stop", "a", 2)


def test_max_tokens_gives_length():
    checker = StopChecker(SamplingParams(max_tokens=2), [EOS])
    assert run(checker, [(5, "a"), (6, "b"), (7, "c")]) == ("length", "ab", 2)


def test_stop_string_spanning_two_tokens():
    checker = StopChecker(SamplingParams(stop=["###"]), [EOS])
    pieces = [(5, "Answer: 4"), (6, " #"), (7, "##"), (8, " more")]
    assert run(checker, pieces) == ("stop", "Answer: 4 ", 3)


def test_stop_string_include_in_output_cuts_after_it():
    params = SamplingParams(stop=["###"], include_stop_str_in_output=True)
    pieces = [(5, "Answer: 4"), (6, " #"), (7, "##tail"), (8, " more")]
    assert run(StopChecker(params, [EOS]), pieces) == ("stop", "Answer: 4 ###", 3)


def test_stop_string_inside_one_token_drops_rest_of_token():
    checker = StopChecker(SamplingParams(stop="\n\n"), [EOS])
    assert run(checker, [(5, "line"), (6, ".\n\nnext")]) == ("stop", "line.", 2)


def test_first_completed_stop_string_wins():
    # "bc" completes before "abcd" when generating character by character
    checker = StopChecker(SamplingParams(stop=["abcd", "bc"]), [EOS])
    assert run(checker, [(5, "x"), (6, "abcd")]) == ("stop", "xa", 2)


def test_stop_string_before_new_tail_is_not_rematched():
    # the window only looks at text that this token could have completed
    checker = StopChecker(SamplingParams(stop=["ab"]), [EOS])
    assert checker.check(5, 3, "ab-cd", 2) == (None, "ab-cd")


def test_stop_string_beats_length_on_the_same_token():
    checker = StopChecker(SamplingParams(max_tokens=2, stop=["END"]), [EOS])
    assert run(checker, [(5, "ok E"), (6, "ND")]) == ("stop", "ok ", 2)


def test_max_stop_len_hold_back():
    assert StopChecker(SamplingParams(), [EOS]).max_stop_len == 0
    assert StopChecker(SamplingParams(stop=["a", "xyz1"]), [EOS]).max_stop_len == 3
    params = SamplingParams(stop=["xyz1"], include_stop_str_in_output=True)
    assert StopChecker(params, [EOS]).max_stop_len == 0


def test_streamer_holding_back_never_sends_removed_text():
    params = SamplingParams(stop=["<END>"], max_tokens=50)
    checker = StopChecker(params, [EOS])
    pieces = [(5, "abc<"), (6, "E"), (7, "N"), (8, "D>zz")]
    text, sent = "", ""
    for n, (token_id, piece) in enumerate(pieces, start=1):
        text += piece
        reason, text = checker.check(token_id, n, text, len(piece))
        if reason is not None:
            break
        safe = text[: len(text) - checker.max_stop_len]
        sent += safe[len(sent) :]
    assert reason == "stop" and text == "abc"
    assert text.startswith(sent)
