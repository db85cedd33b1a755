"""lab-07, part 1: finding prefix-cache hits, and counting them."""

from __future__ import annotations

from grading.suite import graded
from tests.labs.common import check_pool
from tests.labs.lab_07.helpers import (
    BS,
    DOC,
    admit,
    block_ids,
    free_queue,
    make_manager,
    make_request,
    table,
)


@graded(1, "Prefix-cache hits: an empty cache has no hit; get_computed_blocks returns no blocks "
           "and 0 tokens", f"{DOC}#prefix-cache-hits")
def test_no_hit_in_an_empty_cache():
    """Nothing is cached yet: nothing to skip."""
    mgr = make_manager()
    hits, num_hit = mgr.get_computed_blocks(make_request("a", range(9)))
    assert num_hit == 0, f"an empty cache hit {num_hit} tokens"
    assert block_ids(hits) == [], f"an empty cache returned blocks {block_ids(hits)}"


@graded(3, "Prefix-cache hits: the hit is the longest run of leading full blocks whose chained "
           "hashes are cached, returned as those very blocks", f"{DOC}#prefix-cache-hits")
def test_hit_is_the_longest_cached_prefix():
    """A request sharing 8 of a's tokens hits a's first two blocks."""
    mgr = make_manager()
    a = make_request("a", range(12))
    admit(mgr, a)
    a_table = table(mgr, "a")
    b = make_request("b", [*range(8), 50, 51, 52, 53, 54])
    hits, num_hit = mgr.get_computed_blocks(b)
    assert num_hit == 8, f"b shares a's first 8 tokens (2 full blocks): expected 8, got {num_hit}"
    assert block_ids(hits) == a_table[:2], (
        f"the hits must be a's first two blocks {a_table[:2]}, got {block_ids(hits)}")
    longer = make_request("c", [*range(12), 99])
    _, num_hit = mgr.get_computed_blocks(longer)
    assert num_hit == 12, (
        f"c starts with all 12 of a's tokens: expected a 12-token hit, got {num_hit}")


@graded(3, "Prefix-cache hits: the hit is capped at num_tokens - 1 tokens (the model must run on "
           "the last token to predict the next one); whole blocks only, so a fully cached "
           "block-aligned prompt recomputes its last block", f"{DOC}#the-last-token-is-recomputed")
def test_hit_is_capped_at_num_tokens_minus_one():
    """All 8 tokens cached: the hit is 4, not 8; with a 9th token it is 8."""
    mgr = make_manager()
    admit(mgr, make_request("a", range(8)))
    hits, num_hit = mgr.get_computed_blocks(make_request("b", range(8)))
    assert num_hit == 4, (
        f"b's 8 tokens are all cached, but at most 8 - 1 = 7 may be skipped, rounded down to whole "
        f"blocks: expected 4, got {num_hit}")
    assert len(block_ids(hits)) == 1, f"one block of hits expected, got {block_ids(hits)}"
    _, num_hit = mgr.get_computed_blocks(make_request("c", range(9)))
    assert num_hit == 8, f"c has 9 tokens, 8 of them cached: expected 8, got {num_hit}"
    _, num_hit = mgr.get_computed_blocks(make_request("d", range(5)))
    assert num_hit == 4, f"d has 5 tokens, its first block cached: expected 4, got {num_hit}"


@graded(3, "Prefix-cache hits: hashes are chained, so the first miss ends the hit; a later block "
           "that happens to be cached cannot be used after a gap", f"{DOC}#prefix-cache-hits")
def test_the_first_miss_ends_the_hit():
    """a's middle block is evicted: a request with a's tokens hits only the first block."""
    mgr = make_manager()
    a = make_request("a", range(13))
    admit(mgr, a)
    a_table = table(mgr, "a")
    mgr.free(a)
    mgr.block_pool.evict_blocks({a_table[1]})  # a's second block leaves the cache
    b = make_request("b", range(13))
    hits, num_hit = mgr.get_computed_blocks(b)
    assert num_hit == 4 and block_ids(hits) == a_table[:1], (
        f"blocks 0 and 2 of the prefix are cached but block 1 is not: the hit is block 0 only "
        f"(4 tokens, {a_table[:1]}), got {num_hit} tokens in {block_ids(hits)}")
    # find_longest_cache_hit, directly: a hash nobody cached in the middle stops the search.
    found, n = mgr.find_longest_cache_hit([b.block_hashes[0], b"\x00" * 32, b.block_hashes[2]], 12)
    assert n == 4 and [blk.block_id for blk in found[0]] == a_table[:1], (
        f"find_longest_cache_hit must stop at the first uncached hash: expected 4 tokens in "
        f"{a_table[:1]}, got {n} in {[blk.block_id for blk in found[0]]}")


@graded(2, "find_longest_cache_hit returns at most max_cache_hit_length // block_size blocks, "
           "as (blocks per group, tokens)", f"{DOC}#prefix-cache-hits")
