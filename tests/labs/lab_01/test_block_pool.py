"""lab-01, part 2: the block pool — allocation, reference counts, freeing, usage.

The pool lives in the learner process; what the tests hand to it (a request for
``cache_full_blocks``) is built there too (``learner_side``). The checks read the pool back
as data (``tests/labs/common.py``) and decide here.
"""

from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from grading.remote import LearnerError
from grading.suite import graded, learner_module, load_impl
from tests.labs.common import (
    CEILING_FACTOR,
    as_int,
    assert_constant_time,
    assert_error_names,
    best_time,
    block_ids,
    check_pool,
    check_pool_snapshot,
    describe,
    judge_relink_time,
    pool_snapshot,
    run_machine,
    same_data,
    timed_call,
)

DOC = "phases/02-paged-attention/README.md"


def side():
    return learner_module("learner_side")


def make_pool(n: int, caching: bool = False, block_size: int = 4):
    bp = load_impl("block_pool")
    return bp.BlockPool(num_gpu_blocks=n, enable_caching=caching, hash_block_size=block_size)


def ids(blocks) -> list[int]:
    return block_ids(blocks)


def ref(block) -> int:
    return as_int(block.ref_cnt, "ref_cnt")


def usage(pool) -> float:
    value = pool.get_usage()
    if type(value) not in (float, int):
        raise AssertionError(f"get_usage must return a float, got {describe(value)}")
    return value


@graded(
    2,
    "I1: block 0 is the null block: taken out of the free queue at construction, "
    "marked is_null, never handed out",
    f"{DOC}#the-null-block",
)
def test_null_block_is_reserved():
    """A new pool of n blocks offers n - 1: block 0 is the null block."""
    pool = make_pool(6)
    assert pool.null_block is pool.blocks[0], "null_block must be blocks[0], the block of id 0"
    assert pool.null_block.is_null is True, "the null block must have is_null = True"
    assert ids(pool.blocks) == list(range(6)), (
        f"pool.blocks must hold blocks 0..5 in id order, got {ids(pool.blocks)}"
    )
    free = as_int(pool.get_num_free_blocks(), "get_num_free_blocks()")
    assert free == 5, f"6 blocks minus the null block leaves 5 free, got {free}"
    assert check_pool(pool) == [1, 2, 3, 4, 5], "the free queue must hold blocks 1..5 in order"
    found = pool.get_cached_block(b"x" * 32, [0])
    assert found is None, (
        f"a pool with caching off has an empty cache map all the same (task 8 makes it whatever "
        f"enable_caching says; the given get_cached_block reads it): expected None, got "
        f"{describe(found)}"
    )


@graded(
    1,
    "Misuse: BlockPool refuses num_gpu_blocks < 1 (or not an int) and hash_block_size < 1 "
    "with ValueError",
    f"{DOC}#misuse-errors",
)
def test_bad_pool_sizes_are_errors():
    """A pool needs at least the null block, and blocks of at least one token."""
    bp = load_impl("block_pool")
    for num_gpu_blocks in (0, -2):
        with pytest.raises(ValueError) as excinfo:
            bp.BlockPool(num_gpu_blocks=num_gpu_blocks, enable_caching=False, hash_block_size=4)
        message = str(excinfo.value)
        assert "num_gpu_blocks" in message or str(num_gpu_blocks) in message, (
            f"BlockPool(num_gpu_blocks={num_gpu_blocks}) raised ValueError({message!r}), which "
            f"does not say what was wrong: check num_gpu_blocks >= 1 first and name it (or its "
            f"value) in the message, rather than letting an empty free queue fail later"
        )
    with pytest.raises(ValueError):
        bp.BlockPool(num_gpu_blocks=2.5, enable_caching=False, hash_block_size=4)
    for hash_block_size in (0, -1):
        with pytest.raises(ValueError) as excinfo:
            bp.BlockPool(num_gpu_blocks=4, enable_caching=False, hash_block_size=hash_block_size)
        message = str(excinfo.value)
        assert "hash_block_size" in message or str(hash_block_size) in message, (
            f"BlockPool(hash_block_size={hash_block_size}) raised ValueError({message!r}), which "
            "does not name the size: say hash_block_size (or its value) in the message"
        )
    # The smallest legal pool: the null block alone, blocks of one token.
    try:
        smallest = bp.BlockPool(num_gpu_blocks=1, enable_caching=True, hash_block_size=1)
    except LearnerError as exc:
        raise AssertionError(
            f"BlockPool(num_gpu_blocks=1, hash_block_size=1) raised "
            f"{getattr(exc, 'display', exc)}: both sizes are legal (>= 1 each; refuse only < 1)"
        ) from None
    assert as_int(smallest.get_num_free_blocks(), "get_num_free_blocks()") == 0, (
        "BlockPool(num_gpu_blocks=1): block 0 is the null block, so no block is free"
    )


