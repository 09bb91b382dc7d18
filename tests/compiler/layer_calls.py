"""Real calls of a decoder layer inside the engine, recorded for the compiler tests: the inputs
before the call (cloned: the layer updates h and the cache in place) and what it left after."""

from __future__ import annotations

import torch

from infergen import LLM, SamplingParams
from infergen.kvcache.paged_cache import KVLayer


def clone_cache(cache):
    """A copy of a layer's cache: an attention layer's K / V (its scales left out), a recurrent
    layer's state tensors, or both (Falcon-H1's parallel mixer)."""
    if isinstance(cache, KVLayer):
        k = cache.k.clone()
        return KVLayer(k, k if cache.v is cache.k or _same(cache.v, cache.k) else cache.v.clone())
    if isinstance(cache, dict):
        return {name: tensor.clone() for name, tensor in cache.items()}
    return tuple(clone_cache(part) for part in cache)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two pages are one tensor (MLA's latent cache stands for K and V)."""
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()


def cache_tensors(cache) -> list[torch.Tensor]:
    """A layer's cache tensors, in a fixed order (clone_cache's)."""
    if isinstance(cache, KVLayer):
        return [t for t in (cache.k, cache.v) if t is not None]
    if isinstance(cache, dict):
        return [cache[name] for name in sorted(cache)]
    return [t for part in cache for t in cache_tensors(part)]


def _snapshot_calls(layer, calls: list) -> list:
    """Records each call of `layer`: inputs before (cloned: the layer updates h and the cache
    in place) and results after."""

    def before(module, args):
        h, delta, batch, kv = args
        calls.append(
            {
                "h": h.clone(),
                "delta": None if delta is None else delta.clone(),
                "batch": batch,
                "kv": clone_cache(kv),
            }
        )

    def after(module, args, out):
        h, _, _, kv = args
        calls[-1].update(out=out.clone(), h_after=h.clone(), cache_after=clone_cache(kv))
        if isinstance(kv, KVLayer):
            calls[-1].update(k_after=kv.k.clone(), v_after=kv.v.clone())

    return [layer.register_forward_pre_hook(before), layer.register_forward_hook(after)]


def record_layer_calls(llm: LLM, layer, vocab: int = 200) -> list[dict]:
    """Runs chunked prefill (reading cached KV), a mixed prefill + decode batch and decode
    steps through the per-op path, recording every call of `layer`."""
    calls: list[dict] = []
    hooks = _snapshot_calls(layer, calls)
    try:
        torch.manual_seed(1)
        tokens = torch.randint(0, vocab, (21,)).tolist()
        llm.engine.prompt_logits(tokens, chunk=8)
        params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
        llm.generate([[3, 17, 42], [5, 8, 150, 23, 77, 9, 11]], params)
    finally:
        for hook in hooks:
            hook.remove()
    return calls
