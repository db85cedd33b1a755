"""lab-05, part 2: caching full blocks, hits, revival, eviction order and reset.

The pool lives in the learner process, and so do the requests handed to it: the judge hashes
their tokens with its own reference ``hash_block_tokens`` and ``learner_side.make_request``
builds them there with those hashes. Hits are compared by identity (the same learner block)
and by the judge's own hashes; the pool's state is read back as data
(``tests/labs/common.py``).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from grading.suite import graded, learner_module, load_impl
from mini_vllm.core.kv_cache_utils import (
    hash_block_tokens,
    make_block_hash_with_group_id,
    sha256,
)
from tests.labs.common import (
    as_int,
    assert_constant_time,
    assert_error_names,
    assert_value_error,
    block_ids,
    check_pool,
    check_pool_snapshot,
    describe,
    pool_snapshot,
    run_machine,
    same_data,
    timed_call,
)

DOC = "phases/02-paged-attention/README.md"
BS = 2


def side():
    return learner_module("learner_side")


def make_pool(n: int, caching: bool = True):
    return load_impl("block_pool").BlockPool(
        num_gpu_blocks=n, enable_caching=caching, hash_block_size=BS
    )


def chain_hashes(tokens: list[int]) -> list[bytes]:
    """The chained hashes of the full blocks of ``tokens``, computed here (the reference)."""
    hashes, parent = [], None
    for i in range(0, len(tokens) - len(tokens) % BS, BS):
        parent = hash_block_tokens(sha256, parent, tokens[i : i + BS])
        hashes.append(parent)
    return hashes


@dataclass
class Req:
    """A request: ``obj`` is built in the learner process, ``block_hashes`` are the judge's."""

    obj: Any
    block_hashes: list[bytes]


def make_request(tokens: list[int], rid: str = "r") -> Req:
    hashes = chain_hashes(tokens)
    return Req(side().make_request(rid, list(tokens), hashes), hashes)


def key(block_hash: bytes) -> bytes:
    return make_block_hash_with_group_id(block_hash, 0)


def ids(blocks) -> list[int]:
    return block_ids(blocks)


def ref(block) -> int:
    return as_int(block.ref_cnt, "ref_cnt")


def hit(pool, block_hash):
    found = pool.get_cached_block(block_hash, [0])
    if found is None:
        return None
    if type(found) is not list or len(found) != 1:
        raise AssertionError(
            f"get_cached_block(hash, [0]) must return a list of one block or "
            f"None, got {describe(found)}"
        )
    return found[0]


@graded(
    3,
    "I3: cache_full_blocks hashes blocks[num_cached:num_full] with the request's "
    "block_hashes and indexes them",
    f"{DOC}#caching-full-blocks",
)
def test_cache_full_blocks_indexes_new_full_blocks():
    """Only the newly full blocks are cached; earlier ones are left alone."""
    pool = make_pool(8)
    req = make_request([1, 2, 3, 4, 5, 6])
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(req.obj, blocks, 0, 2, BS, 0)
    assert hit(pool, req.block_hashes[0]) is blocks[0], "block 1 must be cached under h0"
    assert hit(pool, req.block_hashes[1]) is blocks[1], "block 2 must be cached under h1"
    assert blocks[0].block_hash == key(req.block_hashes[0]), (
        "a cached block's block_hash is make_block_hash_with_group_id(its hash, group id)"
    )
    assert blocks[2].block_hash is None, "block 3 is beyond num_full_blocks: not cached yet"
    assert hit(pool, req.block_hashes[2]) is None, "h2 is not cached before its block is full"
    pool.cache_full_blocks(req.obj, blocks, 2, 3, BS, 0)
    assert hit(pool, req.block_hashes[2]) is blocks[2], "block 3 must be cached under h2"
    assert [ref(b) for b in blocks] == [1, 1, 1], "caching must not change reference counts"
    # The request's block_hashes are the keys, whatever made them: the engine's hash function
    # and extra keys (a LoRA adapter, a cache salt) that the tokens alone do not show.
    tokens = [1, 2, 3, 4]
    salted, parent = [], None
    for i in range(0, len(tokens), BS):
        parent = hash_block_tokens(sha256, parent, tokens[i : i + BS], ("salt",))
        salted.append(parent)
    salted_req = Req(side().make_request("salted", tokens, salted), salted)
    more = pool.get_new_blocks(2)
    pool.cache_full_blocks(salted_req.obj, more, 0, 2, BS, 0)
    got = [hit(pool, h) for h in salted]
    assert got[0] is more[0] and got[1] is more[1], (
        "I3: cache_full_blocks must file each block under request.block_hashes[i], as given "
        "(they carry the engine's hash function and extra keys such as a salt), not under a "
        "hash it recomputes from the tokens: a request of tokens [1, 2, 3, 4] whose "
        "block_hashes were made with extra keys ('salt',) got no hit on them"
    )
    check_pool(pool)


@graded(
    2,
    "I3: cache_full_blocks skips the null block and every block whose block_mask entry is "
    "False: neither gets a hash nor a map entry",
    f"{DOC}#caching-full-blocks",
)
def test_cache_full_blocks_skips_null_and_masked_blocks():
    """Only real blocks the caller selected enter the prefix cache."""
    pool = make_pool(10)
    req = make_request([1, 2, 3, 4, 5, 6])
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(req.obj, blocks, 0, 3, BS, 0, block_mask=[True, False, True])
    assert hit(pool, req.block_hashes[0]) is blocks[0], "an unmasked block must be cached"
    assert blocks[1].block_hash is None and hit(pool, req.block_hashes[1]) is None, (
        "I3: a block whose block_mask entry is False must not be cached"
    )
    assert hit(pool, req.block_hashes[2]) is blocks[2], "an unmasked block must be cached"
    other = make_request([7, 7, 8, 8])
    (blk,) = pool.get_new_blocks(1)
    pool.cache_full_blocks(other.obj, [pool.null_block, blk], 0, 2, BS, 0)
    assert pool.null_block.block_hash is None and hit(pool, other.block_hashes[0]) is None, (
        "I3: the null block is a placeholder: it is never cached"
    )
    assert hit(pool, other.block_hashes[1]) is blk, "the real block after it must be cached"
    masked = make_request([6, 6, 7, 7, 8, 8])
    two = pool.get_new_blocks(2)
    pool.cache_full_blocks(
        masked.obj, [pool.null_block, *two], 0, 3, BS, 0, block_mask=[True, False, True]
    )
    assert two[0].block_hash is None and hit(pool, masked.block_hashes[2]) is two[1], (
        "I3: block_mask[i] belongs to blocks[num_cached_blocks + i], the null block counted: "
        "mask [True, False, True] over [null, x, y] leaves x out and caches y"
    )
    third = make_request([3, 3, 4, 4, 5, 5])
    more = pool.get_new_blocks(3)
    pool.cache_full_blocks(third.obj, more, 0, 1, BS, 0)
    pool.cache_full_blocks(third.obj, more, 1, 3, BS, 0, block_mask=[False, True])
    assert more[1].block_hash is None and hit(pool, third.block_hashes[1]) is None, (
        "I3: block_mask has one entry per NEW full block, blocks[num_cached_blocks:"
        "num_full_blocks]: with num_cached_blocks=1, mask [False, True] leaves blocks[1] out"
    )
    assert hit(pool, third.block_hashes[2]) is more[2], (
        "I3: with num_cached_blocks=1, mask [False, True] caches blocks[2]"
    )
    check_pool(pool)
    # A block left out stays out: a later call caches blocks[num_cached_blocks:num_full_blocks]
    # only, and does not catch up on an earlier block that has no hash.
    pool = make_pool(5)
    req = make_request([1, 2, 3, 4, 5, 6])
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(req.obj, blocks, 0, 2, BS, 0, block_mask=[True, False])
    pool.cache_full_blocks(req.obj, blocks, 2, 3, BS, 0)
    assert blocks[1].block_hash is None and hit(pool, req.block_hashes[1]) is None, (
        "I3: cache_full_blocks(req, blocks, 2, 3, ...) must cache blocks[2] only: blocks[1], left "
        "out by the mask of the call before, is not among blocks[num_cached_blocks:"
        "num_full_blocks] and must stay uncached"
    )
    assert hit(pool, req.block_hashes[2]) is blocks[2], "blocks[2] must be cached under h2"
    check_pool(pool)


