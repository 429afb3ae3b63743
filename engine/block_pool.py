"""The pool of physical KV blocks: reference counts, an LRU free list, and the prefix cache.

A block is *free* when no request holds it (``ref_cnt == 0``). A free block that holds a full,
hashed block of tokens stays in the prefix cache until it is handed out again, so a later
request with the same prefix can take it back (vLLM's "automatic prefix caching", V1 design
doc). The free list is ordered for eviction: least recently freed first, and a request's blocks
are freed tail first so that the ends of prefixes are evicted before their beginnings.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

#: The hash of "no parent" (the first block of a sequence).
ROOT_HASH = b"turnout-kv-root"


def hash_block_tokens(parent_hash: bytes, token_ids: Sequence[int]) -> bytes:
    """Content hash of one full block, chained on its parent's hash.

    SHA-256 over the parent's digest and the tokens as int64 (collisions would make one
    request read another's KV; vLLM moved to SHA-256 for the same reason, PR #15297).
    """
    digest = hashlib.sha256(parent_hash)
    digest.update(array("q", token_ids).tobytes())
    return digest.digest()


@dataclass(eq=False)
class KVCacheBlock:
    """One physical block: ``block_size`` token slots of every layer's K and V."""

    block_id: int
    ref_cnt: int = 0
    block_hash: bytes | None = None


class BlockPool:
    """Owns every block of the KV cache.

    Args:
        num_blocks: physical blocks in the cache (``>= 1``).
        enable_caching: keep freed full blocks findable by their hash.
    """

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        # Free block ids in eviction order (front = next to hand out); O(1) removal on a hit.
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[bytes, KVCacheBlock] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    def get_cached_block(self, block_hash: bytes) -> KVCacheBlock | None:
        """The block holding ``block_hash``'s tokens, in use or free, if still cached."""
        return self._cached.get(block_hash)

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Take ``num_blocks`` free blocks (evicting their cached content), ``ref_cnt = 1``.

        Raises:
            ValueError: fewer than ``num_blocks`` blocks are free (callers check first).
        """
        if num_blocks > len(self._free):
            raise ValueError(f"asked for {num_blocks} blocks, {len(self._free)} free")
        out = []
        for _ in range(num_blocks):
            block_id, _ = self._free.popitem(last=False)
            block = self.blocks[block_id]
            self._evict(block)
            block.ref_cnt = 1
            out.append(block)
        return out

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference on cached blocks a request reuses (removing free ones from the list)."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self._free[block.block_id]
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop a reference on each block; those reaching 0 join the free list in this order."""
        for block in ordered_blocks:
            if block.ref_cnt <= 0:
                raise ValueError(f"block {block.block_id} freed more often than taken")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._free[block.block_id] = None

    def cache_full_block(self, block: KVCacheBlock, block_hash: bytes) -> None:
        """Make ``block`` findable by ``block_hash`` (first writer wins on duplicates)."""
        if not self.enable_caching or block.block_hash is not None:
            return
        if block_hash in self._cached:
            return  # the same tokens are already cached in another block
        block.block_hash = block_hash
        self._cached[block_hash] = block

    def reset_prefix_cache(self) -> None:
        """Forget every cached hash (blocks in use keep their data, not their hash)."""
        for block in self._cached.values():
            block.block_hash = None
        self._cached.clear()

    def _evict(self, block: KVCacheBlock) -> None:
        if block.block_hash is not None:
            if self._cached.get(block.block_hash) is block:
                del self._cached[block.block_hash]
            block.block_hash = None


__all__ = ["ROOT_HASH", "BlockPool", "KVCacheBlock", "hash_block_tokens"]