@graded(
    2,
    "I1: get_new_blocks pops from the front of the free queue and sets ref_cnt = 1",
    f"{DOC}#allocating-blocks",
)
def test_get_new_blocks_pops_from_the_front():
    """New blocks come from the front, in order, each with one reference."""
    pool = make_pool(8)
    got = pool.get_new_blocks(3)
    assert ids(got) == [1, 2, 3], f"expected blocks [1, 2, 3] from the front, got {ids(got)}"
    assert [ref(b) for b in got] == [1, 1, 1], "every new block must have ref_cnt == 1"
    free = check_pool(pool)
    assert free == [4, 5, 6, 7], (
        f"after taking 3 blocks the free queue must be [4, 5, 6, 7], got {free}"
    )
    count = as_int(pool.get_num_free_blocks(), "get_num_free_blocks()")
    assert count == 4, f"get_num_free_blocks() after taking 3 of 7 usable blocks is 4, got {count}"
    assert ids(pool.get_new_blocks(0)) == [], "get_new_blocks(0) returns no block"
    got = ids(pool.get_new_blocks(4))
    assert got == [4, 5, 6, 7], f"get_new_blocks(4) must take the rest, [4, 5, 6, 7]: got {got}"
    count = as_int(pool.get_num_free_blocks(), "get_num_free_blocks()")
    assert count == 0, f"get_num_free_blocks() of a drained pool is 0, got {count}"
    free = check_pool(pool)
    assert free == [], f"a drained pool's free queue is empty, got {free}"


@graded(
    2,
    "I1: the null block is never handed out, even when every other block is taken",
    f"{DOC}#the-null-block",
)
def test_null_block_never_handed_out():
    """Draining the pool never yields block 0."""
    pool = make_pool(5)
    handed_out = pool.get_new_blocks(4)
    got = ids(handed_out)
    assert sorted(got) == [1, 2, 3, 4], (
        f"draining a pool of 5 hands out blocks 1..4, never the null block (id 0): got {got}"
    )
    with pytest.raises(ValueError):
        pool.get_new_blocks(1)
    # Nor does the refusal leave a change for later: the next call frees the four blocks, and
    # the queue holds them alone, in the order given, the null block still out of it.
    pool.free_blocks(handed_out)
    free = check_pool(pool)
    assert free == got, (
        f"after the refused get_new_blocks(1), freeing blocks {got} must give the free queue "
        f"{got}, got {free}: a refused call changes nothing, then or at a later call"
    )


@graded(
    2,
    "Asking for more blocks than are free (or a negative count) raises ValueError and "
    "changes nothing",
    f"{DOC}#misuse-errors",
)
def test_too_many_blocks_is_an_error():
    """A request the pool cannot satisfy fails cleanly, all or nothing."""
    pool = make_pool(5)
    pool.get_new_blocks(2)
    with pytest.raises(ValueError) as excinfo:
        pool.get_new_blocks(3)
    assert_error_names(excinfo.value, "get_new_blocks(3) with 2 blocks free", 3)
    assert as_int(pool.get_num_free_blocks(), "get_num_free_blocks()") == 2, (
        "a refused allocation must not take any block"
    )
    assert check_pool(pool) == [3, 4], "a refused allocation must leave the queue as it was"
    with pytest.raises(ValueError) as excinfo:
        pool.get_new_blocks(-1)
    assert_error_names(excinfo.value, "get_new_blocks(-1)")
    assert check_pool(pool) == [3, 4], "get_new_blocks(-1) must be refused and take nothing"
    # With caching on, a refused call must not have evicted (or reported) a free cached block
    # first: check the count before taking anything.
    pool, collector = side().make_pool_with_collector(4, True)
    cached = pool.get_new_blocks(1)  # block 1
    block_hash = b"c" * 32
    pool.cache_full_blocks(side().make_request("r", [1, 2, 3, 4], [block_hash]), cached, 0, 1, 4, 0)
    pool.free_blocks(cached)
    before = collector.events
    with pytest.raises(ValueError):
        pool.get_new_blocks(4)  # 3 are free
    found = pool.get_cached_block(block_hash, [0])
    assert type(found) is list and len(found) == 1 and found[0] is cached[0], (
        "a refused get_new_blocks(4) on a caching pool of 3 free blocks must take nothing: the "
        "free cached block 1 lost its hash (check the count before popping and evicting)"
    )
    assert same_data(collector.events, before), (
        f"a refused get_new_blocks(4) must report nothing to the metrics collector, which saw "
        f"{collector.events!r} after {before!r}"
    )
    assert check_pool(pool) == [2, 3, 1], "a refused get_new_blocks must leave the queue as it was"
    # Nor does a refusal leave a change for later: the next call, which fits, gets the three
    # free blocks in queue order (tests/hostile/undo_the_rollback_at_the_next_success.py).
    got = ids(pool.get_new_blocks(3))
    assert got == [2, 3, 1] and check_pool(pool) == [], (
        f"after the refusals, get_new_blocks(3) of the 3 free blocks [2, 3, 1] gave {got}: a "
        "refused call changes nothing, then or at a later call"
    )