@graded(
    2,
    "Misuse: a block is hashed once; caching a block that already has a hash raises "
    "RuntimeError and caches no block of the call",
    f"{DOC}#misuse-errors",
)
def test_hashing_a_block_twice_is_an_error():
    """Setting a hash on a block that has one is a bug in the caller; the call does nothing."""
    pool = make_pool(5)
    req = make_request([1, 2, 3, 4])
    blocks = pool.get_new_blocks(2)
    # Learner objects are read before each refusal: only the call itself may raise.
    second, both = blocks[1:], [blocks[0], blocks[1]]
    pool.cache_full_blocks(req.obj, second, 0, 1, BS, 0)  # block 2 holds h0
    with pytest.raises(RuntimeError) as raised:
        pool.cache_full_blocks(req.obj, second, 0, 1, BS, 0)
    assert_error_names(raised.value, "cache_full_blocks of block 2, which already has a hash", 2)
    with pytest.raises((RuntimeError, ValueError)):
        both[1].block_hash = b"another"
    # Block 1 is new, block 2 already has a hash: the whole call is refused.
    with pytest.raises(RuntimeError):
        pool.cache_full_blocks(req.obj, both, 0, 2, BS, 0)
    assert blocks[0].block_hash is None, (
        "a refused cache_full_blocks must cache no block: block 1, before the bad block 2, "
        "got a hash (validate every block before caching any)"
    )
    assert hit(pool, req.block_hashes[0]) is blocks[1], (
        "a refused cache_full_blocks must leave the map as it was"
    )
    check_pool(pool)
    # The hashed block in the middle: blocks 3 and 4 around block 2 stay uncached too.
    pool = make_pool(6)
    req = make_request([1, 2, 3, 4, 5, 6])
    first, middle, last = pool.get_new_blocks(3)
    pool.cache_full_blocks(req.obj, [middle], 0, 1, BS, 0)
    with pytest.raises(RuntimeError):
        pool.cache_full_blocks(req.obj, [first, middle, last], 0, 3, BS, 0)
    assert first.block_hash is None and last.block_hash is None, (
        "a refused cache_full_blocks must cache no block: blocks 1 and 3 around the hashed "
        "block 2 got a hash (validate every block, not only the first or the last)"
    )
    check_pool(pool)
    # Nor does the refusal leave a change for later: caching the third block alone, the next
    # call, hashes it and nothing else (the attack of lab-01's
    # tests/hostile/undo_the_rollback_at_the_next_success.py, on this call).
    pool.cache_full_blocks(req.obj, [first, middle, last], 2, 3, BS, 0)
    assert first.block_hash is None and hit(pool, req.block_hashes[2]) is last, (
        "after the refused call, cache_full_blocks(req, [1, 2, 3], num_cached_blocks=2, "
        "num_full_blocks=3) must cache block 3 alone: block 1 got a hash, or block 3 none (a "
        "refused call changes nothing, then or at a later call)"
    )


def _refused(what: str, call) -> None:
    """``call()``, a ``cache_full_blocks`` with ``what`` wrong, must raise ValueError."""
    assert_value_error(f"cache_full_blocks with {what}", call)


@graded(
    2,
    "Misuse: cache_full_blocks refuses (ValueError, nothing cached) too few block hashes or "
    "blocks, a block_mask of the wrong length and a block_size other than hash_block_size; "
    "a call with nothing to cache (num_cached_blocks >= num_full_blocks) returns first",
    f"{DOC}#caching-full-blocks",
)
def test_cache_full_blocks_refuses_bad_arguments():
    """Bad counts would silently cache fewer blocks, or under hashes of another size."""
    pool = make_pool(6)
    req = make_request([1, 2, 3, 4])  # two full blocks: two block hashes
    blocks = pool.get_new_blocks(3)
    one_block = blocks[:1]  # read here: only the calls below may raise the ValueError
    cache = pool.cache_full_blocks
    _refused(
        "num_full_blocks=3 for a request of 2 block hashes",
        lambda: cache(req.obj, blocks, 0, 3, BS, 0),
    )
    _refused("num_full_blocks=2 but 1 block given", lambda: cache(req.obj, one_block, 0, 2, BS, 0))
    _refused(
        "a block_mask of 3 entries for 2 new full blocks",
        lambda: cache(req.obj, blocks, 0, 2, BS, 0, block_mask=[True, True, True]),
    )
    _refused(
        "a block_mask of 1 entry for 2 new full blocks",
        lambda: cache(req.obj, blocks, 0, 2, BS, 0, block_mask=[True]),
    )
    _refused(
        f"block_size={2 * BS} in a pool of hash_block_size={BS}",
        lambda: cache(req.obj, blocks, 0, 2, 2 * BS, 0),
    )
    _refused(
        "num_full_blocks=3 for a request of 2 block hashes, one block already cached",
        lambda: cache(req.obj, blocks, 1, 3, BS, 0),
    )
    _refused(
        "num_full_blocks=2 but 1 block given, one block already cached",
        lambda: cache(req.obj, one_block, 1, 2, BS, 0),
    )
    _refused(
        "an empty block_mask for 2 new full blocks",
        lambda: cache(req.obj, blocks, 0, 2, BS, 0, block_mask=[]),
    )
    hashes = pool_snapshot(pool, hashes=True)["hashes"]
    assert hashes == [None] * 6, "a refused cache_full_blocks must give no block a hash"
    assert hit(pool, req.block_hashes[0]) is None, "a refused cache_full_blocks must cache nothing"
    # Nothing to cache: the call returns before any check, as upstream's first line does.
    for what, call in [
        (
            f"num_cached_blocks=2, num_full_blocks=2 and block_size={2 * BS}",
            lambda: cache(req.obj, blocks, 2, 2, 2 * BS, 0),
        ),
        (
            "num_cached_blocks=3, num_full_blocks=3, 2 block hashes and 1 block",
            lambda: cache(req.obj, one_block, 3, 3, BS, 0),
        ),
        ("num_cached_blocks=2, num_full_blocks=1", lambda: cache(req.obj, blocks, 2, 1, BS, 0)),
    ]:
        try:
            call()
        except NotImplementedError:
            raise
        except Exception as exc:
            raise AssertionError(
                f"cache_full_blocks with {what} has nothing to cache: it returns at once "
                f"(if num_cached_blocks >= num_full_blocks: return), before any check; it "
                f"raised {type(exc).__name__}: {exc}"
            ) from None
    hashes = pool_snapshot(pool, hashes=True)["hashes"]
    assert hashes == [None] * 6, "a call with nothing to cache must give no block a hash"
    # The control: the same call with consistent arguments caches both blocks, and only them.
    cache(req.obj, blocks, 0, 2, BS, 0)
    assert (
        hit(pool, req.block_hashes[0]) is blocks[0] and hit(pool, req.block_hashes[1]) is blocks[1]
    ), (
        "after the refusals, cache_full_blocks(req, blocks, 0, 2, ...) with consistent arguments "
        "must cache both full blocks: refuse only the inconsistent calls"
    )
    hashes = pool_snapshot(pool, hashes=True)["hashes"]
    want = [None, *(key(h) for h in req.block_hashes), None, None, None]
    assert hashes == want, (
        "after the refusals, cache_full_blocks(req, blocks, 0, 2, ...) must hash blocks 1 and 2 "
        "and no other (block 3 got a hash): a refused call changes nothing, then or at a later "
        "call"
    )
    check_pool(pool)


