# lab-01: write the functions below that raise NotImplementedError.
# Grade your work: make lab-01   Guide: labs/lab-01-block-allocator/README.md
"""The KV-cache block allocator, the free-block queue and the block pool: the file of lab-01.

You write the free-block queue (every method of ``FreeKVCacheBlockQueue`` but the given
``_unlink_after``) and the allocating half of ``BlockPool``: ``__init__``, ``get_new_blocks``,
``free_blocks``, ``get_num_free_blocks`` and ``get_usage``. ``KVCacheBlock`` is given (read it
first), and so is everything about prefix caching (``hash_block_tokens``, ``BlockHashToBlockMap``,
``cache_full_blocks``, ``touch``, eviction): that is lab-05, which works on this same file. The
engine keeps these classes in two modules, ``mini_vllm/core/kv_cache_utils.py`` and
``mini_vllm/core/block_pool.py``, as vLLM does; here they share one file so that you edit one file.

The grader checks the ownership and queue invariants (I1, I2) by reading your objects' attributes,
never through your own methods, so keep upstream's names (``prev_free_block``, ``next_free_block``,
``ref_cnt``, ``free_block_queue``, ...); it also checks that a reused block loses its old hash, the
eviction order, the misuse errors and that every operation costs O(1) per block. Every pool test
builds a pool, so until the queue and ``BlockPool.__init__`` work those tests report NOT STARTED:
write the queue first, and use ``get_all_free_blocks`` to look at it while you debug.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mini_vllm.core import kv_cache_utils
from mini_vllm.core.kv_cache_utils import (
    BlockHash,
    BlockHashWithGroupId,
    make_block_hash_with_group_id,
)

if TYPE_CHECKING:
    from mini_vllm.core.block_pool import KVCacheMetricsCollector
    from mini_vllm.request import Request

logger = logging.getLogger(__name__)


def hash_block_tokens(
    hash_function: Callable[[Any], bytes],
    parent_block_hash: BlockHash | None,
    curr_block_token_ids: Sequence[int],
    extra_keys: tuple[Any, ...] | None = None,
) -> BlockHash:
    """Return the chained hash of one full block: its parent's hash, its tokens, its extra keys.

    Chaining is what makes a hit on block ``i`` imply a hit on the whole prefix ``0..i``: the
    same tokens after a different prefix attend to different keys and values, so they must hash
    differently. ``parent_block_hash`` is ``None`` for the first block of a request, which then
    chains from :data:`NONE_HASH`.

    Args:
        hash_function: Maps ``(parent_hash, token_ids, extra_keys)`` to bytes, e.g. :func:`sha256`.
        parent_block_hash: Hash of the previous block, or ``None`` for the first block.
        curr_block_token_ids: The block's token ids; the block is assumed full.
        extra_keys: Anything else that changes the block's KV (adapter, salt, ...), or ``None``.
    """
    if parent_block_hash is None:
        parent_block_hash = kv_cache_utils.NONE_HASH
    return BlockHash(hash_function((parent_block_hash, tuple(curr_block_token_ids), extra_keys)))


@dataclass(slots=True, eq=False)
class KVCacheBlock:
    """Bookkeeping for one physical KV-cache page (``block_size`` token slots on the GPU).

    One object exists per page for the whole life of the pool, so a request's block table can hold
    the objects themselves and ids never change under a running request. The free-list links live
    on the block (rather than in separate list nodes) so that the free queue can unlink any block
    in O(1) without allocating anything.

    Blocks compare by identity: two block objects are the same block only if they are the same
    object (upstream compares fields).
    """

    # Index of the page in the KV cache tensors, 0 .. num_gpu_blocks - 1.
    block_id: int
    # Number of requests currently using the block; 0 means it is in the free queue.
    ref_cnt: int = 0
    # Cache key (block hash + group id); set only while the block is full and in the prefix cache.
    _block_hash: BlockHashWithGroupId | None = None
    # Free-list links, owned by FreeKVCacheBlockQueue; both None while the block is not queued.
    prev_free_block: KVCacheBlock | None = None
    next_free_block: KVCacheBlock | None = None
    # True only for the pool's null block, a placeholder that is never cached nor handed out.
    is_null: bool = False

    @property
    def block_hash(self) -> BlockHashWithGroupId | None:
        """The cache key of the block, or ``None`` while it is not in the prefix cache."""
        return self._block_hash

    @block_hash.setter
    def block_hash(self, block_hash: BlockHashWithGroupId) -> None:
        # A block's contents only change after it is evicted (reset_hash), so re-hashing a block
        # that still has a hash means two cache entries would describe one page.
        if self._block_hash is not None:
            raise RuntimeError(
                f"Block {self.block_id} already has a hash; call reset_hash() (evict it) before "
                "caching it again"
            )
        self._block_hash = block_hash

    def reset_hash(self) -> None:
        """Forget the block's hash: called when the block leaves the prefix cache."""
        self._block_hash = None

    def __repr__(self) -> str:
        # Show neighbours by id: the default repr would recurse along the whole free list.
        prev_id = self.prev_free_block.block_id if self.prev_free_block is not None else None
        next_id = self.next_free_block.block_id if self.next_free_block is not None else None
        return (
            f"KVCacheBlock(block_id={self.block_id}, ref_cnt={self.ref_cnt}, "
            f"_block_hash={self._block_hash!r}, prev_free_block={prev_id}, "
            f"next_free_block={next_id}, is_null={self.is_null})"
        )


