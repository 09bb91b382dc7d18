"""The sampler: turns one step's logits into one next token per request (plus logprobs).

The engine owns one `SamplingState` per request (its params, prompt and output tokens so far,
and its random generator) and calls `Sampler()(logits, states)` once per step with the
logits of the last position of every running request, row i belonging to `states[i]`.

Order of processing (`process_logits`, then the draw), vectorised over the batch with per-row
parameters as tensors:

1. penalties, in this order:
   - repetition (HF/CTRL rule) over tokens seen in the prompt OR the output:
     logit < 0 -> logit * p, else logit / p;
   - frequency and presence (OpenAI rule) over the OUTPUT tokens only:
     logit -= frequency_penalty * count + presence_penalty * (count > 0);
2. temperature: logit / T (greedy rows are left unscaled);
3. top-k: drop logits below the k-th largest (ties with the k-th are kept);
4. top-p: sort ascending, drop tokens whose cumulative probability is <= 1 - top_p, always
   keeping the most likely token;
5. min-p: drop tokens whose probability is < min_p * (probability of the most likely token);
6. draw: greedy rows take the argmax of the penalised logits (no randomness, first index on
   ties); sampled rows draw from softmax(processed logits) by the exponential race
   argmax(probs / q), q ~ Exp(1), with the noise q drawn from the row's own generator. A seeded
   row's token therefore depends only on its seed, its draw count and its own logits, never on
   which other requests share the batch.

Steps 3-5 follow transformers' TopKLogitsWarper / TopPLogitsWarper / MinPLogitsWarper with
their default `min_tokens_to_keep=1` (and vLLM's sampler); tests compare against them.
Differences from transformers: top_k 0 / -1 means "off" (transformers rejects 0 and leaves
the warper out), top_p must lie in (0, 1] (transformers accepts 0), and temperature 0 means
greedy (transformers rejects it and uses do_sample=False instead).

Two paths, chosen by the engine's `kernels` option (`Sampler(kernels)`):

- the generator path (kernels "native" / "torch", and the default `Sampler()`): the code below;
  each sampled row's noise comes from its own `torch.Generator`, one draw per row;
- the batched path (a kernel set with its own row in ops/sampling.SAMPLE_BACKENDS: "triton"):
  the per-row parameters go to the device as a few tensors, the penalties as a [batch, vocab]
  prompt-or-output mask and output counts scattered on the device, and ops/sampling's row picks
  every token in one fused kernel; the only host sync is the `.tolist()` of the tokens (plus
  the logprobs' when asked). Its noise is Philox keyed by (the row's seed, its draw count =
  the number of tokens it has generated, the token index), so a seeded row is still
  reproducible and independent of the batch, but its tokens DIFFER from the generator path's
  for the same seed (another random stream). Its top-p keeps every token tied with the
  cutoff logit, and min-p compares log-probabilities; on logits without exact ties at those
  boundaries the processed logits are the same as the generator path's.

Logprobs are computed from the model's raw logits (log_softmax before any penalty,
temperature or truncation), as vLLM does by default: they describe the model's distribution,
not the one the token was drawn from.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from infergen.engine.sampling_params import SamplingParams
from infergen.ops.sampling import SAMPLE_BACKENDS, SamplingInputs

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    """One round of SplitMix64: decorrelates nearby integers before they seed a generator."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


class SamplingState:
    """Per-request sampling state, owned by the engine.

    Args:
        params: the request's sampling parameters.
        prompt_token_ids: the prompt (used by the repetition penalty).
        engine_seed, request_index: seed the generator when `params.seed` is None, so an
            unseeded run of the engine is still reproducible given the engine seed and the
            order in which requests arrived.
        device: where the generator lives; must match the device of the logits.

    Attributes:
        output_token_ids: the tokens generated so far (the engine calls `append`).
        generator: None for greedy requests; else seeded from `params.seed` if given
            (reproducible whatever the batch), or from (engine_seed, request_index).
        seed: that seed (None for greedy requests), the batched path's Philox key.
    """

    def __init__(
        self,
        params: SamplingParams,
        prompt_token_ids: Sequence[int],
        engine_seed: int = 0,
        request_index: int = 0,
        device: torch.device | str = "cpu",
    ) -> None:
        self.params = params
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.generator: torch.Generator | None = None
        self.seed: int | None = None  # 64-bit; the batched path's Philox key
        if not params.is_greedy:
            if params.seed is not None:
                seed = params.seed & _MASK64
            else:
                seed = _splitmix64(_splitmix64(engine_seed & _MASK64) ^ (request_index & _MASK64))
            self.seed = seed
            self.generator = torch.Generator(device=device)
            self.generator.manual_seed(seed)
        self._prompt_unique: torch.Tensor | None = None

    def append(self, token_id: int) -> None:
        """Record a generated token (call once per step, after sampling)."""
        self.output_token_ids.append(int(token_id))

    def prompt_unique(self) -> torch.Tensor:
        """The prompt's distinct token ids as int64 [n] (computed once)."""
        if self._prompt_unique is None:
            self._prompt_unique = torch.tensor(
                sorted(set(self.prompt_token_ids)), dtype=torch.int64
            )
        return self._prompt_unique


