"""The host tier of a pool on a CUDA GPU (kvcache/tiers/copies.py), run by
benchmarks/device_check.sh where a GPU is lent (skipped elsewhere; the CPU path is
test_kv_tiers.py / test_compact_blocks.py): host copies in pinned memory, copies on a side
stream ordered against the compute stream by events.

The ordering tests make the ordering matter: the compute stream (or the side stream) is kept
busy with a spin (`torch.cuda._sleep`) while the host queues a save or a load, so a missing
wait would read or overwrite the block too early and the values checked would differ. The
GPU machine has no transformers: the engine test builds its model from random tensors.
"""

from __future__ import annotations

import pytest
import torch

from infergen.config import ModelConfig
from infergen.engine.engine import Engine
from infergen.engine.options import engine_config
from infergen.engine.sampling_params import SamplingParams
from infergen.io.random_checkpoint import random_checkpoint
from infergen.kvcache.paged_cache import PagedKVCache
from infergen.kvcache.prefix import block_hash
from infergen.kvcache.tiers.compact import AS_STORED, OFFLOAD_FORMATS
from infergen.kvcache.tiers.copies import CudaCopies, host_copies
from infergen.kvcache.tiers.disk import DiskTier
from infergen.kvcache.tiers.host import HostTier
from infergen.kvcache.tiers.tiered import KVTiers
from tests.engine.greedy import assert_greedy_equivalent
from tests.hf_models import BASE

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
SPIN = 100_000_000  # GPU clock cycles of torch.cuda._sleep: tens of milliseconds
FP8 = OFFLOAD_FORMATS.get("fp8_e4m3")
KEY, OTHER = block_hash(None, [1]), block_hash(None, [2])


def _tiers(dtype=torch.float32, budget_blocks=64, spill=None, codec=AS_STORED):
    """A pool of 8 blocks on the GPU, a host tier of `budget_blocks` blocks, their KVTiers."""
    config = ModelConfig(architecture="llama", head_dim=16, num_key_value_heads=2, **BASE)
    cache = PagedKVCache(config, 8, 8, dtype, device="cuda")
    copies = host_copies(cache.device)
    page = cache.storage[:, :, 0]
    host = HostTier(budget_blocks * codec.stored_bytes(page.shape, dtype), spill, copies)
    return cache, host, KVTiers(cache, [host], codec=codec, copies=copies)


def test_host_copies_are_pinned_and_come_back_bit_exact():
    cache, host, tiers = _tiers()
    assert isinstance(tiers.copies, CudaCopies) and host.copies is tiers.copies
    cache.storage.normal_()
    want = cache.storage[:, :, 2].cpu()
    tiers.save(2, KEY, None)
    cache.storage[:, :, 2].zero_()  # the pool reused the block
    assert tiers.load(KEY, 5)
    torch.cuda.synchronize()
    stored = host.get(KEY)
    assert stored.device.type == "cpu" and stored.is_pinned()
    assert torch.equal(stored, want) and torch.equal(cache.storage[:, :, 5].cpu(), want)


def test_a_save_copies_what_the_compute_stream_wrote_and_nothing_later():
    """The compute stream spins, then writes 1 into the block; the host saves it at once and
    queues a write of 2 into it: the tier holds the 1s (the copy waited for the first write,
    the second waited for the copy)."""
    cache, host, tiers = _tiers()
    torch.cuda.synchronize()
    torch.cuda._sleep(SPIN)
    cache.storage[:, :, 2].fill_(1.0)
    tiers.save(2, KEY, None)
    cache.storage[:, :, 2].fill_(2.0)
    torch.cuda.synchronize()
    assert torch.all(host.get(KEY) == 1.0)


def test_the_step_after_a_load_reads_the_loaded_block():
    """The side stream spins before the load's copy: a read the compute stream queues right
    after the load still sees the loaded values (it waited on the copy's event)."""
    cache, host, tiers = _tiers()
    cache.storage[:, :, 2].fill_(3.0)
    tiers.save(2, KEY, None)
    torch.cuda.synchronize()
    cache.storage.zero_()
    with torch.cuda.stream(tiers.copies.side):
        torch.cuda._sleep(SPIN)
    assert tiers.load(KEY, 5)
    seen = cache.storage[:, :, 5].clone()  # the step reading the block
    torch.cuda.synchronize()
    assert torch.all(seen == 3.0)


