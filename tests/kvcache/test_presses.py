"""KV presses at the op level: each KV head's kept positions (against a brute-force ranking),
compaction moving exactly the chosen tokens (values and FP8 codes, byte for byte), and attention
over a compacted page equal to attention over the full cache masked to the kept tokens."""

from __future__ import annotations

import pytest
import torch

from infergen.kvcache.kv_protocol import KVLayer
from infergen.kvcache.presses import PRESSES, kept_count, kept_positions
from infergen.kvcache.presses.compact import compact_layer


def test_kept_count_and_positions_against_a_brute_force_ranking():
    """Each head keeps its `keep` best positions, ascending; ties go to the later position
    (a press scoring by position alone keeps the most recent); ratio 0 keeps every token."""
    assert [kept_count(n, 0.5) for n in (1, 2, 7, 100)] == [1, 1, 4, 50]
    assert kept_count(37, 0.0) == 37 and kept_count(4, 0.9) == 1
    torch.manual_seed(0)
    scores = torch.randint(0, 5, (3, 40)).float()  # many ties
    scores[1, :4] = float("inf")
    got = kept_positions(scores, 11)
    for head in range(3):
        ranked = sorted(range(40), key=lambda p: (-scores[head, p].item(), -p))[:11]
        assert got[head].tolist() == sorted(ranked)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float8_e4m3fn])
def test_compaction_moves_exactly_the_chosen_tokens(dtype):
    """Per KV head its own tokens land in the new slots in position order: the pages' bytes
    there equal the old slots' bytes (FP8 codes too), nothing else is written."""
    torch.manual_seed(1)
    blocks, size, heads, dim = 12, 4, 3, 8
    k = torch.randn(blocks, size, heads, dim).to(dtype)
    v = torch.randn(blocks, size, heads, dim).to(dtype)
    before_k, before_v = k.clone(), v.clone()
    old = torch.tensor([2, 5, 7, 9, 11]).repeat_interleave(size) * size + torch.arange(size).repeat(
        5
    )  # 20 positions in blocks 2, 5, 7, 9, 11
    chosen = torch.stack([torch.randperm(20)[:9].sort().values for _ in range(heads)])
    new = torch.tensor([0, 3, 4]).repeat_interleave(size)[:9] * size + torch.arange(9) % size
    compact_layer(KVLayer(k, v), old[chosen], new)
    flat = [t.view(torch.uint8) if t.element_size() == 1 else t for t in (k, v)]
    was = [t.view(torch.uint8) if t.element_size() == 1 else t for t in (before_k, before_v)]
    for page, ref in zip(flat, was, strict=True):
        page, ref = page.reshape(-1, heads, dim), ref.reshape(-1, heads, dim)
        for h in range(heads):
            assert torch.equal(page[new, h], ref[old[chosen[h]], h])
        untouched = torch.ones(page.shape[0], dtype=torch.bool)
        untouched[new] = False
        assert torch.equal(page[untouched], ref[untouched])


def test_attention_over_a_compacted_page_equals_masked_full_attention():
    """A decode query per head over the compacted slots equals softmax attention over all the
    positions with the removed ones masked out (each KV head its own mask; GQA: two query
    heads per KV head), within 1e-5."""
    torch.manual_seed(2)
    tokens, kv_heads, group, dim, size = 50, 2, 2, 16, 8
    keys, values = torch.randn(tokens, kv_heads, dim), torch.randn(tokens, kv_heads, dim)
    q = torch.randn(kv_heads * group, dim)
    scores = PRESSES.get("knorm").scores(keys, None, dim**-0.5, 0)
    keep = kept_count(tokens, 0.6)
    chosen = kept_positions(scores, keep)  # [kv_heads, keep]
    pages = [torch.zeros(16, size, kv_heads, dim) for _ in range(2)]
    pages[0].view(-1, kv_heads, dim)[:tokens] = keys
    pages[1].view(-1, kv_heads, dim)[:tokens] = values
    new_slots = 64 + torch.arange(keep)  # blocks 8.. (past the old ones)
    compact_layer(KVLayer(*pages), chosen, new_slots)
    k_new = pages[0].view(-1, kv_heads, dim)[new_slots]  # [keep, kv_heads, dim]
    v_new = pages[1].view(-1, kv_heads, dim)[new_slots]
    for head in range(kv_heads * group):
        kv_head = head // group
        got = torch.softmax(k_new[:, kv_head] @ q[head] * dim**-0.5, 0) @ v_new[:, kv_head]
        mask = torch.full((tokens,), float("-inf"))
        mask[chosen[kv_head]] = 0
        logits = keys[:, kv_head] @ q[head] * dim**-0.5 + mask
        want = torch.softmax(logits, 0) @ values[:, kv_head]
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_position_presses_keep_what_they_say():
    """`streaming` keeps the 4 sinks and the most recent tokens, the same for every head;
    `random` is reproducible per layer and differs between layers."""
    keys = torch.randn(30, 2, 8)
    kept = kept_positions(PRESSES.get("streaming").scores(keys, None, 1.0, 0), 10)
    assert kept.tolist() == [[0, 1, 2, 3, *range(24, 30)]] * 2
    press = PRESSES.get("random")
    assert torch.equal(press.scores(keys, None, 1.0, 3), press.scores(keys, None, 1.0, 3))
    assert not torch.equal(press.scores(keys, None, 1.0, 3), press.scores(keys, None, 1.0, 4))