@graded(
    1,
    "cache_full_blocks: num_cached_blocks >= num_full_blocks means nothing to cache, also when "
    "num_cached_blocks is the larger: it returns before any check, whatever the other arguments",
    f"{DOC}#caching-full-blocks",
)
def test_nothing_to_cache_past_the_full_count_returns_first():
    """A caller whose published count is already past the full blocks has nothing to cache.

    For a long time upstream's first line read ``if num_cached_blocks == num_full_blocks:
    return`` (since vllm-project/vllm#13973): a call with more blocks published than full then
    went on to the checks and raised on a block size or a count it never uses. The refusal
    test's ``num_cached_blocks > num_full_blocks`` call had consistent arguments, so ``==``
    passed it.
    """
    pool = make_pool(6)
    req = make_request([1, 2, 3, 4])  # two full blocks: two block hashes
    blocks = pool.get_new_blocks(3)
    one_block = blocks[:1]  # read here: only the calls below may raise
    cache = pool.cache_full_blocks
    cache(req.obj, blocks, 0, 2, BS, 0)  # blocks 1 and 2 are published
    for what, call in [
        (
            f"num_cached_blocks=2, num_full_blocks=1 and block_size={2 * BS}",
            lambda: cache(req.obj, blocks, 2, 1, 2 * BS, 0),
        ),
        (
            "num_cached_blocks=3, num_full_blocks=2 and 1 block",
            lambda: cache(req.obj, one_block, 3, 2, BS, 0),
        ),
        (
            "num_cached_blocks=4, num_full_blocks=3 and 2 block hashes",
            lambda: cache(req.obj, blocks, 4, 3, BS, 0),
        ),
        (
            "num_cached_blocks=2, num_full_blocks=1 and a block_mask of 2 entries",
            lambda: cache(req.obj, blocks, 2, 1, BS, 0, block_mask=[True, True]),
        ),
    ]:
        try:
            call()
        except NotImplementedError:
            raise
        except Exception as exc:
            raise AssertionError(
                f"cache_full_blocks with {what} has nothing to cache (more blocks published "
                f"than full): it returns at once (if num_cached_blocks >= num_full_blocks: "
                f"return, not ==), before any check; it raised {type(exc).__name__}: {exc}"
            ) from None
    # The control, after the calls that had nothing to do: a third full block is published.
    longer = make_request([1, 2, 3, 4, 5, 6])  # the same two blocks, then a third
    cache(longer.obj, blocks, 2, 3, BS, 0)
    hashes = pool_snapshot(pool, hashes=True)["hashes"]
    want = [None, *(key(h) for h in longer.block_hashes), None, None]
    assert hashes == want, (
        "after the calls with nothing to cache, cache_full_blocks(req, blocks, 2, 3, ...) must "
        f"publish block 3 beside blocks 1 and 2: the block hashes are {hashes}, expected {want}"
    )
    assert hit(pool, longer.block_hashes[2]) is blocks[2], (
        "after the calls with nothing to cache, the third block's hash must hit block 3"
    )
    check_pool(pool)


@graded(
    2,
    "I3: the cache key is the block hash with the KV cache group id: cache_full_blocks files "
    "blocks under its kv_cache_group_id, and get_cached_block returns one block per group "
    "asked, in that order, or None if any of them misses",
    f"{DOC}#the-cache-map",
)
def test_cache_groups_are_all_or_nothing():
    """Each group caches its own pages; a prefix is reusable only if every group has it."""
    pool = make_pool(5)
    req = make_request([1, 2])
    h = req.block_hashes[0]
    a, b = pool.get_new_blocks(2)
    pool.cache_full_blocks(req.obj, [a], 0, 1, BS, 1)
    assert a.block_hash == make_block_hash_with_group_id(h, 1), (
        "cache_full_blocks(..., kv_cache_group_id=1) must give the block the key "
        "make_block_hash_with_group_id(hash, 1), not group 0's"
    )
    assert pool.get_cached_block(h, [0]) is None, "a block cached for group 1 must miss for group 0"
    found = pool.get_cached_block(h, [1])
    assert type(found) is list and len(found) == 1 and found[0] is a, (
        "a block cached for group 1 must hit for group 1"
    )
    for groups in ([0, 1], [1, 0]):
        got = pool.get_cached_block(h, groups)
        assert got is None, (
            f"get_cached_block(hash, {groups}) must be None: group 0 misses (all or nothing), "
            f"got {describe(got) if type(got) is not list else 'a list of ' + str(len(got))}"
        )
    pool.cache_full_blocks(req.obj, [b], 0, 1, BS, 0)
    both = pool.get_cached_block(h, [1, 0])
    assert type(both) is list and len(both) == 2 and both[0] is a and both[1] is b, (
        "get_cached_block(hash, [1, 0]) must return [group 1's block, group 0's block]"
    )


@graded(
    2,
    "get_cached_block returns the cached block without taking a reference, None on a miss",
    f"{DOC}#caching-full-blocks",
)
def test_get_cached_block_hit_and_miss():
    """A lookup is side-effect free."""
    pool = make_pool(5)
    req = make_request([7, 7, 8, 8])
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(req.obj, blocks, 0, 2, BS, 0)
    pool.free_blocks(list(reversed(blocks)))
    before = check_pool(pool)
    assert hit(pool, req.block_hashes[1]) is blocks[1], "a freed cached block still hits"
    assert hit(pool, chain_hashes([9, 9])[0]) is None, "a hash never cached must miss"
    assert pool.get_cached_block(req.block_hashes[0], [1]) is None, (
        "a hash cached for group 0 must not hit for group 1"
    )
    assert check_pool(pool) == before and ref(blocks[1]) == 0, (
        "get_cached_block must not touch ref counts or the queue"
    )


@graded(
    3,
    "I4: touch revives a free block (cached or not) by removing it from the middle of the "
    "free queue, keeping everyone else's order",
    f"{DOC}#touch-and-revival",
)
def test_touch_revives_from_the_middle():
    """A hit on a free cached block takes it out of the queue and gives it one reference."""
    pool = make_pool(8)
    req = make_request([1, 2, 3, 4, 5, 6])
    blocks = pool.get_new_blocks(3)  # 1 2 3
    pool.cache_full_blocks(req.obj, blocks, 0, 3, BS, 0)
    pool.free_blocks(list(reversed(blocks)))
    free = check_pool(pool)
    assert free == [4, 5, 6, 7, 3, 2, 1], (
        f"blocks 1 2 3 freed in reverse join the back as 3 2 1: expected [4, 5, 6, 7, 3, 2, 1], "
        f"got {free}"
    )
    pool.touch([blocks[0], blocks[1]])
    assert (ref(blocks[0]), ref(blocks[1])) == (1, 1), "a revived block has ref_cnt 1"
    assert check_pool(pool) == [4, 5, 6, 7, 3], (
        "I4: touched blocks leave the queue; the other blocks keep their order"
    )
    assert blocks[0].block_hash == key(req.block_hashes[0]), (
        "touch must not drop the hash of a revived block"
    )
    plain = pool.blocks[5]  # free, never cached
    pool.touch([plain])
    free = check_pool(pool)
    assert ref(plain) == 1 and free == [4, 6, 7, 3], (
        f"I1: touch must take any free block out of the queue, cached or not: after touching "
        f"block 5 (free, no hash) it has ref_cnt {ref(plain)} (expected 1) and the queue is "
        f"{free} (expected [4, 6, 7, 3])"
    )


