"""lab-05, part 1: chained block hashes and the cache map.

``hash_block_tokens`` runs in the learner process; the hash function it is given must be there
too: the reference's ``sha256`` as the sandbox holds it (``learner_sha256()``), or
``learner_side.RecordingHasher``. Results come back as bytes and are compared here, with the
judge's own reference ``hash_block_tokens`` for the expected values.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from grading.suite import graded, learner_module, load_impl
from mini_vllm.core.kv_cache_utils import hash_block_tokens, make_block_hash_with_group_id, sha256
from tests.labs.common import describe, same_data

DOC = "phases/02-paged-attention/README.md"


def bp():
    return load_impl("block_pool")


def learner_sha256():
    """The reference ``sha256`` in the learner process (a function cannot be sent there)."""
    return learner_module("mini_vllm.core.kv_cache_utils").sha256


def a_hash(value, what: str = "hash_block_tokens") -> bytes:
    """``value`` if it is a ``bytes`` block hash."""
    if type(value) is not bytes:
        raise AssertionError(
            f"{what} must return the hash as bytes (a BlockHash), got {describe(value)}"
        )
    return value


@contextlib.contextmanager
def judge_none_hash(mod) -> Iterator[bytes]:
    """A seed the judge chose, bound as ``kv_cache_utils.NONE_HASH`` in the learner process for
    the ``with`` block (as ``init_none_hash`` rebinds it when an engine starts), then the seed
    it held before.

    The seed is the judge's, never read back from the learner process: a module that bound
    ``kv_cache_utils.NONE_HASH`` to a constant of its own at import, and chained from that
    constant, agreed with whatever seed it had set (tests/hostile/seed_the_chain_at_import.py).
    A module that binds ``NONE_HASH`` to a value of its own (a constant, a copy imported with
    ``from ... import NONE_HASH``) hashes every prefix differently from the engine and is
    refused here.
    """
    kv_cache_utils = learner_module("mini_vllm.core.kv_cache_utils")
    before = kv_cache_utils.NONE_HASH
    seed = sha256("the seed lab-05's judge chose")
    kv_cache_utils.NONE_HASH = seed
    try:
        own = getattr(mod, "NONE_HASH", None)
        if own is not None and (type(own) is not bytes or own != seed):
            raise AssertionError(
                "I3: your module's NONE_HASH is not mini_vllm.core.kv_cache_utils.NONE_HASH: "
                "read kv_cache_utils.NONE_HASH (the module your file imports at the top); a seed "
                "of your own makes every first block hash differently from the engine's, so no "
                "prefix is ever shared with it"
            )
        yield seed
    finally:
        kv_cache_utils.NONE_HASH = before


@graded(
    3,
    "I3: a block's hash must chain its parent's hash: the same tokens after a different "
    "prefix must hash differently",
    f"{DOC}#prefix-caching-with-chained-hashes",
)
def test_hash_is_chained():
    """hash_block_tokens depends on the parent hash, the tokens and their order."""
    h, fn = bp().hash_block_tokens, learner_sha256()
    first = a_hash(h(fn, None, [1, 2, 3, 4]))
    second = a_hash(h(fn, first, [5, 6, 7, 8]))
    other_first = a_hash(h(fn, None, [9, 9, 9, 9]))
    assert a_hash(h(fn, other_first, [5, 6, 7, 8])) != second, (
        "I3: same tokens after a different parent must give a different hash (chain the parent)"
    )
    assert a_hash(h(fn, first, [5, 6, 7, 8])) == second, "hashing must be deterministic"
    assert a_hash(h(fn, first, [8, 7, 6, 5])) != second, "token order must matter"
    assert a_hash(h(fn, first, (5, 6, 7, 8))) == second, (
        "a tuple and a list of the same ids must hash alike"
    )
    assert first != second, "two different blocks must not hash alike"


@graded(
    2,
    "I3: the first block of a request chains from NONE_HASH (parent None means NONE_HASH)",
    f"{DOC}#prefix-caching-with-chained-hashes",
)
def test_first_block_chains_from_none_hash():
    """A parent of None is the seed NONE_HASH, not nothing."""
    mod = bp()
    h, fn = mod.hash_block_tokens, learner_sha256()
    with judge_none_hash(mod) as seed:
        got, want = a_hash(h(fn, None, [1, 2])), a_hash(h(fn, seed, [1, 2]))
    assert got == want, (
        "I3: hash_block_tokens(fn, None, t) must equal hash_block_tokens(fn, NONE_HASH, t)"
    )


@graded(
    1,
    "I3: NONE_HASH is read when a block is hashed, as kv_cache_utils.NONE_HASH: init_none_hash "
    "rebinds it, and a name imported with `from ... import NONE_HASH` keeps the old seed",
    "labs/lab-05-share-and-evict/README.md#the-seed-of-every-chain",
)
def test_first_block_follows_a_reseeded_none_hash():
    """After ``kv_cache_utils.NONE_HASH`` is rebound (as ``init_none_hash`` does when an engine
    starts with another hash function), a first block chains from the new seed."""
    mod = bp()
    h, fn = mod.hash_block_tokens, learner_sha256()
    kv_cache_utils = learner_module("mini_vllm.core.kv_cache_utils")
    before = a_hash(kv_cache_utils.NONE_HASH, "NONE_HASH")
    reseeded = sha256("a seed the test chose")
    kv_cache_utils.NONE_HASH = reseeded
    try:
        got = a_hash(h(fn, None, [1, 2]))
        want = a_hash(h(fn, reseeded, [1, 2]))
    finally:
        kv_cache_utils.NONE_HASH = before
    assert got == want, (
        "I3: after kv_cache_utils.NONE_HASH was rebound, hash_block_tokens(fn, None, t) still "
        "chained from the old seed: read the seed as kv_cache_utils.NONE_HASH when hashing "
        "(a name imported with `from ... import NONE_HASH` is a copy of the value at import time)"
    )


@graded(
    1,
    "I3: extra keys (LoRA, salt...) are part of a block's identity",
    f"{DOC}#prefix-caching-with-chained-hashes",
)
def test_extra_keys_change_the_hash():
    """Different extra keys give different hashes."""
    h, fn = bp().hash_block_tokens, learner_sha256()
    lora_a = a_hash(h(fn, None, [1, 2], ("lora-a",)))
    lora_b = a_hash(h(fn, None, [1, 2], ("lora-b",)))
    assert lora_a != lora_b, "I3: two different extra keys must give two different hashes"
    assert a_hash(h(fn, None, [1, 2], ("salt",))) != a_hash(h(fn, None, [1, 2])), (
        "I3: extra keys must change the hash compared with none"
    )


@graded(
    1,
    "I3: hash_block_tokens must hash with the hash_function it is given",
    f"{DOC}#prefix-caching-with-chained-hashes",
)
def test_uses_the_given_hash_function():
    """The hash function is a parameter: the engine chooses it."""
    recorder = learner_module("learner_side").RecordingHasher()
    got = a_hash(bp().hash_block_tokens(recorder, None, [3, 1]))
    outputs = recorder.outputs
    assert outputs, "hash_block_tokens never called the hash_function argument"
    assert got in outputs, (
        "hash_block_tokens must return what the hash_function it was given returned"
    )


@graded(
    2,
    "I3: hash_block_tokens(fn, parent, tokens, extra_keys) returns exactly "
    "fn((parent, tuple(tokens), extra_keys)), NONE_HASH standing in for a parent of None",
    f"{DOC}#prefix-caching-with-chained-hashes",
)
def test_hash_is_the_documented_formula():
    """Every process (and upstream) must compute the same hash for the same block."""
    mod = bp()
    h, fn = mod.hash_block_tokens, learner_sha256()
    recorder = learner_module("learner_side").RecordingHasher()
    parent = sha256("some parent")
    returned = h(recorder, parent, [5, 6, 7], ("salt",))
    inputs, outputs = recorder.inputs, recorder.outputs
    want = (parent, (5, 6, 7), ("salt",))
    assert len(inputs) == 1 and same_data(_as_tuples(inputs[0]), want), (
        f"hash_block_tokens(fn, parent, [5, 6, 7], ('salt',)) must call fn once with "
        f"(parent, (5, 6, 7), ('salt',)); it called it with {[describe(x) for x in inputs]}"
    )
    assert same_data(returned, outputs[0]), (
        "hash_block_tokens(fn, parent, [5, 6, 7], ('salt',)) must return what fn returned, "
        f"as it is: fn returned {describe(outputs[0])}, hash_block_tokens {describe(returned)}"
    )
    token_types = recorder.token_types
    assert same_data(token_types, ["tuple"]), (
        f"hash_block_tokens(fn, parent, [5, 6, 7], ('salt',)) handed fn the token ids as "
        f"{describe(token_types)} (type names, one per call), expected ['tuple']: the block "
        "is (parent, tuple(tokens), extra_keys); the caller's list hashes alike under the "
        "engine's sha256, but not under a hash function that pickles its input, and a list "
        "is not even hashable by hash()"
    )
    cases = [
        (parent, [1, 2, 3, 4], None),
        (parent, (9, 8), ("lora-a", 3)),
        (None, [1, 2], None),
        (None, [7], ("salt",)),
        (parent, [3, 3], ()),
    ]
    with judge_none_hash(mod) as seed:
        got_hashes = [a_hash(h(fn, p, tokens, extra)) for p, tokens, extra in cases]
    for (block_parent, tokens, extra), got in zip(cases, got_hashes, strict=True):
        want_hash = hash_block_tokens(sha256, block_parent or seed, tokens, extra)
        assert got == want_hash, (
            f"hash_block_tokens(sha256, {'a parent' if block_parent else 'None'}, {tokens}, "
            f"{extra}) is not sha256((parent, tuple(tokens), extra_keys))"
        )


def _as_tuples(value):
    """Lists as tuples, at every level (sha256 encodes both alike)."""
    if type(value) in (list, tuple):
        return tuple(_as_tuples(v) for v in value)
    return value


def _key(tag: str):
    return make_block_hash_with_group_id(sha256(tag), 0)


@graded(
    2,
    "I3: the cache map keeps several blocks per hash, and pop(key, block_id) removes "
    "exactly that block",
    f"{DOC}#the-cache-map",
)
def test_map_keeps_several_blocks_per_hash():
    """Three blocks with the same content are all cached; popping one keeps the others."""
    mod = bp()
    m = mod.BlockHashToBlockMap()
    a, b, c = mod.KVCacheBlock(1), mod.KVCacheBlock(2), mod.KVCacheBlock(3)
    d = mod.KVCacheBlock(4)
    k, k2 = _key("x"), _key("y")
    assert m.get_one_block(k) is None, "an empty map has no block under any key"
    m.insert(k, a)
    m.insert(k, b)
    m.insert(k2, c)
    m.insert(k, d)
    one = m.get_one_block(k)
    assert one is a or one is b or one is d, (
        "get_one_block must return one of the blocks cached under key"
    )
    assert m.pop(k, 3) is None, "pop must not remove a block cached under another key"
    assert m.pop(k, 1) is a, "pop(key, 1) must remove and return block 1"
    one = m.get_one_block(k)
    assert one is b or one is d, "the other blocks with the same hash must stay cached"
    assert m.pop(k, 1) is None, "popping a block twice returns None"
    assert m.pop(k, 2) is b, "pop(key, 2) must remove and return block 2"
    assert m.get_one_block(k) is d, (
        "block 4, the third block inserted under the key (the map already held two there), "
        "must still be cached: insert adds to the blocks under a key however many it holds"
    )
    assert m.pop(k, 4) is d, "pop(key, 4) must remove and return block 4"
    assert m.get_one_block(k) is None, "a key whose blocks were all popped must miss"
    assert len(m) == 1, (
        f"after popping every block under one of its two keys the map must hold one key "
        f"(len counts keys), got len {len(m)}: pop must delete a key whose last block it removes"
    )
    assert m.get_one_block(k2) is c, "popping under one key must not touch another key"
    assert m.pop(k2, 1) is None, (
        "pop(key, 1) must return None when key holds only block 3: remove exactly the block "
        "asked for, also when it is the only one under key"
    )
    assert m.get_one_block(k2) is c, "pop(key, 1) must leave block 3 cached under key"
    assert m.pop(_key("missing"), 1) is None, "popping under a key never inserted returns None"
    # Nor does a pop that finds nothing leave a change for later (an empty entry, as a
    # defaultdict makes): after the next insert the map holds two keys, each with its block.
    m.insert(k, a)
    size, under_k, under_k2 = len(m), m.get_one_block(k), m.get_one_block(k2)
    assert size == 2 and under_k is a and under_k2 is c, (
        f"after the pops that found nothing, insert(key, block 1) must leave the map two keys, "
        f"block 1 under key and block 3 under the other: got len {size} (a pop of a missing key "
        "or block must not add an entry, not even an empty one)"
    )
