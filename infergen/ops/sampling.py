"""Batched token choice on the device (issue 22): one step's logits and per-row parameter
tensors → one token per row, with no per-row kernel launch and no host sync.

`SamplingInputs` holds the per-row parameters as tensors on the logits' device; a feature no
row uses is None (the caller knows that on the host, so the op never asks the device). The rule,
applied to fp32 logits [batch, vocab]:

1. penalties: repetition (HF/CTRL) on the tokens marked in `seen` (prompt or output):
   x < 0 → x · p, else x / p; then frequency / presence (OpenAI) on the output `counts`:
   x − f · count − pres · (count > 0), evaluated left to right;
2. temperature: x / T; rows with T <= 0 are greedy and left unscaled;
3. top-k / top-p (`truncation_cutoffs`, torch on the device: one batched sort): each row's
   lowest kept logit, the *cutoff*. Top-k keeps the logits >= the k-th largest; top-p then
   sorts ascending, drops the prefix whose cumulative probability is <= 1 − top_p, and always
   keeps the most likely token. Tokens tied with the cutoff are all kept (engine/sampler.py's
   torch path may split such an exact tie at the top-p boundary);
4. min-p: drop x with (x − max_x) < log(min_p), i.e. probability < min_p · max probability;
5. draw: greedy rows take the argmax of the penalised logits (first index on ties); sampled
   rows take the exponential race argmax(p / q), q = −log(u), in log space:
   argmax(x − log(−log u)). u is Philox4x32-10 (Triton's `tl.philox`, `tl.uint_to_uniform_float`)
   with key = the row's 64-bit seed and counter (token index, draw count low, draw count high,
   0): a row's token depends only on its seed, draw count and logits, never on the batch.

`reference` is the plain-torch oracle (Philox written out in int64 arithmetic), and the `torch`
row of `SAMPLE_BACKENDS`; the `triton` row (ops/sampling_triton.py) fuses 1, 2, 4 and 5 in one
kernel (3 runs between, in torch, when a row uses it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from infergen.registry import Registry

SAMPLE_BACKENDS: Registry[Callable[[torch.Tensor, SamplingInputs], torch.Tensor]] = Registry(
    "sampling backend"
)

_MASK32 = 0xFFFFFFFF
PHILOX_KEY_A, PHILOX_KEY_B = 0x9E3779B9, 0xBB67AE85
PHILOX_ROUND_A, PHILOX_ROUND_B = 0xD2511F53, 0xCD9E8D57
PHILOX_ROUNDS = 10
UNIFORM_SCALE = 4.6566127342e-10  # Triton's uint_to_uniform_float for 32-bit integers


class SamplingInputs(NamedTuple):
    """Per-row parameters, every tensor on the logits' device; None = no row uses it."""

    temperature: torch.Tensor  # fp32 [batch]; <= 0: greedy
    seeds: torch.Tensor  # int64 [batch]: the row's 64-bit seed (two's complement)
    draws: torch.Tensor  # int64 [batch]: draws the row made before this one
    top_k: torch.Tensor | None = None  # int64 [batch]; <= 0 or >= vocab: off
    top_p: torch.Tensor | None = None  # fp32 [batch]; 1: off
    min_p: torch.Tensor | None = None  # fp32 [batch]; 0: off
    repetition_penalty: torch.Tensor | None = None  # fp32 [batch] (1: off), with `seen`
    seen: torch.Tensor | None = None  # bool [batch, vocab]: token in the prompt or output
    frequency_penalty: torch.Tensor | None = None  # fp32 [batch], with `counts`
    presence_penalty: torch.Tensor | None = None  # fp32 [batch], with `counts`
    counts: torch.Tensor | None = None  # fp32 [batch, vocab]: output token counts

    @property
    def truncates(self) -> bool:
        return self.top_k is not None or self.top_p is not None


def check_inputs(logits: torch.Tensor, inputs: SamplingInputs) -> None:
    """Shapes and pairings; raises ValueError naming the field."""
    if logits.dim() != 2:
        raise ValueError(f"logits must be [batch, vocab], got {tuple(logits.shape)}")
    batch = logits.shape[0]
    for name, value in inputs._asdict().items():
        if value is None:
            continue
        want = logits.shape if name in ("seen", "counts") else (batch,)
        if tuple(value.shape) != tuple(want) or value.device != logits.device:
            raise ValueError(f"{name} {tuple(value.shape)} on {value.device}: expected "
                             f"{tuple(want)} on {logits.device}")  # fmt: skip
    if (inputs.seen is None) != (inputs.repetition_penalty is None):
        raise ValueError("repetition_penalty and seen go together")
    with_counts = (inputs.frequency_penalty, inputs.presence_penalty, inputs.counts)
    if any(v is None for v in with_counts) and any(v is not None for v in with_counts):
        raise ValueError("frequency_penalty, presence_penalty and counts go together")


def penalize(logits: torch.Tensor, inputs: SamplingInputs) -> torch.Tensor:
    """Steps 1-2: penalties then temperature → fp32 [batch, vocab] (a new tensor)."""
    x = logits.float()
    if inputs.seen is not None:
        penalty = inputs.repetition_penalty.unsqueeze(1)  # [batch, 1]
        x = torch.where(inputs.seen, torch.where(x < 0, x * penalty, x / penalty), x)
    if inputs.counts is not None:
        counts = inputs.counts
        x = x - inputs.frequency_penalty.unsqueeze(1) * counts
        x = x - inputs.presence_penalty.unsqueeze(1) * (counts > 0).float()
    temperature = inputs.temperature
    return x / torch.where(temperature > 0, temperature, 1.0).unsqueeze(1)