@graded(
    2,
    "touch on a block in use only adds a reference (the block is not in the queue)",
    f"{DOC}#touch-and-revival",
)
def test_touch_shared_block_in_use():
    """Sharing a running request's block counts one more user."""
    pool = make_pool(5)
    req = make_request([1, 2])
    (blk,) = pool.get_new_blocks(1)
    pool.cache_full_blocks(req.obj, [blk], 0, 1, BS, 0)
    before = check_pool(pool)
    pool.touch([blk])
    assert ref(blk) == 2, f"touching a block in use gives it a second reference, got {ref(blk)}"
    assert check_pool(pool) == before, "touching a block in use must not change the queue"
    pool.free_blocks([blk])
    assert ref(blk) == 1 and check_pool(pool) == before, (
        "freeing one of two references keeps the block out of the queue"
    )
    pool.free_blocks([blk])
    assert check_pool(pool) == [*before, 1], "the last free queues the block at the back"
    pool.touch([blk, blk])
    assert ref(blk) == 2 and check_pool(pool) == before, (
        f"touch([b, b]) of a free block must take two references, one per entry (as "
        f"free_blocks gives one back per entry), and take b out of the queue once: got ref_cnt "
        f"{ref(blk)} and the queue {check_pool(pool)} (expected 2 and {before})"
    )


@graded(
    1,
    "Misuse: touch refuses the null block with ValueError and then touches no block",
    f"{DOC}#misuse-errors",
)
def test_touch_null_block_is_an_error():
    """The null block is never shared, so a hit can never claim it."""
    pool = make_pool(5)
    req = make_request([1, 2])
    (blk,) = pool.get_new_blocks(1)
    pool.cache_full_blocks(req.obj, [blk], 0, 1, BS, 0)
    pool.free_blocks([blk])
    before = check_pool(pool)
    null = pool.null_block  # read before: only touch itself may raise
    with pytest.raises(ValueError) as raised:
        pool.touch([blk, null])
    message = str(raised.value)
    assert "null" in message.lower() or re.search(r"(?<![\w.])0(?![\w.])", message), (
        f"touch([block 1, the null block]) raised ValueError({message!r}), which does not say "
        "which block was wrong: name the null block (the word 'null', or its id 0) in the "
        "message (the misuse table: a message naming the block and what was wrong)"
    )
    assert ref(blk) == 0 and check_pool(pool) == before, (
        "a refused touch must take no reference and leave the free queue as it was"
    )
    pool.touch([blk])  # the control: the same block alone is revived
    assert ref(blk) == 1 and check_pool(pool) == [b for b in before if b != 1], (
        "touch([block 1]) of a free cached block must take one reference and take it out of "
        "the free queue: refuse only the null block"
    )


@graded(
    1,
    "Misuse (broken state): touch of a block with ref_cnt 0 that is not in the free queue "
    "raises RuntimeError (the queue's remove refuses it)",
    f"{DOC}#misuse-errors",
)
def test_touch_free_block_not_in_queue_is_an_error():
    """ref_cnt 0 means the block is in the free queue (I1); when it is not, say so."""
    pool = make_pool(4)
    (blk,) = pool.get_new_blocks(1)
    blk.ref_cnt = 0  # corrupt the pool: block 1 is not queued, yet nobody holds it
    with pytest.raises(RuntimeError):
        pool.touch([blk])
    # The control: a block that is free and in the queue is revived, not refused.
    pool = make_pool(4)
    (blk,) = pool.get_new_blocks(1)
    pool.free_blocks([blk])
    pool.touch([blk])
    assert ref(blk) == 1 and check_pool(pool) == [2, 3], (
        "touch([block 1]) of a block in the free queue must take it out with one reference: "
        "refuse only a free block that is missing from the queue"
    )


@graded(
    3,
    "I4: freed blocks are evicted LRU first and, within a request, tail first, so a "
    "prefix's head outlives its tail",
    f"{DOC}#eviction-order",
)
def test_eviction_is_lru_and_tail_first():
    """Reusing free blocks evicts the never-used ones, then the tail of the oldest request."""
    pool = make_pool(7)
    req = make_request([1, 2, 3, 4, 5, 6])
    blocks = pool.get_new_blocks(3)  # 1 2 3
    pool.cache_full_blocks(req.obj, blocks, 0, 3, BS, 0)
    pool.free_blocks(list(reversed(blocks)))  # queue: 4 5 6 3 2 1
    assert ids(pool.get_new_blocks(4)) == [4, 5, 6, 3], "4 5 6, then the tail block 3"
    assert blocks[2].block_hash is None and hit(pool, req.block_hashes[2]) is None, (
        "I4: the request's tail block (3) is evicted first"
    )
    assert hit(pool, req.block_hashes[0]) is blocks[0], "the head of the prefix is still cached"
    assert hit(pool, req.block_hashes[1]) is blocks[1], "the middle of the prefix is still cached"
    check_pool(pool)


@graded(
    2,
    "I4: _maybe_evict_cached_block drops a block's hash and its map entry; True only if "
    "it was cached",
    f"{DOC}#eviction-order",
)
def test_maybe_evict_cached_block():
    """Evicting a cached block forgets it; evicting an uncached one is a no-op."""
    pool = make_pool(5)
    req = make_request([1, 2])
    a, b = pool.get_new_blocks(2)
    pool.cache_full_blocks(req.obj, [a], 0, 1, BS, 0)
    assert pool._maybe_evict_cached_block(a) is True, "evicting a cached block returns True"
    assert a.block_hash is None and hit(pool, req.block_hashes[0]) is None, (
        "I4: an evicted block loses its hash and its map entry"
    )
    assert pool._maybe_evict_cached_block(a) is False, "evicting it again returns False"
    assert pool._maybe_evict_cached_block(b) is False, "evicting a block never cached: False"


