"""Tests of mini_vllm.core.block_pool: allocation, reference counting and prefix caching."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from mini_vllm.core.block_pool import BlockHashToBlockMap, BlockPool
from mini_vllm.core.kv_cache_utils import (
    BlockHash,
    BlockHashWithGroupId,
    KVCacheBlock,
    get_request_block_hasher,
    hash_block_tokens,
    make_block_hash_with_group_id,
    sha256,
)
from mini_vllm.teaching.invariants import check_block_pool


class FakeRequest:
    """The slice of upstream's Request that the pool and the block hasher read."""

    def __init__(self, token_ids: list[int], block_size: int) -> None:
        self.all_token_ids = list(token_ids)
        self.cache_salt: str | None = None
        self.block_hashes: list[BlockHash] = []
        self._block_hasher = get_request_block_hasher(block_size, sha256)
        self.block_hashes.extend(self._block_hasher(self))

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    def append_output_token_ids(self, token_ids: list[int]) -> None:
        self.all_token_ids.extend(token_ids)
        self.block_hashes.extend(self._block_hasher(self))


def ids(blocks: list[KVCacheBlock]) -> list[int]:
    return [block.block_id for block in blocks]


def free_ids(pool: BlockPool) -> list[int]:
    return ids(pool.free_block_queue.get_all_free_blocks())


def key(block_hash: BlockHash, group_id: int = 0) -> BlockHashWithGroupId:
    return make_block_hash_with_group_id(block_hash, group_id)


def cached_request(
    pool: BlockPool, token_ids: list[int], block_size: int = 2
) -> tuple[FakeRequest, list[KVCacheBlock]]:
    """Allocate blocks for ``token_ids`` and cache the full ones, as the manager would."""
    request = FakeRequest(token_ids, block_size)
    blocks = pool.get_new_blocks(-(-len(token_ids) // block_size))
    pool.cache_full_blocks(request, blocks, 0, len(request.block_hashes), block_size, 0)
    return request, blocks


# ------------------------------------------------------------------------------------------
# Construction, allocation, freeing, usage
# ------------------------------------------------------------------------------------------


def test_construction_reserves_the_null_block() -> None:
    pool = BlockPool(num_gpu_blocks=5, enable_caching=True, hash_block_size=4)
    assert pool.null_block is pool.blocks[0] and pool.null_block.is_null
    assert pool.get_num_free_blocks() == 4
    assert free_ids(pool) == [1, 2, 3, 4]
    assert pool.get_usage() == 0.0
    assert len(pool.cached_block_hash_to_block) == 0
    check_block_pool(pool)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"num_gpu_blocks": 0, "enable_caching": True, "hash_block_size": 4}, ValueError),
        ({"num_gpu_blocks": 2.0, "enable_caching": True, "hash_block_size": 4}, ValueError),
        ({"num_gpu_blocks": 4, "enable_caching": True, "hash_block_size": 0}, ValueError),
    ],
)
def test_construction_rejects_bad_arguments(kwargs: dict, error: type[Exception]) -> None:
    with pytest.raises(error):
        BlockPool(**kwargs)


def test_get_new_blocks_pops_front_with_ref_cnt_one() -> None:
    pool = BlockPool(6, enable_caching=False, hash_block_size=2)
    assert pool.get_new_blocks(0) == []
    blocks = pool.get_new_blocks(3)
    assert ids(blocks) == [1, 2, 3]
    assert all(block.ref_cnt == 1 for block in blocks)
    assert free_ids(pool) == [4, 5]
    assert pool.get_usage() == pytest.approx(0.6)
    check_block_pool(pool)


def test_get_new_blocks_refuses_more_than_free() -> None:
    pool = BlockPool(6, enable_caching=True, hash_block_size=2)
    pool.get_new_blocks(2)
    with pytest.raises(ValueError) as excinfo:
        pool.get_new_blocks(5)
    assert str(excinfo.value) == "Cannot get 5 free blocks from the pool: only 3 are free"
    with pytest.raises(ValueError, match="negative"):
        pool.get_new_blocks(-1)
    assert pool.get_num_free_blocks() == 3
    check_block_pool(pool)