@graded(
    1,
    "I1 (broken state): get_new_blocks raises RuntimeError if a block it pops from the free "
    "queue has ref_cnt != 0",
    f"{DOC}#misuse-errors",
)
def test_queued_block_in_use_is_an_error():
    """A block in the queue with a reference is a corrupted pool: say so, do not hide it."""
    pool = make_pool(4)
    pool.blocks[1].ref_cnt = 1  # corrupt the pool: block 1 is queued but held
    with pytest.raises(RuntimeError) as excinfo:
        pool.get_new_blocks(1)
    assert_error_names(excinfo.value, "get_new_blocks(1) popping block 1 with ref_cnt 1", 1)
    pool = make_pool(4)
    pool.blocks[1].ref_cnt = -1  # a count gone below zero is as broken
    with pytest.raises(RuntimeError):
        pool.get_new_blocks(1)
    for caching in (False, True):
        pool = make_pool(5, caching=caching)
        pool.blocks[2].ref_cnt = 1  # the second block handed out, not the front one
        try:
            pool.get_new_blocks(2)
        except RuntimeError:
            continue
        raise AssertionError(
            f"get_new_blocks(2) on a pool (caching {'on' if caching else 'off'}) whose block 2, "
            "second in the free queue, has ref_cnt 1 must raise RuntimeError: check every block "
            "it pops, with caching on and off"
        )


@graded(
    3,
    "I1: free_blocks decrements ref_cnt and appends the blocks that reach 0, in the order "
    "given (any iterable: the KV cache manager passes reversed(blocks))",
    f"{DOC}#freeing-blocks-and-the-eviction-order",
)
def test_free_blocks_appends_in_given_order():
    """Freed blocks go to the back of the queue in the order they were passed."""
    pool = make_pool(7)
    a = pool.get_new_blocks(4)  # 1 2 3 4
    pool.free_blocks(list(reversed(a)))  # a request frees its blocks tail first
    assert check_pool(pool) == [5, 6, 4, 3, 2, 1], (
        "freed blocks must go to the BACK of the queue in the order given (LRU eviction)"
    )
    again = pool.get_new_blocks(2)
    assert ids(again) == [5, 6], (
        "the never-used blocks at the front are handed out before recently freed ones"
    )
    side().free_reversed(pool, again)  # pool.free_blocks(reversed([5, 6])): an iterator
    free, refs = check_pool(pool), (ref(again[0]), ref(again[1]))
    assert free == [4, 3, 2, 1, 6, 5] and refs == (0, 0), (
        f"free_blocks(reversed([block 5, block 6])) must free both, 6 then 5: the queue is "
        f"{free} (expected [4, 3, 2, 1, 6, 5]) and their ref_cnts {refs} (expected (0, 0)). "
        "ordered_blocks may be an iterator, which can be walked only once: make it a list first"
    )


@graded(
    3,
    "I1: a block shared by two holders (ref_cnt 2) stays allocated until both free it",
    f"{DOC}#freeing-blocks-and-the-eviction-order",
)
def test_shared_block_freed_only_at_zero():
    """Only blocks whose count reaches 0 return to the queue."""
    pool = make_pool(5)
    a, b = pool.get_new_blocks(2)
    a.ref_cnt = 2  # a second request shares block a (prefix caching does this through touch)
    pool.free_blocks([a, b])
    assert (ref(a), ref(b)) == (1, 0), (
        f"freeing [a (ref_cnt 2), b (ref_cnt 1)] leaves ref_cnts 1 and 0, got {ref(a)} and {ref(b)}"
    )
    free = check_pool(pool)
    assert free == [3, 4, 2], f"only b (ref_cnt 0) may be appended: expected [3, 4, 2], got {free}"
    pool.free_blocks([a])
    free = check_pool(pool)
    assert free == [3, 4, 2, 1], (
        f"the last holder's free queues a (block 1): expected [3, 4, 2, 1], got {free}"
    )
    # One call, the block listed once per holder: each entry drops one reference.
    (c,) = pool.get_new_blocks(1)  # block 3
    c.ref_cnt = 2
    pool.free_blocks([c, c])
    free = check_pool(pool)
    assert ref(c) == 0 and free == [4, 2, 1, 3], (
        f"free_blocks([c, c]) with c (block 3) held twice drops both references and queues c "
        f"once: expected ref_cnt 0 and the queue [4, 2, 1, 3], got {ref(c)} and {free} (collect "
        "a block when its count reaches 0, not every entry whose count is 0 after the loop)"
    )
    # Blocks join the queue in the order they reach 0, a repeated entry where it reaches 0.
    x, c, y = pool.get_new_blocks(3)  # blocks 4, 2, 1; block 3 stays free
    c.ref_cnt = 2
    pool.free_blocks([x, c, y, c])
    free = check_pool(pool)
    assert free == [3, 4, 1, 2], (
        f"free_blocks([x, c, y, c]) (blocks 4, 2, 1, 2; c held twice) must queue x, then y, then "
        f"c, when its second entry drops it to 0: expected [3, 4, 1, 2], got {free}"
    )


