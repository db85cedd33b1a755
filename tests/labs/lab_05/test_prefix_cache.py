"""lab-05, part 2: caching full blocks, hits, revival, eviction order and reset."""

from __future__ import annotations

from types import SimpleNamespace
from typing import ClassVar

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from grading.suite import graded, load_impl
from mini_vllm.core.kv_cache_utils import hash_block_tokens, sha256
from tests.labs.common import STATEFUL_SETTINGS, assert_constant_time, check_pool, free_ids

DOC = "phases/02-paged-attention/README.md"
BS = 2


def make_pool(n: int, caching: bool = True):
    return load_impl("block_pool").BlockPool(num_gpu_blocks=n, enable_caching=caching,
                                             hash_block_size=BS)


def make_request(tokens: list[int], rid: str = "r"):
    hashes, parent = [], None
    for i in range(0, len(tokens) - len(tokens) % BS, BS):
        parent = hash_block_tokens(sha256, parent, tokens[i:i + BS])
        hashes.append(parent)
    return SimpleNamespace(request_id=rid, block_hashes=hashes, all_token_ids=list(tokens),
                           num_tokens=len(tokens), lora_request=None)


def ids(blocks) -> list[int]:
    return [b.block_id for b in blocks]


def hit(pool, block_hash):
    found = pool.get_cached_block(block_hash, [0])
    return None if found is None else found[0]


@graded(3, "I3: cache_full_blocks hashes blocks[num_cached:num_full] with the request's "
           "block_hashes and indexes them", f"{DOC}#caching-full-blocks")
def test_cache_full_blocks_indexes_new_full_blocks():
    """Only the newly full blocks are cached; earlier ones are left alone."""
    pool = make_pool(8)
    req = make_request([1, 2, 3, 4, 5, 6])
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(req, blocks, 0, 2, BS, 0)
    assert hit(pool, req.block_hashes[0]) is blocks[0]
    assert hit(pool, req.block_hashes[1]) is blocks[1]
    assert blocks[2].block_hash is None, "block 3 is beyond num_full_blocks: not cached yet"
    assert hit(pool, req.block_hashes[2]) is None
    pool.cache_full_blocks(req, blocks, 2, 3, BS, 0)
    assert hit(pool, req.block_hashes[2]) is blocks[2]
    assert all(b.ref_cnt == 1 for b in blocks), "caching must not change reference counts"
    check_pool(pool)


@graded(2, "I3: cache_full_blocks skips the null block and every block whose block_mask entry is "
           "False: neither gets a hash nor a map entry", f"{DOC}#caching-full-blocks")
def test_cache_full_blocks_skips_null_and_masked_blocks():
    """Only real blocks the caller selected enter the prefix cache."""
    pool = make_pool(8)
    req = make_request([1, 2, 3, 4, 5, 6])
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(req, blocks, 0, 3, BS, 0, block_mask=[True, False, True])
    assert hit(pool, req.block_hashes[0]) is blocks[0]
    assert blocks[1].block_hash is None and hit(pool, req.block_hashes[1]) is None, (
        "I3: a block whose block_mask entry is False must not be cached")
    assert hit(pool, req.block_hashes[2]) is blocks[2]
    other = make_request([7, 7, 8, 8])
    (blk,) = pool.get_new_blocks(1)
    pool.cache_full_blocks(other, [pool.null_block, blk], 0, 2, BS, 0)
    assert pool.null_block.block_hash is None and hit(pool, other.block_hashes[0]) is None, (
        "I3: the null block is a placeholder: it is never cached")
    assert hit(pool, other.block_hashes[1]) is blk
    check_pool(pool)


@graded(1, "Misuse: a block is hashed once; caching it again raises RuntimeError",
        f"{DOC}#misuse-errors")
def test_hashing_a_block_twice_is_an_error():
    """Setting a hash on a block that has one is a bug in the caller."""
    pool = make_pool(4)
    req = make_request([1, 2])
    blocks = pool.get_new_blocks(1)
    pool.cache_full_blocks(req, blocks, 0, 1, BS, 0)
    with pytest.raises((RuntimeError, ValueError)):
        pool.cache_full_blocks(req, blocks, 0, 1, BS, 0)
    with pytest.raises((RuntimeError, ValueError)):
        blocks[0].block_hash = b"another"