@graded(
    2,
    "evict_blocks forgets the cached prefixes of the given block ids only, and refuses "
    "(ValueError, nothing evicted) an id outside the pool, 0 .. num_gpu_blocks - 1",
    f"{DOC}#eviction-order",
)
def test_evict_blocks_by_id():
    """Evicting by id removes cache entries but does not free or move blocks."""
    pool = make_pool(6)
    req = make_request([1, 2, 3, 4, 5, 6])
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(req.obj, blocks, 0, 3, BS, 0)
    pool.evict_blocks({2})
    assert hit(pool, req.block_hashes[1]) is None and blocks[1].block_hash is None, (
        "evict_blocks({2}) must forget block 2's hash and map entry"
    )
    assert hit(pool, req.block_hashes[0]) is blocks[0], "block 1 must stay cached"
    assert hit(pool, req.block_hashes[2]) is blocks[2], "block 3 must stay cached"
    assert [ref(b) for b in blocks] == [1, 1, 1], "evict_blocks must not free blocks"
    check_pool(pool)
    pool.evict_blocks({0})  # the null block is a block of the pool (never cached): a no-op
    given = side().evict_blocks_given_a_set(pool, [0, 3])
    _check_the_callers_set(given, "")
    pool.cache_full_blocks(req.obj, blocks, 2, 3, BS, 0)  # block 3 cached again
    for bad in (6, -1):
        with pytest.raises(ValueError) as raised:
            pool.evict_blocks({1, bad})
        assert_error_names(raised.value, f"evict_blocks({{1, {bad}}}) of a pool of 6 blocks", bad)
        assert hit(pool, req.block_hashes[0]) is blocks[0], (
            f"a refused evict_blocks({{1, {bad}}}) must evict nothing: block 1 lost its entry"
        )
        assert hit(pool, req.block_hashes[2]) is blocks[2], (
            f"a refused evict_blocks({{1, {bad}}}) must evict nothing: block 3 lost its entry"
        )
    # A free cached block: it loses its prefix and nothing else. It stays free, where it was in
    # the free queue (the eviction order), neither taken out nor moved to either end.
    pool.free_blocks(list(reversed(blocks)))  # the free queue: 4 5 3 2 1
    before = check_pool(pool)
    pool.evict_blocks({3})  # block 3: free, cached, in the middle of the queue
    assert blocks[2].block_hash is None and hit(pool, req.block_hashes[2]) is None, (
        "evict_blocks({3}) of a free cached block must forget its hash and map entry"
    )
    free = check_pool(pool)
    assert ref(blocks[2]) == 0 and free == before, (
        f"I4: evict_blocks({{3}}) of a free cached block must leave it free and where it was in "
        f"the free queue: only its cache entry goes (no freeing, no moving; the queue is the "
        f"eviction order), but the queue went from {before} to {free}"
    )
    assert hit(pool, req.block_hashes[0]) is blocks[0], "block 1 must stay cached"
    # The last id of the pool is a valid one: 4 blocks, ids 0 .. 3, block 3 cached.
    pool = make_pool(4)
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(req.obj, blocks, 0, 3, BS, 0)
    try:
        pool.evict_blocks({3})
    except ValueError as exc:
        raise AssertionError(
            f"evict_blocks({{3}}) in a pool of 4 blocks refused block 3 ({exc}): the valid ids "
            "are 0 .. num_gpu_blocks - 1, the last one included"
        ) from None
    assert blocks[2].block_hash is None and hit(pool, req.block_hashes[2]) is None, (
        "evict_blocks({3}) in a pool of 4 blocks must forget block 3's hash and map entry: the "
        "valid ids are 0 .. num_gpu_blocks - 1, the last one included"
    )
    assert hit(pool, req.block_hashes[1]) is blocks[1], "block 2 must stay cached"
    _check_the_callers_set(given, ", nor change it at a later call")


def _check_the_callers_set(given: Any, when: str) -> None:
    """The set of ids ``evict_blocks({0, 3})`` was given is still ``{0, 3}``: read right after
    the call, and again once the test's last call is made."""
    kept = side().given_ids(given)
    assert same_data(kept, [0, 3]), (
        f"evict_blocks({{0, 3}}) must leave the caller's set as it was{when}, got "
        f"{describe(kept)}: the set belongs to the caller"
    )


@graded(
    3,
    "reset_prefix_cache refuses (returns False) while any block is in use; otherwise it "
    "empties the map and clears every hash",
    f"{DOC}#resetting-the-prefix-cache",
)
def test_reset_prefix_cache():
    """Resetting is all or nothing and keeps the free queue intact."""
    pool = make_pool(6)
    req = make_request([1, 2, 3, 4])
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(req.obj, blocks, 0, 2, BS, 0)
    assert pool.reset_prefix_cache() is False, "blocks are in use: the reset must be refused"
    assert hit(pool, req.block_hashes[0]) is blocks[0], "a refused reset must change nothing"
    pool.free_blocks(list(reversed(blocks)))
    queue_before = check_pool(pool)
    # Nor does the refusal leave a change for later: after the free, the next call, both blocks
    # still hold their prefixes (tests/hostile/reset_the_cache_at_the_next_call.py).
    hashes = pool_snapshot(pool, hashes=True)["hashes"]
    want = [None, *(key(h) for h in req.block_hashes), None, None, None]
    found = [hit(pool, h) for h in req.block_hashes]
    assert hashes == want and found[0] is blocks[0] and found[1] is blocks[1], (
        "after the refused reset, free_blocks of the two cached blocks must leave them cached "
        "(their hashes and map entries): a refused call changes nothing, then or at a later call"
    )
    assert pool.reset_prefix_cache() is True, "no block is in use: the reset must happen"
    assert hit(pool, req.block_hashes[0]) is None and hit(pool, req.block_hashes[1]) is None, (
        "after a reset no prefix hits"
    )
    hashes = pool_snapshot(pool, hashes=True)["hashes"]
    assert hashes == [None] * 6, "after a reset no block keeps a hash"
    assert check_pool(pool) == queue_before, "a reset must leave the free queue as it was"
    (one,) = pool.get_new_blocks(1)  # one block in use, not (yet) cached
    got = pool.reset_prefix_cache()
    assert got is False, (
        f"one block (block {as_int(one.block_id, 'block_id')}) is in use, not cached: the reset "
        f"must still be refused (no block may be in use, cached or not), got {describe(got)}"
    )
    plain = make_pool(4, caching=False)
    got = plain.reset_prefix_cache()
    assert got is True, (
        f"reset_prefix_cache() on a pool without prefix caching, no block in use, must return "
        f"True: it refuses only while a block is in use, whatever enable_caching says, got "
        f"{describe(got)}"
    )


def _new_events(collector, seen: int) -> list:
    events = collector.events
    if type(events) is not list:
        raise AssertionError(f"the recorder's events must be a list, got {describe(events)}")
    return events[seen:]


