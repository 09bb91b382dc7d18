"""Real calls of a decoder layer inside the engine, recorded for the compiler tests: the inputs
before the call (cloned: the layer updates h and the cache in place) and what it left after."""

from __future__ import annotations

import torch

from infergen import LLM, SamplingParams
from infergen.kvcache.paged_cache import KVLayer


def _snapshot_calls(layer, calls: list) -> list:
    """Records each call of `layer`: inputs before (cloned: the layer updates h and the cache
    in place) and results after."""

    def before(module, args):
        h, delta, batch, kv = args
        calls.append(
            {
                "h": h.clone(),
                "delta": delta.clone(),
                "batch": batch,
                "kv": KVLayer(kv.k.clone(), kv.v.clone()),
            }
        )

    def after(module, args, out):
        h, _, _, kv = args
        calls[-1].update(
            out=out.clone(), h_after=h.clone(), k_after=kv.k.clone(), v_after=kv.v.clone()
        )

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