@graded(
    2,
    "Misuse: freeing a block whose ref_cnt is already 0 (double free) raises and changes nothing",
    f"{DOC}#misuse-errors",
)
def test_double_free_is_an_error():
    """A double free is reported, not silently corrupting ref counts or the queue."""
    pool = make_pool(5)
    a, b = pool.get_new_blocks(2)
    pool.free_blocks([a])
    a_id = as_int(a.block_id, "a's block_id")
    with pytest.raises(ValueError) as excinfo:
        pool.free_blocks([a])
    assert_error_names(excinfo.value, f"free_blocks([block {a_id}]) of a freed block", a_id)
    assert ref(a) == 0, f"a refused double free must leave ref_cnt at 0, got {ref(a)}"
    free = check_pool(pool)
    assert free == [3, 4, 1], f"after freeing a once the free queue is [3, 4, 1], got {free}"
    # The bad block comes second: the call is refused as a whole, b keeps its references.
    b.ref_cnt = 2  # shared with a second holder
    with pytest.raises(ValueError):
        pool.free_blocks([b, a])
    assert (ref(b), ref(a)) == (2, 0), (
        f"a refused free_blocks([b, a]) must change no ref_cnt: b has {ref(b)} (expected 2), "
        f"a has {ref(a)} (expected 0)"
    )
    assert check_pool(pool) == [3, 4, 1], "a refused free must not queue any block"
    # The same block twice in one call, held once: its second entry is a double free.
    b.ref_cnt = 1
    with pytest.raises(ValueError):
        pool.free_blocks([b, b])
    assert ref(b) == 1, (
        f"free_blocks([b, b]) with b held once must be refused and leave ref_cnt 1, got "
        f"{ref(b)}: check each block's ref_cnt as you drop its reference, not all of them "
        "before dropping any"
    )
    assert check_pool(pool) == [3, 4, 1], "a refused free_blocks([b, b]) must not queue b"
    # Refused through an iterator, as the KV cache manager passes: reversed([a, b]) gives b, a.
    b.ref_cnt = 2
    with pytest.raises(ValueError):
        side().free_reversed(pool, [a, b])
    assert (ref(b), ref(a)) == (2, 0), (
        f"a refused free_blocks(reversed([a, b])) must change no ref_cnt: b has {ref(b)} "
        f"(expected 2), a has {ref(a)} (expected 0). ordered_blocks may be an iterator, which "
        "can be walked (or sliced) only as a list: make it one first"
    )
    assert check_pool(pool) == [3, 4, 1], "a refused free through an iterator must queue nothing"
    # A block listed twice before the bad entry: both its references come back.
    b.ref_cnt = 2
    with pytest.raises(ValueError):
        pool.free_blocks([b, b, a])
    assert ref(b) == 2, (
        f"a refused free_blocks([b, b, a]) (b held twice, a free) must leave b's ref_cnt at 2, "
        f"got {ref(b)}: undo one reference per entry already counted, a repeated block included"
    )
    assert check_pool(pool) == [3, 4, 1], "a refused free_blocks([b, b, a]) must queue nothing"
    # Nor do the refused calls leave a change for later: the next call, which succeeds, drops
    # b's two references and changes nothing else (tests/hostile/
    # undo_the_rollback_at_the_next_success.py).
    pool.free_blocks([b, b])
    after = (ref(b), ref(a), check_pool(pool))
    assert after == (0, 0, [3, 4, 1, 2]), (
        f"after the refused calls, free_blocks([b, b]) of b held twice must leave (ref_cnt of b, "
        f"ref_cnt of a, the free queue) = (0, 0, [3, 4, 1, 2]), got {after}: a refused call "
        "changes nothing, then or at a later call"
    )


@graded(2, "Misuse: freeing the null block raises ValueError", f"{DOC}#misuse-errors")
def test_freeing_the_null_block_is_an_error():
    """The null block is never freed (it was never handed out), and the error says so: a
    null block that is refused only as a "double free" (its ref_cnt is 0) sends the caller
    looking for a bug that is not there."""
    pool = make_pool(4)
    null = pool.null_block  # read before: only free_blocks itself may raise
    with pytest.raises(ValueError) as raised:
        pool.free_blocks([null])
    assert "null" in str(raised.value).lower(), (
        "freeing the null block must raise a ValueError whose message says it is the null "
        "block (the word 'null'; a message about block 0 or a double free does not say why), "
        f"got: {raised.value}"
    )
    free = check_pool(pool)
    assert free == [1, 2, 3], f"a refused free of the null block changes nothing: got {free}"
    got = ids(pool.get_new_blocks(3))
    assert got == [1, 2, 3] and check_pool(pool) == [], (
        f"after the refused free, get_new_blocks(3) must give the 3 free blocks [1, 2, 3], got "
        f"{got}: a refused call changes nothing, then or at a later call"
    )


