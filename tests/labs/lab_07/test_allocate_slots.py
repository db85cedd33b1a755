"""lab-07, part 2: allocate_slots — new blocks only, all or nothing, hits claimed, publishing."""

from __future__ import annotations

import pytest

from grading.suite import graded
from mini_vllm.core.invariants import check_block_pool
from tests.labs.common import check_pool
from tests.labs.lab_07.helpers import (
    BS,
    DOC,
    admit,
    block_ids,
    cache_key,
    decode,
    describe_change,
    free_queue,
    make_manager,
    make_request,
    snapshot,
    table,
)


@graded(2, "Allocating slots: a request with n tokens to place holds cdiv(n, block_size) blocks, "
           "in order, each with ref_cnt 1", f"{DOC}#allocating-slots")
def test_prefill_gets_cdiv_blocks():
    """10 tokens, blocks of 4: three blocks, taken from the front of the free queue."""
    mgr = make_manager(10)
    req = make_request("a", range(10))
    new, num_hit = admit(mgr, req)
    assert num_hit == 0
    assert new is not None, "9 blocks are free: 3 must fit"
    assert block_ids(new) == [1, 2, 3], (
        f"a fresh pool hands out blocks 1, 2, 3 for 10 tokens; allocate_slots returned "
        f"{block_ids(new)}")
    assert table(mgr, "a") == [1, 2, 3], (
        f"req_to_blocks['a'] should be [1, 2, 3], is {table(mgr, 'a')}")
    assert mgr.block_pool.get_num_free_blocks() == 6
    check_block_pool(mgr.block_pool, expected_ref_cnts={1: 1, 2: 1, 3: 1})


@graded(3, "Allocating slots: allocate_slots returns only the blocks it added this call (none "
           "when the table has room), never the whole table", f"{DOC}#allocating-slots")
def test_returns_only_new_blocks():
    """Decode steps fill the last block before a new one is taken."""
    mgr = make_manager(10)
    req = make_request("a", range(6))
    admit(mgr, req)
    for token, expected in ((100, []), (101, []), (102, [3]), (103, []), (104, [])):
        new = decode(mgr, req, token)
        assert new is not None, "the pool has room"
        assert block_ids(new) == expected, (
            f"decoding token {req.num_tokens} (slot {req.num_tokens - 1}) of a request holding "
            f"{table(mgr, 'a')}: expected new blocks {expected}, got {block_ids(new)}")
    assert table(mgr, "a") == [1, 2, 3]


@graded(3, "Claiming hits: allocate_slots touches the hits (ref_cnt + 1) and puts them first in "
           "the new request's table; only the fresh blocks are returned", f"{DOC}#claiming-hits")
def test_hits_are_shared_and_touched():
    """b shares a's first 8 tokens: both tables start with the same two blocks."""
    mgr = make_manager(10)
    admit(mgr, make_request("a", range(9)))
    b = make_request("b", [*range(8), 55, 56])
    new, num_hit = admit(mgr, b)
    assert num_hit == 8
    assert new is not None and block_ids(new) == [4], (
        f"b needs 10 slots: 2 hit blocks + 1 fresh; allocate_slots must return only the fresh "
        f"block [4], got {None if new is None else block_ids(new)}")
    assert table(mgr, "b") == [1, 2, 4], f"b's table should be [1, 2, 4], is {table(mgr, 'b')}"
    check_block_pool(mgr.block_pool, expected_ref_cnts={1: 2, 2: 2, 3: 1, 4: 1})
    assert b.block_hashes[0] and mgr.block_pool.blocks[1].block_hash == cache_key(b, 0), (
        "a hit block keeps its hash")


@graded(3, "Claiming hits: a hit on a free cached block revives it: ref_cnt 1, out of the free "
           "queue, and it costs one free block", f"{DOC}#claiming-hits")
def test_free_cached_hits_are_revived():
    """a finished; b with the same prefix gets a's blocks back."""
    mgr = make_manager(10)
    a = make_request("a", range(9))
    admit(mgr, a)
    mgr.free(a)
    free_before = mgr.block_pool.get_num_free_blocks()
    b = make_request("b", range(9))
    new, num_hit = admit(mgr, b)
    assert num_hit == 8 and new is not None
    assert table(mgr, "b")[:2] == [1, 2], (
        f"b must reuse blocks 1 and 2, its table is {table(mgr, 'b')}")
    assert 1 not in free_queue(mgr) and 2 not in free_queue(mgr), (
        "revived hit blocks must leave the free queue")
    assert mgr.block_pool.get_num_free_blocks() == free_before - 3, (
        "b took 2 free hit blocks and 1 fresh block: 3 fewer free blocks")
    check_block_pool(mgr.block_pool, expected_ref_cnts={1: 1, 2: 1})