def test_free_blocks_appends_in_the_given_order() -> None:
    pool = BlockPool(6, enable_caching=True, hash_block_size=2)
    first = pool.get_new_blocks(3)
    pool.free_blocks(reversed(first))  # any iterable; a request frees its tail first
    assert free_ids(pool) == [4, 5, 3, 2, 1]
    assert all(block.ref_cnt == 0 for block in first)
    check_block_pool(pool, expected_free_order=[4, 5, 3, 2, 1])


def test_shared_block_is_freed_when_the_last_user_frees_it() -> None:
    pool = BlockPool(4, enable_caching=True, hash_block_size=2)
    block = pool.get_new_blocks(1)[0]
    pool.touch([block])
    assert block.ref_cnt == 2
    pool.free_blocks([block])
    assert block.ref_cnt == 1 and block.block_id not in free_ids(pool)
    pool.free_blocks([block])
    assert block.ref_cnt == 0 and free_ids(pool)[-1] == block.block_id
    check_block_pool(pool)


def test_free_blocks_rejects_null_block_and_double_free_atomically() -> None:
    pool = BlockPool(5, enable_caching=True, hash_block_size=2)
    a, b = pool.get_new_blocks(2)
    with pytest.raises(ValueError, match=r"Cannot free the null block \(block 0\)"):
        pool.free_blocks([a, pool.null_block])
    pool.free_blocks([b])
    with pytest.raises(ValueError, match="Cannot free block 2: its ref_cnt is already 0"):
        pool.free_blocks([a, b])
    # Neither failed call freed anything.
    assert a.ref_cnt == 1
    assert free_ids(pool) == [3, 4, 2]
    check_block_pool(pool, expected_ref_cnts={1: 1, 2: 0})


def test_get_usage() -> None:
    pool = BlockPool(5, enable_caching=False, hash_block_size=1)
    pool.get_new_blocks(1)
    assert pool.get_usage() == pytest.approx(0.25)
    pool.get_new_blocks(3)
    assert pool.get_usage() == pytest.approx(1.0)
    assert BlockPool(1, enable_caching=False, hash_block_size=1).get_usage() == 0.0


# ------------------------------------------------------------------------------------------
# BlockHashToBlockMap
# ------------------------------------------------------------------------------------------


def test_block_hash_to_block_map_keeps_duplicates() -> None:
    cache = BlockHashToBlockMap()
    k1, k2 = key(BlockHash(b"a")), key(BlockHash(b"b"))
    b1, b2, b3 = KVCacheBlock(1), KVCacheBlock(2), KVCacheBlock(3)
    assert cache.get_one_block(k1) is None
    cache.insert(k1, b1)
    cache.insert(k1, b2)
    cache.insert(k1, b3)
    cache.insert(k2, b2)
    assert len(cache) == 2
    assert cache.get_one_block(k1) is b1  # the earliest cached block
    assert cache.pop(k1, 1) is b1
    assert cache.get_one_block(k1) is b2
    assert cache.pop(k1, 7) is None
    assert cache.pop(k1, 2) is b2 and cache.pop(k1, 3) is b3
    assert cache.get_one_block(k1) is None and len(cache) == 1
    assert cache.pop(k2, 3) is None  # wrong block under a single-block key: kept
    assert cache.get_one_block(k2) is b2
    assert cache.pop(k2, 2) is b2 and len(cache) == 0
    assert cache.pop(k2, 2) is None


# ------------------------------------------------------------------------------------------
# Prefix caching: cache_full_blocks, get_cached_block, touch, eviction
# ------------------------------------------------------------------------------------------


