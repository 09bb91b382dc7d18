"""Lossless verification of drafted tokens for sampled requests (speculative sampling, Leviathan
et al. 2023 / Chen et al. 2023) with a deterministic proposer.

A proposer that drafts one token d per position (n-gram, suffix: q(d) = 1) is verified
position by position against the target's sampling distribution p there (the sampler's
processed logits: temperature, top-k, top-p, min-p): d is kept with probability
min(1, p(d) / q(d)) = p(d); a rejected position instead draws from the residual
max(0, p - q) renormalised — p without d — and ends the run; when every draft is kept, one
more token is drawn from the distribution after the last one. Each emitted token is thus
distributed exactly as the target's sample there, whatever was drafted. The uniform draws and
the exponential races come from the request's own generator, so a seeded request is
reproducible (its stream differs from decoding one token a step, which draws once per token).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token from `probs` [vocab] (need not sum to 1) by the exponential race the
    sampler uses: argmax(probs / q), q ~ Exp(1)."""
    noise = torch.empty_like(probs).exponential_(generator=generator)
    noise.clamp_(min=torch.finfo(noise.dtype).tiny)
    return int((probs / noise).argmax())


def verify_drafts(
    probs: torch.Tensor, drafts: Sequence[int], generator: torch.Generator | None
) -> list[int]:
    """probs [len(drafts) + 1, vocab]: the target's sampling distribution at the last token's
    position and after each draft. Returns the tokens emitted: the kept drafts, then a residual
    draw at the first rejection or a draw after the last draft (module docstring)."""
    out: list[int] = []
    for j, d in enumerate(drafts):
        p = probs[j]
        u = float(torch.rand((), generator=generator, device=p.device))
        if u < float(p[d]):
            out.append(int(d))
            continue
        residual = p.clone()
        residual[d] = 0.0
        out.append(draw(residual, generator))
        return out
    out.append(draw(probs[len(drafts)], generator))
    return out
