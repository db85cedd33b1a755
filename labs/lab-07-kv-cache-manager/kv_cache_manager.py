# lab-07: write the functions below that raise NotImplementedError.
# Grade your work: make lab-07   Guide: labs/lab-07-kv-cache-manager/README.md
"""The KV cache manager, the scheduler's interface to the paged KV cache: the file of lab-07.

``KVCacheManager`` knows requests (which blocks each holds, how many of them are already published
in the prefix cache, how many more a step needs); the ``BlockPool`` underneath knows blocks. You
write eleven of its methods: ``usage``, ``get_block_ids``, ``find_longest_cache_hit``,
``get_computed_blocks``, ``make_prefix_cache_stats``, ``allocate_slots`` with its four helpers
(``get_num_blocks_to_allocate``, ``allocate_new_computed_blocks``, ``allocate_new_blocks``,
``cache_blocks``) and ``free``. The rest is given (read ``__init__`` first). vLLM spreads this over
three classes (``KVCacheManager``, ``KVCacheCoordinator``, ``FullAttentionManager``); with one KV
cache group the middle one has nothing to coordinate, so here they are one class that keeps
upstream's method names.

The grader reads your manager's attributes (``req_to_blocks``, ``num_cached_block``, the pool's
reference counts, hashes and free queue) rather than trusting its methods, and runs a random
workload checked after every step. The pool is imported from ``mini_vllm.core.block_pool``: the
engine's, or with ``--chain`` your own lab-01/lab-05 ``BlockPool``. ``allocate_slots`` is all or
nothing: count first, and return ``None`` before changing anything.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, overload

from mini_vllm.core.block_pool import BlockPool
from mini_vllm.metrics.stats import PrefixCacheStats
from mini_vllm.utils.math_utils import cdiv

if TYPE_CHECKING:
    from mini_vllm.core.kv_cache_utils import BlockHash, KVCacheBlock
    from mini_vllm.request import Request

# The only KV cache group: every layer uses full attention.
_GROUP_ID = 0


@dataclass
class KVCacheBlocks:
    """A set of blocks handed between the KV cache manager and the scheduler.

    The scheduler never touches ``KVCacheBlock`` objects itself; it passes these
    around (prefix hits from ``get_computed_blocks`` into ``allocate_slots``) and
    turns them into block ids for the model runner. Keeping the wrapper means the
    scheduler would not change if the cache grew more groups.
    """

    blocks: tuple[Sequence[KVCacheBlock], ...]
    """``blocks[g][j]``: the j-th block of KV cache group g. Groups are the outer
    dimension because groups may one day differ in block size (and so in the
    number of blocks per request). mini-vLLM always has exactly one group. An
    empty group is an empty tuple, which makes the shared empty instance
    immutable."""

    def __add__(self, other: KVCacheBlocks) -> KVCacheBlocks:
        """Concatenate two block sets group by group."""
        return KVCacheBlocks(
            tuple(list(itertools.chain(a, b)) for a, b in zip(self.blocks, other.blocks))
        )

    @overload
    def get_block_ids(self, allow_none: Literal[False] = False) -> tuple[list[int], ...]: ...

    @overload
    def get_block_ids(self, allow_none: Literal[True]) -> tuple[list[int], ...] | None: ...

    def get_block_ids(self, allow_none: bool = False) -> tuple[list[int], ...] | None:
        """Block ids per group, e.g. ``([3, 7, 8],)``.

        With ``allow_none``, an all-empty set gives None: the scheduler output
        uses None for "no new blocks this step" to keep decode steps cheap.
        """
        if allow_none and not any(self.blocks):
            return None
        return tuple([blk.block_id for blk in group] for group in self.blocks)

    def get_unhashed_block_ids(self) -> list[int]:
        """Ids of the blocks not (yet) in the prefix cache, single-group only."""
        if len(self.blocks) != 1:
            raise ValueError(f"expected one KV cache group, got {len(self.blocks)}")
        return [blk.block_id for blk in self.blocks[0] if blk.block_hash is None]

    def new_empty(self) -> KVCacheBlocks:
        """An empty block set with the same number of groups."""
        return KVCacheBlocks(tuple(() for _ in self.blocks))


class KVCacheManager:
    """Allocates, shares and frees the KV cache blocks of requests.

    Every block a request holds covers ``block_size`` consecutive token
    positions; a request with ``n`` tokens needing slots holds
    ``cdiv(n, block_size)`` blocks, in order (its *block table*). Full blocks are
    published in the prefix cache as soon as their tokens are computed (or
    scheduled to be, which is the same thing a step later), so a request that
    arrives with the same prefix can reuse them instead of recomputing.

    Two rules keep the scheduler simple:

    * ``allocate_slots`` is all or nothing: it checks capacity before touching
      anything, and on failure returns None with the pool exactly as it was, so
      the scheduler can preempt someone and simply try again.
    * ``free`` releases a request's blocks tail first, so that under LRU eviction
      the end of a sequence (least likely to be shared) goes before its prefix.

    Args:
        num_gpu_blocks: Blocks in the pool, the null block (id 0) included.
        block_size: Tokens per block; must equal the block size of the
            requests' ``block_hasher`` when caching is enabled.
        max_model_len: Longest sequence (prompt + output) the model accepts;
            no request is given slots beyond it.
        enable_caching: Whether to look up and publish prefix-cache blocks.
        log_stats: Whether to count prefix-cache lookups (``PrefixCacheStats``).
    """

    def __init__(
        self,
        num_gpu_blocks: int,
        block_size: int,
        max_model_len: int,
        enable_caching: bool = True,
        log_stats: bool = False,
    ) -> None:
        if not isinstance(num_gpu_blocks, int) or num_gpu_blocks < 2:
            raise ValueError(
                f"num_gpu_blocks must be an int >= 2 (the null block plus one usable "
                f"block), got {num_gpu_blocks!r}"
            )
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        if not isinstance(max_model_len, int) or max_model_len < 1:
            raise ValueError(f"max_model_len must be a positive int, got {max_model_len!r}")
        self.num_gpu_blocks = num_gpu_blocks
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.log_stats = log_stats
        self.prefix_cache_stats: PrefixCacheStats | None = PrefixCacheStats() if log_stats else None

        self.block_pool = BlockPool(
            num_gpu_blocks=num_gpu_blocks,
            enable_caching=enable_caching,
            hash_block_size=block_size,
        )
        self.num_kv_cache_groups = 1

        # request_id -> the request's block table (upstream: req_to_blocks of the
        # single-type manager). Only requests holding blocks have an entry.
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        # request_id -> how many leading blocks of its table are already in the
        # prefix cache, so cache_blocks hashes each block once. Only running
        # requests are tracked; a preempted request starts over.
        self.num_cached_block: dict[str, int] = {}

        # One shared empty instance (nested tuples: immutable), returned whenever
        # there is nothing to return, to spare an allocation per request per step.
        self.empty_kv_cache_blocks = KVCacheBlocks(tuple(() for _ in range(1)))

    # ------------------------------------------------------------------ stats

    @property
    def usage(self) -> float:
        """Fraction of usable blocks (null block excluded) held by requests.

        Free blocks that still hold cached prefixes count as free: they can be
        evicted the moment someone needs them.
        """
        raise NotImplementedError(
            "lab-07: KVCacheManager.usage — the fraction of usable blocks held by requests: ask "
            "the pool"
        )

    def make_prefix_cache_stats(self) -> PrefixCacheStats | None:
        """Return the prefix-cache counters gathered so far and start afresh.

        None when the manager was built with ``log_stats=False``.
        """
        raise NotImplementedError(
            "lab-07: KVCacheManager.make_prefix_cache_stats — hand out the counters gathered so "
            "far and start afresh; None without log_stats"
        )

    # ---------------------------------------------------------- prefix cache

    def get_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int]:
        """Find the longest prefix of ``request`` already in the prefix cache.

        Returns the cached blocks and the number of tokens they cover (a multiple
        of ``block_size``). The blocks are not claimed yet: the caller passes
        them to ``allocate_slots``, which touches them only if the whole
        allocation fits.

        The hit is capped at ``num_tokens - 1`` tokens: even when the entire
        prompt is cached, the model must run on its last token to produce the
        logits of the next one. Because hits are whole blocks, a fully cached
        prompt whose length is a multiple of ``block_size`` recomputes its whole
        last block, not just one token.
        """
        raise NotImplementedError(
            "lab-07: KVCacheManager.get_computed_blocks — the longest cached prefix, capped at "
            "num_tokens - 1; record the lookup when log_stats"
        )

    def find_longest_cache_hit(
        self, block_hashes: Sequence[BlockHash], max_cache_hit_length: int
    ) -> tuple[tuple[list[KVCacheBlock], ...], int]:
        """Cached blocks for the longest run of leading ``block_hashes``.

        Hashes are chained (each covers its parent), so the first miss ends the
        search: nothing after it can be cached under this prefix. At most
        ``max_cache_hit_length // block_size`` blocks are returned, with the
        number of tokens they cover.
        """
        raise NotImplementedError(
            "lab-07: KVCacheManager.find_longest_cache_hit — cached blocks for the leading "
            "hashes, stopping at the first miss and at max_cache_hit_length // block_size "
            "blocks"
        )

    # ------------------------------------------------------------ allocation

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
        full_sequence_must_fit: bool = False,
    ) -> KVCacheBlocks | None:
        """Give ``request`` slots for ``num_new_tokens`` more tokens.

        The request's block table is laid out as::

            | computed | new computed | new | lookahead |
              already    prefix hits    to be computed
              held       (not yet held) this step
                         |<-------- to be allocated -------->|

        ``computed`` is ``request.num_computed_tokens``, already backed by the
        request's blocks. ``new computed`` are the tokens covered by the prefix
        hits ``new_computed_blocks`` (``num_new_computed_tokens`` of them, from
        ``get_computed_blocks``). ``new`` tokens are scheduled this step;
        ``lookahead`` slots are reserved for draft tokens.

        ``full_sequence_must_fit`` is the scheduler's admission gate: with it, a
        waiting request gets its first chunk only if the free blocks could hold
        its *whole* current sequence (``request.num_tokens``, prompt plus any
        outputs it must recompute, less its prefix hits). Without the gate,
        chunked prefill checks only the chunk, so the scheduler can admit more
        prompts than the cache can finish and must then preempt one of them
        half-way through its prefill, throwing that work away. The gate checks
        capacity only; it reserves nothing, so requests admitted later in the
        same step see the blocks this one will need as still free.

        The call proceeds in three stages, and touches nothing until the first
        one succeeds:

        1. Count the blocks needed: new blocks for the slots beyond what the
           request and its prefix hits cover, plus the prefix hits that sit in
           the free queue (claiming them takes them out of it). If that exceeds
           the free blocks, return None: nothing was changed.
        2. Claim the prefix hits (``touch``: ref_cnt + 1, out of the free queue)
           and append them to the request's table.
        3. Take fresh blocks for the remaining slots, then publish every block
           that this step fills completely in the prefix cache.

        Returns:
            The freshly allocated blocks only (an empty set when the existing
            blocks have room), or None when they do not fit.
        """
        raise NotImplementedError(
            "lab-07: KVCacheManager.allocate_slots — with full_sequence_must_fit, None unless "
            "the whole sequence fits; count, and return None before changing anything; then "
            "claim hits, take fresh blocks, cache full blocks"
        )

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock],
    ) -> int:
        """How many free blocks giving ``num_tokens`` slots would consume.

        That is the fresh blocks beyond the request's table and its prefix hits,
        plus the prefix hits that are currently free (ref_cnt 0): claiming one
        removes it from the free queue just like a fresh allocation would.
        """
        raise NotImplementedError(
            "lab-07: KVCacheManager.get_num_blocks_to_allocate — fresh blocks beyond the table "
            "and the hits, plus the hits that are free (ref_cnt 0)"
        )

    def allocate_new_computed_blocks(
        self, request_id: str, new_computed_blocks: Sequence[KVCacheBlock]
    ) -> None:
        """Claim a new request's prefix-cache hits and start its table with them.

        Touching raises each block's ref_cnt (taking it out of the free queue if
        it was evictable), so no later allocation in the same step can evict a
        block this request now relies on. The hits are already cached, so they
        count as published for ``cache_blocks``.
        """
        raise NotImplementedError(
            "lab-07: KVCacheManager.allocate_new_computed_blocks — touch a new request's hits "
            "and start its table with them (already cached)"
        )

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[KVCacheBlock]:
        """Extend the request's table to at least ``num_tokens`` slots.

        Returns only the blocks added (possibly none).
        """
        raise NotImplementedError(
            "lab-07: KVCacheManager.allocate_new_blocks — grow the table to cover num_tokens "
            "slots; return only the blocks added"
        )

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Publish the request's blocks that the first ``num_computed_tokens`` fill.

        Blocks already published for this request are skipped (tracked in
        ``num_cached_block``), so each block is hashed into the cache once.
        A block can only be published under its hash, so a request built
        without a ``block_hasher`` (no ``block_hashes``) publishes nothing.
        """
        raise NotImplementedError(
            "lab-07: KVCacheManager.cache_blocks — publish the blocks the first "
            "num_computed_tokens tokens fill, each block once"
        )

    # ------------------------------------------------------------- freeing

    def free(self, request: Request) -> None:
        """Release every block of ``request`` (finished or preempted).

        Blocks go back tail first: the pool appends freed blocks to the end of
        its eviction (LRU) queue in the order given, so the request's last block
        becomes the first of them to be evicted. A prefix is more likely to be
        shared than a suffix, so it should survive longest. Cached blocks keep
        their hash while free and can still be hit until they are evicted.
        Freeing a request that holds no blocks (aborted while waiting) is a no-op.
        """
        raise NotImplementedError(
            "lab-07: KVCacheManager.free — release the request's blocks tail first and forget "
            "its table"
        )

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix (e.g. after new weights are loaded).

        Only possible when no request holds blocks; returns whether it happened.
        """
        if not self.block_pool.reset_prefix_cache():
            return False
        if self.log_stats:
            assert self.prefix_cache_stats is not None
            self.prefix_cache_stats.reset = True
        return True

    # ------------------------------------------------------------- queries

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        """Leading blocks of ``running_request_id`` shared by every request holding blocks.

        A block is common when its ref_cnt equals the number of requests with a
        block table, i.e. all of them point at it (cascade attention can then
        read it once for the whole batch). Requests that hold blocks but are
        not scheduled this step still count, so the result may understate the
        prefix shared by the scheduled batch.
        """
        if not self.enable_caching:
            # Without prefix caching no two requests share a block (as upstream's
            # no-prefix-cache coordinator reports).
            return [0]
        blocks = self.req_to_blocks.get(running_request_id, [])
        num_requests = len(self.req_to_blocks)
        num_common_blocks = 0
        for block in blocks:
            if block.ref_cnt != num_requests:
                break
            num_common_blocks += 1
        return [num_common_blocks]

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        """The request's whole block table."""
        return self.create_kv_cache_blocks((self.req_to_blocks.get(request_id) or [],))

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        """The request's block table as ids, one list per group: ``([5, 2, 9],)``."""
        raise NotImplementedError(
            "lab-07: KVCacheManager.get_block_ids — the request's block table as ids, one list "
            "per group"
        )

    def create_kv_cache_blocks(self, blocks: tuple[list[KVCacheBlock], ...]) -> KVCacheBlocks:
        """Wrap ``blocks``, reusing the shared empty instance when there are none."""
        return KVCacheBlocks(blocks) if any(blocks) else self.empty_kv_cache_blocks
