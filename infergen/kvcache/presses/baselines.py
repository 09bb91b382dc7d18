"""The presses every other is measured against: `streaming` (StreamingLLM: the first `SINKS`
tokens and the most recent ones; position alone), `random` (a uniform draw per layer and KV
head, seeded: reproducible) and `knorm` (query-agnostic: keys with a small L2 norm draw more
attention in practice (Devoto et al., 2024), so the largest-norm keys go first)."""

from __future__ import annotations

import torch

from infergen.kvcache.presses.press import PRESSES, Press

SINKS = 4  # StreamingLLM's attention-sink tokens


class Streaming(Press):
    name = "streaming"
    description = f"the first {SINKS} tokens (attention sinks) and the most recent ones"

    def scores(self, keys, queries, scale, layer):
        tokens, kv_heads, _ = keys.shape
        position = torch.arange(tokens, dtype=torch.float32, device=keys.device)
        position[:SINKS] = float("inf")
        return position.expand(kv_heads, tokens).clone()


class Random(Press):
    name = "random"
    description = "a uniform random draw per token, layer and KV head (seeded by the layer)"

    def scores(self, keys, queries, scale, layer):
        tokens, kv_heads, _ = keys.shape
        generator = torch.Generator().manual_seed(layer)
        return torch.rand(kv_heads, tokens, generator=generator).to(keys.device)


class KeyNorm(Press):
    name = "knorm"
    description = "query-agnostic: the keys with the smallest L2 norm kept"

    def scores(self, keys, queries, scale, layer):
        return -keys.norm(dim=-1).t()  # [kv_heads, tokens]


for row in (Streaming(), Random(), KeyNorm()):
    PRESSES.register(row.name, row)
