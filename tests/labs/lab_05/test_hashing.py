"""lab-05, part 1: chained block hashes and the cache map."""

from __future__ import annotations

from grading.suite import graded, load_impl
from mini_vllm.core.kv_cache_utils import make_block_hash_with_group_id, sha256

DOC = "phases/02-paged-attention/README.md"


def bp():
    return load_impl("block_pool")


@graded(3, "I3: a block's hash must chain its parent's hash: the same tokens after a different "
           "prefix must hash differently", f"{DOC}#prefix-caching-with-chained-hashes")
def test_hash_is_chained():
    """hash_block_tokens depends on the parent hash, the tokens and their order."""
    h = bp().hash_block_tokens
    first = h(sha256, None, [1, 2, 3, 4])
    second = h(sha256, first, [5, 6, 7, 8])
    other_first = h(sha256, None, [9, 9, 9, 9])
    assert isinstance(second, bytes), "a block hash is bytes (BlockHash)"
    assert h(sha256, other_first, [5, 6, 7, 8]) != second, (
        "I3: same tokens after a different parent must give a different hash (chain the parent)")
    assert h(sha256, first, [5, 6, 7, 8]) == second, "hashing must be deterministic"
    assert h(sha256, first, [8, 7, 6, 5]) != second, "token order must matter"
    assert h(sha256, first, (5, 6, 7, 8)) == second, "a tuple and a list of the same ids agree"
    assert first != second


@graded(2, "I3: the first block of a request chains from NONE_HASH (parent None means NONE_HASH)",
        f"{DOC}#prefix-caching-with-chained-hashes")
def test_first_block_chains_from_none_hash():
    """A parent of None is the seed NONE_HASH, not nothing."""
    mod = bp()
    h = mod.hash_block_tokens
    from mini_vllm.core import kv_cache_utils

    seed = getattr(mod, "NONE_HASH", kv_cache_utils.NONE_HASH)
    assert h(sha256, None, [1, 2]) == h(sha256, seed, [1, 2]), (
        "I3: hash_block_tokens(fn, None, t) must equal hash_block_tokens(fn, NONE_HASH, t)")


@graded(1, "I3: extra keys (LoRA, salt...) are part of a block's identity",
        f"{DOC}#prefix-caching-with-chained-hashes")
def test_extra_keys_change_the_hash():
    """Different extra keys give different hashes."""
    h = bp().hash_block_tokens
    assert h(sha256, None, [1, 2], ("lora-a",)) != h(sha256, None, [1, 2], ("lora-b",))
    assert h(sha256, None, [1, 2], ("salt",)) != h(sha256, None, [1, 2])


@graded(1, "I3: hash_block_tokens must hash with the hash_function it is given",
        f"{DOC}#prefix-caching-with-chained-hashes")
def test_uses_the_given_hash_function():
    """The hash function is a parameter: the engine chooses it."""
    seen = []

    def recording(obj):
        seen.append(obj)
        return sha256(obj)

    bp().hash_block_tokens(recording, None, [3, 1])
    assert seen, "hash_block_tokens never called the hash_function argument"


def _key(tag: bytes):
    return make_block_hash_with_group_id(sha256(tag), 0)


@graded(2, "I3: the cache map keeps several blocks per hash, and pop(key, block_id) removes "
           "exactly that block", f"{DOC}#the-cache-map")
def test_map_keeps_several_blocks_per_hash():
    """Two blocks with the same content are both cached; popping one keeps the other."""
    m = bp().BlockHashToBlockMap()
    block = bp().KVCacheBlock
    a, b, c = block(1), block(2), block(3)
    k, k2 = _key(b"x"), _key(b"y")
    assert m.get_one_block(k) is None
    m.insert(k, a)
    m.insert(k, b)
    m.insert(k2, c)
    assert m.get_one_block(k) in (a, b)
    assert m.pop(k, 3) is None, "pop must not remove a block cached under another key"
    assert m.pop(k, a.block_id) is a
    assert m.get_one_block(k) is b, "the other block with the same hash must stay cached"
    assert m.pop(k, a.block_id) is None, "popping a block twice returns None"
    assert m.pop(k, b.block_id) is b
    assert m.get_one_block(k) is None
    assert m.get_one_block(k2) is c
    assert m.pop(_key(b"missing"), 1) is None
