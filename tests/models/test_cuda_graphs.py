"""The CUDA-graph decode path (models/cuda_graphs.py) without a GPU: its "graphs" run the
layers eagerly on the same static, padded buffers, so the bucketing and padding logic is
checked here against the eager path (the device check replays real graphs on a GPU).

Metamorphic: decode steps of 1..5 sequences run in buckets of 1, 2, 4 and 8 rows (padded rows
write to the cache's spare block) give the same greedy tokens and logprobs as the per-op
path, with prefix hits and sequences finishing at different steps (so a bucket serves fewer
rows than it did the step before)."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from infergen import LLM, SamplingParams
from infergen.engine import build
from infergen.models.cuda_graphs import GraphedDecode, buckets
from tests.engine.greedy import assert_greedy_equivalent
from tests.hf_models import build_hf_model

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs Triton and its interpreter (the graph path runs the Triton decode row)",
)


@pytest.mark.parametrize(
    ("max_num_seqs", "expected"),
    [(1, [1]), (2, [1, 2]), (5, [1, 2, 4, 5]), (8, [1, 2, 4, 8]), (64, [1, 2, 4, 8, 16, 32, 64])],
)
def test_buckets_are_powers_of_two_up_to_max_num_seqs(max_num_seqs, expected):
    assert buckets(max_num_seqs) == expected


def test_padded_buckets_equal_the_eager_path(tmp_path, monkeypatch):
    build_hf_model("llama_gqa", tmp_path)
    gen = torch.Generator().manual_seed(5)
    shared = torch.randint(3, 200, (9,), generator=gen).tolist()
    prompts = [shared + torch.randint(3, 200, (n,), generator=gen).tolist() for n in (2, 7, 4)]
    prompts += [torch.randint(3, 200, (5,), generator=gen).tolist(), prompts[0]]
    lengths = (4, 6, 2, 7, 5)  # sequences leave at different steps: buckets shrink
    params = [
        SamplingParams(max_tokens=n, temperature=0, ignore_eos=True, logprobs=2) for n in lengths
    ]
    options = dict(kernels="triton", block_size=4, max_num_seqs=5, device="cpu")
    eager = LLM(str(tmp_path), **options)
    want = eager.generate(prompts, params)

    monkeypatch.setattr(build, "records_graphs", lambda config: True)  # the GPU's cache: a spare
    graphed = LLM(str(tmp_path), **options)
    model, cache = graphed.engine.runner.model, graphed.engine.kv_cache
    runner = GraphedDecode(model, cache)
    runner.capture(buckets(5), graphed.engine.max_model_len)
    model.fast_path, model._runner = "cuda_graphs", runner
    served = []  # (rows of the step, rows of the bucket that ran it)
    for rows, static in runner.graphs.items():
        static.load = lambda h, batch, rows=rows, load=static.load: (
            served.append((h.shape[0], rows)),
            load(h, batch),
        )
    got = graphed.generate(prompts, params)
    assert (3, 4) in served and len({rows for _, rows in served}) >= 3, served  # padded
    for a, b in zip(got, want, strict=True):
        assert_greedy_equivalent(a, b)
        for x, y in zip(a.logprobs, b.logprobs, strict=False):
            if x.token_id != y.token_id:
                break
            assert abs(x.logprob - y.logprob) < 1e-4
    assert cache.spare_block == cache.num_blocks  # past every block the pool hands out