def test_cache_full_blocks_indexes_full_blocks_only() -> None:
    pool = BlockPool(8, enable_caching=True, hash_block_size=2)
    request, blocks = cached_request(pool, [1, 2, 3, 4, 5])
    assert len(blocks) == 3 and len(request.block_hashes) == 2
    for block, block_hash in zip(blocks[:2], request.block_hashes):
        assert block.block_hash == key(block_hash)
        assert pool.get_cached_block(block_hash, [0]) == [block]
    assert blocks[2].block_hash is None
    assert pool.get_cached_block(request.block_hashes[0], [1]) is None  # other group: miss
    check_block_pool(pool)


def test_cache_full_blocks_continues_where_it_stopped() -> None:
    pool = BlockPool(8, enable_caching=True, hash_block_size=2)
    request, blocks = cached_request(pool, [1, 2, 3])
    request.append_output_token_ids([4, 5, 6])
    blocks += pool.get_new_blocks(1)
    pool.cache_full_blocks(request, blocks, 1, 1, 2, 0)  # nothing new: no-op
    pool.cache_full_blocks(request, blocks, 1, 3, 2, 0)
    expected = [
        hash_block_tokens(sha256, None, [1, 2]),
    ]
    expected.append(hash_block_tokens(sha256, expected[-1], [3, 4]))
    expected.append(hash_block_tokens(sha256, expected[-1], [5, 6]))
    assert [block.block_hash for block in blocks] == [key(h) for h in expected]
    check_block_pool(pool)


def test_cache_full_blocks_skips_null_and_masked_blocks() -> None:
    pool = BlockPool(8, enable_caching=True, hash_block_size=2)
    request = FakeRequest([1, 2, 3, 4, 5, 6], 2)
    blocks = [pool.null_block, *pool.get_new_blocks(2)]
    pool.cache_full_blocks(request, blocks, 0, 3, 2, 0, block_mask=[True, False, True])
    assert pool.null_block.block_hash is None
    assert blocks[1].block_hash is None
    assert blocks[2].block_hash == key(request.block_hashes[2])
    check_block_pool(pool)


def test_cache_full_blocks_rejects_bad_calls_without_caching_anything() -> None:
    pool = BlockPool(8, enable_caching=True, hash_block_size=2)
    request = FakeRequest([1, 2, 3, 4], 2)
    blocks = pool.get_new_blocks(2)
    with pytest.raises(ValueError, match="only 2 block hashes"):
        pool.cache_full_blocks(request, blocks, 0, 3, 2, 0)
    with pytest.raises(ValueError, match="only 1 blocks were given"):
        pool.cache_full_blocks(request, blocks[:1], 0, 2, 2, 0)
    with pytest.raises(ValueError, match="hash_block_size"):
        pool.cache_full_blocks(request, blocks, 0, 1, 4, 0)
    with pytest.raises(ValueError, match="block_mask"):
        pool.cache_full_blocks(request, blocks, 0, 2, 2, 0, block_mask=[True])
    pool.cache_full_blocks(request, blocks, 1, 2, 2, 0)
    with pytest.raises(RuntimeError, match="Cannot cache block 2: it already has a hash"):
        pool.cache_full_blocks(request, blocks, 0, 2, 2, 0)
    assert blocks[0].block_hash is None  # validated before caching block 1
    check_block_pool(pool)


def test_get_cached_block_returns_earliest_duplicate_and_needs_every_group() -> None:
    pool = BlockPool(8, enable_caching=True, hash_block_size=2)
    request, first = cached_request(pool, [7, 7])
    _, second = cached_request(pool, [7, 7])
    block_hash = request.block_hashes[0]
    assert first[0].block_hash == second[0].block_hash
    assert pool.get_cached_block(block_hash, [0]) == [first[0]]
    assert pool.get_cached_block(block_hash, [0, 1]) is None
    pool.cache_full_blocks(request, pool.get_new_blocks(1), 0, 1, 2, 1)
    assert ids(pool.get_cached_block(block_hash, [0, 1]) or []) == [1, 3]
    assert pool.get_cached_block(BlockHash(b"unknown"), [0]) is None
    check_block_pool(pool)