@graded(
    2,
    "get_usage is 1 - free / (num_gpu_blocks - 1): the null block is not usable memory "
    "(and a pool of only the null block is 0.0 used)",
    f"{DOC}#allocating-blocks",
)
def test_usage():
    """Usage counts the blocks in use out of the usable ones."""
    pool = make_pool(11)
    assert usage(pool) == pytest.approx(0.0), f"a new pool is 0.0 used, got {usage(pool)}"
    blocks = pool.get_new_blocks(4)
    assert usage(pool) == pytest.approx(0.4), f"4 of 10 usable blocks: 0.4, got {usage(pool)}"
    pool.get_new_blocks(6)
    assert usage(pool) == pytest.approx(1.0), f"every usable block taken: 1.0, got {usage(pool)}"
    pool.free_blocks(blocks)
    assert usage(pool) == pytest.approx(0.6), f"6 of 10 usable blocks: 0.6, got {usage(pool)}"
    thirds = make_pool(4)
    thirds.get_new_blocks(1)
    assert usage(thirds) == pytest.approx(1 / 3), (
        f"1 of 3 usable blocks: 1 - 2 / 3, got {usage(thirds)} (the fraction itself, not rounded)"
    )
    only_null = make_pool(1)
    assert usage(only_null) == pytest.approx(0.0), (
        f"a pool of 1 block (the null block) has nothing usable: 0.0, got {usage(only_null)}"
    )


@graded(
    3,
    "I4: when caching is on, every block popped for reuse must drop its stale hash from the "
    "cache map (its contents are about to be overwritten), not only the first or the last",
    f"{DOC}#allocating-blocks",
)
def test_reused_block_loses_its_stale_hash():
    """get_new_blocks evicts the prefix-cache entry of each cached free block it hands out."""
    pool = make_pool(4, caching=True, block_size=2)
    cached = pool.get_new_blocks(2)  # blocks 1 and 2
    hashes = [b"h" * 32, b"k" * 32]
    request = side().make_request("r", [1, 2, 3, 4], hashes)
    pool.cache_full_blocks(request, cached, 0, 2, 2, 0)
    for blk in cached:
        assert type(blk.block_hash) is bytes, "cache_full_blocks (given) must hash the blocks"
    pool.free_blocks(cached)
    for blk, block_hash in zip(cached, hashes):
        found = pool.get_cached_block(block_hash, [0])
        assert type(found) is list and len(found) == 1 and found[0] is blk, (
            "a freed cached block stays in the prefix cache until it is reused"
        )
    got = pool.get_new_blocks(3)  # drains the pool: block 3, then the cached blocks 1 and 2
    assert ids(got) == [3, 1, 2], f"draining the pool must give blocks [3, 1, 2], got {ids(got)}"
    for blk, block_hash in zip(cached, hashes):
        block_id = as_int(blk.block_id, "block_id")
        assert blk.block_hash is None, (
            f"I4: reused block {block_id} kept its old hash (get_new_blocks handed out 3 blocks; "
            "each cached one must be evicted)"
        )
        assert pool.get_cached_block(block_hash, [0]) is None, (
            f"I4: the cache map still finds block {block_id}, which was handed out for new contents"
        )
    # Two blocks cached under one hash (two requests computed the same block): reusing one
    # evicts that block only; the other still answers for the hash.
    pool = make_pool(5, caching=True, block_size=2)
    first, second = pool.get_new_blocks(1), pool.get_new_blocks(1)  # blocks 1 and 2
    shared = b"s" * 32
    for name, blocks in (("r1", first), ("r2", second)):
        pool.cache_full_blocks(side().make_request(name, [1, 2], [shared]), blocks, 0, 1, 2, 0)
    pool.free_blocks([*first, *second])
    got = pool.get_new_blocks(3)  # blocks 3, 4, then block 1
    assert ids(got) == [3, 4, 1], f"the pool must hand out blocks [3, 4, 1], got {ids(got)}"
    found = pool.get_cached_block(shared, [0])
    assert type(found) is list and len(found) == 1 and found[0] is second[0], (
        f"blocks 1 and 2 were both cached under one hash and only block 1 was reused: the hash "
        f"must still find block 2, got {describe(found)}. Evict through the given "
        "_maybe_evict_cached_block, which removes the one block from the hash's entry, not the "
        "whole entry"
    )


