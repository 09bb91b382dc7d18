"""Accuracy of a weight scheme or KV cache format against the unquantized model: perplexity of
held-out text, per-token KL divergence and top-1 agreement of the next-token distributions,
and passkey retrieval (eval/passkey.py).

Both models score the same token ids teacher-forced (Engine.prompt_logits: the paged cache,
the engine's own kernels). KL(p_ref || p_scheme) = Σ p_ref (log p_ref − log p_scheme), in nats,
averaged over positions; top-1 agreement: the fraction of positions whose argmax agree.
"""

from __future__ import annotations

import math
import pathlib
from collections.abc import Sequence

import torch

from infergen.errors import ConfigError
from infergen.eval.passkey import LENGTHS, passkey_accuracy
from infergen.kvcache.sizing import bytes_per_token
from infergen.layers.linear import Linear
from infergen.llm import LLM
from infergen.quant.spec import parse_spec

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
    return sum(
        m.weight.numel() * m.weight.element_size() for m in model.modules() if isinstance(m, Linear)
    )


def probe_errors(model: torch.nn.Module) -> dict[str, float] | None:
    """Mean and largest load-time probe error (layers/probe.py) over the checked projections."""
    errors = [m.probe_error for m in model.modules() if isinstance(m, Linear)]
    errors = [e for e in errors if e is not None]
    if not errors:
        return None
    return {"mean": sum(errors) / len(errors), "max": max(errors)}


def bits_per_weight(model: torch.nn.Module) -> float:
    """Bits the projections hold per weight (codes, scales and padding)."""
    weights = sum(m.in_features * m.out_features for m in model.modules() if isinstance(m, Linear))
    return 8 * weight_bytes(model) / weights


TASKS = ("ppl", "kl", "passkey")  # ppl and kl come from the same teacher-forced pass


def evaluate(
    model: str | None,
    schemes: Sequence[str | None],
    tokens: int = 1024,
    token_ids: Sequence[int] | None = None,
    kv_formats: Sequence[str] = (),
    tasks: Sequence[str] = ("ppl", "kl"),
    passkey_lengths: Sequence[int] = (),
    passkey_samples: int = 3,
    progress=None,
    **llm_args,
) -> list[dict]:
    """One row per quantization config (a weight scheme or a quant/spec.py string such as
    "int4+awq" or "fp8_e4m3/fp8_e4m3"), then per KV cache format over unquantized weights (the
    unquantized model with the engine-dtype cache is always scored first, as the reference):
    perplexity, KL / top-1 against the reference ("ppl" / "kl"), passkey retrieval accuracy
    per prompt length ("passkey"), the projections' bytes and bits per weight and the KV
    cache's bytes per token. `progress(name)` is called as each configuration starts."""
    configs = [("none", parse_spec("none"), None)]
    configs += [(s, parse_spec(s), None) for s in schemes if s is not None]
    configs += [(f"kv {kv}", parse_spec("none"), kv) for kv in kv_formats]
    rows, reference, ids = [], None, token_ids
    for name, quant, kv_format in configs:
        if progress is not None:
            progress(name)
        quant = dict(quant)
        kv_format = quant.pop("kv_format") or kv_format
        described = {"scheme": name, "weights": quant["weights"] or "none",
                     "activations": quant["activations"] or "none",
                     "kv_format": kv_format or "none"}  # fmt: skip
        try:
            llm = LLM(model, kv_format=kv_format, **quant, **llm_args)
        except ConfigError as exc:  # a scheme this model cannot take (e.g. its group size)
            if name == "none":
                raise
            rows.append({**described, "error": exc.what})
            continue
        engine = llm.engine
        per_token = bytes_per_token(
            engine.config.cache, engine.model_config, engine.kv_cache.dtype.itemsize
        )
        row = {
            **described,
            "weight_bytes": weight_bytes(engine.runner.model),
            "bits_per_weight": bits_per_weight(engine.runner.model),
            "kv_bytes_per_token": round(per_token, 1),
            "probe_error": probe_errors(engine.runner.model),
        }
        if "ppl" in tasks or "kl" in tasks:
            if ids is None:
                ids = default_tokens(llm.tokenizer, tokens)
            ids = list(ids)
            logits = engine.prompt_logits(ids)
            row.update(tokens=len(ids), perplexity=perplexity(logits, ids))
            if reference is None:
                reference = logits
                row.update(kl_nats=0.0, top1_agreement=1.0)
            else:
                row.update(divergence(reference, logits))
        if "passkey" in tasks:
            found = passkey_accuracy(llm, passkey_lengths or LENGTHS, passkey_samples)
            row["passkey"] = {str(length): acc for length, acc in found.items()}
        rows.append(row)
        del llm, engine
    return rows
