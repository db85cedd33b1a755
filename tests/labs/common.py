"""Checks shared by the graded suites.

They read the learner's objects only through the attributes the labs define (upstream's
names: ``fake_free_list_head``, ``prev_free_block``, ``ref_cnt``…), never through the
learner's own methods, so a broken method cannot vouch for itself. Every failure names the
invariant it broke.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, settings

#: Property tests are derandomized so a grade is reproducible, and unhurried on slow laptops.
GRADED_SETTINGS = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
STATEFUL_SETTINGS = settings(GRADED_SETTINGS, max_examples=40, stateful_step_count=40)


def walk_forward(queue: Any, limit: int) -> list[Any]:
    """The blocks from the head sentinel to the tail sentinel, refusing to loop forever."""
    head, tail = queue.fake_free_list_head, queue.fake_free_list_tail
    out = []
    node = head.next_free_block
    while node is not tail:
        if node is None:
            raise AssertionError(
                "I2 violated: walking forward from the head sentinel hit None before the tail "
                "sentinel (a block's next_free_block was not linked)")
        out.append(node)
        if len(out) > limit:
            raise AssertionError(
                f"I2 violated: walking forward visited more than {limit} blocks: the list has a "
                "cycle")
        node = node.next_free_block
    return out


def walk_backward(queue: Any, limit: int) -> list[Any]:
    head, tail = queue.fake_free_list_head, queue.fake_free_list_tail
    out = []
    node = tail.prev_free_block
    while node is not head:
        if node is None:
            raise AssertionError(
                "I2 violated: walking backward from the tail sentinel hit None before the head "
                "sentinel (a block's prev_free_block was not linked)")
        out.append(node)
        if len(out) > limit:
            raise AssertionError(
                f"I2 violated: walking backward visited more than {limit} blocks: a cycle")
        node = node.prev_free_block
    out.reverse()
    return out


def free_ids(queue: Any, limit: int = 100_000) -> list[int]:
    return [b.block_id for b in walk_forward(queue, limit)]


def check_queue(queue: Any, limit: int = 100_000) -> list[Any]:
    """Invariant I2: a consistent doubly linked list whose length is ``num_free_blocks``."""
    forward = walk_forward(queue, limit)
    backward = walk_backward(queue, limit)
    ids_f = [b.block_id for b in forward]
    ids_b = [b.block_id for b in backward]
    if ids_f != ids_b:
        raise AssertionError(
            f"I2 violated: walking forward gives {ids_f[:12]} but walking backward gives "
            f"{ids_b[:12]}: some prev_free_block / next_free_block pair disagrees")
    if len(set(map(id, forward))) != len(forward):
        raise AssertionError(f"I2 violated: a block appears twice in the free queue: {ids_f[:12]}")
    if queue.num_free_blocks != len(forward):
        raise AssertionError(
            f"I2 violated: num_free_blocks is {queue.num_free_blocks} but the queue links "
            f"{len(forward)} blocks")
    return forward


def check_pool(pool: Any) -> None:
    """Invariants I1 and I2 on a block pool, read through its attributes."""
    forward = check_queue(pool.free_block_queue, len(pool.blocks) + 2)
    in_queue = {id(b) for b in forward}
    null = pool.null_block
    if id(null) in in_queue:
        raise AssertionError("I1 violated: the null block (block 0) is in the free queue")
    for block in pool.blocks:
        if block is null:
            continue
        if block.ref_cnt < 0:
            raise AssertionError(f"I1 violated: block {block.block_id} has ref_cnt {block.ref_cnt}")
        if (block.ref_cnt == 0) != (id(block) in in_queue):
            where = "is" if id(block) in in_queue else "is not"
            raise AssertionError(
                f"I1 violated: block {block.block_id} has ref_cnt {block.ref_cnt} and {where} "
                "in the free queue (free blocks, and only they, belong in the queue)")


def best_time(fn: Callable[[], Any], repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def assert_constant_time(op_name: str, run_ops: Callable[[int], Callable[[], Any]],
                         small: int = 2_000, big: int = 200_000, max_ratio: float = 12.0) -> None:
    """Time the same number of operations on a small and a 100x larger structure.

    ``run_ops(n)`` builds a structure of ``n`` blocks and returns a callable doing a fixed
    number of operations on it. An O(1) operation costs about the same on both; an O(n) one
    costs ~100x more on the big one.
    """
    t_small = best_time(run_ops(small))
    t_big = best_time(run_ops(big))
    ratio = t_big / max(t_small, 1e-6)
    if ratio > max_ratio and t_big > 0.05:
        raise AssertionError(
            f"I2 (O(1) operations): {op_name} took {t_big * 1e3:.1f} ms on {big:,} blocks vs "
            f"{t_small * 1e3:.1f} ms on {small:,} blocks ({ratio:.0f}x for 100x more blocks): "
            "it walks the list or copies it instead of relinking neighbours")
