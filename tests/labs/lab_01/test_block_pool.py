"""lab-01, part 2: the block pool — allocation, reference counts, freeing, usage."""

from __future__ import annotations

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
from tests.labs.common import STATEFUL_SETTINGS, assert_constant_time, check_pool, free_ids

DOC = "phases/02-paged-attention/README.md"


def make_pool(n: int, caching: bool = False, block_size: int = 4):
    bp = load_impl("block_pool")
    return bp.BlockPool(num_gpu_blocks=n, enable_caching=caching, hash_block_size=block_size)


def ids(blocks) -> list[int]:
    return [b.block_id for b in blocks]


@graded(2, "I1: block 0 is the null block: taken out of the free queue at construction, "
           "marked is_null, never handed out", f"{DOC}#the-null-block")
def test_null_block_is_reserved():
    """A new pool of n blocks offers n - 1: block 0 is the null block."""
    pool = make_pool(6)
    assert pool.null_block is pool.blocks[0] and pool.null_block.block_id == 0
    assert pool.null_block.is_null, "the null block must have is_null = True"
    assert [b.block_id for b in pool.blocks] == list(range(6))
    assert pool.get_num_free_blocks() == 5, (
        f"6 blocks minus the null block leaves 5 free, got {pool.get_num_free_blocks()}")
    check_pool(pool)
    assert free_ids(pool.free_block_queue) == [1, 2, 3, 4, 5]


@graded(2, "I1: get_new_blocks pops from the front of the free queue and sets ref_cnt = 1",
        f"{DOC}#allocating-blocks")
def test_get_new_blocks_pops_from_the_front():
    """New blocks come from the front, in order, each with one reference."""
    pool = make_pool(8)
    got = pool.get_new_blocks(3)
    assert ids(got) == [1, 2, 3], f"expected blocks [1, 2, 3] from the front, got {ids(got)}"
    assert all(b.ref_cnt == 1 for b in got), "every new block must have ref_cnt == 1"
    assert pool.get_num_free_blocks() == 4
    check_pool(pool)
    assert ids(pool.get_new_blocks(0)) == [], "get_new_blocks(0) returns no block"
    assert ids(pool.get_new_blocks(4)) == [4, 5, 6, 7]
    assert pool.get_num_free_blocks() == 0
    check_pool(pool)


@graded(2, "I1: the null block is never handed out, even when every other block is taken",
        f"{DOC}#the-null-block")
def test_null_block_never_handed_out():
    """Draining the pool never yields block 0."""
    pool = make_pool(5)
    got = pool.get_new_blocks(4)
    assert 0 not in ids(got), "the null block (id 0) must never be handed out"
    with pytest.raises(ValueError):
        pool.get_new_blocks(1)


@graded(2, "Asking for more blocks than are free raises ValueError and changes nothing",
        f"{DOC}#misuse-errors")
def test_too_many_blocks_is_an_error():
    """A request the pool cannot satisfy fails cleanly, all or nothing."""
    pool = make_pool(5)
    pool.get_new_blocks(2)
    with pytest.raises(ValueError) as excinfo:
        pool.get_new_blocks(3)
    assert str(excinfo.value), "the error must say how many blocks were asked and how many are free"
    assert pool.get_num_free_blocks() == 2, "a refused allocation must not take any block"
    check_pool(pool)
    assert free_ids(pool.free_block_queue) == [3, 4]


@graded(3, "I1: free_blocks decrements ref_cnt and appends the blocks that reach 0, in the "
           "order given", f"{DOC}#freeing-blocks-and-the-eviction-order")
def test_free_blocks_appends_in_given_order():
    """Freed blocks go to the back of the queue in the order they were passed."""
    pool = make_pool(7)
    a = pool.get_new_blocks(4)  # 1 2 3 4
    pool.free_blocks(list(reversed(a)))  # a request frees its blocks tail first
    check_pool(pool)
    assert free_ids(pool.free_block_queue) == [5, 6, 4, 3, 2, 1], (
        "freed blocks must go to the BACK of the queue in the order given (LRU eviction)")
    again = pool.get_new_blocks(2)
    assert ids(again) == [5, 6], (
        "the never-used blocks at the front are handed out before recently freed ones")


@graded(3, "I1: a block shared by two holders (ref_cnt 2) stays allocated until both free it",
        f"{DOC}#freeing-blocks-and-the-eviction-order")
def test_shared_block_freed_only_at_zero():
    """Only blocks whose count reaches 0 return to the queue."""
    pool = make_pool(5)
    a, b = pool.get_new_blocks(2)
    a.ref_cnt += 1  # a second request shares block a (prefix caching does this through touch)
    pool.free_blocks([a, b])
    assert a.ref_cnt == 1 and b.ref_cnt == 0
    check_pool(pool)
    assert free_ids(pool.free_block_queue) == [3, 4, 2], "only b (ref_cnt 0) may be appended"
    pool.free_blocks([a])
    check_pool(pool)
    assert free_ids(pool.free_block_queue) == [3, 4, 2, 1]


@graded(2, "Misuse: freeing a block whose ref_cnt is already 0 (double free) raises and "
           "changes nothing", f"{DOC}#misuse-errors")
