"""Teacher-forced passes: a prompt's logits at every position, computed in chunks through the
paged cache (evaluation: perplexity, top-1 agreement), and `scratch_runner`, the callable the
build step hands to calibration (a prompt through the model on a scratch cache of its own)."""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence as Seq

import torch

from infergen.config import ModelConfig
from infergen.config.sections import SchedulerConfig
from infergen.engine.request import Sequence
from infergen.engine.runner import ModelRunner
from infergen.engine.sampling_params import SamplingParams
from infergen.engine.scheduler import ScheduledBatch, Scheduler
from infergen.errors import RequestError
from infergen.kvcache.block_pool import BlockPool
from infergen.kvcache.paged_cache import PagedKVCache
from infergen.kvcache.state_checkpoints import StateCheckpoints
from infergen.kvcache.tiers.tiered import KVTiers
from infergen.models.transformer import Transformer


@torch.no_grad()
def teacher_forced_logits(
    scheduler: Scheduler, runner: ModelRunner, token_ids: Seq[int], chunk: int
) -> torch.Tensor:
    """Logits [len(token_ids), vocab] (fp32), `chunk` tokens per forward; the blocks go back
    to the pool after."""
    token_ids = list(token_ids)
    seq = Sequence("score", None, token_ids, SamplingParams(), None, None, None, -1)
    batch = ScheduledBatch([seq], [0])
    rows = []
    try:
        while seq.num_computed_tokens < len(token_ids):
            n = min(chunk, len(token_ids) - seq.num_computed_tokens)
            if not scheduler.grow(seq, n):
                raise RequestError("KV cache is busy or too small to score this prompt")
            batch.num_tokens[0] = n
            forward_batch, _ = runner.prepare(batch)
            start = seq.num_computed_tokens
            forward_batch.logits_indices = torch.arange(n)
            forward_batch.logits_all = True  # every row, in order
            rows.append(runner.forward(forward_batch))
            seq.num_computed_tokens = start + n
    finally:
        scheduler.release_blocks(seq)
    return torch.cat(rows)


def serving_parts(
    model: Transformer,
    kv_cache: PagedKVCache,
    scheduler: SchedulerConfig,
    prefix_caching: bool,
    max_model_len: int | None = None,
    tiers: KVTiers | None = None,
    checkpoints: StateCheckpoints | None = None,
) -> tuple[BlockPool, Scheduler, ModelRunner]:
    """A block pool over `kv_cache`, a scheduler over the pool, a runner writing to it; with
    `tiers`, the blocks the pool evicts move down to them and prefix hits come back."""
    pool = BlockPool(kv_cache.num_blocks, prefix_caching)
    pool.on_free = kv_cache.block_freed
    if kv_cache.summaries:
        pool.on_allocate = kv_cache.block_allocated
    if tiers is not None:
        pool.on_evict = tiers.save
        if tiers.write_through:
            pool.on_register = tiers.save_through
    lookahead = scheduler.max_drafts if scheduler.speculative else 0
    sched = Scheduler(
        scheduler, pool, kv_cache.block_size, kv_cache.groups, kv_cache.states, max_model_len,
        lookahead, tiers=tiers, checkpoints=checkpoints,
    )  # fmt: skip
    return pool, sched, ModelRunner(model, kv_cache)


def scratch_runner(
    model: Transformer,
    model_config: ModelConfig,
    block_size: int,
    dtype: torch.dtype,
    scheduler: SchedulerConfig,
) -> Callable[[Seq[int]], PagedKVCache]:
    """`run(token_ids)`: the prompt teacher-forced through `model` on a fresh engine-dtype
    cache just big enough for it; returns that cache (its K / V are the prompt's)."""

    def run(token_ids: Seq[int]) -> PagedKVCache:
        groups = model.cache_groups
        blocks = (len(token_ids) // block_size + 2) * max(1, len(groups))
        cache = PagedKVCache(
            model_config, blocks, block_size, dtype, None, 0, model.state_layers, 2,
            groups=groups,
        )  # fmt: skip
        _, sched, runner = serving_parts(model, cache, scheduler, prefix_caching=False)
        teacher_forced_logits(sched, runner, token_ids, scheduler.max_num_batched_tokens)
        return cache

    return run
