"""Tests of mini_vllm.teaching.invariants: the one statement of I1-I4 that the reference's tests,
the simulator and the graded suites share.

The graded suites read a learner's pool in the learner process and judge the data in the
judge, so the tests here check both halves: the snapshot is plain data that survives a copy,
and each invariant, broken on purpose, is reported by name with the block that broke it.
(The breakages shared with the older checks are in test_block_pool.py and test_kv_cache_utils.py.)
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mini_vllm.core.block_pool import BlockPool
from mini_vllm.core.kv_cache_utils import (
    FreeKVCacheBlockQueue,
    KVCacheBlock,
    get_request_block_hasher,
    sha256,
)
from mini_vllm.teaching.invariants import (
    as_int,
    check_block_pool,
    check_free_queue,
    check_pool_snapshot,
    check_queue_snapshot,
    describe,
    pool_snapshot,
    queue_snapshot,
    same_data,
)


class FakeRequest:
    """What ``cache_full_blocks`` and the block hasher read of a request."""

    def __init__(self, token_ids: list[int], block_size: int = 2) -> None:
        self.request_id = "r"
        self.all_token_ids = list(token_ids)
        self.num_tokens = len(token_ids)
        self.lora_request = None
        self.cache_salt = None
        self.block_hashes: list[bytes] = []
        self.block_hashes += get_request_block_hasher(block_size, sha256)(self)


def cached_pool() -> tuple[BlockPool, list[KVCacheBlock]]:
    """Six blocks: 1 and 2 hold a cached two-block prefix, 3-5 are free."""
    pool = BlockPool(6, enable_caching=True, hash_block_size=2)
    request = FakeRequest([1, 2, 3, 4])
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(request, blocks, 0, 2, 2, 0)
    return pool, blocks


def plain(value: Any) -> bool:
    """Whether ``value`` is built of builtin data only, as the grader's wire carries it."""
    if value is None or type(value) in (bool, int, float, str, bytes):
        return True
    if type(value) in (list, tuple):
        return all(plain(v) for v in value)
    if type(value) is dict:
        return all(type(k) is str and plain(v) for k, v in value.items())
    return False


# ------------------------------------------------------------------------------------------
# Reading: plain data, and the verdict needs nothing else
# ------------------------------------------------------------------------------------------


def test_snapshots_are_plain_data_and_judged_alone() -> None:
    pool, _ = cached_pool()
    snap = pool_snapshot(pool, hashes=True, cache_map=True)
    assert plain(snap)
    assert check_pool_snapshot(copy.deepcopy(snap)) == [3, 4, 5]
    assert check_block_pool(pool) == [3, 4, 5]
    queue = queue_snapshot(pool.free_block_queue)
    assert plain(queue) and check_queue_snapshot(copy.deepcopy(queue)) == [3, 4, 5]


def test_the_cache_map_and_hashes_are_read_only_when_asked() -> None:
    pool, _ = cached_pool()
    snap = pool_snapshot(pool)
    assert snap["hashes"] is None and snap["cache_map"] is None
    check_pool_snapshot(snap)  # I1, I2 only


def test_learner_values_must_be_plain() -> None:
    class Sneaky(int):
        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = int.__hash__

    assert not same_data(Sneaky(3), 3) and same_data([1, b"x"], [1, b"x"])
    with pytest.raises(AssertionError, match="must be a plain int, got True"):
        as_int(True, "ref_cnt")
    assert describe(Sneaky(3)).startswith("a ") and describe([1] * 100).endswith("...")
    pool, _ = cached_pool()
    snap = pool_snapshot(pool)
    snap["ref_cnts"][1] = Sneaky(1)
    with pytest.raises(AssertionError, match="block 1's ref_cnt must be a plain int"):
        check_pool_snapshot(snap)


# ------------------------------------------------------------------------------------------
# Judging: each breakage is named
# ------------------------------------------------------------------------------------------


