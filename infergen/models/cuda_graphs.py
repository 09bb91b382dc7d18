"""CUDA graphs for decode steps: the FAST_PATHS row "cuda_graphs" (the GPU's default fast path;
`enforce_eager=True` turns it off).

A decode step launches a few kernels per layer (hundreds per step); at small batches the
launches, not the GPU, set the step time. At start (`capture`) the decoder layers of a decode
step are recorded once per batch-size bucket (1, 2, 4, 8, 16, 32, … up to max_num_seqs) on
static input buffers; a step then copies its inputs into the smallest bucket that holds it and
replays the graph: one launch for all layers.

Static buffers of a bucket of B rows: the residual stream h [B, hidden], positions [B], per
cache group the new tokens' slots [B], block tables [B, max_blocks] and context lengths [B],
with every kernel sized for the longest context (the decode kernel splits each row's own
context, so a short one costs what it reads). Padded rows (a step of 3 in the bucket of 4)
compute on a context of one position in the cache's spare block (PagedKVCache.spare_block:
never handed to a sequence), so their writes land nowhere a sequence reads. Steps that are
not all decodes, or larger than the largest bucket, run eagerly (`run` returns None).

On the CPU there is nothing to capture: a "graph" runs the layers eagerly on the same static
buffers, so the tests check the bucketing and padding logic against the eager path there
(tests/models/test_cuda_graphs.py); the device check replays real graphs on a GPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from infergen.kvcache.paged_cache import PagedKVCache
from infergen.layers.forward_batch import ForwardBatch
from infergen.models.fast_paths import FAST_PATHS, FastPath
from infergen.ops.paged_attention import DECODE_BACKENDS, AttentionPlan
from infergen.ops.rope import RopeInputs


def buckets(max_num_seqs: int) -> list[int]:
    """Batch sizes captured: powers of two below max_num_seqs, then max_num_seqs."""
    sizes = [1 << i for i in range(max_num_seqs.bit_length()) if 1 << i < max_num_seqs]
    return [*sizes, max_num_seqs]


class _Static:
    """One bucket's static inputs and the callable that runs the layers on them."""

    def __init__(self, model, kv_cache: PagedKVCache, rows: int, max_blocks: list[int],
                 max_context: int):  # fmt: skip
        device = kv_cache.device
        self.rows = rows
        self.spare = spare = kv_cache.spare_block
        if spare is None:
            raise ValueError("captured decode steps need a cache with a spare block")
        self.pad_slot = spare * kv_cache.block_size
        self.h = torch.zeros(rows, model.config.hidden_size, dtype=model.dtype, device=device)
        self.positions = torch.zeros(rows, dtype=torch.int64, device=device)
        self.slots = [torch.full((rows,), self.pad_slot, device=device) for _ in max_blocks]
        self.tables = [
            torch.full((rows, width), spare, dtype=torch.int64, device=device)
            for width in max_blocks
        ]
        self.lens = [torch.ones(rows, dtype=torch.int64, device=device) for _ in max_blocks]
        arange = torch.arange(rows, device=device)
        plans = [
            AttentionPlan(
                decode_rows=arange, prefills=[], block_size=kv_cache.block_size,
                decode_only=True, decode_block_tables=table, decode_seq_lens=lens,
                window=group.window or 0, sinks=group.sinks if group.window else 0,
                decode_max_context=max_context,
            )
            for group, table, lens in zip(kv_cache.groups, self.tables, self.lens, strict=True)
        ]  # fmt: skip
        self.batch = ForwardBatch(
            input_ids=torch.zeros(rows, dtype=torch.int64, device=device),
            positions=self.positions,
            slot_mappings=self.slots,
            attn_plans=plans,
            logits_indices=arange,
            ropes=[RopeInputs(self.positions, table) for table in model.rope_tables],
        )
        self.out: tuple[torch.Tensor, torch.Tensor] | None = None
        self.replay: Callable[[], None] = self._eager
        self._run = lambda: model.run_layers(self.h, self.batch, kv_cache)

    def _eager(self) -> None:
        self.out = self._run()

    def load(self, h: torch.Tensor, batch: ForwardBatch) -> None:
        """Copy a step's inputs into the first rows; the other rows keep the pad values."""
        n = h.shape[0]
        self.h[:n].copy_(h)
        self.positions[:n].copy_(batch.positions)
        for g, plan in enumerate(batch.attn_plans):
            self.slots[g][:n].copy_(batch.slot_mappings[g])
            table = plan.decode_block_tables
            self.tables[g][:n, : table.shape[1]].copy_(table)
            self.lens[g][:n].copy_(plan.decode_seq_lens)

    def reset_padding(self, n: int) -> None:
        """Rows from `n` on back to the pad values (a smaller step than the last one)."""
        self.positions[n:] = 0
        for g in range(len(self.slots)):
            self.slots[g][n:] = self.pad_slot
            self.lens[g][n:] = 1
            self.tables[g][n:] = self.spare

    def capture(self, pool) -> None:
        """Record the layers as a CUDA graph (after two eager runs: Triton compiles and
        cuBLAS sets up its workspaces outside the capture)."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._run()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            self.out = self._run()
        self.replay = graph.replay


class GraphedDecode:
    """The "cuda_graphs" fast path bound to one KV cache; `capture` records the buckets."""

    def __init__(self, model, kv_cache: PagedKVCache):
        self.model, self.kv_cache = model, kv_cache
        self.graphs: dict[int, _Static] = {}
        self.capture_seconds = 0.0
        self._last_rows: dict[int, int] = {}

    def capture(self, sizes: list[int], max_context: int) -> float:
        """Record one graph per batch size in `sizes` for contexts up to `max_context`
        tokens; returns the seconds it took (reported at start)."""
        start = time.perf_counter()
        cache = self.kv_cache
        widths = [-(-max_context // cache.block_size)] * max(1, len(cache.groups))
        on_gpu = cache.device.type == "cuda"
        pool = torch.cuda.graph_pool_handle() if on_gpu else None
        for rows in sorted(sizes, reverse=True):  # the largest first: the others reuse memory
            static = _Static(self.model, cache, rows, widths, max_context)
            if on_gpu:
                static.capture(pool)
            self.graphs[rows] = static
        if on_gpu:
            torch.cuda.synchronize()
        self.capture_seconds = time.perf_counter() - start
        return self.capture_seconds

    def run(self, h: torch.Tensor, batch: ForwardBatch):
        plan = batch.attn_plans[0] if batch.attn_plans else None
        n = h.shape[0]
        if plan is None or not plan.decode_only or not self.graphs or n > max(self.graphs):
            return None  # prefill, or more rows than the largest bucket: the eager path
        rows = min(size for size in self.graphs if size >= n)
        static = self.graphs[rows]
        if self._last_rows.get(rows, rows) > n:
            static.reset_padding(n)
        self._last_rows[rows] = n
        static.load(h, batch)
        static.replay()
        h_out, delta = static.out
        return h_out[:n], delta[:n]


def _supports(model) -> bool:
    """Every layer's decode reads the plan's block tables (the Triton row) and nothing in a
    step depends on its data's values on the host (no experts' routing, no recurrent
    states, no latent attention)."""
    config = model.config
    if model.state_layers or config.moe is not None or config.mla is not None:
        return False
    if "triton" not in DECODE_BACKENDS:  # kernels="triton" registers it
        return False
    triton_row = DECODE_BACKENDS.get("triton")
    return all(getattr(layer.attn, "decode", None) is triton_row for layer in model.layers)


FAST_PATHS.register(
    "cuda_graphs",
    FastPath(
        applies=_supports,
        features=None,
        build=GraphedDecode,
        description="decode steps replayed from CUDA graphs captured per batch-size bucket",
    ),
)
