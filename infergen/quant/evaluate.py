"""Accuracy of a weight scheme against the unquantized model: perplexity of held-out text,
and per-token KL divergence and top-1 agreement of the next-token distributions.

Both models score the same token ids teacher-forced (Engine.prompt_logits: the paged cache,
the engine's own kernels). KL(p_ref || p_scheme) = Σ p_ref (log p_ref − log p_scheme), in nats,
averaged over positions; top-1 agreement: the fraction of positions whose argmax agree.
"""

from __future__ import annotations

import math
import pathlib
from collections.abc import Sequence

import torch

DEFAULT_TEXT = "shakespeare.txt"  # data/ of the repository: its last part is held out


def default_tokens(tokenizer, count: int, data_dir: pathlib.Path | None = None) -> list[int]:
    """`count` tokens from the end of the shipped corpus (text no benchmark prompt uses)."""
    root = data_dir or pathlib.Path(__file__).resolve().parents[2] / "data"
    path = root / DEFAULT_TEXT
    if not path.is_file():
        raise FileNotFoundError(f"evaluation text {path} is missing; pass token ids instead")
    tokens = tokenizer.encode(path.read_text()[-60000:])
    if len(tokens) < count + 1:
        raise ValueError(f"{path} holds {len(tokens)} tokens, {count + 1} needed")
    return tokens[-count:]


def perplexity(logits: torch.Tensor, tokens: Sequence[int]) -> float:
    """exp(mean negative log-likelihood of tokens[1:] under logits[:-1])."""
    logp = torch.log_softmax(logits[:-1].double(), dim=-1)
    targets = torch.tensor(list(tokens[1:]))[:, None]
    return math.exp(-logp.gather(1, targets).mean().item())


def divergence(reference: torch.Tensor, logits: torch.Tensor) -> dict[str, float]:
    """Mean KL(reference || logits) in nats per position, and top-1 agreement."""
    ref = torch.log_softmax(reference.double(), dim=-1)
    got = torch.log_softmax(logits.double(), dim=-1)
    kl = (ref.exp() * (ref - got)).sum(-1).mean().item()
    top1 = (reference.argmax(-1) == logits.argmax(-1)).double().mean().item()
    return {"kl_nats": max(kl, 0.0), "top1_agreement": top1}


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes the model's projections hold in memory, in their prepared (quantized) form."""
    from infergen.layers.linear import Linear

    return sum(
        m.weight.numel() * m.weight.element_size() for m in model.modules() if isinstance(m, Linear)
    )


def evaluate(
    model: str | None,
    schemes: Sequence[str | None],
    tokens: int = 1024,
    token_ids: Sequence[int] | None = None,
    kv_formats: Sequence[str] = (),
    **llm_args,
) -> list[dict]:
    """One row per weight scheme, then per KV cache format over unquantized weights (the
    unquantized model with the engine-dtype cache is always scored first, as the reference):
    perplexity, KL / top-1 against the reference, the projections' weight bytes and the KV
    cache's bytes per token."""
    from infergen import LLM

    configs = [("none", None, None)]
    configs += [(s, s, None) for s in schemes if s is not None]
    configs += [(f"kv {kv}", None, kv) for kv in kv_formats]
    rows, reference, ids = [], None, token_ids
    for name, scheme, kv_format in configs:
        llm = LLM(model, weights=scheme, kv_format=kv_format, **llm_args)
        if ids is None:
            ids = default_tokens(llm.tokenizer, tokens)
        ids = list(ids)
        engine = llm.engine
        logits = engine.prompt_logits(ids)
        element = engine.config.cache.element_bytes(engine.kv_cache.dtype.itemsize)
        row = {
            "scheme": name,
            "tokens": len(ids),
            "perplexity": perplexity(logits, ids),
            "weight_bytes": weight_bytes(engine.runner.model),
            "kv_bytes_per_token": engine.model_config.kv_bytes_per_token(element),
        }
        if reference is None:
            reference = logits
            row.update(kl_nats=0.0, top1_agreement=1.0)
        else:
            row.update(divergence(reference, logits))
        rows.append(row)
    return rows