@graded(2, "get_cached_block returns the cached block without taking a reference, None on a "
           "miss", f"{DOC}#caching-full-blocks")
def test_get_cached_block_hit_and_miss():
    """A lookup is side-effect free."""
    pool = make_pool(5)
    req = make_request([7, 7, 8, 8])
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(req, blocks, 0, 2, BS, 0)
    pool.free_blocks(reversed(blocks))
    before = free_ids(pool.free_block_queue)
    assert hit(pool, req.block_hashes[1]) is blocks[1]
    assert hit(pool, make_request([9, 9]).block_hashes[0]) is None
    assert pool.get_cached_block(req.block_hashes[0], [1]) is None, (
        "a hash cached for group 0 must not hit for group 1")
    assert free_ids(pool.free_block_queue) == before and blocks[1].ref_cnt == 0, (
        "get_cached_block must not touch ref counts or the queue")


@graded(3, "I4: touch revives a free cached block by removing it from the middle of the free "
           "queue, keeping everyone else's order", f"{DOC}#touch-and-revival")
def test_touch_revives_from_the_middle():
    """A hit on a free cached block takes it out of the queue and gives it one reference."""
    pool = make_pool(8)
    req = make_request([1, 2, 3, 4, 5, 6])
    blocks = pool.get_new_blocks(3)  # 1 2 3
    pool.cache_full_blocks(req, blocks, 0, 3, BS, 0)
    pool.free_blocks(reversed(blocks))
    assert free_ids(pool.free_block_queue) == [4, 5, 6, 7, 3, 2, 1]
    pool.touch([blocks[0], blocks[1]])
    assert blocks[0].ref_cnt == 1 and blocks[1].ref_cnt == 1
    assert free_ids(pool.free_block_queue) == [4, 5, 6, 7, 3], (
        "I4: touched blocks leave the queue; the other blocks keep their order")
    check_pool(pool)
    assert blocks[0].block_hash is not None, "touch must not drop the hash of a revived block"


@graded(2, "touch on a block in use only adds a reference (the block is not in the queue)",
        f"{DOC}#touch-and-revival")
def test_touch_shared_block_in_use():
    """Sharing a running request's block counts one more user."""
    pool = make_pool(5)
    req = make_request([1, 2])
    (blk,) = pool.get_new_blocks(1)
    pool.cache_full_blocks(req, [blk], 0, 1, BS, 0)
    before = free_ids(pool.free_block_queue)
    pool.touch([blk])
    assert blk.ref_cnt == 2
    assert free_ids(pool.free_block_queue) == before
    pool.free_blocks([blk])
    assert blk.ref_cnt == 1 and blk.block_id not in free_ids(pool.free_block_queue)
    pool.free_blocks([blk])
    check_pool(pool)
    assert free_ids(pool.free_block_queue)[-1] == blk.block_id


@graded(1, "Misuse: touch refuses the null block with ValueError and then touches no block",
        f"{DOC}#misuse-errors")
def test_touch_null_block_is_an_error():
    """The null block is never shared, so a hit can never claim it."""
    pool = make_pool(5)
    req = make_request([1, 2])
    (blk,) = pool.get_new_blocks(1)
    pool.cache_full_blocks(req, [blk], 0, 1, BS, 0)
    pool.free_blocks([blk])
    before = free_ids(pool.free_block_queue)
    with pytest.raises(ValueError):
        pool.touch([blk, pool.null_block])
    assert blk.ref_cnt == 0 and free_ids(pool.free_block_queue) == before, (
        "a refused touch must take no reference and leave the free queue as it was")
    check_pool(pool)


@graded(3, "I4: freed blocks are evicted LRU first and, within a request, tail first, so a "
           "prefix's head outlives its tail", f"{DOC}#eviction-order")
def test_eviction_is_lru_and_tail_first():
    """Reusing free blocks evicts the never-used ones, then the tail of the oldest request."""
    pool = make_pool(7)
    req = make_request([1, 2, 3, 4, 5, 6])
    blocks = pool.get_new_blocks(3)  # 1 2 3
    pool.cache_full_blocks(req, blocks, 0, 3, BS, 0)
    pool.free_blocks(reversed(blocks))  # queue: 4 5 6 3 2 1
    pool.get_new_blocks(4)  # 4 5 6 and then the tail block 3
    assert blocks[2].block_hash is None and hit(pool, req.block_hashes[2]) is None, (
        "I4: the request's tail block (3) is evicted first")
    assert hit(pool, req.block_hashes[0]) is blocks[0], "the head of the prefix is still cached"
    assert hit(pool, req.block_hashes[1]) is blocks[1]
    check_pool(pool)