class FreeKVCacheBlockQueue:
    """The free blocks, as a doubly linked list threaded through the blocks themselves.

    Why not ``collections.deque``? A prefix-cache hit revives a free block that may sit anywhere in
    the queue, and a deque can only remove from the middle in O(n). Linking the blocks through
    their own ``prev_free_block``/``next_free_block`` fields makes every operation O(1) per block,
    and, since no node objects are created, the operations allocate no Python objects (apart from
    the list that ``popleft_n`` returns), which keeps them close to deque speed.

    Two sentinel blocks (id -1) bound the list, so every real block always has both neighbours and
    linking code needs no empty-list or end-of-list branches. The sentinels are never returned.

    The order is the eviction order. It starts as block-id order; freed blocks are appended, so
    the least recently used block is at the front. Within one request the caller frees the tail
    of its block chain first (it passes the blocks reversed), so among blocks freed together the
    one covering the longest prefix, the least likely to be shared again, is evicted first. The
    queue itself only keeps the order it is given.

    Args:
        blocks: The initially free blocks, in queue order; they must not be linked anywhere.
    """

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        raise NotImplementedError(
            "lab-01: FreeKVCacheBlockQueue.__init__ — link the blocks in order between two "
            "sentinel blocks"
        )

    def popleft(self) -> KVCacheBlock:
        """Unlink and return the first (next to evict) free block.

        Raises:
            ValueError: if the queue is empty.
        """
        raise NotImplementedError(
            "lab-01: FreeKVCacheBlockQueue.popleft — unlink and return the front block "
            "(ValueError if empty)"
        )

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """Unlink and return the first ``n`` free blocks, in queue order.

        Raises:
            ValueError: if ``n`` is negative or larger than ``num_free_blocks``.
        """
        raise NotImplementedError(
            "lab-01: FreeKVCacheBlockQueue.popleft_n — unlink and return the first n blocks, in "
            "order"
        )

    def remove(self, block: KVCacheBlock) -> None:
        """Unlink ``block`` from wherever it is in the queue, in O(1).

        Raises:
            RuntimeError: if ``block`` is not linked into a free queue (or is a sentinel).
        """
        raise NotImplementedError(
            "lab-01: FreeKVCacheBlockQueue.remove — unlink a block from anywhere in O(1)"
        )

    def append(self, block: KVCacheBlock) -> None:
        """Link ``block`` at the back of the queue (it becomes the last to evict).

        Raises:
            RuntimeError: if ``block`` is already linked into a free queue.
        """
        raise NotImplementedError(
            "lab-01: FreeKVCacheBlockQueue.append — link a block in at the back"
        )

    def append_n(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Link ``blocks`` at the back of the queue, keeping their order.

        Raises:
            RuntimeError: if a block is already in a free queue or appears twice in ``blocks``;
                the queue is then left as it was.
        """
        raise NotImplementedError(
            "lab-01: FreeKVCacheBlockQueue.append_n — link blocks in at the back, in order"
        )

    def _unlink_after(self, anchor: KVCacheBlock, count: int) -> None:
        """Undo a partial ``append_n``: unlink the ``count`` blocks chained after ``anchor``."""
        block = anchor.next_free_block
        for _ in range(count):
            assert block is not None
            following = block.next_free_block
            block.prev_free_block = block.next_free_block = None
            block = following
        anchor.next_free_block = self.fake_free_list_tail

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """Return the free blocks front to back. O(n): meant for tests and debugging."""
        raise NotImplementedError(
            "lab-01: FreeKVCacheBlockQueue.get_all_free_blocks — list the free blocks front to "
            "back"
        )


class BlockHashToBlockMap:
    """The prefix cache: cache key -> the block, or blocks, currently holding that content.

    Several blocks can hold the same content. Two requests with the same prompt that are
    scheduled together each fill their own blocks before either is cached, and we do not merge
    the duplicates afterwards: a block id, once in a request's block table, must never change
    (block tables are append-only on the GPU side). So a key may map to more than one block.

    The common case is one block per key, stored directly; only a key with duplicates gets a
    ``{block_id: block}`` dict. Avoiding a dict per entry saves memory and garbage-collector work
    on a map that can hold every block of the GPU.
    """

    def __init__(self) -> None:
        self._cache: dict[BlockHashWithGroupId, KVCacheBlock | dict[int, KVCacheBlock]] = {}

    def get_one_block(self, key: BlockHashWithGroupId) -> KVCacheBlock | None:
        """Return a block cached under ``key``, or ``None``: any of its duplicates is a correct
        hit (upstream and the reference return the earliest cached)."""
        blocks = self._cache.get(key)
        if blocks is None:
            return None
        if isinstance(blocks, KVCacheBlock):
            return blocks
        return next(iter(blocks.values()))

    def insert(self, key: BlockHashWithGroupId, block: KVCacheBlock) -> None:
        """Cache ``block`` under ``key``, next to any block already cached there."""
        blocks = self._cache.get(key)
        if blocks is None:
            self._cache[key] = block
        elif isinstance(blocks, KVCacheBlock):
            self._cache[key] = {blocks.block_id: blocks, block.block_id: block}
        else:
            blocks[block.block_id] = block

    def pop(self, key: BlockHashWithGroupId, block_id: int) -> KVCacheBlock | None:
        """Remove block ``block_id`` from under ``key``; return it, or ``None`` if not there."""
        blocks = self._cache.get(key)
        if blocks is None:
            return None
        if isinstance(blocks, KVCacheBlock):
            if blocks.block_id != block_id:
                return None
            del self._cache[key]
            return blocks
        block = blocks.pop(block_id, None)
        if not blocks:
            del self._cache[key]
        return block

    def __len__(self) -> int:
        """Number of distinct keys (not blocks) in the cache."""
        return len(self._cache)


class BlockPool:
    """Owns every KV-cache block: allocation, reference counting, freeing and prefix caching.

    ``free_block_queue`` holds the blocks with ``ref_cnt == 0`` in eviction order, so allocation
    and eviction are the same operation: take from the front. ``cached_block_hash_to_block`` maps
    cache keys to the full blocks holding that prefix, whether in use or free, so a new request
    can find and share them.

    Block 0 is reserved as the *null block*: a placeholder that block tables use for positions
    that need no real page (sliding-window or skipped blocks upstream). It is taken out of the free
    queue at construction and is never handed out, cached or freed; its ``ref_cnt`` means nothing.

    Args:
        num_gpu_blocks: Number of pages in the KV cache, including the null block.
        enable_caching: Whether full blocks are kept in the prefix cache after being freed.
        hash_block_size: Number of tokens per hashed block (``request.block_hashes`` granularity).
        metrics_collector: Optional residency-metrics hooks, see :class:`KVCacheMetricsCollector`.
            Keyword-only: upstream passes ``enable_kv_cache_events`` before it, which mini-vLLM
            does not take (no KV cache events).
    """

    def __init__(
        self,
        num_gpu_blocks: int,
        enable_caching: bool,
        hash_block_size: int,
        *,
        metrics_collector: KVCacheMetricsCollector | None = None,
    ) -> None:
        """Make the blocks, the free queue and the prefix-cache map; reserve block 0.

        The other methods read these attributes, under upstream's names, so keep them:

        * ``num_gpu_blocks``, ``enable_caching``, ``hash_block_size``: the arguments;
        * ``blocks``: every ``KVCacheBlock``, ``blocks[i].block_id == i``;
        * ``free_block_queue``: a ``FreeKVCacheBlockQueue`` of all blocks, in id order, at
          first;
        * ``cached_block_hash_to_block``: an empty ``BlockHashToBlockMap``;
        * ``null_block``: block 0, popped from the free queue, with ``is_null = True``;
        * ``metrics_collector``: the argument (``get_new_blocks``, ``touch`` and eviction call
          the collector's hooks unless it is None).

        Raises:
            ValueError: if ``num_gpu_blocks`` is not an int >= 1 or ``hash_block_size`` < 1.
        """
        raise NotImplementedError(
            "lab-01: BlockPool.__init__ — make the blocks, the free queue and the null block"
        )

    def get_cached_block(
        self, block_hash: BlockHash, kv_cache_group_ids: list[int]
    ) -> list[KVCacheBlock] | None:
        """Return one cached block per group in ``kv_cache_group_ids``, or ``None`` on any miss.

        A prefix is only reusable if every group caches it, hence all-or-nothing. The blocks are
        returned without taking a reference: the caller first decides how long a hit it can
        use, then claims exactly those blocks with :meth:`touch`.
        """
        cached_blocks: list[KVCacheBlock] = []
        for group_id in kv_cache_group_ids:
            key = make_block_hash_with_group_id(block_hash, group_id)
            block = self.cached_block_hash_to_block.get_one_block(key)
            if block is None:
                return None
            cached_blocks.append(block)
        return cached_blocks

    def cache_full_blocks(
        self,
        request: Request,
        blocks: list[KVCacheBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        kv_cache_group_id: int,
        block_mask: list[bool] | None = None,
    ) -> None:
        """Enter the request's newly full blocks into the prefix cache.

        The hashes themselves were computed by the request as its tokens arrived
        (``request.block_hashes``); this only attaches them to the blocks and indexes the blocks.
        Blocks ``blocks[num_cached_blocks:num_full_blocks]`` are cached; earlier ones already
        are. Null blocks, and blocks whose ``block_mask`` entry is False, are skipped.

        Args:
            request: The request owning ``blocks``; its ``block_hashes`` cover the full blocks.
            blocks: All blocks of the request, in token order.
            num_cached_blocks: How many leading blocks are already cached.
            num_full_blocks: How many leading blocks are full and cached after this call.
            block_size: Tokens per block; must equal the pool's ``hash_block_size``.
            kv_cache_group_id: The KV cache group the blocks belong to.
            block_mask: Optional flags for ``blocks[num_cached_blocks:num_full_blocks]``: False
                leaves that block out of the cache.

        Raises:
            ValueError: bad counts (too few hashes or blocks), mask length, or block size.
            RuntimeError: a block to cache already has a hash (nothing is cached then).
        """
        if num_cached_blocks >= num_full_blocks:
            return
        if block_size != self.hash_block_size:
            raise ValueError(
                f"block_size ({block_size}) must equal hash_block_size ({self.hash_block_size}): "
                "mini-vLLM supports one KV cache group"
            )
        if num_full_blocks > len(request.block_hashes):
            raise ValueError(
                f"Cannot cache {num_full_blocks} full blocks: the request has only "
                f"{len(request.block_hashes)} block hashes"
            )
        if num_full_blocks > len(blocks):
            raise ValueError(
                f"Cannot cache {num_full_blocks} full blocks: only {len(blocks)} blocks were given"
            )
        new_full_blocks = blocks[num_cached_blocks:num_full_blocks]
        if block_mask is not None and len(block_mask) != len(new_full_blocks):
            raise ValueError(
                f"block_mask has {len(block_mask)} entries for {len(new_full_blocks)} new full "
                "blocks"
            )
        selected = [
            (block, block_hash)
            for i, (block, block_hash) in enumerate(
                zip(new_full_blocks, request.block_hashes[num_cached_blocks:num_full_blocks])
            )
            if not block.is_null and (block_mask is None or block_mask[i])
        ]
        # Validate every block first, so a bad call leaves no block half-cached.
        for block, _ in selected:
            if block.block_hash is not None:
                raise RuntimeError(
                    f"Cannot cache block {block.block_id}: it already has a hash (was it cached "
                    "twice, or is num_cached_blocks too small?)"
                )
        for block, block_hash in selected:
            key = make_block_hash_with_group_id(block_hash, kv_cache_group_id)
            block.block_hash = key
            self.cached_block_hash_to_block.insert(key, block)

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Allocate ``num_blocks`` blocks from the front of the free queue, each with ref_cnt 1.

        The prefix cache is not consulted: hits are revived with :meth:`touch`. When caching is
        enabled, a popped block that still holds a cached prefix is evicted from the cache
        first, since its page is about to be overwritten. Each block handed out is reported to
        the ``metrics_collector``'s ``on_block_allocated``, when the pool has one.

        Raises:
            ValueError: if ``num_blocks`` is negative or more than the free blocks.
        """
        raise NotImplementedError(
            "lab-01: BlockPool.get_new_blocks — pop n blocks, evict stale hashes, set ref_cnt = "
            "1, report each"
        )

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        """Take ``block`` out of the prefix cache if it is in it; return whether it was.

        Called when a free block is reused (its contents are about to change) and by
        :meth:`evict_blocks`. Clearing the hash and the map entry together keeps them consistent.
        The ``metrics_collector`` hears ``on_block_evicted`` first, for every block this is
        called on, cached or not (as upstream: the collector then never holds a reused block).
        """
        if self.metrics_collector is not None:
            self.metrics_collector.on_block_evicted(block)
        key = block.block_hash
        if key is None:
            return False
        if self.cached_block_hash_to_block.pop(key, block.block_id) is None:
            return False
        block.reset_hash()
        return True

    def touch(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Take a reference on each of ``blocks``, reviving free ones from the free queue.

        This is how a prefix-cache hit is claimed: a hit block may be in use by another request
        (just count one more user) or free but still cached, in which case it must leave the
        free queue, from wherever it is, in O(1), so it cannot be evicted while in use. Each
        touched block is reported to the ``metrics_collector``'s ``on_block_accessed``, if any.

        Raises:
            ValueError: if a block is the null block (no block is touched then).
            RuntimeError: if a block has ref_cnt 0 but is not in the free queue.
        """
        for block in blocks:
            if block.is_null:
                raise ValueError(
                    f"Cannot touch the null block (block {block.block_id}): it is a placeholder "
                    "that is never shared"
                )
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1
            if self.metrics_collector is not None:
                self.metrics_collector.on_block_accessed(block)

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference on each block; blocks reaching 0 join the free queue in order.

        The order is the eviction order: pass the block evicted first, first. A request passes
        its blocks reversed, so the tail of its chain is evicted before the shared head. A block
        listed twice joins at the entry that drops it to 0 (the second, if it held two).

        Raises:
            ValueError: for the null block or a block whose ref_cnt is already 0 (double free);
                no block of the call is freed then.
        """
        raise NotImplementedError(
            "lab-01: BlockPool.free_blocks — decrement ref counts; append blocks reaching 0, in "
            "order"
        )

    def evict_blocks(self, block_ids: set[int]) -> None:
        """Remove the given blocks from the prefix cache (their pages are not freed).

        Used when the contents of blocks turn out to be invalid (e.g. a failed KV transfer): the
        blocks stay allocated to whoever holds them but can no longer produce cache hits.

        Raises:
            ValueError: if an id is not a block of this pool (nothing is evicted then).
        """
        for block_id in block_ids:
            if not 0 <= block_id < self.num_gpu_blocks:
                raise ValueError(
                    f"Cannot evict block {block_id}: block ids are 0 .. {self.num_gpu_blocks - 1}"
                )
        for block_id in block_ids:
            self._maybe_evict_cached_block(self.blocks[block_id])

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix, e.g. after a weight update made the cached KV stale.

        Only possible while no request holds a block: an in-use block's hash will be needed when
        its request frees it. Returns whether the reset happened; a reset also resets the
        ``metrics_collector``, if any.
        """
        num_used_blocks = self.num_gpu_blocks - self.get_num_free_blocks() - 1  # minus null
        if num_used_blocks != 0:
            logger.warning(
                "Cannot reset the prefix cache: %d blocks are still in use", num_used_blocks
            )
            return False
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        for block in self.blocks:
            block.reset_hash()
        if self.metrics_collector is not None:
            self.metrics_collector.reset()
        logger.info("Prefix cache reset")
        return True

    def get_num_free_blocks(self) -> int:
        """Number of blocks in the free queue (free, whether cached or not)."""
        raise NotImplementedError(
            "lab-01: BlockPool.get_num_free_blocks — the number of free blocks, in O(1)"
        )

    def get_usage(self) -> float:
        """Fraction of the usable blocks (all but the null block) that are in use, in [0, 1]."""
        raise NotImplementedError(
            "lab-01: BlockPool.get_usage — the fraction of usable blocks in use"
        )
