"""lab-07, part 3: freeing tail first, block ids, usage."""

from __future__ import annotations

import pytest

from grading.suite import graded
from mini_vllm.core.invariants import check_block_pool
from tests.labs.lab_07.helpers import (
    DOC,
    admit,
    free_queue,
    make_manager,
    make_request,
    table,
)


@graded(3, "Freeing: a request's blocks go back tail first, so under LRU eviction the end of a "
           "sequence is evicted before its prefix", f"{DOC}#freeing-tail-first")
def test_free_returns_blocks_tail_first():
    """a holds 1 2 3; after free the queue is 4 5 3 2 1 and eviction takes 3 before 1."""
    mgr = make_manager(6)
    a = make_request("a", range(12))
    admit(mgr, a)
    assert table(mgr, "a") == [1, 2, 3]
    mgr.free(a)
    assert free_queue(mgr) == [4, 5, 3, 2, 1], (
        f"never-used blocks 4, 5 stay in front and a's blocks follow tail first: expected "
        f"[4, 5, 3, 2, 1], got {free_queue(mgr)}")
    c = make_request("c", [70 + i for i in range(13)])
    admit(mgr, c)
    assert table(mgr, "c") == [4, 5, 3, 2], (
        f"c's 4 blocks come from the front of the queue: [4, 5, 3, 2], got {table(mgr, 'c')}")
    _, num_hit = mgr.get_computed_blocks(make_request("d", range(5)))
    assert num_hit == 4, "a's first block (block 1) was freed last and must still be cached"
    check_block_pool(mgr.block_pool)


@graded(2, "Freeing: free forgets the request (its req_to_blocks and num_cached_block entries), "
           "so a preempted request can be admitted again from scratch", f"{DOC}#freeing-tail-first")
def test_free_forgets_the_request():
    """Free, then admit the same request again (a preemption by recompute)."""
    mgr = make_manager(10)
    a = make_request("a", range(10))
    admit(mgr, a)
    mgr.free(a)
    assert "a" not in mgr.req_to_blocks, "free must remove the request's block table"
    assert "a" not in mgr.num_cached_block, "free must forget how many of its blocks were cached"
    a.num_computed_tokens = 0
    a.num_preemptions += 1
    new, num_hit = admit(mgr, a)
    assert num_hit == 8 and new is not None, "readmitted, a hits its own two cached blocks"
    assert len(table(mgr, "a")) == 3, (
        f"a's new table covers 10 tokens in 3 blocks, got {table(mgr, 'a')}")
    check_block_pool(mgr.block_pool, expected_ref_cnts={b: 1 for b in table(mgr, "a")})


@graded(2, "Freeing: a block shared with another request stays held (ref_cnt drops by one) and "
           "out of the free queue", f"{DOC}#freeing-tail-first")
def test_free_keeps_shared_blocks_held():
    """a and b share two blocks; freeing a leaves them to b."""
    mgr = make_manager(10)
    a = make_request("a", range(9))
    b = make_request("b", range(9))
    admit(mgr, a)
    admit(mgr, b)
    mgr.free(a)
    check_block_pool(mgr.block_pool, expected_ref_cnts={1: 1, 2: 1})
    assert 1 not in free_queue(mgr) and 2 not in free_queue(mgr)
    mgr.free(b)
    check_block_pool(mgr.block_pool, expected_ref_cnts={1: 0, 2: 0})
    assert mgr.block_pool.get_num_free_blocks() == 9


@graded(1, "Freeing: freeing a request that holds no blocks (aborted while waiting) is a no-op",
        f"{DOC}#freeing-tail-first")
def test_free_unknown_request():
    """Nothing to free: nothing changes."""
    mgr = make_manager(10)
    admit(mgr, make_request("a", range(5)))
    queue = free_queue(mgr)
    mgr.free(make_request("ghost", [1, 2, 3]))
    assert free_queue(mgr) == queue and "ghost" not in mgr.req_to_blocks


@graded(2, "get_block_ids: the request's table as ids, one list per KV cache group: ([1, 2, 3],); "
           "([],) for a request holding nothing", f"{DOC}#block-tables")
def test_get_block_ids():
    """Ids in table order, wrapped in a one-group tuple."""
    mgr = make_manager(10)
    a = make_request("a", range(9))
    admit(mgr, a)
    admit(mgr, make_request("b", [*range(8), 40, 41, 42, 43, 44]))
    assert mgr.get_block_ids("a") == ([1, 2, 3],), f"got {mgr.get_block_ids('a')}"
    assert mgr.get_block_ids("b") == ([1, 2, 4, 5],), f"got {mgr.get_block_ids('b')}"
    assert mgr.get_block_ids("nobody") == ([],), f"got {mgr.get_block_ids('nobody')}"
    mgr.free(a)
    assert mgr.get_block_ids("a") == ([],)


@graded(2, "usage: the fraction of usable blocks (the null block excluded) held by requests; "
           "free cached blocks count as free", f"{DOC}#usage-and-prefix-cache-statistics")
def test_usage():
    """10 blocks = 9 usable; 3 held is 1/3."""
    mgr = make_manager(10)
    assert mgr.usage == 0.0
    a = make_request("a", range(10))
    admit(mgr, a)
    assert mgr.usage == pytest.approx(3 / 9), f"3 of 9 usable blocks held: 0.333, got {mgr.usage}"
    admit(mgr, make_request("b", [*range(8), 5]))
    assert mgr.usage == pytest.approx(4 / 9), "b shares 2 blocks and takes 1: 4 blocks held"
    mgr.free(a)
    assert mgr.usage == pytest.approx(3 / 9), "b still holds 3 blocks"