@graded(2, "I4: _maybe_evict_cached_block drops a block's hash and its map entry; True only if "
           "it was cached", f"{DOC}#eviction-order")
def test_maybe_evict_cached_block():
    """Evicting a cached block forgets it; evicting an uncached one is a no-op."""
    pool = make_pool(5)
    req = make_request([1, 2])
    a, b = pool.get_new_blocks(2)
    pool.cache_full_blocks(req, [a], 0, 1, BS, 0)
    assert pool._maybe_evict_cached_block(a) is True
    assert a.block_hash is None and hit(pool, req.block_hashes[0]) is None
    assert pool._maybe_evict_cached_block(a) is False
    assert pool._maybe_evict_cached_block(b) is False


@graded(2, "evict_blocks forgets the cached prefixes of the given block ids only",
        f"{DOC}#eviction-order")
def test_evict_blocks_by_id():
    """Evicting by id removes cache entries but does not free or move blocks."""
    pool = make_pool(6)
    req = make_request([1, 2, 3, 4, 5, 6])
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(req, blocks, 0, 3, BS, 0)
    pool.evict_blocks({blocks[1].block_id})
    assert hit(pool, req.block_hashes[1]) is None and blocks[1].block_hash is None
    assert hit(pool, req.block_hashes[0]) is blocks[0]
    assert hit(pool, req.block_hashes[2]) is blocks[2]
    assert all(b.ref_cnt == 1 for b in blocks), "evict_blocks must not free blocks"
    check_pool(pool)


@graded(3, "reset_prefix_cache refuses (returns False) while any block is in use; otherwise it "
           "empties the map and clears every hash", f"{DOC}#resetting-the-prefix-cache")
def test_reset_prefix_cache():
    """Resetting is all or nothing and keeps the free queue intact."""
    pool = make_pool(6)
    req = make_request([1, 2, 3, 4])
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(req, blocks, 0, 2, BS, 0)
    assert pool.reset_prefix_cache() is False, "blocks are in use: the reset must be refused"
    assert hit(pool, req.block_hashes[0]) is blocks[0], "a refused reset must change nothing"
    pool.free_blocks(reversed(blocks))
    queue_before = free_ids(pool.free_block_queue)
    assert pool.reset_prefix_cache() is True
    assert hit(pool, req.block_hashes[0]) is None and hit(pool, req.block_hashes[1]) is None
    assert all(b.block_hash is None for b in pool.blocks)
    assert free_ids(pool.free_block_queue) == queue_before
    check_pool(pool)


@graded(2, "I3: two requests that computed the same block separately both stay cached; block ids "
           "never change under a running request", f"{DOC}#the-cache-map")
def test_duplicate_blocks_both_cached():
    """The map holds duplicates; reusing one leaves the other reachable."""
    pool = make_pool(4)
    req = make_request([1, 2])
    (a,) = pool.get_new_blocks(1)
    (b,) = pool.get_new_blocks(1)
    pool.cache_full_blocks(req, [a], 0, 1, BS, 0)
    pool.cache_full_blocks(req, [b], 0, 1, BS, 0)
    assert a.block_hash is not None and b.block_hash is not None, (
        "both blocks hold the content: both must carry the hash")
    pool.free_blocks([a])
    pool.free_blocks([b])
    pool.get_new_blocks(2)  # pops block 3 then a: a is evicted
    assert hit(pool, req.block_hashes[0]) is b, "the duplicate b must still serve hits"