@graded(
    2,
    "the pool reports prefix-cache events to its metrics_collector, if it has one: touch -> "
    "on_block_accessed per block, _maybe_evict_cached_block -> on_block_evicted, a reset -> "
    "reset()",
    f"{DOC}#touch-and-revival",
)
def test_cache_events_are_reported_to_the_metrics_collector():
    """Upstream's KV-cache residency metrics hear of every hit, eviction and reset."""
    pool, collector = side().make_pool_with_collector(4, BS)
    req = make_request([1, 2, 3, 4])
    blocks = pool.get_new_blocks(2)  # blocks 1, 2
    first, second = ids(blocks)
    pool.cache_full_blocks(req.obj, blocks, 0, 2, BS, 0)
    pool.free_blocks(list(reversed(blocks)))  # free queue: 3, 2, 1
    seen = len(collector.events)
    pool.touch([blocks[0]])  # a hit on block 1, revived from the queue
    got = _new_events(collector, seen)
    assert same_data(got, [["accessed", first]]), (
        f"touch([block {first}]) must tell the collector on_block_accessed(block {first}) once, "
        f"and nothing else; it saw {got!r}"
    )
    seen += len(got)
    pool.touch([blocks[0]])  # a second user of block 1, which is no longer free
    got = _new_events(collector, seen)
    assert same_data(got, [["accessed", first]]), (
        f"touch([block {first}]) of a block already in use is a hit too: the collector must "
        f"hear on_block_accessed(block {first}) for every block touched; it saw {got!r}"
    )
    told = collector.accessed_blocks
    if type(told) is not list:
        raise AssertionError(f"the recorder's blocks must be a list, got {describe(told)}")
    itself = [b is blocks[0] for b in told]
    assert len(told) == 2 and all(itself), (
        f"touch([block {first}]) twice: on_block_accessed must be given the block itself, the "
        f"one touch was given, each time; of the {len(told)} objects it was given, "
        f"{sum(itself)} were (a stand-in that says a block's id is not the block)"
    )
    seen_refs = collector.accessed_ref_cnts
    assert same_data(seen_refs, [[first, 1], [first, 2]]), (
        f"touch([block {first}]) twice: on_block_accessed must see the block holding the "
        f"reference touch just took ([block_id, ref_cnt]: [[{first}, 1], [{first}, 2]]), but it "
        f"saw {seen_refs!r} (README row 8: take the reference, then tell the collector, as "
        f"upstream and get_new_blocks do)"
    )
    pool.free_blocks([blocks[0]])
    seen = len(collector.events)
    reused = ids(pool.get_new_blocks(2))  # blocks 3 and 2: block 2 loses its cached prefix
    got = _new_events(collector, seen)
    assert ["evicted", second] in got, (
        f"get_new_blocks reused cached block {second}: _maybe_evict_cached_block must tell the "
        f"collector on_block_evicted(block {second}); it saw {got!r}"
    )
    (never_cached,) = [i for i in reused if i != second]
    assert ["evicted", never_cached] in got, (
        f"get_new_blocks reused block {never_cached}, which held no prefix: "
        f"_maybe_evict_cached_block tells the collector on_block_evicted for every block it is "
        f"called on, cached or not (so the collector never keeps a reused block); it saw {got!r}"
    )
    seen = len(collector.events)
    assert pool.reset_prefix_cache() is False, "blocks are in use: the reset must be refused"
    got = _new_events(collector, seen)
    assert same_data(got, []), (
        f"a refused reset_prefix_cache changes nothing, the collector included; it saw {got!r}"
    )
    pool.evict_blocks({first})  # block 1, in use and still cached
    got = _new_events(collector, seen)
    assert same_data(got, [["evicted", first]]), (
        f"evict_blocks({{{first}}}) evicts through _maybe_evict_cached_block, which tells the "
        f"collector on_block_evicted(block {first}); it saw {got!r}"
    )
    pool.free_blocks(pool.blocks[1:4])
    seen = len(collector.events)
    assert pool.reset_prefix_cache() is True, "no block is in use: the reset must happen"
    got = _new_events(collector, seen)
    assert same_data(got, [["reset", None]]), (
        f"reset_prefix_cache must call the collector's reset() once; it saw {got!r}"
    )
    seen += len(got)
    pool.touch([pool.blocks[second]])  # free and no longer cached
    got = _new_events(collector, seen)
    assert same_data(got, [["accessed", second]]), (
        f"touch([block {second}]) of a free block that holds no prefix must still tell the "
        f"collector on_block_accessed(block {second}); it saw {got!r}"
    )
    seen += len(got)
    pool.evict_blocks({second})  # in use, and holds no prefix
    got = _new_events(collector, seen)
    assert same_data(got, [["evicted", second]]), (
        f"evict_blocks({{{second}}}) of a block that holds no prefix still goes through "
        f"_maybe_evict_cached_block, which tells the collector on_block_evicted for every block "
        f"it is called on, cached or not; it saw {got!r}"
    )
    seen += len(got)
    pool.evict_blocks({0})  # the null block: a block of the pool, never cached
    got = _new_events(collector, seen)
    assert same_data(got, [["evicted", 0]]), (
        f"evict_blocks({{0}}) evicts the null block like any other id of the pool: through "
        f"_maybe_evict_cached_block, which tells the collector on_block_evicted(block 0) (nothing "
        f"is cached there, so nothing else happens; README row 9: every id, none skipped); it "
        f"saw {got!r}"
    )
    seen += len(got)
    third = next(i for i in (1, 2, 3) if i not in (first, second))  # free
    asked = [pool.blocks[third], pool.null_block]  # read before: only touch may raise
    with pytest.raises(ValueError):
        pool.touch(asked)
    got = _new_events(collector, seen)
    assert same_data(got, []), (
        f"a refused touch (the null block listed after block {third}) touches no block, so the "
        f"collector must hear nothing: report on_block_accessed only once the whole call is "
        f"valid; it saw {got!r}"
    )
    pool.touch([pool.blocks[third], pool.blocks[third]])
    got = _new_events(collector, seen)
    assert same_data(got, [["accessed", third], ["accessed", third]]), (
        f"touch([block {third}, block {third}]) takes two references, one per entry: the "
        f"collector must hear on_block_accessed(block {third}) once per entry; it saw {got!r}"
    )
    # A reset forgets cached prefixes without evicting them one by one: the collector hears
    # reset() alone, even while free blocks still hold prefixes.
    pool, collector = side().make_pool_with_collector(4, BS)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(req.obj, blocks, 0, 2, BS, 0)
    pool.free_blocks(list(reversed(blocks)))  # free, both still cached
    seen = len(collector.events)
    assert pool.reset_prefix_cache() is True, "no block is in use: the reset must happen"
    got = _new_events(collector, seen)
    assert same_data(got, [["reset", None]]), (
        f"reset_prefix_cache with two free cached blocks must call the collector's reset() "
        f"once and report nothing else: a reset is not an eviction (README row 10: empty the "
        f"map and every hash, then reset the collector; no on_block_evicted); it saw {got!r}"
    )


@graded(
    2,
    "I3: two requests that computed the same block separately both stay cached; block ids "
    "never change under a running request",
    f"{DOC}#the-cache-map",
)
def test_duplicate_blocks_both_cached():
    """The map holds duplicates; reusing one leaves the other reachable."""
    pool = make_pool(4)
    req = make_request([1, 2])
    (a,) = pool.get_new_blocks(1)
    (b,) = pool.get_new_blocks(1)
    pool.cache_full_blocks(req.obj, [a], 0, 1, BS, 0)
    pool.cache_full_blocks(req.obj, [b], 0, 1, BS, 0)
    assert a.block_hash == key(req.block_hashes[0]) and b.block_hash == a.block_hash, (
        "both blocks hold the content: both must carry the hash"
    )
    pool.free_blocks([a])
    pool.free_blocks([b])
    pool.get_new_blocks(2)  # pops block 3 then a: a is evicted
    assert hit(pool, req.block_hashes[0]) is b, "the duplicate b must still serve hits"
    # The other order: the block reused is the one cached second.
    pool = make_pool(4)
    (a,) = pool.get_new_blocks(1)
    (b,) = pool.get_new_blocks(1)
    pool.cache_full_blocks(req.obj, [a], 0, 1, BS, 0)
    pool.cache_full_blocks(req.obj, [b], 0, 1, BS, 0)
    pool.free_blocks([b])
    pool.free_blocks([a])
    pool.get_new_blocks(2)  # pops block 3 then b: b, cached second under the hash, is evicted
    assert hit(pool, req.block_hashes[0]) is a and b.block_hash is None, (
        "reusing b (cached second under the hash) must remove b itself from the map, "
        "pop(key, b.block_id), and clear b's hash: a keeps serving hits, and a hit never "
        "returns b, whose page now holds other tokens"
    )
    pool.get_new_blocks(1)  # a is reused too
    assert hit(pool, req.block_hashes[0]) is None and a.block_hash is None, (
        "both duplicates were reused: the hash must miss, and a's hash is cleared"
    )