def truncation_cutoffs(scaled: torch.Tensor, inputs: SamplingInputs) -> torch.Tensor:
    """Step 3: fp32 [batch], each row's lowest kept logit (-inf: keeps all; greedy rows -inf)."""
    batch, vocab = scaled.shape
    sorted_logits = scaled.sort(dim=-1).values  # [batch, vocab] ascending
    cutoff = torch.full((batch,), -float("inf"), device=scaled.device)
    if inputs.top_k is not None:
        k = inputs.top_k
        k = torch.where((k <= 0) | (k > vocab), vocab, k)
        kth = sorted_logits.gather(1, (vocab - k).unsqueeze(1))  # [batch, 1]
        sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, -float("inf"))
        cutoff = kth.squeeze(1)
    if inputs.top_p is not None:
        top_p = inputs.top_p.unsqueeze(1)  # [batch, 1]
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop = (cumulative <= 1 - top_p) & (top_p < 1)
        drop[:, -1] = False  # always keep the most likely token
        first_kept = drop.sum(dim=-1, keepdim=True)  # drop is a prefix: cumulative only grows
        cutoff = torch.maximum(cutoff, sorted_logits.gather(1, first_kept).squeeze(1))
    return torch.where(inputs.temperature > 0, cutoff, -float("inf"))


def log_min_p(inputs: SamplingInputs) -> torch.Tensor | None:
    """Step 4's per-row bound fp32 [batch]: log(min_p), -inf where off or greedy."""
    if inputs.min_p is None:
        return None
    bound = torch.where(inputs.min_p > 0, inputs.min_p, 0.0).log()
    return torch.where(inputs.temperature > 0, bound, -float("inf"))


def processed_logits(logits: torch.Tensor, inputs: SamplingInputs) -> torch.Tensor:
    """Steps 1-4 → fp32 [batch, vocab]: the logits each row draws from, dropped ones -inf."""
    check_inputs(logits, inputs)
    x = penalize(logits, inputs)
    keep = torch.ones_like(x, dtype=torch.bool)
    if inputs.truncates:
        keep &= x >= truncation_cutoffs(x, inputs).unsqueeze(1)
    bound = log_min_p(inputs)
    if bound is not None:
        keep &= (x - x.amax(dim=-1, keepdim=True)) >= bound.unsqueeze(1)
    return x.masked_fill(~keep, -float("inf"))


def _mul_parts(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(high, low) 32 bits of a · b for a < 2³², b int64 in [0, 2³²), without int64 overflow."""
    b_lo, b_hi = b & 0xFFFF, b >> 16
    lo_part, hi_part = a * b_lo, a * b_hi  # each < 2⁴⁸
    high = (hi_part + (lo_part >> 16)) >> 16
    low = (((hi_part & 0xFFFF) << 16) + lo_part) & _MASK32
    return high, low


def philox_uniform(seeds: torch.Tensor, draws: torch.Tensor, vocab: int) -> torch.Tensor:
    """fp32 [batch, vocab] in [0, 1): Triton's Philox4x32-10 `rand` with key = the seed and
    counter (token, draw low, draw high, 0), written out in int64 torch arithmetic."""
    device = seeds.device
    batch = seeds.shape[0]
    k0 = (seeds & _MASK32).unsqueeze(1)  # [batch, 1]
    k1 = ((seeds >> 32) & _MASK32).unsqueeze(1)
    c0 = torch.arange(vocab, device=device, dtype=torch.int64).expand(batch, vocab)
    c1 = (draws & _MASK32).unsqueeze(1).expand(batch, vocab)
    c2 = ((draws >> 32) & _MASK32).unsqueeze(1).expand(batch, vocab)
    c3 = torch.zeros_like(c0)
    for _ in range(PHILOX_ROUNDS):
        hi_b, lo_b = _mul_parts(PHILOX_ROUND_B, c2)
        hi_a, lo_a = _mul_parts(PHILOX_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0 = (k0 + PHILOX_KEY_A) & _MASK32
        k1 = (k1 + PHILOX_KEY_B) & _MASK32
    signed = torch.where(c0 >= 1 << 31, c0 - (1 << 32), c0)  # bitcast to int32
    signed = torch.where(signed < 0, ~signed, signed)
    scale = torch.tensor(UNIFORM_SCALE, dtype=torch.float32, device=device)
    return signed.to(torch.float32) * scale


@SAMPLE_BACKENDS.decorator("torch")
def reference(logits: torch.Tensor, inputs: SamplingInputs) -> torch.Tensor:
    """One token per row, int64 [batch] on the logits' device (module docstring rule)."""
    x = processed_logits(logits, inputs)
    u = philox_uniform(inputs.seeds, inputs.draws, x.shape[1])
    score = x - (-u.log()).log()  # the exponential race argmax(p / q) in log space
    score = torch.where(inputs.temperature.unsqueeze(1) > 0, score, x)
    return score.argmax(dim=-1)
