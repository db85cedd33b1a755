"""Snapshots of a block pool and its free queue, taken in the learner process.

Shared by the learner_side helpers of the labs that read a ``BlockPool`` (01, 05, 08): the
grader stages this file into the sandbox next to them. It reads attributes and returns plain
data (block ids, identity keys, ref counts, how each walk of the links ended); it judges
nothing. ``tests/labs/common.py`` checks what it returns, in the judge.
"""

from __future__ import annotations

from typing import Any

SENTINEL, HIT_NONE, TOO_LONG, NOT_A_BLOCK, NO_SENTINEL = (
    "sentinel", "none", "limit", "not-a-block", "no-sentinel")
_MISSING = object()


def _walk(start: Any, stop: Any, link: str, limit: int) -> tuple[list[Any], str]:
    """The nodes from ``start``'s ``link`` up to ``stop``, and how the walk ended."""
    nodes: list[Any] = []
    if start is None:
        return nodes, NO_SENTINEL
    node = getattr(start, link, _MISSING)
    while node is not stop:
        if node is None:
            return nodes, HIT_NONE
        if node is _MISSING:
            return nodes, NOT_A_BLOCK
        if len(nodes) >= limit:
            return nodes, TOO_LONG
        nodes.append(node)
        node = getattr(node, link, _MISSING)
    return nodes, SENTINEL


def queue_snapshot(queue: Any, limit: int) -> dict[str, Any]:
    """The queue's links as data: block ids and identity keys walking forward from the head
    and backward from the tail (both front to back), how each walk ended, and the counter."""
    head = getattr(queue, "fake_free_list_head", None)
    tail = getattr(queue, "fake_free_list_tail", None)
    forward, forward_end = _walk(head, tail, "next_free_block", limit)
    backward, backward_end = _walk(tail, head, "prev_free_block", limit)
    backward.reverse()
    return {
        "forward": [getattr(b, "block_id", None) for b in forward],
        "forward_keys": [id(b) for b in forward],
        "forward_end": forward_end,
        "backward": [getattr(b, "block_id", None) for b in backward],
        "backward_keys": [id(b) for b in backward],
        "backward_end": backward_end,
        "num_free_blocks": getattr(queue, "num_free_blocks", None),
    }


def pool_snapshot(pool: Any, hashes: bool = False) -> dict[str, Any]:
    """Every block of ``pool.blocks`` as data (id, identity key, ref_cnt, whether it has a
    free-list link, its hash if asked), the null block's key and flag, and the queue."""
    blocks = list(pool.blocks)
    null = pool.null_block
    return {
        "ids": [getattr(b, "block_id", None) for b in blocks],
        "keys": [id(b) for b in blocks],
        "ref_cnts": [getattr(b, "ref_cnt", None) for b in blocks],
        "linked": [getattr(b, "prev_free_block", None) is not None
                   or getattr(b, "next_free_block", None) is not None for b in blocks],
        "hashes": [getattr(b, "block_hash", None) for b in blocks] if hashes else None,
        "null_key": id(null),
        "null_is_null": getattr(null, "is_null", None),
        "queue": queue_snapshot(pool.free_block_queue, len(blocks) + 2),
    }
