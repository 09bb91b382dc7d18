"""Static KV scales for a KV format (kv_format.py): one fp32 scale per (layer, K/V, KV head).

The engine runs the model once, teacher-forced, over calibration text — `CALIBRATION_TOKENS`
tokens from the start of the shipped corpus (evaluation text comes from its end) — with a
scratch cache in the engine dtype, and takes each head's largest |K| and |V| over every
position and channel: scale = amax / the format's largest code, so nothing the model produced
on that text saturates. A model without a tokenizer is calibrated on a fixed pseudo-random
token sequence.
"""

from __future__ import annotations

import pathlib
import random
from collections.abc import Callable

import torch

from infergen.kvcache.kv_format import kv_format_of
from infergen.kvcache.paged_cache import PagedKVCache

CALIBRATION_TOKENS = 512
CALIBRATION_TEXT = "shakespeare.txt"


def calibration_tokens(
    tokenizer, vocab_size: int, count: int = CALIBRATION_TOKENS, text: str | None = None
) -> list[int]:
    """`count` tokens from the start of `text` (a file; default: the shipped corpus); a text
    too short for `count` tokens is repeated."""
    path = (
        pathlib.Path(text)
        if text
        else pathlib.Path(__file__).resolve().parents[2] / "data" / CALIBRATION_TEXT
    )
    if tokenizer is not None and path.is_file():
        tokens = tokenizer.encode(path.read_text()[: count * 8])
        if tokens and text and len(tokens) < count:
            tokens = tokens * (count // len(tokens) + 1)
        if len(tokens) >= count:
            return tokens[:count]
    rng = random.Random(0)
    return [rng.randrange(vocab_size) for _ in range(count)]


def calibrate_kv_scales(
    run: Callable[[list[int]], PagedKVCache],
    tokenizer,
    vocab_size: int,
    max_model_len: int,
    kv_format: str,
    smooth_keys: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(scales [layers, 2, kv_heads], key shift [layers, kv_heads, head_dim]) for `kv_format`:
    the shift is each key channel's mean over the calibration text, the scales the largest
    |K − shift| and |V| of each head over the format's largest code (`smooth_keys=False`: no
    shift). `run(tokens)` runs the model on the tokens and returns the engine-dtype cache
    holding their K / V (engine/scoring.py: scratch_runner).

    With several cache groups (sliding-window and full layers), the j-th layers of the groups
    share a page slot (storage[j], each group in blocks of its own): their statistics are
    taken together, and each layer gets its slot's — the largest of those layers' ranges, so
    none saturates (recurrent layers, which have no slot, get the first slot's: unused)."""
    fmt = kv_format_of(kv_format)
    count = min(CALIBRATION_TOKENS, max_model_len - 1)
    tokens = calibration_tokens(tokenizer, vocab_size, count)
    scratch = run(tokens)
    slots = scratch.storage.float().flatten(2, 3)  # [layers, 2, slots, kv_heads, d]
    used = slots[:, :, slots.abs().amax(dim=(0, 1, 3, 4)) > 0]  # the calibration positions
    shift = used[:, 0].mean(dim=1)  # [layers, kv_heads, d]
    if not smooth_keys:  # scales for the keys as they are (a checkpoint without a key shift)
        shift = torch.zeros_like(shift)
    keys = (used[:, 0] - shift[:, None]).abs().amax(dim=(1, 3))
    amax = torch.stack([keys, used[:, 1].abs().amax(dim=(1, 3))], dim=1)  # per page slot
    index = torch.tensor([scratch.page_slot.get(i, 0) for i in range(scratch.num_layers)])
    # amax / the largest code (all-zero head: 1), each layer its page slot's
    return fmt.scales_for(amax)[index], shift[index]