class PrefixCacheMachine(RuleBasedStateMachine):
    """Requests with shared prefixes, hits, frees and resets against an exact model.

    The model tracks what each block holds (its chained hash), each block's holders, the
    free-queue order and which content is cached; after every step the pool must match it,
    every hit must return a block holding exactly the requested prefix (I1-I4), and every
    leading block whose hash some block still holds must be a hit.
    """

    N = 9
    PROMPTS: ClassVar[list[list[int]]] = [
        [1, 2, 3, 4, 5, 6],
        [1, 2, 3, 4, 7, 8],
        [1, 2, 9, 9],
        [5, 5, 6, 6, 7, 7],
        [1, 2, 3, 4, 5, 6, 1, 1],
    ]

    def __init__(self) -> None:
        super().__init__()
        self.pool = make_pool(self.N)
        self.side = side()
        self.blocks: dict[int, Any] = {}  # block id -> the learner's block
        self.content: dict[int, bytes] = {}  # block id -> the hash of the prefix it holds
        self.refs = [0] * self.N
        self.running: list[list[int]] = []
        self.queue = list(range(1, self.N))
        self.admissions = 0  # requests admitted so far, named in the messages

    @rule(data=st.data())
    def admit(self, data) -> None:
        tokens = data.draw(st.sampled_from(self.PROMPTS), label="prompt")
        hashes = chain_hashes(tokens)
        self.admissions += 1
        # The hits that must happen: the leading hashes some block still holds (cached, and
        # neither reused nor reset since; the model's content is the pool's, checked by I3).
        holder = {h: block_id for block_id, h in sorted(self.content.items(), reverse=True)}
        expected = 0
        while expected < len(hashes) and hashes[expected] in holder:
            expected += 1
        hits: list[int] = []
        for h in hashes:
            blk = hit(self.pool, h)
            if blk is None:
                break
            block_id = as_int(blk.block_id, "a hit block's block_id")
            assert self.content.get(block_id) == h, (
                f"I3: a hit returned block {block_id}, which does not hold that prefix"
            )
            self.blocks[block_id] = blk
            hits.append(block_id)
        if len(hits) < expected:
            missed = hashes[len(hits)]
            raise AssertionError(
                f"request {self.admissions} (prompt {tokens}): expected {expected} hit blocks, "
                f"got {len(hits)}: get_cached_block missed the hash of its block {len(hits)} "
                f"(from 0), which block {holder[missed]} still holds (cached, not reused or "
                f"reset since); a block whose hash is still cached must be found, or its prefix "
                f"is computed again (read {DOC}#caching-full-blocks)"
            )
        need = len(hashes) - len(hits)
        if need > len(self.queue) - sum(self.refs[i] == 0 for i in hits):
            return
        self.pool.touch([self.blocks[i] for i in hits])
        for block_id in hits:
            if self.refs[block_id] == 0:
                self.queue.remove(block_id)
            self.refs[block_id] += 1
        new = self.pool.get_new_blocks(need)
        want, self.queue = self.queue[:need], self.queue[need:]
        got = self.side.block_ids(new)
        assert same_data(got, want), f"get_new_blocks popped {got}, expected {want}"
        for block_id, blk in zip(want, new):
            self.content.pop(block_id, None)
            self.blocks[block_id] = blk
            self.refs[block_id] = 1
        table = hits + want
        req = self.side.make_request(f"r{len(self.running)}", list(tokens), hashes)
        self.pool.cache_full_blocks(
            req, [self.blocks[i] for i in table], len(hits), len(table), BS, 0
        )
        for block_id, h in zip(table, hashes):
            self.content.setdefault(block_id, h)
        self.running.append(table)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def finish(self, data) -> None:
        table = self.running.pop(data.draw(st.integers(0, len(self.running) - 1), label="which"))
        self.pool.free_blocks([self.blocks[i] for i in reversed(table)])
        for block_id in reversed(table):
            self.refs[block_id] -= 1
            if self.refs[block_id] == 0:
                self.queue.append(block_id)

    @rule()
    def reset(self) -> None:
        ok = self.pool.reset_prefix_cache()
        assert ok is (not self.running), (
            f"reset_prefix_cache must return True iff no block is in use: got {describe(ok)} "
            f"with {len(self.running)} running requests"
        )
        if ok:
            self.content.clear()

    @invariant()
    def consistent(self) -> None:
        snap = pool_snapshot(self.pool, hashes=True)
        free = check_pool_snapshot(snap)
        assert free == self.queue, f"I4: free queue {free} is not in eviction order {self.queue}"
        refs = snap["ref_cnts"][1:]
        assert refs == self.refs[1:], (
            f"I1: ref_cnts of blocks 1..{self.N - 1} are {refs}, expected {self.refs[1:]} "
            "(one per running request holding the block)"
        )
        for block_id, block_hash in enumerate(snap["hashes"]):
            want = key(self.content[block_id]) if block_id in self.content else None
            if block_hash != want or type(block_hash) is not type(want):
                what = (
                    "keeps a hash for content it no longer holds"
                    if want is None
                    else ("lost its hash" if block_hash is None else "has the wrong hash")
                )
                raise AssertionError(
                    f"I3: block {block_id} {what} (a cached block's block_hash is its prefix's "
                    "hash with the group id; an evicted or reset block has none)"
                )


@graded(
    5,
    "I1-I4: under random shared-prefix workloads every hit holds exactly the requested "
    "prefix, every prefix still cached is found, ref_cnts count the requests holding each "
    "block, and the free queue stays in eviction order",
    f"{DOC}#invariants",
    timeout=30,
)
def test_random_prefix_sharing_workload():
    """Property test: hits are always correct and never missed, and eviction follows LRU, tail
    first."""
    _call_every_method_once()
    run_machine(PrefixCacheMachine)


def _call_every_method_once() -> None:
    """Call each method the machine uses once, outside hypothesis.

    A method that is not written yet then raises its NotImplementedError here, and the test
    reads NOT STARTED, instead of hypothesis reporting each rule's error as a separate failure.
    """
    pool = make_pool(4)
    req = make_request([1, 2])
    hit(pool, req.block_hashes[0])
    blocks = pool.get_new_blocks(1)
    pool.cache_full_blocks(req.obj, blocks, 0, 1, BS, 0)
    pool.touch(blocks)
    pool.free_blocks(blocks)
    pool.free_blocks(blocks)
    pool.reset_prefix_cache()


