"""KV blocks: allocation arithmetic, reference counts, prefix-cache hits and eviction order."""

from __future__ import annotations

import pytest

from turnout.engine.block_pool import ROOT_HASH, BlockPool, hash_block_tokens
from turnout.engine.kv_cache_manager import KVCacheManager
from turnout.engine.request import Request
from turnout.engine.sampling_params import SamplingParams

_arrival = iter(range(10**9))


def _req(req_id: str, tokens: list[int], **params: object) -> Request:
    return Request(req_id, tokens, SamplingParams(**params), next(_arrival))  # type: ignore[arg-type]


# (num_tokens, block_size, blocks needed)
ALLOC = [
    (1, 16, 1),
    (15, 16, 1),
    (16, 16, 1),
    (17, 16, 2),
    (32, 16, 2),
    (33, 16, 3),
    (5, 4, 2),
    (8, 4, 2),
]


@pytest.mark.parametrize(("num_tokens", "block_size", "want"), ALLOC)
def test_blocks_for_a_prompt(num_tokens: int, block_size: int, want: int) -> None:
    kv = KVCacheManager(num_blocks=8, block_size=block_size)
    req = _req("a", list(range(num_tokens)))
    blocks = kv.allocate_slots(req, num_tokens)
    assert blocks is not None and len(blocks) == want
    assert kv.num_free_blocks == 8 - want
    assert kv.get_block_ids("a") == [b.block_id for b in blocks]


def test_growth_by_decode_and_refusal_when_full() -> None:
    kv = KVCacheManager(num_blocks=2, block_size=4)
    req = _req("a", [1, 2, 3])
    assert len(kv.allocate_slots(req, 3)) == 1
    req.num_computed_tokens = 3
    assert kv.allocate_slots(req, 1) == []  # token 4 still fits block 0
    req.num_computed_tokens = 4
    assert len(kv.allocate_slots(req, 1)) == 1  # token 5 opens block 1
    req.num_computed_tokens = 8
    other = _req("b", [9])
    assert kv.allocate_slots(req, 1) is None and kv.allocate_slots(other, 1) is None
    assert kv.num_free_blocks == 0
    kv.free(req)
    assert kv.num_free_blocks == 2 and kv.allocate_slots(other, 1) is not None


def test_hash_chain_depends_on_prefix_and_content() -> None:
    h1 = hash_block_tokens(ROOT_HASH, [1, 2, 3, 4])
    assert h1 == hash_block_tokens(ROOT_HASH, [1, 2, 3, 4])
    assert h1 != hash_block_tokens(ROOT_HASH, [1, 2, 3, 5])
    assert hash_block_tokens(h1, [5, 6, 7, 8]) != hash_block_tokens(ROOT_HASH, [5, 6, 7, 8])


# (prompt of the second request relative to a cached 40-token first request, hit tokens)
HITS = [
    ("same 40 tokens", list(range(40)), 32),
    ("exactly 32 tokens: the last is recomputed", list(range(32)), 16),
    ("33 tokens", list(range(33)), 32),
    ("differs in block 1", [*range(20), 999, *range(21, 40)], 16),
    ("differs in token 0", [999, *range(1, 40)], 0),
    ("shorter than a block", list(range(10)), 0),
]


@pytest.mark.parametrize(("note", "prompt", "want"), HITS, ids=[h[0] for h in HITS])
def test_prefix_cache_hits(note: str, prompt: list[int], want: int) -> None:
    kv = KVCacheManager(num_blocks=16, block_size=16)
    first = _req("first", list(range(40)))
    kv.allocate_slots(first, 40)
    first_ids = kv.get_block_ids("first")
    kv.free(first)  # freed but still cached
    second = _req("second", prompt)
    hits, num_hit = kv.get_computed_blocks(second)
    assert num_hit == want
    assert [b.block_id for b in hits] == first_ids[: len(hits)]
    blocks = kv.allocate_slots(second, len(prompt) - num_hit, hits)
    assert blocks is not None
    assert kv.get_block_ids("second")[: len(hits)] == [b.block_id for b in hits]
    assert all(b.ref_cnt == 1 for b in hits)


def test_hits_while_in_use_share_blocks_with_reference_counts() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=4)
    a, b = _req("a", list(range(9))), _req("b", list(range(9)))
    kv.allocate_slots(a, 9)
    hits, num_hit = kv.get_computed_blocks(b)
    assert num_hit == 8
    kv.allocate_slots(b, 1, hits)
    assert [blk.ref_cnt for blk in hits] == [2, 2]
    assert kv.num_free_blocks == 8 - 3 - 1
    kv.free(a)
    assert [blk.ref_cnt for blk in hits] == [1, 1]
    kv.free(b)
    assert kv.num_free_blocks == 8
    assert all(blk.ref_cnt == 0 for blk in kv.block_pool.blocks)


def test_prompt_logprobs_requests_do_not_read_the_cache() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=4)
    a = _req("a", list(range(9)))
    kv.allocate_slots(a, 9)
    assert kv.get_computed_blocks(_req("b", list(range(9)), prompt_logprobs=1)) == ([], 0)
    assert KVCacheManager(8, 4, enable_caching=False).get_computed_blocks(
        _req("c", list(range(9)))
    ) == ([], 0)


def test_free_cached_hits_are_not_counted_twice() -> None:
    # 3 blocks: a cached free prefix (2 blocks) is taken by the hit, leaving 1 for new blocks.
    kv = KVCacheManager(num_blocks=3, block_size=4)
    a = _req("a", list(range(8)))
    kv.allocate_slots(a, 8)
    kv.free(a)
    b = _req("b", [*range(8), 50, 51, 52, 53, 54])  # 13 tokens: 2 hit + 2 new blocks
    hits, num_hit = kv.get_computed_blocks(b)
    assert num_hit == 8
    assert kv.allocate_slots(b, 5, hits) is None  # needs 2 new blocks, only 1 truly free
    assert kv.num_free_blocks == 3 and all(blk.ref_cnt == 0 for blk in kv.block_pool.blocks)
    assert kv.allocate_slots(b, 4, hits) is not None  # 12 tokens: 1 new block


def test_eviction_takes_least_recently_freed_and_tails_first() -> None:
    pool = BlockPool(4)
    blocks = pool.get_new_blocks(4)
    for i, blk in enumerate(blocks):
        pool.cache_full_block(blk, bytes([i]))
    pool.free_blocks(reversed(blocks[:2]))  # a request's blocks 0, 1: tail first
    pool.free_blocks(reversed(blocks[2:]))
    taken = pool.get_new_blocks(1)[0]
    assert taken is blocks[1]  # the first freed: the tail of the first request
    assert pool.get_cached_block(bytes([1])) is None  # evicted
    assert pool.get_cached_block(bytes([0])) is blocks[0]  # still findable
    with pytest.raises(ValueError, match="freed more often"):
        pool.free_blocks([blocks[0]])


def test_drafts_are_never_cached() -> None:
    kv = KVCacheManager(num_blocks=4, block_size=4)
    req = _req("a", [1, 2, 3])
    req.spec_token_ids = [4, 5]
    kv.allocate_slots(req, 5)  # 3 prompt tokens + 2 drafts span 2 blocks, none full of known tokens
    assert kv.block_pool.num_cached_blocks == 0
    req.append_output_token(4)
    req.num_computed_tokens = 4
    kv.allocate_slots(req, 1)
    assert kv.block_pool.num_cached_blocks == 1