def test_double_free_is_an_error():
    """A double free is reported, not silently corrupting ref counts or the queue."""
    pool = make_pool(5)
    a, b = pool.get_new_blocks(2)
    pool.free_blocks([a])
    with pytest.raises(ValueError) as excinfo:
        pool.free_blocks([a])
    assert str(excinfo.value)
    assert a.ref_cnt == 0, f"a refused double free must leave ref_cnt at 0, got {a.ref_cnt}"
    check_pool(pool)
    assert free_ids(pool.free_block_queue) == [3, 4, 1]
    # The bad block comes second: the call is refused as a whole, b keeps its reference.
    with pytest.raises(ValueError):
        pool.free_blocks([b, a])
    assert b.ref_cnt == 1 and a.ref_cnt == 0, (
        f"a refused free_blocks([b, a]) must change no ref_cnt: b has {b.ref_cnt} (expected 1), "
        f"a has {a.ref_cnt} (expected 0)")
    check_pool(pool)
    assert free_ids(pool.free_block_queue) == [3, 4, 1], "a refused free must not queue any block"


@graded(2, "Misuse: freeing the null block raises ValueError", f"{DOC}#misuse-errors")
def test_freeing_the_null_block_is_an_error():
    """The null block is never freed (it was never handed out)."""
    pool = make_pool(4)
    with pytest.raises(ValueError):
        pool.free_blocks([pool.null_block])
    check_pool(pool)
    assert free_ids(pool.free_block_queue) == [1, 2, 3]


@graded(2, "get_usage is 1 - free / (num_gpu_blocks - 1): the null block is not usable memory",
        f"{DOC}#allocating-blocks")
def test_usage():
    """Usage counts the blocks in use out of the usable ones."""
    pool = make_pool(11)
    assert pool.get_usage() == pytest.approx(0.0)
    blocks = pool.get_new_blocks(4)
    assert pool.get_usage() == pytest.approx(0.4), f"4 of 10 usable blocks: {pool.get_usage()}"
    pool.get_new_blocks(6)
    assert pool.get_usage() == pytest.approx(1.0)
    pool.free_blocks(blocks)
    assert pool.get_usage() == pytest.approx(0.6)


@graded(3, "I4: when caching is on, a block popped for reuse must drop its stale hash from the "
           "cache map (its contents are about to be overwritten)",
        f"{DOC}#allocating-blocks")
def test_reused_block_loses_its_stale_hash():
    """get_new_blocks evicts the prefix-cache entry of a cached free block it hands out."""
    from types import SimpleNamespace

    bp = load_impl("block_pool")
    pool = make_pool(3, caching=True, block_size=2)
    (blk,) = pool.get_new_blocks(1)
    request = SimpleNamespace(request_id="r", block_hashes=[bp.BlockHash(b"h" * 32)],
                              all_token_ids=[1, 2], lora_request=None)
    pool.cache_full_blocks(request, [blk], 0, 1, 2, 0)
    assert blk.block_hash is not None
    pool.free_blocks([blk])
    assert pool.get_cached_block(request.block_hashes[0], [0]) is not None, (
        "a freed cached block stays in the prefix cache until it is reused")
    got = pool.get_new_blocks(2)  # drains the pool: block 2, then the cached block 1
    assert blk in got
    assert blk.block_hash is None, "I4: a reused block must not keep its old hash"
    assert pool.get_cached_block(request.block_hashes[0], [0]) is None, (
        "I4: the cache map must forget a block that was handed out for new contents")


class PoolMachine(RuleBasedStateMachine):
    """Random allocations and frees checked against a simple model after every step."""

    N = 10

    def __init__(self) -> None:
        super().__init__()
        self.pool = make_pool(self.N)
        self.model_free = list(range(1, self.N))
        self.held: list[list] = []

    @rule(data=st.data())
    def allocate(self, data) -> None:
        n = data.draw(st.integers(0, self.N))
        if n > len(self.model_free):
            with pytest.raises(ValueError):
                self.pool.get_new_blocks(n)
            return
        got = self.pool.get_new_blocks(n)
        want, self.model_free = self.model_free[:n], self.model_free[n:]
        assert ids(got) == want, f"get_new_blocks({n}) gave {ids(got)}, expected {want}"
        self.held.append(got)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def free(self, data) -> None:
        group = self.held.pop(data.draw(st.integers(0, len(self.held) - 1)))
        order = data.draw(st.permutations(group))
        self.pool.free_blocks(order)
        self.model_free.extend(b.block_id for b in order)

    @invariant()
    def consistent(self) -> None:
        check_pool(self.pool)
        assert free_ids(self.pool.free_block_queue) == self.model_free, (
            f"I1: free queue is {free_ids(self.pool.free_block_queue)}, expected "
            f"{self.model_free} (front pops, frees append in the order given)")
        assert self.pool.get_num_free_blocks() == len(self.model_free)


@graded(4, "I1/I2: after any sequence of allocations and frees, every block is either free "
           "(in the queue, ref_cnt 0) or held, and the queue order is the model's",
        f"{DOC}#invariants")
def test_random_allocations_and_frees_keep_the_invariants():
    """Property test: the pool matches a model under random allocate / free sequences."""
    run_state_machine_as_test(PoolMachine, settings=STATEFUL_SETTINGS)


def _pool_ops(n: int):
    pool = make_pool(n)
    held = pool.get_new_blocks(n // 2)
    chunk = held[n // 8: n // 8 + 500]

    def run() -> None:
        pool.free_blocks(chunk)
        got = pool.get_new_blocks(len(chunk))
        chunk[:] = got
        for _ in range(200):
            pool.get_num_free_blocks()
            pool.get_usage()
    return run


@graded(2, "I2: freeing and allocating k blocks costs O(k), and get_num_free_blocks / "
           "get_usage are O(1), whatever the pool size", f"{DOC}#why-a-hand-written-linked-list")
def test_pool_operations_are_constant_time():
    """The same work costs the same on a small and on a 100x larger pool."""
    assert_constant_time("BlockPool.free_blocks / get_new_blocks / get_num_free_blocks",
                         _pool_ops)