@graded(4, "All or nothing: when the blocks do not fit, allocate_slots returns None and changes "
           "NOTHING: free count, free-queue order, ref counts, hashes, block tables (no empty "
           "entry either)", f"{DOC}#all-or-nothing")
def test_none_changes_nothing():
    """4 usable blocks, 3 held: a request needing 2 is refused cleanly."""
    mgr = make_manager(5)
    a = make_request("a", range(12))
    admit(mgr, a)
    b = make_request("b", [50 + i for i in range(8)])
    before = snapshot(mgr)
    assert mgr.allocate_slots(b, 8) is None, "b needs 2 blocks, 1 is free: expected None"
    after = snapshot(mgr)
    assert after == before, f"a refused allocation changed {describe_change(before, after)}"
    assert "b" not in mgr.req_to_blocks, (
        "a refused request must not get an entry in req_to_blocks, not even an empty one")
    # A running request that cannot grow is refused the same way.
    assert mgr.allocate_slots(make_request("c", range(4)), 4) is not None  # the last free block
    before = snapshot(mgr)
    assert decode(mgr, a, 7) is None, "a's 13th slot needs a 4th block and none is free: None"
    after = snapshot(mgr)
    assert after == before, f"a refused decode changed {describe_change(before, after)}"
    check_pool(mgr.block_pool)


@graded(3, "All or nothing: a refused admission leaves its prefix hits unclaimed (ref_cnt 0, in "
           "the free queue, same place)", f"{DOC}#all-or-nothing")
def test_none_leaves_hits_unclaimed():
    """b's hits are free cached blocks; b does not fit, then fits with one token fewer."""
    mgr = make_manager(5)
    a = make_request("a", range(9))
    admit(mgr, a)
    mgr.free(a)
    b = make_request("b", [*range(8), *(90 + i for i in range(9))])
    hits, num_hit = mgr.get_computed_blocks(b)
    assert num_hit == 8
    before = snapshot(mgr)
    assert mgr.allocate_slots(b, 9, num_hit, hits) is None, (
        "b needs 17 slots = 5 blocks: 2 free hits + 3 fresh > 4 free blocks")
    after = snapshot(mgr)
    assert after == before, f"a refused admission changed {describe_change(before, after)}"
    assert all(blk.ref_cnt == 0 for blk in hits.blocks[0]), "refused hits must not be touched"
    assert mgr.allocate_slots(b, 8, num_hit, hits) is not None, (
        "with 8 new tokens b needs 4 blocks (2 hits + 2 fresh) and 4 are free: it fits")
    check_pool(mgr.block_pool)


@graded(3, "Capacity: claiming a free cached hit takes a block out of the free queue, so hits "
           "with ref_cnt 0 count against the free blocks just like fresh ones",
        f"{DOC}#hits-on-free-blocks-cost-capacity")
def test_free_hits_count_against_capacity():
    """3 usable blocks; b hits 2 free blocks and needs 2 more: 4 > 3, so None."""
    mgr = make_manager(4)
    a = make_request("a", range(8))
    admit(mgr, a)
    mgr.free(a)
    b = make_request("b", [*range(8), 99, 98, 97, 96, 95])
    hits, num_hit = mgr.get_computed_blocks(b)
    assert num_hit == 8
    before = snapshot(mgr)
    try:
        result = mgr.allocate_slots(b, 5, num_hit, hits)
    except (ValueError, RuntimeError) as exc:
        raise AssertionError(
            f"allocate_slots ran out of blocks half-way ({type(exc).__name__}: {exc}): it must "
            f"count the 2 free hit blocks it will claim, see 4 > 3 free, and return None") from exc
    assert result is None, "b needs 4 blocks (2 free hits + 2 fresh), 3 are free: expected None"
    after = snapshot(mgr)
    assert after == before, f"a refused admission changed {describe_change(before, after)}"


