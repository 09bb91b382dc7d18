"""Passkey retrieval (as in Mohtashami & Jaggi, 2023): a five-digit key hidden at some depth
in repetitive filler text of a given length, then asked for. A scheme that damages long-range
attention (KV cache formats above all) loses the key before perplexity shows it.

Each sample: a fresh key and a depth spread evenly over (0, 1); greedy decoding of a few
tokens; correct when the key's digits appear in the answer.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from infergen.engine.sampling_params import SamplingParams

INTRO = (
    "There is an important piece of information hidden inside a lot of irrelevant text. "
    "Find it and memorize it. I will quiz you about it.\n"
)
FILLER = (
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
)
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key. "
QUESTION = "\nWhat is the pass key? The pass key is"
LENGTHS = (1024, 2048, 4096, 7168)  # prompt tokens


def passkey_prompt(tokenizer, length: int, depth: float, key: int) -> list[int]:
    """About `length` tokens: intro, filler with the needle at `depth` (0..1), question."""
    encode = tokenizer.encode
    fixed = len(encode(INTRO)) + len(encode(NEEDLE.format(key=key))) + len(encode(QUESTION))
    filler_tokens = len(encode(FILLER))
    repeats = max(1, (length - fixed) // filler_tokens)
    before = round(repeats * depth)
    text = INTRO + FILLER * before + NEEDLE.format(key=key) + FILLER * (repeats - before) + QUESTION
    return encode(text)


def passkey_accuracy(
    llm, lengths: Sequence[int] = LENGTHS, samples: int = 3, seed: int = 0
) -> dict[int, float]:
    """Fraction of samples whose key the model repeats, per prompt length."""
    if llm.tokenizer is None:
        raise ValueError("passkey retrieval needs a checkpoint with a tokenizer")
    rng = random.Random(seed)
    params = SamplingParams(max_tokens=8, temperature=0.0)
    result = {}
    for length in lengths:
        keys = [rng.randrange(10000, 100000) for _ in range(samples)]
        prompts = [
            passkey_prompt(llm.tokenizer, length, (i + 0.5) / samples, key)
            for i, key in enumerate(keys)
        ]
        outputs = llm.generate(prompts, params)
        hits = sum(str(key) in out.text for key, out in zip(keys, outputs, strict=True))
        result[length] = hits / samples
    return result