def test_touch_revives_a_free_cached_block_from_the_middle() -> None:
    pool = BlockPool(8, enable_caching=True, hash_block_size=2)
    request, blocks = cached_request(pool, [1, 2, 3, 4, 5, 6])
    pool.free_blocks(reversed(blocks))
    assert free_ids(pool) == [4, 5, 6, 7, 3, 2, 1]
    hit = pool.get_cached_block(request.block_hashes[1], [0])
    assert hit == [blocks[1]]
    pool.touch(hit)
    assert blocks[1].ref_cnt == 1
    assert free_ids(pool) == [4, 5, 6, 7, 3, 1]  # the rest keep their order
    pool.touch(hit)  # a second user of an in-use block: just one more reference
    assert blocks[1].ref_cnt == 2 and pool.get_num_free_blocks() == 6
    check_block_pool(pool, expected_free_order=[4, 5, 6, 7, 3, 1])


def test_touch_rejects_null_block_and_unqueued_free_block() -> None:
    pool = BlockPool(4, enable_caching=True, hash_block_size=2)
    block = pool.get_new_blocks(1)[0]
    with pytest.raises(ValueError, match="null block"):
        pool.touch([block, pool.null_block])
    assert block.ref_cnt == 1  # validated before touching anything
    block.ref_cnt = 0  # corrupt the state: free, but not in the queue
    with pytest.raises(RuntimeError, match="Cannot remove block 1 from the free queue"):
        pool.touch([block])


def test_reusing_a_free_cached_block_evicts_its_stale_hash() -> None:
    pool = BlockPool(3, enable_caching=True, hash_block_size=2)
    request, blocks = cached_request(pool, [1, 2, 3, 4])
    pool.free_blocks(reversed(blocks))
    assert free_ids(pool) == [2, 1]  # tail of the chain first
    (reused,) = pool.get_new_blocks(1)
    assert reused is blocks[1] and reused.block_hash is None
    assert pool.get_cached_block(request.block_hashes[1], [0]) is None
    assert pool.get_cached_block(request.block_hashes[0], [0]) == [blocks[0]]
    check_block_pool(pool)


def test_caching_disabled_pool_never_evicts() -> None:
    pool = BlockPool(3, enable_caching=False, hash_block_size=2)
    blocks = pool.get_new_blocks(2)
    pool.free_blocks(blocks)
    assert ids(pool.get_new_blocks(2)) == [1, 2]
    check_block_pool(pool)


def test_maybe_evict_cached_block() -> None:
    pool = BlockPool(6, enable_caching=True, hash_block_size=2)
    request, (first,) = cached_request(pool, [3, 3])
    _, (second,) = cached_request(pool, [3, 3])
    assert pool._maybe_evict_cached_block(first) is True
    assert first.block_hash is None
    assert pool._maybe_evict_cached_block(first) is False
    assert pool.get_cached_block(request.block_hashes[0], [0]) == [second]  # duplicate survives
    check_block_pool(pool)


def test_evict_blocks_only_uncaches() -> None:
    pool = BlockPool(6, enable_caching=True, hash_block_size=2)
    request, blocks = cached_request(pool, [1, 2, 3, 4])
    pool.evict_blocks({blocks[0].block_id, 0, 5})
    assert blocks[0].block_hash is None and blocks[0].ref_cnt == 1
    assert pool.get_cached_block(request.block_hashes[0], [0]) is None
    with pytest.raises(ValueError, match="Cannot evict block 6"):
        pool.evict_blocks({blocks[1].block_id, 6})
    with pytest.raises(ValueError, match="Cannot evict block -1"):
        pool.evict_blocks({-1})
    assert blocks[1].block_hash is not None  # the bad call evicted nothing
    check_block_pool(pool)