def test_the_null_block_and_the_block_count() -> None:
    pool, blocks = cached_pool()
    pool.num_gpu_blocks = 7
    with pytest.raises(AssertionError, match="I1 violated: the pool has 6 blocks but num_gpu_bl"):
        check_block_pool(pool)
    pool.num_gpu_blocks = 6
    pool.null_block = blocks[0]
    with pytest.raises(AssertionError, match="the null block must be block 0"):
        check_block_pool(pool)
    pool.null_block = pool.blocks[0]
    pool.blocks[0].block_hash = blocks[0].block_hash
    with pytest.raises(AssertionError, match=r"the null block \(block 0\) has a hash"):
        check_block_pool(pool)
    pool.blocks[0].reset_hash()
    blocks[1].is_null = True
    with pytest.raises(AssertionError, match="block 2 has is_null True; only block 0"):
        check_block_pool(pool)


def test_sentinels_and_the_pair_that_does_not_point_back() -> None:
    blocks = [KVCacheBlock(i) for i in range(4)]
    queue = FreeKVCacheBlockQueue(blocks)
    queue.fake_free_list_head.prev_free_block = blocks[3]
    with pytest.raises(AssertionError, match="the head sentinel has a prev_free_block"):
        check_free_queue(queue)
    queue = FreeKVCacheBlockQueue(blocks)
    queue.fake_free_list_tail.next_free_block = blocks[0]
    with pytest.raises(AssertionError, match="the tail sentinel has a next_free_block"):
        check_free_queue(queue)
    queue = FreeKVCacheBlockQueue(blocks)
    extra = KVCacheBlock(9)  # the backward walk goes on past the front block, to block 9
    blocks[0].prev_free_block, extra.prev_free_block = extra, queue.fake_free_list_head
    with pytest.raises(
        AssertionError,
        match=r"block 0's prev_free_block is block 9, but walking "
        r"forward it comes first",
    ):
        check_free_queue(queue)
    queue = FreeKVCacheBlockQueue(blocks)
    blocks[1].prev_free_block = queue.fake_free_list_head  # the backward walk stops early
    with pytest.raises(
        AssertionError,
        match=r"block 1's prev_free_block is the head sentinel, "
        r"but walking forward block 0 comes before it",
    ):
        check_free_queue(queue)


def test_membership_links_and_order() -> None:
    pool, blocks = cached_pool()
    stranger = KVCacheBlock(4)
    pool.free_block_queue.remove(pool.blocks[4])
    pool.free_block_queue.append(stranger)
    with pytest.raises(AssertionError, match=r"I1 violated: the free queue holds block\(s\) \[4\]"):
        check_block_pool(pool)
    pool, blocks = cached_pool()
    blocks[0].next_free_block = pool.blocks[3]
    with pytest.raises(AssertionError, match="block 1 is not in the free queue but keeps a"):
        check_block_pool(pool)
    pool, _ = cached_pool()
    pool.blocks[4].block_id, pool.blocks[5].block_id = 5, 4
    with pytest.raises(AssertionError, match=r"pool.blocks\[4\] has block_id 5"):
        check_block_pool(pool)


def test_the_cache_map() -> None:
    pool, blocks = cached_pool()
    raw = pool.cached_block_hash_to_block._cache
    key = blocks[0].block_hash
    raw[key] = {}
    with pytest.raises(AssertionError, match=r"I3 violated: cache key .* maps to no block"):
        check_block_pool(pool)
    raw[key] = {7: blocks[0]}
    with pytest.raises(AssertionError, match="I3 violated: block 1 is filed under block id 7"):
        check_block_pool(pool)
    raw[key] = KVCacheBlock(1)
    with pytest.raises(AssertionError, match=r"the cache map files block 1 under .*, not one of"):
        check_block_pool(pool)
    raw[key] = pool.null_block
    with pytest.raises(AssertionError, match=r"the null block \(block 0\) is in the cache map"):
        check_block_pool(pool)
    del raw[key]
    with pytest.raises(AssertionError, match=r"block 1 has block_hash .* but is not in the cache"):
        check_block_pool(pool)