class TokenLogprobs(NamedTuple):
    """Logprob of the chosen token and the top-k alternatives (id, logprob), best first."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]


class SamplerOutput(NamedTuple):
    """One token per request, and its logprobs (None where the request asked for none)."""

    token_ids: list[int]
    logprobs: list[TokenLogprobs | None]


def argmax_only(states: Sequence[SamplingState]) -> bool:
    """Whether each row's token is its raw logits' argmax: greedy, no penalty, no logprobs
    (the sampler's fast path)."""
    return all(
        s.params.is_greedy and not s.params.has_penalties and s.params.logprobs is None
        for s in states
    )


def argmax_rows(logits: torch.Tensor) -> list[int]:
    """Each row's argmax (the first index on ties; a NaN counts as the largest, as in torch).
    On the CPU through numpy: torch's argmax of one 49k-float row takes ~40 us warm and ~100
    us after a decode step's weight streams, numpy's ~5 us (docs/profile.md)."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        return np.argmax(logits.detach().numpy(), axis=-1).tolist()
    return logits.argmax(dim=-1).tolist()


def _row_tensor(values: list[float], like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(values, dtype=like.dtype, device=like.device).unsqueeze(1)  # [batch, 1]


def _token_index(
    states: Sequence[SamplingState], rows: list[int], with_prompt: bool, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, token) index pairs of the output tokens (and prompt tokens) of the given rows."""
    row_parts, token_parts = [], []
    for row in rows:
        state = states[row]
        tokens = torch.tensor(state.output_token_ids, dtype=torch.int64)
        if with_prompt:
            tokens = torch.cat([state.prompt_unique(), tokens])
        row_parts.append(torch.full_like(tokens, row))
        token_parts.append(tokens)
    return torch.cat(row_parts).to(device), torch.cat(token_parts).to(device)


def _apply_penalties(logits: torch.Tensor, states: Sequence[SamplingState]) -> torch.Tensor:
    batch, vocab = logits.shape
    params = [s.params for s in states]
    rep_rows = [i for i, p in enumerate(params) if p.repetition_penalty != 1.0]
    if rep_rows:
        rows, tokens = _token_index(states, rep_rows, with_prompt=True, device=logits.device)
        seen = torch.zeros(batch, vocab, dtype=torch.bool, device=logits.device)
        seen[rows, tokens] = True  # [batch, vocab]
        penalty = _row_tensor([p.repetition_penalty for p in params], logits)
        penalised = torch.where(logits < 0, logits * penalty, logits / penalty)
        logits = torch.where(seen, penalised, logits)
    openai_rows = [
        i for i, p in enumerate(params) if p.frequency_penalty != 0.0 or p.presence_penalty != 0.0
    ]
    if openai_rows:
        rows, tokens = _token_index(states, openai_rows, with_prompt=False, device=logits.device)
        counts = torch.zeros_like(logits)  # [batch, vocab]
        counts.index_put_((rows, tokens), torch.ones_like(tokens, dtype=logits.dtype), True)
        frequency = _row_tensor([p.frequency_penalty for p in params], logits)
        presence = _row_tensor([p.presence_penalty for p in params], logits)
        logits = logits - frequency * counts - presence * (counts > 0).to(logits.dtype)
    return logits


def _apply_top_k_top_p(
    logits: torch.Tensor, top_k: list[int] | None, top_p: list[float] | None
) -> torch.Tensor:
    """Top-k then top-p on one ascending sort. `top_k[i]` is in [1, vocab]; None = off."""
    vocab = logits.shape[1]
    sorted_logits, sorted_index = logits.sort(dim=-1, descending=False)  # [batch, vocab]
    if top_k is not None:
        kth_position = torch.tensor([vocab - k for k in top_k], device=logits.device)
        kth_value = sorted_logits.gather(1, kth_position.unsqueeze(1))  # [batch, 1]
        sorted_logits = sorted_logits.masked_fill(sorted_logits < kth_value, -float("inf"))
    if top_p is not None:
        p = _row_tensor(top_p, logits)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop = (cumulative <= 1 - p) & (p < 1)
        drop[:, -1] = False  # always keep the most likely token
        sorted_logits = sorted_logits.masked_fill(drop, -float("inf"))
    return torch.empty_like(logits).scatter_(1, sorted_index, sorted_logits)


def process_logits(logits: torch.Tensor, states: Sequence[SamplingState]) -> torch.Tensor:
    """Apply penalties, temperature, top-k, top-p and min-p (module docstring order).

    Args:
        logits: fp32 [batch, vocab], row i belonging to `states[i]`; not modified.
    Returns:
        fp32 [batch, vocab]: the logits the token is drawn from (softmax of them is the
        sampling distribution); dropped tokens are -inf. Greedy rows get penalties only.
    """
    params = [s.params for s in states]
    vocab = logits.shape[1]
    if any(p.has_penalties for p in params):
        logits = _apply_penalties(logits, states)
    sampled = [None if p.is_greedy else p for p in params]  # greedy rows: penalties only
    if all(p is None for p in sampled):
        return logits
    if any(p is not None and p.temperature != 1.0 for p in sampled):
        temperature = [1.0 if p is None else p.temperature for p in sampled]
        logits = logits / _row_tensor(temperature, logits)
    top_k = [min(p.top_k, vocab) if p is not None and p.top_k_enabled else vocab for p in sampled]
    top_p = [1.0 if p is None else p.top_p for p in sampled]
    use_top_k = any(k < vocab for k in top_k)
    use_top_p = any(p < 1.0 for p in top_p)
    if use_top_k or use_top_p:
        logits = _apply_top_k_top_p(
            logits, top_k if use_top_k else None, top_p if use_top_p else None
        )
    min_p = [0.0 if p is None else p.min_p for p in sampled]
    if any(m > 0 for m in min_p):
        probs = logits.softmax(dim=-1)  # [batch, vocab]
        threshold = _row_tensor(min_p, logits) * probs.amax(dim=-1, keepdim=True)
        logits = logits.masked_fill(probs < threshold, -float("inf"))
    return logits


def _logprobs(
    raw_logits: torch.Tensor, states: Sequence[SamplingState], token_ids: list[int]
) -> list[TokenLogprobs | None]:
    out: list[TokenLogprobs | None] = [None] * len(states)
    rows = [i for i, s in enumerate(states) if s.params.logprobs is not None]
    if not rows:
        return out
    row_index = torch.tensor(rows, device=raw_logits.device)
    logprobs = torch.log_softmax(raw_logits[row_index], dim=-1)  # [rows, vocab]
    chosen = torch.tensor([token_ids[i] for i in rows], device=raw_logits.device)
    chosen_logprob = logprobs.gather(1, chosen.unsqueeze(1)).squeeze(1).tolist()
    max_k = min(max(states[i].params.logprobs for i in rows), raw_logits.shape[1])
    top_values, top_ids = logprobs.topk(max_k, dim=-1, sorted=True)  # [rows, max_k]
    top_values, top_ids = top_values.tolist(), top_ids.tolist()
    for j, i in enumerate(rows):
        k = states[i].params.logprobs
        top = list(zip(top_ids[j][:k], top_values[j][:k], strict=True))
        out[i] = TokenLogprobs(token_ids[i], chosen_logprob[j], top)
    return out


def _signed64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def sampling_inputs(
    states: Sequence[SamplingState], vocab: int, device: torch.device
) -> SamplingInputs:
    """The batched path's per-row tensors on `device`: one host→device copy per kind, the
    penalty mask / counts scattered on the device; features no row uses are None."""
    params = [s.params for s in states]
    batch = len(states)
    floats = [
        [0.0 if p.is_greedy else p.temperature for p in params],
        [p.top_p for p in params],
        [p.min_p for p in params],
        [p.repetition_penalty for p in params],
        [p.frequency_penalty for p in params],
        [p.presence_penalty for p in params],
    ]
    ints = [
        [_signed64(s.seed) if s.seed is not None else 0 for s in states],
        [len(s.output_token_ids) for s in states],  # draws made so far
        [p.top_k if p.top_k_enabled else 0 for p in params],
    ]
    temperature, top_p, min_p, rep, freq, pres = torch.tensor(floats).to(device).unbind(0)
    seeds, draws, top_k = torch.tensor(ints, dtype=torch.int64).to(device).unbind(0)
    drawn = [p for p in params if not p.is_greedy]  # greedy rows ignore truncation
    fields: dict[str, torch.Tensor | None] = dict(
        top_k=top_k if any(p.top_k_enabled and p.top_k < vocab for p in drawn) else None,
        top_p=top_p if any(p.top_p < 1.0 for p in drawn) else None,
        min_p=min_p if any(p.min_p > 0.0 for p in drawn) else None,
    )
    rep_rows = [i for i, p in enumerate(params) if p.repetition_penalty != 1.0]
    if rep_rows:
        rows, tokens = _token_index(states, rep_rows, with_prompt=True, device=device)
        seen = torch.zeros(batch, vocab, dtype=torch.bool, device=device)
        seen[rows, tokens] = True  # [batch, vocab]
        fields.update(repetition_penalty=rep, seen=seen)
    openai_rows = [
        i for i, p in enumerate(params) if p.frequency_penalty != 0.0 or p.presence_penalty != 0.0
    ]
    openai_rows = [i for i in openai_rows if states[i].output_token_ids]
    if openai_rows:
        rows, tokens = _token_index(states, openai_rows, with_prompt=False, device=device)
        counts = torch.zeros(batch, vocab, device=device)  # [batch, vocab]
        counts.index_put_((rows, tokens), torch.ones_like(tokens, dtype=counts.dtype), True)
        fields.update(frequency_penalty=freq, presence_penalty=pres, counts=counts)
    return SamplingInputs(temperature, seeds, draws, **fields)


class Sampler:
    """Picks one next token per request; stateless (all state is in `SamplingState`).

    Args:
        kernels: the engine's kernel set. One with its own row in SAMPLE_BACKENDS other than
            "torch" (i.e. "triton") takes the batched path; the others ("native", "torch")
            the generator path, which keeps their seeded streams (module docstring).
    """

    def __init__(self, kernels: str = "torch") -> None:
        batched = kernels in SAMPLE_BACKENDS and kernels != "torch"
        self.batched = SAMPLE_BACKENDS.get(kernels, where="kernels") if batched else None

    def __call__(
        self,
        logits: torch.Tensor,
        states: list[SamplingState],
        argmax: list[int] | None = None,
    ) -> SamplerOutput:
        """Sample one token for each row.

        Args:
            logits: fp32 [batch, vocab], the model's raw logits, row i for `states[i]`.
            states: one per row; generators advance for sampled rows. The caller appends the
                returned tokens to the states.
            argmax: each row's argmax, where the model's head computed it beside the logits
                (runner.StepLogits); the tokens when every row is `argmax_only`.
        """
        if logits.dim() != 2 or logits.shape[0] != len(states):
            raise ValueError(f"logits {tuple(logits.shape)} do not match {len(states)} states")
        if argmax_only(states):  # fast path: one argmax for the batch (or the head's)
            token_ids = argmax_rows(logits) if argmax is None else argmax
            return SamplerOutput(token_ids, [None] * len(states))
        params = [s.params for s in states]
        if self.batched is not None:
            inputs = sampling_inputs(states, logits.shape[1], logits.device)
            token_ids = self.batched(logits, inputs).tolist()  # the one sync of the step
            return SamplerOutput(token_ids, _logprobs(logits, states, token_ids))
        processed = process_logits(logits, states)
        tokens = processed.argmax(dim=-1)  # [batch]; final for greedy rows
        sampled_rows = [i for i, p in enumerate(params) if not p.is_greedy]
        if sampled_rows:
            row_index = torch.tensor(sampled_rows, device=logits.device)
            probs = processed[row_index].softmax(dim=-1)  # [rows, vocab]
            noise = torch.empty_like(probs)
            for j, i in enumerate(sampled_rows):
                noise[j].exponential_(generator=states[i].generator)
            noise.clamp_(min=torch.finfo(noise.dtype).tiny)  # q = 0 would make 0/0 = nan
            tokens[row_index] = (probs / noise).argmax(dim=-1)
        token_ids = tokens.tolist()
        return SamplerOutput(token_ids, _logprobs(logits, states, token_ids))