def test_reset_prefix_cache(caplog: pytest.LogCaptureFixture) -> None:
    pool = BlockPool(6, enable_caching=True, hash_block_size=2)
    request, blocks = cached_request(pool, [1, 2, 3, 4])
    with caplog.at_level(logging.WARNING, logger="mini_vllm.core.block_pool"):
        assert pool.reset_prefix_cache() is False
    assert "2 blocks are still in use" in caplog.text
    assert pool.get_cached_block(request.block_hashes[0], [0]) == [blocks[0]]
    pool.free_blocks(reversed(blocks))
    assert pool.reset_prefix_cache() is True
    assert len(pool.cached_block_hash_to_block) == 0
    assert all(block.block_hash is None for block in pool.blocks)
    assert pool.get_cached_block(request.block_hashes[0], [0]) is None
    check_block_pool(pool)


@dataclass
class RecordingCollector:
    events: list[tuple[str, int]] = field(default_factory=list)

    def on_block_allocated(self, block: KVCacheBlock) -> None:
        self.events.append(("allocated", block.block_id))

    def on_block_accessed(self, block: KVCacheBlock) -> None:
        self.events.append(("accessed", block.block_id))

    def on_block_evicted(self, block: KVCacheBlock) -> None:
        self.events.append(("evicted", block.block_id))

    def reset(self) -> None:
        self.events.append(("reset", -1))


def test_metrics_collector_hooks() -> None:
    collector = RecordingCollector()
    pool = BlockPool(3, enable_caching=True, hash_block_size=2, metrics_collector=collector)
    (block,) = pool.get_new_blocks(1)
    pool.touch([block])
    pool.evict_blocks({block.block_id})
    pool.free_blocks([block, block])
    assert pool.reset_prefix_cache()
    assert collector.events == [
        ("evicted", 1),  # a popped block is checked for a stale hash first
        ("allocated", 1),
        ("accessed", 1),
        ("evicted", 1),
        ("reset", -1),
    ]


# ------------------------------------------------------------------------------------------
# check_block_pool catches broken pools
# ------------------------------------------------------------------------------------------


def test_check_block_pool_reports_each_invariant() -> None:
    pool = BlockPool(6, enable_caching=True, hash_block_size=2)
    _, blocks = cached_request(pool, [1, 2, 3, 4])
    check_block_pool(pool)

    blocks[0].ref_cnt = 0
    with pytest.raises(AssertionError, match="I1 violated: block 1 has ref_cnt 0 and is not in"):
        check_block_pool(pool)
    blocks[0].ref_cnt = 1

    pool.free_block_queue.num_free_blocks += 1
    with pytest.raises(AssertionError, match="I2 violated"):
        check_block_pool(pool)
    pool.free_block_queue.num_free_blocks -= 1

    stale = blocks[1].block_hash
    blocks[1].reset_hash()
    with pytest.raises(AssertionError, match="I3 violated: block 2 is in the cache map"):
        check_block_pool(pool)
    blocks[1].block_hash = stale  # type: ignore[assignment]

    with pytest.raises(AssertionError, match="I4 violated: the free queue is"):
        check_block_pool(pool, expected_free_order=[5, 4, 3])
    with pytest.raises(AssertionError, match=r"I4 violated: block 2 .* still carries hash"):
        check_block_pool(pool, expected_block_hashes={2: None})
    with pytest.raises(AssertionError, match="I1 violated: block 1 has ref_cnt 1, expected 2"):
        check_block_pool(pool, expected_ref_cnts={1: 2})
    check_block_pool(pool, expected_free_order=[3, 4, 5])


# ------------------------------------------------------------------------------------------
# O(1): reviving and freeing a cached block does not depend on the pool size
# ------------------------------------------------------------------------------------------