def test_the_model_checks_need_what_they_compare() -> None:
    pool, blocks = cached_pool()
    hashes = {1: blocks[0].block_hash, 2: blocks[1].block_hash, 3: None}
    assert check_pool_snapshot(pool_snapshot(pool, hashes=True), [3, 4, 5], hashes) == [3, 4, 5]
    with pytest.raises(AssertionError, match=r"I4 violated: block 3 \(ref_cnt=0\) lost its cac"):
        check_pool_snapshot(
            pool_snapshot(pool, hashes=True), expected_block_hashes={3: blocks[0].block_hash}
        )
    with pytest.raises(AssertionError, match=r"I3 violated: block 1 has hash .*, expected"):
        check_pool_snapshot(
            pool_snapshot(pool, hashes=True), expected_block_hashes={1: blocks[1].block_hash}
        )
    with pytest.raises(AssertionError, match="needs a snapshot taken with hashes=True"):
        check_pool_snapshot(pool_snapshot(pool), expected_block_hashes={1: None})


@settings(max_examples=40, deadline=None, database=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=12), st.data())
def test_any_flipped_ref_cnt_is_caught(takes: list[int], data: st.DataObject) -> None:
    """Whatever the pool went through, one block's ref_cnt flipped between zero and non-zero
    (the bug of a forgotten or doubled decrement) is an I1 failure naming that block."""
    pool = BlockPool(8, enable_caching=False, hash_block_size=2)
    held: list[KVCacheBlock] = []
    for n in takes:
        if n <= pool.get_num_free_blocks():
            held += pool.get_new_blocks(n)
        elif held:
            pool.free_blocks(held[: len(held) // 2 + 1])
            del held[: len(held) // 2 + 1]
    free = check_block_pool(pool)
    snap = pool_snapshot(pool)
    block_id = data.draw(st.integers(1, 7), label="block")
    snap["ref_cnts"][block_id] = 1 if block_id in free else 0
    with pytest.raises(AssertionError, match=f"I1 violated: block {block_id} has ref_cnt"):
        check_pool_snapshot(snap)


# ------------------------------------------------------------------------------------------
# lab-07's positional snapshots are judged by the same statements
# ------------------------------------------------------------------------------------------


def lab07_state(**change: Any) -> dict[str, Any]:
    """lab-07's state of a reference manager after two requests that share a prefix, then
    ``change`` applied to its fields (a broken pool, as the judge would receive it)."""
    from mini_vllm.core.kv_cache_manager import KVCacheManager
    from tests.labs.lab_07 import learner_side

    driver = learner_side.Driver(KVCacheManager(10, learner_side.BS, 64))
    driver.arrive("a", list(range(9)))
    driver.admit("a")
    driver.arrive("b", [*range(8), 50, 51])
    driver.admit("b")
    state = driver.state()
    state.update(change)
    return state


def test_lab07_states_are_checked_by_the_shared_statements() -> None:
    from tests.labs.lab_07.checks import check_pool_state, check_state

    state = lab07_state()
    check_state(state, expected_ref_cnts={1: 2, 2: 2, 3: 1, 4: 1})
    refs = list(state["ref_cnt"])
    refs[5] = 1
    broken = [
        ({"ref_cnt": refs}, "I1 violated: block 5 has ref_cnt 1 and is in the free queue"),
        ({"null": 3}, "the null block must be block 0"),
        (
            {"forward": state["forward"][:-1], "forward_end": "none"},
            r"walking forward from the head sentinel hit None .* reached block 8, whose next_",
        ),
        ({"backward": [9, *state["backward"][1:]]}, "pair disagrees"),
        (
            {"forward": [-1, *state["forward"][1:]], "backward": [-1, *state["backward"][1:]]},
            r"the free queue holds block\(s\) \[-1\] that are not objects of pool.blocks",
        ),
        ({"hash": [None] * 10}, "I3 violated: block 1 is in the cache map under"),
        (
            {"cache_map": [[*state["cache_map"][0][:2], 0]]},
            r"the null block \(block 0\) is in the cache map",
        ),
        ({"get_num_free_blocks": 7}, "the free queue links 5 blocks but get_num_free_blocks"),
        ({"num_gpu_blocks": True}, "num_gpu_blocks must be a plain int, got True"),
    ]
    for change, message in broken:
        with pytest.raises(AssertionError, match=message):
            check_pool_state(lab07_state(**change))