def test_a_spilled_block_is_complete_on_disk(tmp_path):
    """A host tier of one block spills the older block to disk while its copy may still be in
    flight (the compute stream spun before writing it): the disk gets the complete block."""
    disk = DiskTier(tmp_path, 1 << 22, "fingerprint")
    cache, host, tiers = _tiers(budget_blocks=1, spill=disk.put)
    torch.cuda.synchronize()
    torch.cuda._sleep(SPIN)
    cache.storage[:, :, 2].fill_(1.0)
    tiers.save(2, KEY, None)
    cache.storage[:, :, 3].fill_(4.0)
    tiers.save(3, OTHER, None)  # evicts KEY from the host tier to the disk
    assert KEY in disk and KEY not in host
    assert torch.all(disk.get(KEY) == 1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compact_blocks_on_the_gpu_equal_the_cpu_encoding(dtype):
    """Encoded where the pool lives: the GPU's codes and scales equal the CPU's bit for bit
    (the CPU's are checked against ml_dtypes in test_compact_blocks.py), and so do the
    decoded blocks."""
    cache, host, tiers = _tiers(dtype, codec=FP8)
    gen = torch.Generator().manual_seed(0)
    page = (torch.randn(cache.storage[:, :, 2].shape, generator=gen) * 7).to(dtype)
    cache.storage[:, :, 2] = page.cuda()
    tiers.save(2, KEY, None)
    assert tiers.load(KEY, 5)
    torch.cuda.synchronize()
    want = FP8.encode(page)
    assert torch.equal(host.get(KEY), want)
    decoded = FP8.decode(want, page.shape, dtype).contiguous()
    assert torch.equal(cache.storage[:, :, 5].cpu(), decoded)


def _generate(engine: Engine, prompts: list[list[int]], params: SamplingParams) -> list:
    ids = [engine.add_request(prompt, params) for prompt in prompts]
    while engine.has_unfinished():
        engine.step()
    return [engine.output(i) for i in ids]


def _conversation() -> list[list[list[int]]]:
    """Each turn re-sends the last prompt plus new tokens, beside an unrelated prompt that
    evicts it from a small pool."""
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, 200, (40,), generator=gen).tolist()
    other = torch.randint(3, 200, (60,), generator=gen).tolist()
    turns = []
    for _ in range(4):
        turns.append([prompt, other])
        prompt = prompt + torch.randint(3, 200, (12,), generator=gen).tolist()
    return turns


@pytest.mark.parametrize("offload_format", [None, "fp8_e4m3"])
def test_engine_on_the_gpu_with_a_host_tier(offload_format):
    """A tiny random llama in fp32 on the GPU (Triton kernels, CUDA graphs), its pool too small
    for a conversation: with a host tier its prefix hits come back from pinned host memory and
    the greedy tokens equal the run without tiers (logprobs within 1e-3; with FP8 blocks
    within 0.01 — lossy, as on the CPU)."""
    limits = dict(block_size=4, num_kv_blocks=24, max_num_seqs=1, dtype="float32")
    plain = Engine(engine_config(device="cuda", **limits), random_checkpoint("llama_gqa"))
    tiered = Engine(
        engine_config(device="cuda", kv_offload_memory="1MiB", kv_offload_format=offload_format,
                      **limits),
        random_checkpoint("llama_gqa"),
    )  # fmt: skip
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=2)
    tolerance = 1e-3 if offload_format is None else 1e-2
    for turn in _conversation():
        want, got = _generate(plain, turn, params), _generate(tiered, turn, params)
        for a, b in zip(got, want, strict=True):
            assert_greedy_equivalent(a, b)
            for x, y in zip(a.logprobs, b.logprobs, strict=False):
                if x.token_id != y.token_id:
                    break
                assert abs(x.logprob - y.logprob) < tolerance
    tiers = tiered.kv_tiers
    assert isinstance(tiers.copies, CudaCopies) and tiers.loaded > 0
    host = tiers.tiers[0]
    assert all(data.is_pinned() for data in host._data.values())


def test_a_rider_page_comes_back_with_its_block_on_the_gpu():
    """A rider (kvcache/tiers/riders.py: the `mtp` layer's KV) packed on the GPU, through
    pinned host memory, and unpacked into its own cache's block (views of the device tensor
    at aligned offsets)."""
    cache, host, tiers = _tiers()
    config = ModelConfig(architecture="llama", **dict(BASE, num_hidden_layers=1, head_dim=6,
                                                      num_key_value_heads=1))  # fmt: skip
    rider = PagedKVCache(config, 8, 8, torch.bfloat16, device="cuda")
    tiers.carry(rider)
    cache.storage.normal_()
    rider.storage.normal_()
    want, want_rider = cache.storage[:, :, 2].cpu(), rider.storage[:, :, 2].cpu()
    tiers.save(2, KEY, None)
    cache.storage[:, :, 2].zero_()
    rider.storage[:, :, 2].zero_()
    assert tiers.load(KEY, 5)
    torch.cuda.synchronize()
    assert torch.equal(cache.storage[:, :, 5].cpu(), want)
    assert torch.equal(rider.storage[:, :, 5].cpu(), want_rider)