def _best_touch_free_time(num_gpu_blocks: int, num_ops: int = 2000, repeats: int = 5) -> float:
    pool = BlockPool(num_gpu_blocks, enable_caching=True, hash_block_size=1)
    targets = [pool.blocks[1 + (i * 7919) % (num_gpu_blocks - 1)] for i in range(num_ops)]
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for block in targets:
            pool.touch([block])
            pool.free_blocks([block])
        best = min(best, time.perf_counter() - start)
    return best / num_ops


def test_touch_and_free_time_does_not_grow_with_pool_size() -> None:
    small = _best_touch_free_time(100)
    large = _best_touch_free_time(100_000)
    # O(n) would be ~1000x slower; 10x leaves room for cache misses on a loaded machine.
    assert large < 10 * small + 5e-6, (small, large)


# ------------------------------------------------------------------------------------------
# Stateful test: random request lifecycles against a simple model
# ------------------------------------------------------------------------------------------


TOKEN_IDS = st.integers(min_value=0, max_value=2)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class ModelRequest:
    request: FakeRequest
    blocks: list[KVCacheBlock]
    num_cached: int


class BlockPoolMachine(RuleBasedStateMachine):
    """Random request lifecycles; the model is a list (free order) and dicts (refs, hashes).

    Tokens come from a 3-letter alphabet and blocks are 1-3 tokens, so prefixes collide often:
    hits, duplicate cached blocks and eviction of cached blocks all happen in short runs.
    """

    @initialize(
        num_gpu_blocks=st.sampled_from([8, 16, 24, 1, 2, 4]),
        block_size=st.integers(min_value=1, max_value=3),
        enable_caching=st.sampled_from([True, True, True, False]),
    )
    def setup(self, num_gpu_blocks: int, block_size: int, enable_caching: bool) -> None:
        self.pool = BlockPool(num_gpu_blocks, enable_caching, block_size)
        self.block_size = block_size
        self.caching = enable_caching
        self.free_order: list[int] = list(range(1, num_gpu_blocks))
        self.ref_cnts: dict[int, int] = {i: 0 for i in range(1, num_gpu_blocks)}
        self.hashes: dict[int, BlockHashWithGroupId | None] = dict.fromkeys(range(num_gpu_blocks))
        self.cache: dict[BlockHashWithGroupId, list[int]] = {}
        self.requests: list[ModelRequest] = []
        self.history: list[list[int]] = []

    # -- model helpers -------------------------------------------------------------------

    def model_uncache(self, block_id: int) -> None:
        cache_key = self.hashes[block_id]
        if cache_key is None:
            return
        self.cache[cache_key].remove(block_id)
        if not self.cache[cache_key]:
            del self.cache[cache_key]
        self.hashes[block_id] = None

    def allocate(self, num_blocks: int) -> list[KVCacheBlock]:
        expected = self.free_order[:num_blocks]
        del self.free_order[:num_blocks]
        for block_id in expected:
            if self.caching:
                self.model_uncache(block_id)
            self.ref_cnts[block_id] = 1
        blocks = self.pool.get_new_blocks(num_blocks)
        assert ids(blocks) == expected
        return blocks

    def expect_allocation_error(self, num_blocks: int) -> None:
        free = self.pool.get_num_free_blocks()
        with pytest.raises(ValueError, match=f"Cannot get {num_blocks} free blocks"):
            self.pool.get_new_blocks(num_blocks)
        assert self.pool.get_num_free_blocks() == free

    def chain(self, token_ids: list[int]) -> list[BlockHash]:
        hashes: list[BlockHash] = []
        parent = None
        for start in range(0, len(token_ids) - self.block_size + 1, self.block_size):
            parent = hash_block_tokens(sha256, parent, token_ids[start : start + self.block_size])
            hashes.append(parent)
        return hashes

    # -- rules ---------------------------------------------------------------------------

    @rule(data=st.data())
    def add_request(self, data: st.DataObject) -> None:
        token_ids = data.draw(st.lists(TOKEN_IDS, max_size=9))
        if self.history and data.draw(st.booleans()):
            # Most prefix sharing comes from here: an earlier prompt's prefix, a new suffix.
            base = data.draw(st.sampled_from(self.history))
            token_ids = base[: data.draw(st.integers(0, len(base)))] + token_ids[:3]
        self.admit(token_ids, cache_now=self.caching and data.draw(st.booleans()))

    def admit(self, token_ids: list[int], cache_now: bool) -> None:
        """Look up the prefix cache, claim the hits, allocate the rest, as the manager does."""
        request = FakeRequest(token_ids, self.block_size)
        assert request.block_hashes == self.chain(token_ids)
        hits: list[KVCacheBlock] = []
        if self.caching:
            for block_hash in request.block_hashes:
                found = self.pool.get_cached_block(block_hash, [0])
                expected = self.cache.get(key(block_hash))
                if expected is None:
                    assert found is None
                    break
                assert found is not None and ids(found) == [expected[0]]
                hits.append(found[0])
        num_new = cdiv(len(token_ids), self.block_size) - len(hits)
        num_revived = sum(1 for block in hits if block.ref_cnt == 0)
        if num_new > self.pool.get_num_free_blocks() - num_revived:
            if num_new > self.pool.get_num_free_blocks():
                self.expect_allocation_error(num_new)
            return  # not admitted
        self.pool.touch(hits)
        for block in hits:
            if self.ref_cnts[block.block_id] == 0:
                self.free_order.remove(block.block_id)
            self.ref_cnts[block.block_id] += 1
        blocks = hits + self.allocate(num_new)
        entry = ModelRequest(request, blocks, num_cached=len(hits))
        self.requests.append(entry)
        self.history.append(list(token_ids))
        if cache_now:
            self.cache_full(entry)

    @precondition(lambda self: self.requests)
    @rule(data=st.data(), token_ids=st.lists(TOKEN_IDS, min_size=1, max_size=4))
    def append_tokens(self, data: st.DataObject, token_ids: list[int]) -> None:
        entry = data.draw(st.sampled_from(self.requests))
        num_tokens = entry.request.num_tokens + len(token_ids)
        num_new = cdiv(num_tokens, self.block_size) - len(entry.blocks)
        if num_new > self.pool.get_num_free_blocks():
            self.expect_allocation_error(num_new)
            return
        entry.request.append_output_token_ids(token_ids)
        assert entry.request.block_hashes == self.chain(entry.request.all_token_ids)
        entry.blocks += self.allocate(num_new)
        self.history.append(list(entry.request.all_token_ids))

    @precondition(lambda self: self.caching and self.requests)
    @rule(data=st.data())
    def cache_blocks(self, data: st.DataObject) -> None:
        self.cache_full(data.draw(st.sampled_from(self.requests)))

    def cache_full(self, entry: ModelRequest) -> None:
        num_full = len(entry.request.block_hashes)
        self.pool.cache_full_blocks(
            entry.request, entry.blocks, entry.num_cached, num_full, self.block_size, 0
        )
        expected_hashes = self.chain(entry.request.all_token_ids)
        for index in range(entry.num_cached, num_full):
            block_id = entry.blocks[index].block_id
            cache_key = key(expected_hashes[index])
            self.hashes[block_id] = cache_key
            self.cache.setdefault(cache_key, []).append(block_id)
        entry.num_cached = max(entry.num_cached, num_full)

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def free_request(self, data: st.DataObject) -> None:
        entry = data.draw(st.sampled_from(self.requests))
        self.requests.remove(entry)
        if data.draw(st.booleans()):
            order = list(reversed(entry.blocks))  # what the manager does
            self.pool.free_blocks(reversed(entry.blocks))
        else:
            order = data.draw(st.permutations(entry.blocks))
            self.pool.free_blocks(order)
        for block in order:
            self.ref_cnts[block.block_id] -= 1
            if self.ref_cnts[block.block_id] == 0:
                self.free_order.append(block.block_id)
        if self.caching and data.draw(st.booleans()):
            # The next turn of a conversation: the finished request's tokens are its prefix,
            # so its freed blocks are revived from the middle of the free queue.
            tokens = entry.request.all_token_ids
            prefix = tokens[: data.draw(st.integers(0, len(tokens)))]
            self.admit(prefix + data.draw(st.lists(TOKEN_IDS, max_size=3)), cache_now=True)

    @rule(data=st.data())
    def misuse(self, data: st.DataObject) -> None:
        """Double free, freeing or touching the null block: refused, and nothing changes."""
        in_use = [b for b in self.pool.blocks if b.ref_cnt > 0 and not b.is_null]
        if self.free_order and data.draw(st.booleans()):
            free_block = self.pool.blocks[data.draw(st.sampled_from(self.free_order))]
            with pytest.raises(ValueError, match="double free"):
                self.pool.free_blocks([*in_use[:1], free_block])
        else:
            with pytest.raises(ValueError, match="null block"):
                self.pool.free_blocks([*in_use[:1], self.pool.null_block])
            with pytest.raises(ValueError, match="null block"):
                self.pool.touch([*in_use[:1], self.pool.null_block])

    @rule(data=st.data())
    def evict(self, data: st.DataObject) -> None:
        num_blocks = self.pool.num_gpu_blocks
        block_ids = data.draw(st.sets(st.integers(0, num_blocks - 1), max_size=3))
        if data.draw(st.booleans()):
            with pytest.raises(ValueError):
                self.pool.evict_blocks(block_ids | {num_blocks})
        self.pool.evict_blocks(block_ids)
        for block_id in block_ids:
            self.model_uncache(block_id)

    @precondition(lambda self: self.cache or self.requests)
    @rule()
    def reset_prefix_cache(self) -> None:
        expected = all(ref_cnt == 0 for ref_cnt in self.ref_cnts.values())
        assert self.pool.reset_prefix_cache() is expected
        if expected:
            self.cache.clear()
            self.hashes = dict.fromkeys(self.hashes)

    # -- checks after every step ---------------------------------------------------------

    @invariant()
    def pool_matches_model(self) -> None:
        check_block_pool(
            self.pool,
            expected_free_order=self.free_order,
            expected_block_hashes=self.hashes,
            expected_ref_cnts=self.ref_cnts,
        )
        usable = self.pool.num_gpu_blocks - 1
        expected_usage = 1 - len(self.free_order) / usable if usable else 0.0
        assert self.pool.get_usage() == pytest.approx(expected_usage)


BlockPoolMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=50, deadline=None, database=None
)
TestBlockPoolMachine = BlockPoolMachine.TestCase


def test_block_pool_machine_example_reaches_every_state() -> None:
    """A fixed run through the machine: share, duplicate, evict on reuse, reset."""
    machine = BlockPoolMachine()
    machine.setup(num_gpu_blocks=5, block_size=2, enable_caching=True)
    machine.admit([1, 2, 1, 2], cache_now=False)
    first = machine.requests[0]

    class Draw:
        def __init__(self, *values: object) -> None:
            self.values = list(values)

        def draw(self, _strategy: object) -> object:
            return self.values.pop(0)

    machine.admit([1, 2, 1, 2], cache_now=False)  # duplicate before caching
    machine.cache_blocks(Draw(first))  # type: ignore[arg-type]
    machine.cache_blocks(Draw(machine.requests[1]))  # type: ignore[arg-type]
    machine.pool_matches_model()
    machine.free_request(Draw(first, True, False))  # type: ignore[arg-type]
    machine.admit([1, 2, 1, 2, 0], cache_now=True)  # hits the first request's freed blocks
    assert machine.requests[-1].num_cached == 2
    machine.pool_matches_model()
    for entry in list(machine.requests):
        machine.free_request(Draw(entry, True, False))  # type: ignore[arg-type]
    machine.reset_prefix_cache()
    machine.pool_matches_model()
    assert len(machine.pool.cached_block_hash_to_block) == 0
