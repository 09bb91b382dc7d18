"""Synthetic long-context tasks for KV presses (issue 25): a fact hidden in filler text of a
given length, asked for, answered greedily; correct when the answer's digits appear in the
first tokens generated. Built in the project from fixed sentences (no dataset download):

- `passkey`: one five-digit key at a depth, the question after the text (Mohtashami & Jaggi).
- `passkey_first`: the same, the question before the text (only "The pass key is" after it:
  a query-aware press's observation window then holds filler, not the question).
- `multikey`: four keys, each for a named door, at spread depths; one door is asked for.
- `chain`: variable tracking over two hops — "VAR A = 51423", later "VAR B = A"; asked for
  B's value (the model must follow B → A → the number).

Each sample: a fresh key and a depth spread evenly over (0, 1); `LongContextTask.prompt`
returns (tokens, answer). `score` runs every task at every length on one engine.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from infergen.engine.sampling_params import SamplingParams
from infergen.eval.passkey import FILLER, INTRO, NEEDLE, QUESTION
from infergen.registry import Registry

DOORS = ("red", "blue", "green", "yellow")
ANSWER_TOKENS = 10


@dataclass(frozen=True)
class LongContextTask:
    """A task row: `build(rng, depth)` → (head, needles [(depth, text)], tail, answer)."""

    name: str
    description: str
    build: Callable[[random.Random, float], tuple[str, list[tuple[float, str]], str, str]]

    def prompt(self, tokenizer, length: int, depth: float, rng: random.Random):
        """(prompt tokens, about `length` of them; the answer's text)."""
        head, needles, tail, answer = self.build(rng, depth)
        encode = tokenizer.encode
        fixed = len(encode(head + "".join(text for _, text in needles) + tail))
        repeats = max(len(needles) + 1, (length - fixed) // len(encode(FILLER)))
        parts, placed = [head], 0
        for at, text in sorted(needles):
            before = round(repeats * at)
            parts.append(FILLER * (before - placed) + text)
            placed = before
        parts.append(FILLER * (repeats - placed) + tail)
        return encode("".join(parts)), answer


TASKS: Registry[LongContextTask] = Registry("long-context task")


def _key(rng: random.Random) -> int:
    return rng.randrange(10000, 100000)


def _passkey(rng, depth):
    key = _key(rng)
    return INTRO, [(depth, NEEDLE.format(key=key))], QUESTION, str(key)


def _passkey_first(rng, depth):
    key = _key(rng)
    head = INTRO + "Question: what is the pass key? Read the text below.\n"
    return head, [(depth, NEEDLE.format(key=key))], "\nThe pass key is", str(key)


def _multikey(rng, depth):
    keys = [_key(rng) for _ in DOORS]
    asked = rng.randrange(len(DOORS))
    needles = [((depth + i / len(DOORS)) % 1.0,
                f"The pass key of the {door} door is {key}. Remember it. ")
               for i, (door, key) in enumerate(zip(DOORS, keys, strict=True))]  # fmt: skip
    tail = f"\nWhat is the pass key of the {DOORS[asked]} door? The pass key of the " \
        f"{DOORS[asked]} door is"  # fmt: skip
    return INTRO, needles, tail, str(keys[asked])


def _chain(rng, depth):
    key = _key(rng)
    first, second = depth * 0.5, 0.5 + depth * 0.5
    needles = [(first, f"VAR A = {key}. "), (second, "VAR B = A. ")]
    return INTRO, needles, "\nWhat is the value of VAR B? VAR B =", str(key)


for _row in (
    LongContextTask("passkey", "one key, the question after the text", _passkey),
    LongContextTask("passkey_first", "one key, the question before the text", _passkey_first),
    LongContextTask("multikey", "four keys for named doors, one asked for", _multikey),
    LongContextTask("chain", "variable tracking: B = A = the key, asked for B", _chain),
):
    TASKS.register(_row.name, _row)


def score(
    llm, tasks: Sequence[str], lengths: Sequence[int], samples: int = 3, seed: int = 0
) -> dict[str, dict[int, float]]:
    """Accuracy per task and prompt length: the share of `samples` prompts (depths spread
    over (0, 1)) whose answer appears in the greedy output."""
    if llm.tokenizer is None:
        raise ValueError("long-context tasks need a checkpoint with a tokenizer")
    params = SamplingParams(max_tokens=ANSWER_TOKENS, temperature=0.0)
    result: dict[str, dict[int, float]] = {}
    for name in tasks:
        task = TASKS.get(name, where="long-context task")
        rng = random.Random(seed)
        result[name] = {}
        for length in lengths:
            built = [task.prompt(llm.tokenizer, length, (i + 0.5) / samples, rng)
                     for i in range(samples)]  # fmt: skip
            outputs = llm.generate([tokens for tokens, _ in built], params)
            hits = sum(answer in out.text for (_, answer), out in zip(built, outputs,
                                                                       strict=True))  # fmt: skip
            result[name][length] = hits / samples
    return result