@graded(3, "Publishing: every block this step fills completely is cached (under the request's "
           "chained hash), once; partial blocks are not", f"{DOC}#publishing-full-blocks")
def test_newly_full_blocks_are_published():
    """7 tokens publish one block; the decode that fills the second publishes it."""
    mgr = make_manager(10)
    a = make_request("a", range(7))
    admit(mgr, a)
    blocks = mgr.req_to_blocks["a"]
    assert blocks[0].block_hash == cache_key(a, 0), "block 0 is full after the prefill: cached"
    assert blocks[1].block_hash is None, "block 1 holds 3 of 4 tokens: it must not be cached"
    decode(mgr, a, 7)
    assert blocks[1].block_hash == cache_key(a, 1), (
        "the decode step scheduled a's 8th token: block 1 is full now and must be cached")
    decode(mgr, a, 8)
    assert mgr.req_to_blocks["a"][2].block_hash is None
    _, num_hit = mgr.get_computed_blocks(make_request("b", [*range(8), 1]))
    assert num_hit == 8, (
        f"both full blocks of a are published: expected an 8-token hit, got {num_hit}")
    check_block_pool(mgr.block_pool)


@graded(3, "Publishing: only tokens computed by this step count: a prefill chunk publishes the "
           "blocks it fills, not the rest of the prompt", f"{DOC}#publishing-full-blocks")
def test_a_chunk_publishes_only_what_it_fills():
    """A 12-token prompt in chunks of 6: 1 block, then 3."""
    mgr = make_manager(10)
    a = make_request("a", range(12))
    new = mgr.allocate_slots(a, 6)
    assert new is not None and len(new.blocks[0]) == 2
    a.num_computed_tokens = 6
    blocks = mgr.req_to_blocks["a"]
    assert blocks[0].block_hash == cache_key(a, 0)
    assert blocks[1].block_hash is None, (
        "after a 6-token chunk block 1 holds only 2 computed tokens: it must not be cached yet")
    new = mgr.allocate_slots(a, 6)
    assert new is not None and len(new.blocks[0]) == 1
    assert [blk.block_hash for blk in mgr.req_to_blocks["a"]] == [cache_key(a, i) for i in range(3)]


@graded(2, "Publishing: lookahead slots are allocated but never published: only tokens the "
           "request has and this step computes are cached", f"{DOC}#publishing-full-blocks")
def test_lookahead_slots_are_not_published():
    """4 tokens computed, 8 lookahead slots: 3 blocks, 1 cached."""
    mgr = make_manager(10)
    a = make_request("a", range(12))
    new = mgr.allocate_slots(a, 4, num_lookahead_tokens=8)
    assert new is not None and len(new.blocks[0]) == 3, "4 + 8 slots: 3 blocks"
    hashes = [blk.block_hash for blk in mgr.req_to_blocks["a"]]
    assert hashes[0] == cache_key(a, 0) and hashes[1:] == [None, None], (
        "only block 0 is computed this step; blocks 1 and 2 are lookahead slots and must not "
        "be cached")


@graded(2, "Allocating slots: no request gets slots beyond max_model_len",
        f"{DOC}#allocating-slots")
def test_slots_capped_at_max_model_len():
    """max_model_len 8: 6 tokens + 10 lookahead still get only 2 blocks."""
    mgr = make_manager(10, max_model_len=8)
    a = make_request("a", range(6))
    new = mgr.allocate_slots(a, 6, num_lookahead_tokens=10)
    assert new is not None and len(new.blocks[0]) == 2, (
        f"max_model_len=8 caps the slots at 8 = 2 blocks, got "
        f"{None if new is None else len(new.blocks[0])} blocks")


@graded(1, "Allocating slots: num_new_tokens must be > 0 (ValueError), and hits must match "
           "num_new_computed_tokens", f"{DOC}#allocating-slots")
def test_bad_arguments_are_rejected():
    """Nothing to allocate for, or hits that do not add up, is the caller's bug."""
    mgr = make_manager(10)
    a = make_request("a", range(6))
    with pytest.raises(ValueError):
        mgr.allocate_slots(a, 0)
    with pytest.raises(ValueError):
        mgr.allocate_slots(a, 2, num_new_computed_tokens=BS)  # claims hits, gives no blocks
    assert "a" not in mgr.req_to_blocks and mgr.block_pool.get_num_free_blocks() == 9