@graded(
    1,
    "get_new_blocks reports each block it hands out to the pool's metrics_collector "
    "(on_block_allocated), when the pool has one; with caching on, after evicting it",
    f"{DOC}#allocating-blocks",
)
def test_allocations_are_reported_to_the_metrics_collector():
    """Upstream's KV-cache residency metrics learn of every allocation from the pool."""
    pool, collector = side().make_pool_with_collector(5)
    handed_out = pool.get_new_blocks(3)
    got = ids(handed_out)
    assert got == [1, 2, 3], f"a new pool's get_new_blocks(3) must give blocks [1, 2, 3], got {got}"
    events = collector.events
    want = [["allocated", block_id] for block_id in got]
    assert same_data(events, want), (
        f"get_new_blocks(3) handed out blocks {got}: the collector must have been told "
        f"{want} (one on_block_allocated(block) per block, in order), but it saw {events!r}"
    )
    told = collector.allocated_blocks
    if type(told) is not list:
        raise AssertionError(f"the recorder's blocks must be a list, got {describe(told)}")
    itself = [a is b for a, b in zip(told, handed_out)]
    assert len(told) == 3 and all(itself), (
        f"get_new_blocks(3) handed out blocks {got}: on_block_allocated must be given each of "
        f"those very blocks, in order; of the {len(told)} objects it was given, "
        f"{sum(itself)} were (a stand-in that says a block's id is not the block)"
    )
    seen = collector.allocated_ref_cnts
    want_seen = [[block_id, 1] for block_id in got]
    assert same_data(seen, want_seen), (
        f"get_new_blocks(3) handed out blocks {got}: on_block_allocated must see each block "
        f"taken, ref_cnt already 1 ([block_id, ref_cnt]: {want_seen}), but it saw {seen!r} "
        f"(README row 11: set ref_cnt to 1, then tell the collector)"
    )
    pool.get_new_blocks(0)
    assert same_data(collector.events, want), "get_new_blocks(0) allocates nothing to report"
    # With caching on, each block handed out is first evicted (_maybe_evict_cached_block tells
    # the collector, cached or not), then allocated: the collector ends the block's last
    # residency before it starts the new one.
    pool, collector = side().make_pool_with_collector(4, True)
    first = ids(pool.get_new_blocks(2))
    pool.free_blocks([pool.blocks[i] for i in first])
    second = ids(pool.get_new_blocks(3))
    events = collector.events
    _check_evicted_then_allocated(events, [*first, *second])


def _check_evicted_then_allocated(events, handed_out: list[int]) -> None:
    """``events``: one ``evicted`` then one ``allocated`` per block of ``handed_out``, in order."""
    if type(events) is not list or not all(
        type(e) is list and len(e) == 2 and type(e[0]) is str for e in events
    ):
        raise AssertionError(f"the collector recorded {describe(events)}")
    allocated = [block_id for kind, block_id in events if kind == "allocated"]
    assert allocated == handed_out, (
        f"a caching pool handed out blocks {handed_out} over two calls: the collector must be "
        f"told on_block_allocated for each, in that order, but it saw {events!r}"
    )
    pending: dict[int, int] = {}
    for kind, block_id in events:
        if kind == "evicted":
            pending[block_id] = pending.get(block_id, 0) + 1
        elif kind == "allocated":
            assert pending.get(block_id, 0) == 1, (
                f"with caching on, get_new_blocks must evict each block it hands out "
                f"(_maybe_evict_cached_block, for every block, cached or not: it tells the "
                f"collector on_block_evicted) and only then report it allocated; block "
                f"{block_id} was reported allocated without exactly one eviction before it: "
                f"{events!r}"
            )
            pending[block_id] = 0


