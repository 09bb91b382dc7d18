"""The `triton` row of SAMPLE_BACKENDS (ops/sampling.py's rule): one program per row walks the
vocabulary in blocks and fuses the penalties (repetition over `seen`, frequency / presence
over `counts`), temperature, the top-k / top-p cutoff, min-p and the draw — the exponential race
argmax(x − log(−log u)) with u from Philox (`tl.philox`) keyed by (the row's seed, its draw
count, the token index), so there is no per-row generator launch; greedy rows take the argmax.

With min-p a first pass finds the row max. Top-k / top-p need a sort: when a row uses them, a
first kernel writes the penalised, scaled logits, torch computes each row's cutoff from one
batched sort (ops/sampling.truncation_cutoffs, on the device), and the draw kernel reads them.

The arithmetic is the reference's, operation for operation, so the processed logits are
bit-identical: IEEE division (`div_rn`; Triton's `/` is approximate on the GPU) and no fused
multiply-add (`enable_fp_fusion=False`). Only the draw's logs may differ in the last bit from
torch's on the GPU. Triton is optional: without it this module imports and the row raises.
"""

from __future__ import annotations

import torch

from infergen.ops.sampling import (
    SAMPLE_BACKENDS,
    SamplingInputs,
    check_inputs,
    log_min_p,
    truncation_cutoffs,
)
from infergen.ops.triton_lang import jit, tl, triton

BLOCK = 1024


