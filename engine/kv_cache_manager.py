"""Paged KV-cache bookkeeping per request: which physical blocks hold its tokens, prefix-cache
lookups, and the ``can allocate → allocate → free`` protocol the scheduler drives.

Token ``i`` of a request lives in block ``block_ids[i // block_size]`` at offset
``i % block_size``: its KV slot is ``block_id * block_size + offset`` (the runners'
``slot_mapping``). The design follows vLLM V1's ``KVCacheManager`` (vLLM PR #10321).
"""

from __future__ import annotations

from dataclasses import dataclass

from turnout.engine.block_pool import ROOT_HASH, BlockPool, KVCacheBlock, hash_block_tokens
from turnout.engine.request import Request


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative ints."""
    return -(-a // b)


@dataclass
class PrefixCacheStats:
    """Prefix-cache lookups since start: tokens asked for and tokens found."""

    num_queries: int = 0
    num_query_tokens: int = 0
    num_hit_tokens: int = 0

    @property
    def hit_rate(self) -> float:
        return self.num_hit_tokens / self.num_query_tokens if self.num_query_tokens else 0.0


class KVCacheManager:
    """Maps requests to KV blocks.

    Args:
        num_blocks: physical blocks in the cache.
        block_size: tokens per block (16 by default, as vLLM).
        enable_caching: prefix caching by hash of full blocks.
    """

    def __init__(self, num_blocks: int, block_size: int = 16, enable_caching: bool = True) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(num_blocks, enable_caching)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        # Blocks of each request already entered in the prefix cache (a prefix of its list).
        self._num_cached_blocks: dict[str, int] = {}
        self.prefix_cache_stats = PrefixCacheStats()

    @property
    def num_blocks(self) -> int:
        return self.block_pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.num_free_blocks

    @property
    def usage(self) -> float:
        """Fraction of blocks held by requests (cached free blocks count as free)."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def update_block_hashes(self, request: Request) -> None:
        """Extend ``request.block_hashes`` to every full block of its known tokens."""
        size = self.block_size
        hashes = request.block_hashes
        while len(hashes) < request.num_tokens // size:
            start = len(hashes) * size
            parent = hashes[-1] if hashes else ROOT_HASH
            hashes.append(hash_block_tokens(parent, request.all_token_ids[start : start + size]))

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """The longest cached prefix of ``request`` in full blocks, and its length in tokens.

        The last token is never taken from the cache (its logits must be computed), and
        requests that want prompt logprobs or pooling compute every token.
        """
        if not self.enable_caching or request.wants_prompt_logprobs or request.pooling:
            return [], 0
        self.update_block_hashes(request)
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        hits: list[KVCacheBlock] = []
        for block_hash in request.block_hashes[:max_hit_blocks]:
            block = self.block_pool.get_cached_block(block_hash)
            if block is None:
                break
            hits.append(block)
        num_hit_tokens = len(hits) * self.block_size
        stats = self.prefix_cache_stats
        stats.num_queries += 1
        stats.num_query_tokens += request.num_tokens
        stats.num_hit_tokens += num_hit_tokens
        return hits, num_hit_tokens

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: list[KVCacheBlock] | None = None,
    ) -> list[KVCacheBlock] | None:
        """Reserve blocks for ``num_new_tokens`` tokens after the request's computed ones.

        Args:
            request: its ``num_computed_tokens`` is the count before this step.
            num_new_tokens: tokens to compute this step (drafts included).
            new_computed_blocks: prefix-cache hits from :meth:`get_computed_blocks`, taken
                only when the allocation succeeds.

        Returns:
            The newly allocated blocks (possibly none), or ``None`` when there are not enough
            free blocks; then nothing changed.
        """
        blocks = self.req_to_blocks.get(request.req_id)
        num_total = request.num_computed_tokens + num_new_tokens
        if (
            blocks is not None
            and not new_computed_blocks
            and num_total <= len(blocks) * self.block_size
        ):
            # The common decode step: the request's last block has room, nothing to take; a
            # block that has just filled up still enters the prefix cache.
            if self.enable_caching:
                num_full = min(num_total, request.num_tokens) // self.block_size
                if num_full > self._num_cached_blocks.get(request.req_id, 0):
                    self._cache_full_blocks(request, num_full)
            return []
        return self._allocate_new_blocks(
            request, num_new_tokens, new_computed_blocks or [], blocks or []
        )

    def _allocate_new_blocks(
        self,
        request: Request,
        num_new_tokens: int,
        computed: list[KVCacheBlock],
        blocks: list[KVCacheBlock],
    ) -> list[KVCacheBlock] | None:
        num_total = request.num_computed_tokens + len(computed) * self.block_size + num_new_tokens
        num_required = max(0, cdiv(num_total, self.block_size) - len(blocks) - len(computed))
        # Free cached hits leave the free list when taken: they are not available twice.
        num_free_hits = sum(1 for block in computed if block.ref_cnt == 0)
        if num_required > self.num_free_blocks - num_free_hits:
            return None
        blocks = self.req_to_blocks.setdefault(request.req_id, blocks)
        if computed:
            self.block_pool.touch(computed)
            blocks.extend(computed)
            self._num_cached_blocks[request.req_id] = len(blocks)
        new_blocks = self.block_pool.get_new_blocks(num_required)
        blocks.extend(new_blocks)
        # Only blocks whose tokens are all known are cached: drafts may be rejected.
        self._cache_full_blocks(request, min(num_total, request.num_tokens) // self.block_size)
        return new_blocks

    def free(self, request: Request) -> None:
        """Release the request's blocks (tail first, so prefix heads outlive their tails)."""
        blocks = self.req_to_blocks.pop(request.req_id, [])
        self._num_cached_blocks.pop(request.req_id, None)
        self.block_pool.free_blocks(reversed(blocks))

    def get_block_ids(self, req_id: str) -> list[int]:
        """Physical block ids of the request, in token order."""
        return [block.block_id for block in self.req_to_blocks.get(req_id, [])]

    def reset_prefix_cache(self) -> None:
        self.block_pool.reset_prefix_cache()

    def _cache_full_blocks(self, request: Request, num_full_blocks: int) -> None:
        if not self.enable_caching:
            return
        start = self._num_cached_blocks.get(request.req_id, 0)
        if num_full_blocks <= start:
            return
        self.update_block_hashes(request)
        blocks = self.req_to_blocks[request.req_id]
        for i in range(start, num_full_blocks):
            self.block_pool.cache_full_block(blocks[i], request.block_hashes[i])
        self._num_cached_blocks[request.req_id] = num_full_blocks


__all__ = ["KVCacheManager", "PrefixCacheStats", "cdiv"]