class PoolMachine(RuleBasedStateMachine):
    """Random allocations, shared blocks, frees and refused frees, checked against a model.

    A *holder* stands for a request: it holds one reference on each of its blocks. ``share``
    makes a new holder of blocks already held through ``touch`` (given in lab-01's file), as a
    prefix-cache hit does, so blocks reach ref_cnt 2, 3…; only the last holder's free may
    queue a block. ``revive`` touches a free block that was handed out before (a hit on a
    freed, still-cached block), which takes it out of the middle of the free queue.
    """

    N = 10

    def __init__(self) -> None:
        super().__init__()
        self.pool = make_pool(self.N)
        self.side = side()
        self.null = self.pool.null_block
        self.blocks: dict[int, object] = {}  # block id -> the learner's block, once handed out
        self.refs = [0] * self.N
        self.model_free = list(range(1, self.N))
        self.holders: list[list[int]] = []

    @rule(data=st.data())
    def allocate(self, data) -> None:
        n = data.draw(st.integers(0, self.N), label="n")
        if n > len(self.model_free):
            with pytest.raises(ValueError):
                self.pool.get_new_blocks(n)
            return
        got = self.pool.get_new_blocks(n)
        want, self.model_free = self.model_free[:n], self.model_free[n:]
        got_ids = self.side.block_ids(got)
        assert same_data(got_ids, want), f"get_new_blocks({n}) gave {got_ids}, expected {want}"
        for block_id, block in zip(want, got):
            self.blocks[block_id] = block
            self.refs[block_id] = 1
        self.holders.append(want)

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def share(self, data) -> None:
        group = data.draw(st.sampled_from(self.holders), label="holder")
        if not group:
            return
        chosen = data.draw(
            st.lists(st.sampled_from(group), min_size=1, unique=True), label="blocks"
        )
        for block_id in chosen:
            self.refs[block_id] += 1
        self.pool.touch([self.blocks[i] for i in chosen])
        self.holders.append(chosen)

    @precondition(lambda self: any(i in self.blocks for i in self.model_free))
    @rule(data=st.data())
    def revive(self, data) -> None:
        block_id = data.draw(
            st.sampled_from([i for i in self.model_free if i in self.blocks]), label="block"
        )
        self.pool.touch([self.blocks[block_id]])
        self.model_free.remove(block_id)
        self.refs[block_id] = 1
        self.holders.append([block_id])

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def free(self, data) -> None:
        group = self.holders.pop(data.draw(st.integers(0, len(self.holders) - 1), label="holder"))
        order = data.draw(st.permutations(group), label="order")
        self.pool.free_blocks([self.blocks[i] for i in order])
        for block_id in order:
            self.refs[block_id] -= 1
            if self.refs[block_id] == 0:
                self.model_free.append(block_id)

    @rule(data=st.data())
    def refused_free(self, data) -> None:
        """A free naming a free block (a double free) or the null block changes nothing."""
        free_known = [i for i in self.model_free if i in self.blocks]
        bad = data.draw(st.sampled_from([0, *free_known]), label="bad_block")
        group = data.draw(st.sampled_from(self.holders), label="holder") if self.holders else []
        call = [self.blocks[i] for i in group]
        call.insert(
            data.draw(st.integers(0, len(call)), label="position"),
            self.null if bad == 0 else self.blocks[bad],
        )
        with pytest.raises(ValueError):
            self.pool.free_blocks(call)

    @invariant()
    def consistent(self) -> None:
        snap = pool_snapshot(self.pool)
        free = check_pool_snapshot(snap)
        assert free == self.model_free, (
            f"I1: free queue is {free}, expected {self.model_free} (front pops, frees append "
            "in the order given, only blocks whose last holder freed them)"
        )
        refs = snap["ref_cnts"][1:]
        assert refs == self.refs[1:], (
            f"I1: ref_cnts of blocks 1..{self.N - 1} are {refs}, expected {self.refs[1:]} "
            "(one per holder; a refused free_blocks changes none)"
        )
        count = as_int(self.pool.get_num_free_blocks(), "get_num_free_blocks()")
        assert count == len(self.model_free), (
            f"get_num_free_blocks() is {count}, but {len(self.model_free)} blocks are free"
        )


@graded(
    4,
    "I1/I2: after any sequence of allocations, shared references and frees, every block "
    "is either free (in the queue, ref_cnt 0) or held (ref_cnt = its holders), and the "
    "queue order is the model's",
    f"{DOC}#invariants",
    timeout=30,
)
def test_random_allocations_and_frees_keep_the_invariants():
    """Property test: the pool matches a model under random allocate / share / free sequences."""
    run_machine(PoolMachine)


