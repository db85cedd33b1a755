"""The scheduler's interface to the paged KV cache: which blocks each request holds.

Mirrors ``vllm/v1/core/kv_cache_manager.py`` at v0.22.1 (``KVCacheBlocks``, ``KVCacheManager``)
for a model whose layers all use full attention, i.e. a single KV cache group, so upstream's
``KVCacheCoordinator`` and ``FullAttentionManager`` are folded into ``KVCacheManager`` under their
own method names. The block pool underneath knows blocks; this module knows requests: which
blocks each one holds, how many are already published in the prefix cache, and how many more a
step needs (the three layers it folds: docs/upstream-fidelity.md, module notes).
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
        return self.block_pool.get_usage()

    def make_prefix_cache_stats(self) -> PrefixCacheStats | None:
        """Return the prefix-cache counters gathered so far and start afresh.

        None when the manager was built with ``log_stats=False``.
        """
        if not self.log_stats:
            return None
        stats = self.prefix_cache_stats
        self.prefix_cache_stats = PrefixCacheStats()
        return stats

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
        if not self.enable_caching:
            return self.empty_kv_cache_blocks, 0

        max_cache_hit_length = request.num_tokens - 1
        computed_blocks, num_new_computed_tokens = self.find_longest_cache_hit(
            request.block_hashes, max_cache_hit_length
        )
        if self.log_stats:
            assert self.prefix_cache_stats is not None
            self.prefix_cache_stats.record(
                num_tokens=request.num_tokens,
                num_hits=num_new_computed_tokens,
                preempted=request.num_preemptions > 0,
            )
        return self.create_kv_cache_blocks(computed_blocks), num_new_computed_tokens

    def find_longest_cache_hit(
        self, block_hashes: Sequence[BlockHash], max_cache_hit_length: int
    ) -> tuple[tuple[list[KVCacheBlock], ...], int]:
        """Cached blocks for the longest run of leading ``block_hashes``.

        Hashes are chained (each covers its parent), so the first miss ends the
        search: nothing after it can be cached under this prefix. At most
        ``max_cache_hit_length // block_size`` blocks are returned, with the
        number of tokens they cover.
        """
        computed: list[KVCacheBlock] = []
        max_num_blocks = max(max_cache_hit_length, 0) // self.block_size
        for block_hash in itertools.islice(block_hashes, max_num_blocks):
            cached = self.block_pool.get_cached_block(block_hash, [_GROUP_ID])
            if not cached:
                break
            computed.append(cached[0])
        return (computed,), len(computed) * self.block_size

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
        if num_new_tokens <= 0:
            raise ValueError(
                f"request {request.request_id!r}: num_new_tokens must be > 0, got {num_new_tokens}"
            )
        if num_lookahead_tokens < 0:
            raise ValueError(f"num_lookahead_tokens must be >= 0, got {num_lookahead_tokens}")
        if new_computed_blocks is not None:
            new_computed_block_list = new_computed_blocks.blocks
        else:
            new_computed_block_list = self.empty_kv_cache_blocks.blocks
        if len(new_computed_block_list[0]) * self.block_size != num_new_computed_tokens:
            raise ValueError(
                f"request {request.request_id!r}: num_new_computed_tokens="
                f"{num_new_computed_tokens} does not match the {len(new_computed_block_list[0])}"
                f" prefix-hit blocks of {self.block_size} tokens"
            )

        num_local_computed_tokens = request.num_computed_tokens + num_new_computed_tokens
        total_computed_tokens = min(num_local_computed_tokens, self.max_model_len)

        if full_sequence_must_fit:
            full_num_tokens = min(request.num_tokens, self.max_model_len)
            num_blocks_for_full_sequence = self.get_num_blocks_to_allocate(
                request_id=request.request_id,
                num_tokens=full_num_tokens,
                new_computed_blocks=new_computed_block_list[0],
            )
            if num_blocks_for_full_sequence > self.block_pool.get_num_free_blocks():
                return None

        num_tokens_need_slot = min(
            total_computed_tokens + num_new_tokens + num_lookahead_tokens, self.max_model_len
        )

        # Stage 1: capacity check, before any state changes.
        num_blocks_to_allocate = self.get_num_blocks_to_allocate(
            request_id=request.request_id,
            num_tokens=num_tokens_need_slot,
            new_computed_blocks=new_computed_block_list[0],
        )
        if num_blocks_to_allocate > self.block_pool.get_num_free_blocks():
            return None

        # Stage 2: claim the prefix hits (an empty set of hits, shared or not, is
        # no hit at all: running requests pass none).
        if new_computed_block_list[0]:
            self.allocate_new_computed_blocks(request.request_id, new_computed_block_list[0])

        # Stage 3: fresh blocks, then publish the blocks this step fills.
        new_blocks = self.allocate_new_blocks(request.request_id, num_tokens_need_slot)
        if self.enable_caching:
            # Draft (lookahead) tokens may be rejected: publish only blocks made
            # of tokens the request really has.
            num_tokens_to_cache = min(total_computed_tokens + num_new_tokens, request.num_tokens)
            self.cache_blocks(request, num_tokens_to_cache)
        return self.create_kv_cache_blocks((new_blocks,))

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
        num_required_blocks = cdiv(num_tokens, self.block_size)
        num_req_blocks = len(self.req_to_blocks.get(request_id, ()))
        if num_req_blocks:
            # Fast path, as upstream's: a request that holds blocks (every running request,
            # every step) has no new prefix hits, so nothing it needs can be in the free queue.
            if new_computed_blocks:
                raise ValueError(
                    f"request {request_id!r} already holds blocks; prefix-cache hits apply "
                    f"only to a request's first allocation"
                )
            return max(num_required_blocks - num_req_blocks, 0)
        num_new_blocks = max(num_required_blocks - len(new_computed_blocks), 0)
        num_evictable_blocks = sum(
            blk.ref_cnt == 0 and not blk.is_null for blk in new_computed_blocks
        )
        return num_new_blocks + num_evictable_blocks

    def allocate_new_computed_blocks(
        self, request_id: str, new_computed_blocks: Sequence[KVCacheBlock]
    ) -> None:
        """Claim a new request's prefix-cache hits and start its table with them.

        Touching raises each block's ref_cnt (taking it out of the free queue if
        it was evictable), so no later allocation in the same step can evict a
        block this request now relies on. The hits are already cached, so they
        count as published for ``cache_blocks``.
        """
        req_blocks = self.req_to_blocks.setdefault(request_id, [])
        if req_blocks:
            raise ValueError(
                f"request {request_id!r} already holds {len(req_blocks)} blocks; prefix-cache "
                f"hits apply only to a request's first allocation"
            )
        if self.enable_caching:
            self.block_pool.touch(new_computed_blocks)
        elif new_computed_blocks:
            raise ValueError("prefix-cache hits given to a manager with caching disabled")
        req_blocks.extend(new_computed_blocks)
        self.num_cached_block[request_id] = len(req_blocks)

    def allocate_new_blocks(self, request_id: str, num_tokens: int) -> list[KVCacheBlock]:
        """Extend the request's table to at least ``num_tokens`` slots.

        Returns only the blocks added (possibly none).
        """
        req_blocks = self.req_to_blocks.setdefault(request_id, [])
        num_new_blocks = cdiv(num_tokens, self.block_size) - len(req_blocks)
        if num_new_blocks <= 0:
            return []
        new_blocks = self.block_pool.get_new_blocks(num_new_blocks)
        req_blocks.extend(new_blocks)
        return new_blocks

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Publish the request's blocks that the first ``num_computed_tokens`` fill.

        Blocks already published for this request are skipped (tracked in
        ``num_cached_block``), so each block is hashed into the cache once.
        A block can only be published under its hash, so a request built
        without a ``block_hasher`` (no ``block_hashes``) publishes nothing.
        """
        if not self.enable_caching:
            return
        request_id = request.request_id
        num_cached_blocks = self.num_cached_block.get(request_id, 0)
        num_full_blocks = num_computed_tokens // self.block_size
        if num_cached_blocks >= num_full_blocks:
            return  # the common case, checked first: no block was filled since the last call
        num_full_blocks = min(num_full_blocks, len(request.block_hashes))
        if num_cached_blocks >= num_full_blocks:
            return
        self.block_pool.cache_full_blocks(
            request=request,
            blocks=self.req_to_blocks[request_id],
            num_cached_blocks=num_cached_blocks,
            num_full_blocks=num_full_blocks,
            block_size=self.block_size,
            kv_cache_group_id=_GROUP_ID,
        )
        self.num_cached_block[request_id] = num_full_blocks

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
        req_blocks = self.req_to_blocks.pop(request.request_id, [])
        self.block_pool.free_blocks(list(reversed(req_blocks)))
        self.num_cached_block.pop(request.request_id, None)

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
        return self.get_blocks(request_id).get_block_ids()

    def create_kv_cache_blocks(self, blocks: tuple[list[KVCacheBlock], ...]) -> KVCacheBlocks:
        """Wrap ``blocks``, reusing the shared empty instance when there are none."""
        return KVCacheBlocks(blocks) if any(blocks) else self.empty_kv_cache_blocks