@jit
def _penalized(logits_ptr, seen_ptr, counts_ptr, offs, mask, rep, freq, pres, scale,
               HAS_SEEN: tl.constexpr, HAS_COUNTS: tl.constexpr, SCALE: tl.constexpr):  # fmt: skip
    """Steps 1-2 for one block of a row: fp32 logits after penalties and temperature."""
    x = tl.load(logits_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if SCALE:
        if HAS_SEEN:
            seen = tl.load(seen_ptr + offs, mask=mask, other=0)
            penalised = tl.where(x < 0, x * rep, tl.math.div_rn(x, rep))
            x = tl.where(seen != 0, penalised, x)
        if HAS_COUNTS:
            count = tl.load(counts_ptr + offs, mask=mask, other=0.0)
            x = x - freq * count
            x = x - pres * (count > 0).to(tl.float32)
        x = tl.math.div_rn(x, scale)
    return x


@jit
def _sample_kernel(logits_ptr, seen_ptr, counts_ptr, temp_ptr, rep_ptr, freq_ptr, pres_ptr,
                   cutoff_ptr, bound_ptr, seed_ptr, draw_ptr, token_ptr, out_ptr, vocab,
                   HAS_SEEN: tl.constexpr, HAS_COUNTS: tl.constexpr, SCALE: tl.constexpr,
                   HAS_CUTOFF: tl.constexpr, HAS_MIN_P: tl.constexpr, DRAW: tl.constexpr,
                   WRITE: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    base = row * vocab  # the row's first element in every [batch, vocab] tensor
    temp = tl.load(temp_ptr + row)
    greedy = temp <= 0
    scale = tl.where(greedy, 1.0, temp)
    rep = tl.load(rep_ptr + row) if HAS_SEEN else 1.0
    freq = tl.load(freq_ptr + row) if HAS_COUNTS else 0.0
    pres = tl.load(pres_ptr + row) if HAS_COUNTS else 0.0
    cutoff = tl.load(cutoff_ptr + row) if HAS_CUTOFF else -float("inf")
    bound = tl.load(bound_ptr + row) if HAS_MIN_P else -float("inf")
    row_max = tl.full([], -float("inf"), tl.float32)
    if HAS_MIN_P:  # pass 1: the row max (it always survives top-k / top-p)
        for start in range(0, vocab, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            mask = offs < vocab
            x = _penalized(logits_ptr + base, seen_ptr + base, counts_ptr + base, offs,
                           mask, rep, freq, pres, scale, HAS_SEEN, HAS_COUNTS, SCALE)  # fmt: skip
            row_max = tl.maximum(row_max, tl.max(tl.where(mask, x, -float("inf")), 0))
    seed = tl.load(seed_ptr + row)
    draw = tl.load(draw_ptr + row)
    zero = tl.zeros([BLOCK], dtype=tl.uint32)
    draw_lo = zero + (draw & 0xFFFFFFFF).to(tl.uint32)
    draw_hi = zero + ((draw >> 32) & 0xFFFFFFFF).to(tl.uint32)
    best_score = tl.full([], -float("inf"), tl.float32)
    best_index = tl.zeros([], dtype=tl.int32)
    for start in range(0, vocab, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < vocab
        x = _penalized(logits_ptr + base, seen_ptr + base, counts_ptr + base, offs, mask,
                       rep, freq, pres, scale, HAS_SEEN, HAS_COUNTS, SCALE)  # fmt: skip
        keep = mask
        if HAS_CUTOFF:
            keep = keep & (x >= cutoff)
        if HAS_MIN_P:
            keep = keep & ((x - row_max) >= bound)
        x = tl.where(keep, x, -float("inf"))
        if WRITE:
            tl.store(out_ptr + base + offs, x, mask=mask)
        if DRAW:
            bits, _, _, _ = tl.philox(seed, offs.to(tl.uint32), draw_lo, draw_hi, zero)
            u = tl.uint_to_uniform_float(bits)
            score = tl.where(greedy, x, x - tl.log(-tl.log(u)))
            score = tl.where(mask, score, -float("inf"))
            block_best = tl.max(score, 0)
            block_index = start + tl.argmax(score, 0)
            better = block_best > best_score  # strictly: the first index wins ties
            best_index = tl.where(better, block_index, best_index)
            best_score = tl.where(better, block_best, best_score)
    if DRAW:
        tl.store(token_ptr + row, best_index.to(tl.int64))


def _launch(logits: torch.Tensor, inputs: SamplingInputs, *, scale: bool, cutoff, bound,
            draw: bool, out: torch.Tensor | None, tokens: torch.Tensor | None) -> None:  # fmt: skip
    assert logits.is_contiguous() and logits.dtype == torch.float32, "fp32 contiguous logits"
    batch, vocab = logits.shape
    dummy = inputs.temperature
    seen = inputs.seen.contiguous().view(torch.uint8) if inputs.seen is not None else None
    counts = inputs.counts.float().contiguous() if inputs.counts is not None else None
    _sample_kernel[(batch,)](
        logits, dummy if seen is None else seen, dummy if counts is None else counts,
        inputs.temperature.float().contiguous(),
        dummy if seen is None else inputs.repetition_penalty.float().contiguous(),
        dummy if counts is None else inputs.frequency_penalty.float().contiguous(),
        dummy if counts is None else inputs.presence_penalty.float().contiguous(),
        dummy if cutoff is None else cutoff, dummy if bound is None else bound,
        inputs.seeds.contiguous(), inputs.draws.contiguous(),
        dummy if tokens is None else tokens, dummy if out is None else out, vocab,
        HAS_SEEN=seen is not None and scale, HAS_COUNTS=counts is not None and scale,
        SCALE=scale, HAS_CUTOFF=cutoff is not None, HAS_MIN_P=bound is not None, DRAW=draw,
        WRITE=out is not None, BLOCK=min(BLOCK, triton.next_power_of_2(vocab)),
        enable_fp_fusion=False,
    )  # fmt: skip


def _run(logits: torch.Tensor, inputs: SamplingInputs, write: bool, draw: bool):
    if triton is None:
        raise RuntimeError("the triton sampling row needs Triton: pip install 'infergen[triton]'")
    check_inputs(logits, inputs)
    logits = logits.float().contiguous()
    batch, vocab = logits.shape
    scale, cutoff = True, None
    if inputs.truncates and batch:  # penalties + temperature first, then the cutoffs from one sort
        scaled = torch.empty_like(logits)
        _launch(logits, inputs, scale=True, cutoff=None, bound=None, draw=False, out=scaled,
                tokens=None)  # fmt: skip
        cutoff = truncation_cutoffs(scaled, inputs).contiguous()
        logits, scale = scaled, False
    bound = log_min_p(inputs)
    out = torch.empty_like(logits) if write else None
    tokens = torch.empty(batch, dtype=torch.int64, device=logits.device) if draw else None
    if batch:
        _launch(logits, inputs, scale=scale, cutoff=cutoff,
                bound=None if bound is None else bound.contiguous(), draw=draw, out=out,
                tokens=tokens)  # fmt: skip
    return out, tokens


def processed_logits_triton(logits: torch.Tensor, inputs: SamplingInputs) -> torch.Tensor:
    """ops/sampling.processed_logits by the kernel: fp32 [batch, vocab], dropped ones -inf."""
    return _run(logits, inputs, write=True, draw=False)[0]


@SAMPLE_BACKENDS.decorator("triton")
def sample_triton(logits: torch.Tensor, inputs: SamplingInputs) -> torch.Tensor:
    """fp32 [batch, vocab] logits → int64 [batch] tokens on their device (no host sync)."""
    return _run(logits, inputs, write=False, draw=True)[1]