class PoolBench:
    """A pool of ``n`` blocks in the learner process, half of them held, and its model.

    Each step frees 500 held blocks one at a time, reading both counters after each free, and
    allocates 500 one at a time, in one request (timed here); what it returns is checked against
    the model. The counters are read between changes, so a count cached until the next change
    does not pass for O(1), and each allocation counts the free blocks again.
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self.pool = make_pool(n)
        self.run_ops = side().run_pool_ops
        half = n // 2
        (got,) = self.run_ops(self.pool, [["get_new_blocks", half]])
        if not same_data(got, list(range(1, half + 1))):
            raise AssertionError(
                f"get_new_blocks({half}) on a new pool of {n:,} blocks must give blocks 1..{half}"
            )
        self.free = list(range(half + 1, n))
        self.chunk = list(range(1, half + 1))[n // 8 : n // 8 + 500]

    def step(self) -> float:
        k, before = len(self.chunk), len(self.free)
        ops = [
            x
            for i in self.chunk
            for x in (["free_blocks", [i]], ["get_num_free_blocks"], ["get_usage"])
        ]
        ops += [["get_new_blocks", 1]] * k
        queue = self.free + self.chunk
        popped, self.free = queue[:k], queue[k:]
        seconds, got = timed_call(self.run_ops, self.pool, ops)
        if type(got) is not list or len(got) != 3 * k:
            raise AssertionError(
                f"the batch on a pool of {self.n:,} blocks returned {describe(got)}"
            )
        if not same_data(got[2 * k :], [[i] for i in popped]):
            raise AssertionError(
                f"after free_blocks of {k} blocks, {k} calls of get_new_blocks(1) on a pool of "
                f"{self.n:,} blocks must take the front of the free queue; they gave other blocks"
            )
        counts, usages = got[0 : 2 * k : 2], got[1 : 2 * k : 2]
        want_counts = [before + i + 1 for i in range(k)]
        if not same_data(counts, want_counts):
            raise AssertionError(
                f"get_num_free_blocks() after each of {k} frees must count {before + 1} .. "
                f"{before + k}: got {describe(counts[:3])} ..."
            )
        for count, usage in zip(want_counts, usages, strict=True):
            want = 1 - count / (self.n - 1)
            if not (type(usage) is float and abs(usage - want) < 1e-9):
                raise AssertionError(
                    f"get_usage() with {count} blocks free must be {want:.4f}, got "
                    f"{describe(usage)}"
                )
        self.chunk = popped
        return seconds

    def step_run(self) -> float:
        """One ``free_blocks`` of a quarter of the pool and one ``get_new_blocks`` as long, the
        seconds of the whole request (:func:`assert_linear_in_one_call` divides by ``k``): a
        long call costs O(k) too (no search of what the call has already collected, no count
        of a block's later entries, no copy of it per block)."""
        k = self.n // 4
        held = self.held()
        freed = held[:k]
        queue = self.free + freed
        popped, self.free = queue[:k], queue[k:]
        ops = [["free_blocks", freed], ["get_new_blocks", k]]
        seconds, got = timed_call(self.run_ops, self.pool, ops)
        if not same_data(got, [popped]):
            raise AssertionError(
                f"free_blocks of {k:,} blocks, then get_new_blocks({k:,}), on a pool of "
                f"{self.n:,} blocks must give the front of the free queue; it gave other blocks"
            )
        self.chunk = popped[:500]
        return seconds

    def held(self) -> list[int]:
        """The held blocks, in id order (every block but the null block and the free ones)."""
        free = set(self.free)
        return [i for i in range(1, self.n) if i not in free]

    def verify(self) -> None:
        free = check_pool(self.pool)
        if free != self.free:
            raise AssertionError(
                f"after the timed batches the free queue of a pool of {self.n:,} blocks is not "
                "in the expected order"
            )


@graded(
    2,
    "I2: freeing and allocating k blocks costs O(k), and get_num_free_blocks / "
    "get_usage are O(1), whatever the pool size",
    f"{DOC}#why-a-hand-written-linked-list",
    timeout=30,
)
def test_pool_operations_are_constant_time():
    """The same work costs the same on a small and on a 100x larger pool, and is right; so does
    each block of one long free_blocks and get_new_blocks (a quarter of the pool)."""
    benches: dict[int, PoolBench] = {}

    def run_ops(n: int):
        benches[n] = PoolBench(n)
        return benches[n].step

    assert_constant_time("BlockPool.free_blocks / get_new_blocks / get_num_free_blocks", run_ops)
    assert_linear_in_one_call(
        "BlockPool.free_blocks / get_new_blocks of a quarter of the pool in one call",
        {n: bench.step_run for n, bench in benches.items()},
    )
    for bench in benches.values():
        bench.verify()


def assert_linear_in_one_call(op_name: str, steps: dict, max_ratio: float = 12.0) -> None:
    """Each step handles a quarter of its pool (``n // 4`` blocks) in one call: the cost per
    block must be about the same on both pools, and each 500 blocks of the big call stay under
    :func:`assert_constant_time`'s ceiling.

    The noise floor (a ratio counts once the big call takes over 50 ms) is applied to the whole
    big call, not to its time per 500 blocks: an O(k^2) call that copies its list per block
    (``newly_free = newly_free + [block]``) took 3 s for 50,000 blocks, 30 ms per 500, 40x the
    small call's rate; scaled down to 500 blocks it hid under the floor.
    """
    (small, run_small), (big, run_big) = sorted(steps.items())
    k_small, k_big = small // 4, big // 4
    t_small, t_big = best_time(run_small), best_time(run_big)
    ratio = (t_big / k_big) / max(t_small / k_small, 1e-9)
    per_500 = t_big * 500 / k_big
    ceiling = max(0.05, CEILING_FACTOR * judge_relink_time())
    if (ratio > max_ratio and t_big > 0.05) or per_500 > ceiling:
        raise AssertionError(
            f"I2 (O(1) per block): {op_name} took {t_big * 1e3:.0f} ms for {k_big:,} blocks vs "
            f"{t_small * 1e3:.1f} ms for {k_small:,} ({ratio:.0f}x the time per block; at most "
            f"{max_ratio:g}x, and {ceiling * 1e3:.0f} ms per 500 blocks on this machine): one "
            "long call must cost O(1) per block, with no search or copy of what it has collected"
        )