class TouchBench:
    """A pool of ``n`` blocks, all free, ``K`` of them in the middle of the queue cached.

    The first step revives those ``K`` (``touch``) and frees them again, in one request (timed
    here); each later step does the same to ``K`` blocks drawn afresh from anywhere in the
    queue (seeded), so a search for the block that starts where the last one ended, or at the
    back where the last step left them, does not pass for O(1). The model moves them to the
    back of the queue. ``K`` is small enough that a touch costing a copy of the queue fails in
    seconds, not in minutes.
    """

    K = 50

    def __init__(self, n: int) -> None:
        self.n = n
        self.pool = make_pool(n)
        self.run_ops = side().run_pool_ops
        everything = list(range(1, n))
        self.middle = everything[n // 3 : n // 3 + self.K]
        self.hashes = chain_hashes(list(range(2 * self.K)))
        request = side().make_request("bench", list(range(2 * self.K)), self.hashes)
        (got,) = self.run_ops(
            self.pool,
            [
                ["get_new_blocks", n - 1],
                ["cache_full_blocks", self.middle, 0, self.K, BS, 0],
                ["free_blocks", everything],
            ],
            request,
        )
        if not same_data(got, everything):
            raise AssertionError(
                f"get_new_blocks({n - 1}) on a new pool of {n:,} blocks must give blocks 1..{n - 1}"
            )
        self.queue = everything
        self.rng = random.Random(n)
        self.picked = self.middle

    def step(self) -> float:
        picked = self.picked
        ops = [["touch", picked], ["free_blocks", picked], ["get_num_free_blocks"]]
        seconds, got = timed_call(self.run_ops, self.pool, ops)
        moved = set(picked)
        self.queue = [i for i in self.queue if i not in moved] + picked
        self.picked = self.rng.sample(self.queue, self.K)
        if not same_data(got, [self.n - 1]):
            raise AssertionError(
                f"after touch and free_blocks of the same {self.K} blocks, all "
                f"{self.n - 1:,} blocks must be free again: got {describe(got)}"
            )
        return seconds

    def verify(self) -> None:
        snap = pool_snapshot(self.pool, hashes=True)
        free = check_pool_snapshot(snap)
        if free != self.queue:
            raise AssertionError(
                f"I4: after touching and freeing {self.K} blocks of a pool of {self.n:,}, they "
                "must have left the middle of the queue and joined its back, in order"
            )
        kept = [snap["hashes"][i] for i in self.middle]
        if kept != [key(h) for h in self.hashes]:
            raise AssertionError(
                "touch and free_blocks must not drop the hashes of the blocks they revive and free"
            )


@graded(
    2,
    "I4: touch revives a block from anywhere in the free queue in O(1)",
    f"{DOC}#touch-and-revival",
    timeout=30,
)
def test_touch_is_constant_time():
    """Reviving 50 blocks costs the same in a small and a 100x larger pool, and is right."""
    benches: dict[int, TouchBench] = {}

    def run_ops(n: int):
        benches[n] = TouchBench(n)
        return benches[n].step

    assert_constant_time("BlockPool.touch", run_ops)
    for bench in benches.values():
        bench.verify()


class PublishEvictBench:
    """A pool of ``n`` blocks whose prefix cache holds about half of them, and one long request.

    Request A holds blocks ``1..Q`` (``Q = n // 4``), all but its last ``4 * K`` published;
    request B's ``Q`` blocks were published and freed, so they sit cached at the front of the
    free queue. Each step, in one request (timed here): ``get_new_blocks(K)`` reuses the next
    ``K`` of B's blocks (each an eviction from a map of about ``n / 2`` keys),
    ``evict_blocks({i})`` names each of them once more (uncached now: nothing to do) and each
    of the next ``K // 2`` blocks of the queue (still cached: each leaves the map),
    ``free_blocks`` puts them back, A publishes its next ``K`` blocks one
    ``cache_full_blocks`` call at a time, as a decoding request fills them, and
    ``get_cached_block`` finds each of them. Each of these is
    O(1) per block in the reference; a scan of the map, of the pool or of the request's whole
    block list is ~100x slower on the big pool.
    """

    K = 50

    def __init__(self, n: int) -> None:
        self.n, q = n, n // 4
        self.pool = make_pool(n)
        self.run_ops = side().run_pool_ops
        self.a_ids = list(range(1, q + 1))
        self.b_ids = list(range(q + 1, 2 * q + 1))
        self.a_hashes = chain_hashes(list(range(BS * q)))
        b_hashes = chain_hashes(list(range(BS * q, 2 * BS * q)))
        self.request = side().make_request("long", list(range(BS * q)), self.a_hashes)
        b_request = side().make_request("done", list(range(BS * q, 2 * BS * q)), b_hashes)
        self.published = q - 4 * self.K
        (got,) = self.run_ops(
            self.pool,
            [["get_new_blocks", n - 1], ["publish_each", self.a_ids, [[0, self.published]], BS, 0]],
            self.request,
        )
        if not same_data(got, list(range(1, n))):
            raise AssertionError(
                f"get_new_blocks({n - 1}) on a new pool of {n:,} blocks must give blocks 1..{n - 1}"
            )
        rest = list(range(2 * q + 1, n))
        self.run_ops(
            self.pool,
            [
                ["publish_each", self.b_ids, [[0, q]], BS, 0],
                ["free_blocks", self.b_ids],
                ["free_blocks", rest],
            ],
            b_request,
        )
        self.queue = self.b_ids + rest
        self.evicted: list[int] = []

    def step(self) -> float:
        k, start = self.K, self.published
        taken = self.queue[:k]
        # The next half batch of the queue's blocks is still cached: evict_blocks of those has
        # work to do (evict_blocks of the reused ones, uncached by now, has none, and an
        # evict_blocks that scanned the map only for a cached block passed on those alone).
        cached = self.queue[k : k + k // 2]
        ops = [
            ["get_new_blocks", k],
            ["evict_each", taken],
            ["evict_each", cached],
            ["free_blocks", taken],
            ["publish_each", self.a_ids, [[c, c + 1] for c in range(start, start + k)], BS, 0],
            ["lookup_each", self.a_hashes[start : start + k]],
            ["get_num_free_blocks"],
        ]
        seconds, got = timed_call(self.run_ops, self.pool, ops, self.request)
        self.queue = self.queue[k:] + taken
        self.evicted += taken + cached
        self.published += k
        hits = [[i] for i in self.a_ids[start : start + k]]
        want = [taken, hits, self.n - 1 - len(self.a_ids)]
        if not same_data(got, want):
            raise AssertionError(
                f"get_new_blocks({k}) must reuse the {k} cached blocks at the front of the queue, "
                f"get_cached_block must find the {k} blocks just published, and free_blocks must "
                f"put the reused ones back: want {want[0][:5]}..., {hits[:3]}... and "
                f"{want[2]:,} free blocks, got {describe(got)[:300]}"
            )
        return seconds

    def verify(self) -> None:
        snap = pool_snapshot(self.pool, hashes=True)
        if check_pool_snapshot(snap) != self.queue:
            raise AssertionError(
                f"I4: blocks reused from the front of the queue and freed again must join its "
                f"back, in order (pool of {self.n:,} blocks)"
            )
        hashes = snap["hashes"]
        if any(hashes[i] is not None for i in self.evicted):
            raise AssertionError("I3: a block reused by get_new_blocks must lose its hash")
        want = [key(h) for h in self.a_hashes[: self.published]]
        if [hashes[i] for i in self.a_ids[: self.published]] != want:
            raise AssertionError(
                "I3: cache_full_blocks(request, blocks, c, c + 1, ...) must publish block c "
                "under the request's hash c"
            )


@graded(
    2,
    "I3: evicting, publishing, looking up and evict_blocks cost O(1) per block, whatever the "
    "pool's size",
    "labs/lab-05-share-and-evict/README.md#your-tasks",
    timeout=30,
)
def test_evict_and_publish_are_constant_time():
    """Reusing 50 cached blocks, evict_blocks of each and of 25 still cached, and publishing 50
    blocks of a long request one call at a time cost the same on a small and a 100x larger
    pool."""
    benches: dict[int, PublishEvictBench] = {}

    def run_ops(n: int):
        benches[n] = PublishEvictBench(n)
        return benches[n].step

    assert_constant_time(
        "get_new_blocks (evicting) / evict_blocks / cache_full_blocks / get_cached_block",
        run_ops,
    )
    for bench in benches.values():
        bench.verify()
