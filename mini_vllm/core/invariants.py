"""Executable statements of the allocator invariants I1-I4 (see CONTRIBUTING.md).

Tests, lab graders and notebooks call these after every operation on a pool or a free queue;
each failure is an ``AssertionError`` whose message starts with the invariant's name and says
which block broke it, so that a learner sees *what* is wrong, not just *that* something is.

The checks read only upstream's public attribute names (``blocks``, ``null_block``,
``free_block_queue.fake_free_list_head``/``fake_free_list_tail``, ``num_free_blocks``,
``cached_block_hash_to_block``), so they work on any implementation that mirrors them. They walk
every block, O(num_gpu_blocks) per call: use them on small pools.

What a static snapshot cannot show is checked against a model the caller keeps: the order the
free queue should have (I4's LRU/tail-first order) and the hash each block should carry (I3's
"hash of parent and tokens", I4's "in-use blocks keep their hash, reused blocks lose it").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["check_block_pool", "check_free_queue"]


def _fail(message: str) -> None:
    raise AssertionError(message)


def _describe_hash(key: bytes | None) -> str:
    return "None" if key is None else key.hex()[:16] + "..."


def _walk(start: Any, stop: Any, attr: str, direction: str) -> list[Any]:
    """Follow ``attr`` links from ``start`` to ``stop`` (exclusive), detecting breaks and cycles."""
    back_attr = "prev_free_block" if attr == "next_free_block" else "next_free_block"
    visited: list[Any] = []
    seen: set[int] = set()
    node = start
    while True:
        following = getattr(node, attr)
        if following is None:
            where = "the head sentinel" if node is start else f"block {node.block_id}"
            _fail(
                f"I2 violated: walking {direction} the links end at {where} before reaching the "
                f"{'tail' if direction == 'forward' else 'head'} sentinel"
            )
        if getattr(following, back_attr) is not node:
            back = getattr(following, back_attr)
            _fail(
                f"I2 violated: walking {direction}, block {getattr(node, 'block_id', '?')} links "
                f"to block {following.block_id}, whose {back_attr} is "
                f"{None if back is None else back.block_id} instead of pointing back"
            )
        if following is stop:
            return visited
        if id(following) in seen:
            _fail(f"I2 violated: walking {direction} visits block {following.block_id} twice")
        seen.add(id(following))
        visited.append(following)
        node = following


def check_free_queue(queue: Any) -> list[Any]:
    """Check I2 on a ``FreeKVCacheBlockQueue``; return its blocks front to back.

    I2: the queue is a consistent doubly linked list between two sentinels: walking forward and
    backward visits the same blocks, each once, and their number is ``num_free_blocks``.
    """
    head, tail = queue.fake_free_list_head, queue.fake_free_list_tail
    if head.prev_free_block is not None:
        _fail("I2 violated: the head sentinel has a predecessor")
    if tail.next_free_block is not None:
        _fail("I2 violated: the tail sentinel has a successor")
    forward = _walk(head, tail, "next_free_block", "forward")
    backward = _walk(tail, head, "prev_free_block", "backward")
    backward.reverse()
    if len(forward) != len(backward) or any(a is not b for a, b in zip(forward, backward)):
        _fail(
            "I2 violated: walking forward visits blocks "
            f"{[b.block_id for b in forward]} but walking backward visits "
            f"{[b.block_id for b in backward]} (reversed)"
        )
    if len(forward) != queue.num_free_blocks:
        _fail(
            f"I2 violated: walking forward visits {len(forward)} blocks but num_free_blocks is "
            f"{queue.num_free_blocks}"
        )
    return forward


def _cached_entries(pool: Any) -> list[tuple[bytes, Any]] | None:
    """(key, block) pairs of the pool's cache map, or None if the pool has no readable map."""
    cache_map = getattr(pool, "cached_block_hash_to_block", None)
    raw = getattr(cache_map, "_cache", None)
    if raw is None:
        return None
    entries: list[tuple[bytes, Any]] = []
    for key, value in raw.items():
        if isinstance(value, dict):
            if not value:
                _fail(f"I3 violated: cache key {_describe_hash(key)} maps to no block")
            for block_id, block in value.items():
                if block.block_id != block_id:
                    _fail(
                        f"I3 violated: block {block.block_id} is filed under block id {block_id} "
                        f"for cache key {_describe_hash(key)}"
                    )
                entries.append((key, block))
        else:
            entries.append((key, value))
    return entries