class PrefixCacheMachine(RuleBasedStateMachine):
    """Requests with shared prefixes, hits, frees and resets against an exact model.

    The model tracks what each block holds (its token chain), the free-queue order and which
    content is cached; after every step a hit must return a block holding exactly the
    requested prefix, and the queue must be in eviction order (I3, I4).
    """

    N = 9
    PROMPTS: ClassVar[list[list[int]]] = [
        [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 7, 8], [1, 2, 9, 9], [5, 5, 6, 6, 7, 7],
        [1, 2, 3, 4, 5, 6, 1, 1]]

    def __init__(self) -> None:
        super().__init__()
        self.pool = make_pool(self.N)
        self.content: dict[int, bytes] = {}
        self.running: list[tuple[object, list]] = []
        self.queue = list(range(1, self.N))

    @rule(data=st.data())
    def admit(self, data) -> None:
        tokens = data.draw(st.sampled_from(self.PROMPTS))
        req = make_request(tokens, rid=f"r{len(self.running)}")
        hits = []
        for h in req.block_hashes:
            blk = hit(self.pool, h)
            if blk is None:
                break
            assert self.content.get(blk.block_id) == h, (
                f"I3: a hit returned block {blk.block_id}, which does not hold that prefix")
            hits.append(blk)
        need = len(req.block_hashes) - len(hits)
        if need > self.pool.get_num_free_blocks() - sum(b.ref_cnt == 0 for b in hits):
            return
        self.pool.touch(hits)
        for blk in hits:
            if blk.block_id in self.queue:
                self.queue.remove(blk.block_id)
        new = self.pool.get_new_blocks(need)
        want, self.queue = self.queue[:need], self.queue[need:]
        assert ids(new) == want, f"get_new_blocks popped {ids(new)}, expected {want}"
        for blk in new:
            self.content.pop(blk.block_id, None)
        blocks = hits + new
        self.pool.cache_full_blocks(req, blocks, len(hits), len(blocks), BS, 0)
        for blk, h in zip(blocks, req.block_hashes):
            self.content.setdefault(blk.block_id, h)
        self.running.append((req, blocks))

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def finish(self, data) -> None:
        _, blocks = self.running.pop(data.draw(st.integers(0, len(self.running) - 1)))
        self.pool.free_blocks(reversed(blocks))
        for blk in reversed(blocks):
            if blk.ref_cnt == 0:
                self.queue.append(blk.block_id)

    @rule()
    def reset(self) -> None:
        ok = self.pool.reset_prefix_cache()
        assert ok == (not self.running), "reset_prefix_cache must succeed iff no block is in use"
        if ok:
            self.content.clear()

    @invariant()
    def consistent(self) -> None:
        check_pool(self.pool)
        assert free_ids(self.pool.free_block_queue) == self.queue, (
            f"I4: free queue {free_ids(self.pool.free_block_queue)} is not in eviction order "
            f"{self.queue}")
        for blk in self.pool.blocks[1:]:
            if blk.block_hash is not None:
                assert blk.block_id in self.content, (
                    f"I3: block {blk.block_id} keeps a hash for content it no longer holds")


@graded(5, "I1-I4: under random shared-prefix workloads every hit holds exactly the requested "
           "prefix, and the free queue stays in eviction order", f"{DOC}#invariants")
def test_random_prefix_sharing_workload():
    """Property test: hits are always correct and eviction follows LRU, tail first."""
    _call_every_method_once()
    run_state_machine_as_test(PrefixCacheMachine, settings=STATEFUL_SETTINGS)


def _call_every_method_once() -> None:
    """Call each method the machine uses once, outside hypothesis.

    A method that is not written yet then raises its NotImplementedError here, and the test
    reads NOT STARTED, instead of hypothesis reporting each rule's error as a separate failure.
    """
    pool = make_pool(4)
    req = make_request([1, 2])
    hit(pool, req.block_hashes[0])
    blocks = pool.get_new_blocks(1)
    pool.cache_full_blocks(req, blocks, 0, 1, BS, 0)
    pool.touch(blocks)
    pool.free_blocks(blocks)
    pool.free_blocks(blocks)
    pool.reset_prefix_cache()


def _touch_ops(n: int):
    pool = make_pool(n)
    blocks = pool.get_new_blocks(n - 1)
    req = make_request(list(range(2 * 500)))
    middle = blocks[n // 3: n // 3 + 500]
    pool.cache_full_blocks(req, middle, 0, 500, BS, 0)
    pool.free_blocks(blocks)

    def run() -> None:
        pool.touch(middle)
        pool.free_blocks(middle)
    return run


@graded(2, "I4: touch revives a block from anywhere in the free queue in O(1)",
        f"{DOC}#touch-and-revival")
def test_touch_is_constant_time():
    """Reviving 500 blocks costs the same in a small and a 100x larger pool."""
    assert_constant_time("BlockPool.touch", _touch_ops)