def test_find_longest_cache_hit_respects_the_limit():
    """The limit is in tokens and only whole blocks count."""
    mgr = make_manager()
    a = make_request("a", range(13))
    admit(mgr, a)
    a_table = table(mgr, "a")
    for limit, expected in ((12, 3), (11, 2), (4, 1), (3, 0), (0, 0)):
        found, n = mgr.find_longest_cache_hit(a.block_hashes, limit)
        got = [blk.block_id for blk in found[0]]
        assert (got, n) == (a_table[:expected], expected * BS), (
            f"max_cache_hit_length={limit}: expected {expected} blocks ({expected * BS} tokens) "
            f"{a_table[:expected]}, got {n} tokens in {got}")


@graded(2, "Prefix-cache hits: a lookup has no side effects; hits are claimed (touched) only "
           "by allocate_slots", f"{DOC}#prefix-cache-hits")
def test_lookup_changes_nothing():
    """Looking up free cached blocks leaves them free, in place, with ref_cnt 0."""
    mgr = make_manager()
    a = make_request("a", range(9))
    admit(mgr, a)
    mgr.free(a)
    queue = free_queue(mgr)
    hits, num_hit = mgr.get_computed_blocks(make_request("b", range(9)))
    assert num_hit == 8
    assert all(blk.ref_cnt == 0 for blk in hits.blocks[0]), (
        "get_computed_blocks must not take references: the caller may never allocate")
    assert free_queue(mgr) == queue, (
        f"get_computed_blocks must not move blocks: free queue {queue} became {free_queue(mgr)}")
    assert "b" not in mgr.req_to_blocks, "a lookup must not create a block table"
    check_pool(mgr.block_pool)


@graded(1, "Prefix-cache hits: with enable_caching=False nothing is hashed and nothing hits",
        f"{DOC}#prefix-cache-hits")
def test_caching_disabled():
    """No prefix caching: every prompt is computed in full."""
    mgr = make_manager(enable_caching=False)
    a = make_request("a", range(9))
    admit(mgr, a)
    assert all(blk.block_hash is None for blk in mgr.req_to_blocks["a"]), (
        "caching is off: allocate_slots must not publish blocks")
    hits, num_hit = mgr.get_computed_blocks(make_request("b", range(9)))
    assert (block_ids(hits), num_hit) == ([], 0), "caching is off: no hit"


@graded(2, "Prefix-cache stats: one record per lookup (requests, queries = tokens looked up, "
           "hits = tokens found); resumed requests (num_preemptions > 0) are counted apart",
        f"{DOC}#usage-and-prefix-cache-statistics")
def test_prefix_cache_stats_count_lookups():
    """Two new requests and one resumed one."""
    mgr = make_manager(log_stats=True)
    admit(mgr, make_request("a", range(9)))
    admit(mgr, make_request("b", range(9)))
    resumed = make_request("c", range(9))
    resumed.num_preemptions = 1
    mgr.get_computed_blocks(resumed)
    stats = mgr.make_prefix_cache_stats()
    assert stats is not None, "log_stats=True: make_prefix_cache_stats returns the counters"
    got = (stats.requests, stats.queries, stats.hits)
    assert got == (2, 18, 8), (
        f"two lookups of 9 tokens, the second hitting 8: (requests, queries, hits) should be "
        f"(2, 18, 8), got {got}")
    got = (stats.preempted_requests, stats.preempted_queries, stats.preempted_hits)
    assert got == (1, 9, 8), (
        f"the resumed request's lookup belongs in the preempted_* counters: expected (1, 9, 8), "
        f"got {got}")


@graded(1, "Prefix-cache stats: make_prefix_cache_stats hands the counters out and starts "
           "afresh; it returns None when log_stats is off",
        f"{DOC}#usage-and-prefix-cache-statistics")
def test_make_prefix_cache_stats_resets():
    """Each snapshot covers the lookups since the previous one."""
    mgr = make_manager(log_stats=True)
    admit(mgr, make_request("a", range(9)))
    first = mgr.make_prefix_cache_stats()
    assert first is not None and first.requests == 1
    second = mgr.make_prefix_cache_stats()
    assert second is not None and second.requests == 0 and second is not first, (
        "the second snapshot must be a fresh PrefixCacheStats with nothing counted")
    quiet = make_manager()
    admit(quiet, make_request("a", range(9)))
    assert quiet.make_prefix_cache_stats() is None, "log_stats=False: return None"


@graded(2, "Prefix-cache hits: whatever is cached, the hit is a multiple of block_size and "
           "below num_tokens", f"{DOC}#the-last-token-is-recomputed")
def test_hit_is_block_aligned_and_leaves_a_token():
    """The same prompt, admitted twice, for several lengths."""
    for num_tokens in (1, 3, 4, 5, 8, 12, 13):
        mgr = make_manager()
        admit(mgr, make_request("a", range(num_tokens)))
        _, num_hit = mgr.get_computed_blocks(make_request("b", range(num_tokens)))
        expected = (num_tokens - 1) // BS * BS
        assert num_hit == expected, (
            f"a {num_tokens}-token prompt, fully cached: expected a hit of {expected} tokens "
            f"(whole blocks within the first {num_tokens - 1}), got {num_hit}")