def check_block_pool(
    pool: Any,
    expected_free_order: Sequence[int] | None = None,
    expected_block_hashes: Mapping[int, bytes | None] | None = None,
    expected_ref_cnts: Mapping[int, int] | None = None,
) -> None:
    """Check I1-I4 on a ``BlockPool``, optionally against a model of what it should hold.

    Args:
        pool: The pool to check.
        expected_free_order: Block ids the free queue should hold, front (evicted first) to back.
        expected_block_hashes: For some or all block ids, the cache key (block hash with group
            id) the block should carry, or None if it should not be cached.
        expected_ref_cnts: For some or all block ids, the reference count the block should have.
    """
    blocks = pool.blocks
    if len(blocks) != pool.num_gpu_blocks:
        _fail(
            f"I1 violated: the pool has {len(blocks)} blocks but num_gpu_blocks is "
            f"{pool.num_gpu_blocks}"
        )
    for index, block in enumerate(blocks):
        if block.block_id != index:
            _fail(f"I1 violated: pool.blocks[{index}] has block_id {block.block_id}")

    # I1: the null block.
    null = pool.null_block
    if null is not blocks[0] or not null.is_null:
        _fail("I1 violated: the null block must be block 0 with is_null set")
    if null.prev_free_block is not None or null.next_free_block is not None:
        _fail("I1 violated: the null block (block 0) is linked into the free queue")
    if getattr(null, "block_hash", None) is not None:
        _fail("I1 violated: the null block (block 0) has a hash; it must never be cached")
    for block in blocks[1:]:
        if block.is_null:
            _fail(f"I1 violated: block {block.block_id} is marked is_null; only block 0 may be")

    # I2: the free queue's structure.
    free = check_free_queue(pool.free_block_queue)
    if pool.get_num_free_blocks() != len(free):
        _fail(
            f"I2 violated: get_num_free_blocks() is {pool.get_num_free_blocks()} but the free "
            f"queue holds {len(free)} blocks"
        )

    # I1: in the free queue if and only if ref_cnt == 0.
    free_ids: set[int] = set()
    for block in free:
        if block.is_null:
            _fail("I1 violated: the null block (block 0) is in the free queue")
        if not 0 <= block.block_id < len(blocks) or blocks[block.block_id] is not block:
            _fail(f"I1 violated: the free queue holds block {block.block_id}, not of this pool")
        free_ids.add(block.block_id)
    for block in blocks[1:]:
        if block.ref_cnt < 0:
            _fail(f"I1 violated: block {block.block_id} has negative ref_cnt {block.ref_cnt}")
        in_queue = block.block_id in free_ids
        if in_queue and block.ref_cnt != 0:
            _fail(
                f"I1 violated: block {block.block_id} is in the free queue but has ref_cnt "
                f"{block.ref_cnt}"
            )
        if not in_queue and block.ref_cnt == 0:
            _fail(f"I1 violated: block {block.block_id} has ref_cnt 0 but is not in the free queue")
        if not in_queue and (
            block.prev_free_block is not None or block.next_free_block is not None
        ):
            _fail(f"I2 violated: block {block.block_id} is not in the free queue but has links")
    if expected_ref_cnts is not None:
        for block_id, ref_cnt in expected_ref_cnts.items():
            if blocks[block_id].ref_cnt != ref_cnt:
                _fail(
                    f"I1 violated: block {block_id} has ref_cnt {blocks[block_id].ref_cnt}, "
                    f"expected {ref_cnt}"
                )

    # I3: the cache map and the blocks' hashes agree.
    entries = _cached_entries(pool)
    if entries is not None:
        filed: set[int] = set()
        for key, block in entries:
            if not 0 <= block.block_id < len(blocks) or blocks[block.block_id] is not block:
                _fail(f"I3 violated: the cache map holds block {block.block_id}, not of this pool")
            if block.is_null:
                _fail("I3 violated: the null block (block 0) is in the cache map")
            if block.block_hash != key:
                _fail(
                    f"I3 violated: block {block.block_id} is in the cache map under "
                    f"{_describe_hash(key)} but its block_hash is "
                    f"{_describe_hash(block.block_hash)}"
                )
            if block.block_id in filed:
                _fail(f"I3 violated: block {block.block_id} is in the cache map twice")
            filed.add(block.block_id)
        for block in blocks:
            if block.block_hash is not None and block.block_id not in filed:
                _fail(
                    f"I3 violated: block {block.block_id} has block_hash "
                    f"{_describe_hash(block.block_hash)} but is not in the cache map"
                )

    # I3/I4 against the caller's model.
    if expected_block_hashes is not None:
        for block_id, expected in expected_block_hashes.items():
            block = blocks[block_id]
            actual = block.block_hash
            if actual == expected:
                continue
            if actual is None:
                _fail(
                    f"I4 violated: block {block_id} (ref_cnt={block.ref_cnt}) lost its cached hash "
                    f"{_describe_hash(expected)} although it was neither reused nor evicted"
                )
            if expected is None:
                _fail(
                    f"I4 violated: block {block_id} (ref_cnt={block.ref_cnt}) still carries hash "
                    f"{_describe_hash(actual)}, which should have left the cache (stale hash)"
                )
            _fail(
                f"I3 violated: block {block_id} has hash {_describe_hash(actual)}, expected "
                f"{_describe_hash(expected)}"
            )
    if expected_free_order is not None:
        actual_order = [block.block_id for block in free]
        if actual_order != list(expected_free_order):
            _fail(
                f"I4 violated: the free queue is {actual_order} but the eviction order (LRU, "
                f"tail of a request first) is {list(expected_free_order)}"
            )
