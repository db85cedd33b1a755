"""lab-07, part 1: finding prefix-cache hits, and counting them."""

from __future__ import annotations

from grading.suite import graded, learner_module, load_impl
from tests.labs.common import (
    assert_cost_does_not_grow,
    best_time,
    describe,
    timed_call,
)
from tests.labs.lab_07.helpers import (
    BS,
    DOC,
    check_state,
    driver,
    free_queue,
    table,
)


def assert_the_same_prompt_hits(d, why: str) -> None:
    """The control of a no-hit test: with ``a`` (9 tokens, added to ``d``) admitted, a second
    request of the same tokens hits a's two full blocks, 8 tokens."""
    d.admit("a")
    d.add("again", list(range(9)))
    _, num_hit = d.lookup("again")
    assert num_hit == 8, (
        f"once a (9 tokens) is admitted and cached, the same prompt must hit its 2 full blocks "
        f"(8 tokens), got {num_hit}: {why}"
    )


@graded(
    1,
    "Prefix-cache hits: an empty cache has no hit; get_computed_blocks returns no blocks "
    "and 0 tokens",
    f"{DOC}#prefix-cache-hits",
)
def test_no_hit_in_an_empty_cache():
    """Nothing is cached yet: nothing to skip."""
    d = driver()
    d.add("a", list(range(9)))
    hit, num_hit = d.lookup("a")
    assert num_hit == 0, f"an empty cache hit {num_hit} tokens"
    assert hit == [], f"an empty cache returned blocks {hit}"
    # The control: a lookup that never hits is not what this test gives its point for.
    assert_the_same_prompt_hits(d, "no hit in an empty cache, but a hit once it holds the prefix")


@graded(
    3,
    "Prefix-cache hits: the hit is the longest run of leading full blocks whose chained "
    "hashes are cached, returned as those very blocks",
    f"{DOC}#prefix-cache-hits",
)
def test_hit_is_the_longest_cached_prefix():
    """A request sharing 8 of a's tokens hits a's first two blocks."""
    d = driver()
    d.add("a", list(range(12)))
    d.admit("a")
    a_table = table(d.state(), "a")
    d.add("b", [*range(8), 50, 51, 52, 53, 54])
    hit, num_hit = d.lookup("b")
    assert num_hit == 8, f"b shares a's first 8 tokens (2 full blocks): expected 8, got {num_hit}"
    assert hit == a_table[:2], f"the hits must be a's first two blocks {a_table[:2]}, got {hit}"
    d.add("c", [*range(12), 99])
    _, num_hit = d.lookup("c")
    assert num_hit == 12, (
        f"c starts with all 12 of a's tokens: expected a 12-token hit, got {num_hit}"
    )


@graded(
    3,
    "Prefix-cache hits: the hit is capped at num_tokens - 1 tokens (the model must run on "
    "the last token to predict the next one); whole blocks only, so a fully cached "
    "block-aligned prompt recomputes its last block",
    f"{DOC}#the-last-token-is-recomputed",
)
def test_hit_is_capped_at_num_tokens_minus_one():
    """All 8 tokens cached: the hit is 4, not 8; with a 9th token it is 8."""
    d = driver()
    d.add("a", list(range(8)))
    d.admit("a")
    d.add("b", list(range(8)))
    hit, num_hit = d.lookup("b")
    assert num_hit == 4, (
        f"b's 8 tokens are all cached, but at most 8 - 1 = 7 may be skipped, rounded down to whole "
        f"blocks: expected 4, got {num_hit}"
    )
    assert len(hit) == 1, f"one block of hits expected, got {hit}"
    d.add("c", list(range(9)))
    _, num_hit = d.lookup("c")
    assert num_hit == 8, f"c has 9 tokens, 8 of them cached: expected 8, got {num_hit}"
    d.add("d", list(range(5)))
    _, num_hit = d.lookup("d")
    assert num_hit == 4, f"d has 5 tokens, its first block cached: expected 4, got {num_hit}"
    # A request as long as max_model_len (9, not a multiple of the block size): the cap is
    # num_tokens - 1 whatever max_model_len is.
    m = driver(max_model_len=9)
    m.add("a", list(range(9)))
    m.admit("a")
    m.add("b", list(range(9)))
    _, num_hit = m.lookup("b")
    assert num_hit == 8, (
        f"max_model_len 9: b's 9 tokens (max_model_len of them) are all cached: expected a hit "
        f"of (9 - 1) // 4 = 2 blocks = 8 tokens, got {num_hit}; the cap is num_tokens - 1, "
        "nothing to do with max_model_len"
    )
    # Blocks of one token: a one-token prompt has num_tokens - 1 = 0 tokens to skip, so it
    # never hits, even when its token is cached; a longer one skips all but its last token.
    one = learner_module("learner_side").Driver(
        load_impl("kv_cache_manager").KVCacheManager(10, 1, 64), block_size=1
    )
    one.add("a", [7, 8, 9])
    one.admit("a")
    for rid, tokens, expected in (("b", [7], 0), ("c", [7, 8, 9], 2)):
        one.add(rid, tokens)
        _, num_hit = one.lookup(rid)
        assert num_hit == expected, (
            f"block_size 1, every token of {tokens} cached: expected a hit of "
            f"{len(tokens)} - 1 = {expected} tokens, got {num_hit}: at most "
            "(num_tokens - 1) // block_size blocks, none for a one-token prompt"
        )


@graded(
    3,
    "Prefix-cache hits: hashes are chained, so the first miss ends the hit; a later block "
    "that happens to be cached cannot be used after a gap",
    f"{DOC}#prefix-cache-hits",
)
def test_the_first_miss_ends_the_hit():
    """a's middle block is evicted: a request with a's tokens hits only the first block."""
    d = driver()
    d.add("a", list(range(13)))
    d.admit("a")
    a_table = table(d.state(), "a")
    d.free("a")
    mgr = d.mgr
    mgr.block_pool.evict_blocks({a_table[1]})  # a's second block leaves the cache
    b = d.add("b", list(range(13)))
    hit, num_hit = d.lookup("b")
    assert num_hit == 4 and hit == a_table[:1], (
        f"blocks 0 and 2 of the prefix are cached but block 1 is not: the hit is block 0 only "
        f"(4 tokens, {a_table[:1]}), got {num_hit} tokens in {hit}"
    )
    # find_longest_cache_hit, directly: a hash nobody cached in the middle stops the search.
    hashes = list(b.block_hashes)
    found, n = mgr.find_longest_cache_hit([hashes[0], b"\x00" * 32, hashes[2]], 12)
    got = [blk.block_id for blk in found[0]]
    assert n == 4 and got == a_table[:1], (
        f"find_longest_cache_hit must stop at the first uncached hash: expected 4 tokens in "
        f"{a_table[:1]}, got {n} in {got}"
    )


@graded(
    2,
    "find_longest_cache_hit returns at most max_cache_hit_length // block_size blocks, "
    "as (blocks per group, tokens); fewer when the hashes end first",
    f"{DOC}#prefix-cache-hits",
)
def test_find_longest_cache_hit_respects_the_limit():
    """The limit is in tokens and only whole blocks count."""
    d = driver()
    a = d.add("a", list(range(13)))
    d.admit("a")
    a_table = table(d.state(), "a")
    mgr = d.mgr
    hashes = list(a.block_hashes)
    for limit, expected in ((12, 3), (11, 2), (4, 1), (3, 0), (0, 0)):
        found, n = mgr.find_longest_cache_hit(hashes, limit)
        got = [blk.block_id for blk in found[0]]
        assert (got, n) == (a_table[:expected], expected * BS), (
            f"max_cache_hit_length={limit}: expected {expected} blocks ({expected * BS} tokens) "
            f"{a_table[:expected]}, got {n} tokens in {got}"
        )
    # A limit beyond the hashes: the hashes end the walk (no IndexError), as a miss would.
    for limit, given in ((100, 3), (12, 1), (8, 0)):
        try:
            found, n = mgr.find_longest_cache_hit(hashes[:given], limit)
        except IndexError as exc:
            raise AssertionError(
                f"find_longest_cache_hit({given} hashes, max_cache_hit_length={limit}) raised "
                f"IndexError ({exc}): the limit only caps the walk, the list of hashes may end "
                "first (a request without a block_hasher has none); walk the hashes themselves"
            ) from exc
        got = [blk.block_id for blk in found[0]]
        assert (got, n) == (a_table[:given], given * BS), (
            f"find_longest_cache_hit({given} hashes, max_cache_hit_length={limit}): expected "
            f"the {given} cached blocks {a_table[:given]} ({given * BS} tokens), got {n} "
            f"tokens in {got}"
        )


@graded(
    2,
    "Prefix-cache hits: a lookup has no side effects; hits are claimed (touched) only "
    "by allocate_slots",
    f"{DOC}#prefix-cache-hits",
)
def test_lookup_changes_nothing():
    """Looking up free cached blocks leaves them free, in place, with ref_cnt 0."""
    d = driver()
    d.add("a", list(range(9)))
    d.admit("a")
    d.free("a")
    before = d.state()
    d.add("b", list(range(9)))
    hit, num_hit = d.lookup("b")
    assert num_hit == 8
    state = d.state()
    assert all(state["ref_cnt"][b] == 0 for b in hit), (
        "get_computed_blocks must not take references: the caller may never allocate"
    )
    assert free_queue(state) == free_queue(before), (
        f"get_computed_blocks must not move blocks: free queue {free_queue(before)} became "
        f"{free_queue(state)}"
    )
    assert "b" not in state["tables"], "a lookup must not create a block table"
    check_state(state)
    # Another lookup in between leaves b's hits as they were: they are the caller's now.
    d.add("c", [70 + i for i in range(9)])
    d.lookup("c")
    try:
        d.allocate("b", 1)
    except (ValueError, RuntimeError) as exc:
        raise AssertionError(
            f"b's hits [1, 2] (8 tokens), then a lookup for c, then allocate_slots(b, 1, 8, "
            f"b's hits) raised {type(exc).__name__} ({exc}): get_computed_blocks must return "
            "a new list each call, not a buffer it refills"
        ) from exc
    assert table(d.state(), "b")[:2] == hit, (
        f"b's table must start with its hits {hit}, got {table(d.state(), 'b')}"
    )


@graded(
    1,
    "Prefix-cache hits: with enable_caching=False nothing is hashed, nothing hits and no "
    "lookup is recorded",
    f"{DOC}#prefix-cache-hits",
)
def test_caching_disabled():
    """No prefix caching: every prompt is computed in full."""
    d = driver(enable_caching=False)
    d.add("a", list(range(9)))
    d.admit("a")
    state = d.state()
    assert all(state["hash"][b] is None for b in table(state, "a")), (
        "caching is off: allocate_slots must not publish blocks"
    )
    d.add("b", list(range(9)))
    assert d.lookup("b") == [[], 0], "caching is off: no hit"
    d = driver(enable_caching=False, log_stats=True)
    d.add("a", list(range(9)))
    d.lookup("a")
    stats = d.stats()
    assert stats is not None and not any(stats), (
        "caching is off, so get_computed_blocks makes no lookup and records none in "
        "prefix_cache_stats (it returns before recording, as upstream's does): expected the "
        f"counters (requests, queries, hits, preempted_*) all 0, got {stats}"
    )
    # The control: the same two requests with caching on do hit.
    d = driver()
    d.add("a", list(range(9)))
    assert_the_same_prompt_hits(d, "only enable_caching=False turns the prefix cache off")


@graded(
    2,
    "Prefix-cache stats: one record per lookup (requests, queries = tokens looked up, "
    "hits = tokens found); resumed requests (num_preemptions > 0) are counted apart",
    f"{DOC}#usage-and-prefix-cache-statistics",
)
def test_prefix_cache_stats_count_lookups():
    """Two new requests and one resumed one, whose 9 tokens are a 7-token prompt and 2
    outputs: a lookup queries all the tokens, outputs included."""
    d = driver(log_stats=True)
    d.add("a", list(range(9)))
    d.admit("a")
    d.add("b", list(range(9)))
    d.admit("b")
    resumed = d.add("c", list(range(7)))
    resumed.append_output_token_ids([7, 8])
    resumed.num_preemptions = 1
    d.lookup("c")
    stats = d.stats()
    assert stats is not None, "log_stats=True: make_prefix_cache_stats returns the counters"
    assert stats[:3] == [2, 18, 8], (
        f"two lookups of 9 tokens, the second hitting 8: (requests, queries, hits) should be "
        f"(2, 18, 8), got {tuple(stats[:3])}"
    )
    assert stats[3:] == [1, 9, 8], (
        f"the resumed request's lookup belongs in the preempted_* counters, and queries all its "
        f"9 tokens (7 of prompt, 2 outputs it recomputes: num_tokens, not num_prompt_tokens): "
        f"expected (1, 9, 8), got {tuple(stats[3:])}"
    )


@graded(
    1,
    "Prefix-cache stats: make_prefix_cache_stats hands the counters out and starts "
    "afresh; it returns None when log_stats is off",
    f"{DOC}#usage-and-prefix-cache-statistics",
)
def test_make_prefix_cache_stats_resets():
    """Each snapshot covers the lookups since the previous one."""
    d = driver(log_stats=True)
    d.add("a", list(range(9)))
    d.admit("a")
    mgr = d.mgr
    first = mgr.make_prefix_cache_stats()
    assert first is not None and first.requests == 1
    second = mgr.make_prefix_cache_stats()
    assert second is not None and second.requests == 0 and second is not first, (
        "the second snapshot must be a fresh PrefixCacheStats with nothing counted"
    )
    assert first.requests == 1, "handing out a snapshot must not change the previous one"
    # A snapshot handed out, even an empty one, is the caller's: later lookups go to the next.
    d.add("b", list(range(9)))
    d.lookup("b")
    assert second.requests == 0, (
        f"an empty snapshot was handed out, then b was looked up, and the snapshot now counts "
        f"{second.requests} request(s): make_prefix_cache_stats must start a fresh "
        "PrefixCacheStats at every call, even when nothing was counted (a logger keeps the "
        "snapshots it is given and sums them over a window)"
    )
    third = mgr.make_prefix_cache_stats()
    assert third is not None and third.requests == 1, (
        "b's lookup, made after the second snapshot, belongs in the third"
    )
    d.free("a")
    assert mgr.reset_prefix_cache() is True, "no request holds a block: the reset happens"
    after_reset, later = mgr.make_prefix_cache_stats(), mgr.make_prefix_cache_stats()
    assert after_reset.reset is True and later.reset is False, (
        "the snapshot after reset_prefix_cache says reset=True, and the next one, a fresh "
        f"PrefixCacheStats, says False (got {after_reset.reset} then {later.reset}): start a new "
        "PrefixCacheStats instead of zeroing the counters of the old one"
    )
    quiet = driver()
    quiet.add("a", list(range(9)))
    quiet.admit("a")
    assert quiet.stats() is None, "log_stats=False: return None"
    quiet.add("b", list(range(9)))
    quiet.admit("b")
    assert quiet.stats() is None, (
        "log_stats=False: return None at every call, not only the first (without log_stats "
        "there are no counters to hand out, nor a fresh PrefixCacheStats to start)"
    )


@graded(
    2,
    "Prefix-cache hits: whatever is cached, the hit is a multiple of block_size and "
    "below num_tokens",
    f"{DOC}#the-last-token-is-recomputed",
)
def test_hit_is_block_aligned_and_leaves_a_token():
    """The same prompt, admitted twice, for several lengths."""
    for num_tokens in (1, 3, 4, 5, 8, 12, 13):
        d = driver()
        d.add("a", list(range(num_tokens)))
        d.admit("a")
        d.add("b", list(range(num_tokens)))
        _, num_hit = d.lookup("b")
        expected = (num_tokens - 1) // BS * BS
        assert num_hit == expected, (
            f"a {num_tokens}-token prompt, fully cached: expected a hit of {expected} tokens "
            f"(whole blocks within the first {num_tokens - 1}), got {num_hit}"
        )


@graded(
    1,
    "Prefix-cache hits: the search stops at the first miss (one get_cached_block call past "
    "the hits), however long the prompt",
    f"{DOC}#prefix-cache-hits",
)
def test_hit_search_stops_at_the_first_miss():
    """b shares a's first 8 tokens, then runs 300 tokens of its own: the hit is 2 blocks,
    found in 3 lookups of the pool; a search that goes on through b's 77 hashes looks up
    every block of every long prompt it is asked about, each step it waits."""
    d = driver(num_blocks=40, max_model_len=512)
    d.add("a", list(range(12)))
    d.admit("a")
    a_table = table(d.state(), "a")
    d.add("b", [*range(8), *range(1000, 1300)])
    hit, num_hit, calls = d.counted_lookup("b")
    assert num_hit == 8 and hit == a_table[:2], (
        f"b shares a's first 8 tokens: expected a's blocks {a_table[:2]} and 8 tokens, got "
        f"{hit} and {num_hit}"
    )
    assert calls <= 3, (
        f"find_longest_cache_hit called block_pool.get_cached_block {calls} times for a hit of "
        "2 blocks: it must stop at the first miss (README task 3), not look up the rest of the "
        "prompt's hashes"
    )


class LongDecodeBench:
    """A request of ``n`` full blocks, all computed and published, then decoding ``K * BS``
    tokens (one ``decode`` a token: ``allocate_slots(request, 1)``, which publishes each block
    as it fills) in one request, timed here. Each step costs O(1) in the reference; one that
    walks the request's table (to count its published blocks, say) costs O(n)."""

    K = 150

    def __init__(self, n: int) -> None:
        self.n = n
        extra = self.K * BS + BS
        self.d = driver(num_blocks=n + self.K + 4, max_model_len=n * BS + extra)
        self.d.add("long", list(range(n * BS)))
        got = self.d.admit("long")
        if not (got["tried"] and got["new"] is not None and len(got["new"]) == n):
            raise AssertionError(
                f"a {n * BS:,}-token request on a pool of {n + self.K + 4:,} blocks must be "
                f"admitted with {n:,} blocks, got {describe(got)[:200]}"
            )
        self.steps = 0

    def step(self) -> float:
        tokens = [7] * (self.K * BS // 3)
        seconds, got = timed_call(self.d.decode_many, "long", tokens)
        self.steps += len(tokens)
        if not isinstance(got, list) or len(got) != len(tokens) or None in got:
            raise AssertionError(
                f"{len(tokens)} decode steps of a request of {self.n:,} blocks, with free "
                f"blocks to spare, must each get their slots: got {describe(got)[:200]}"
            )
        return seconds

    def verify(self) -> None:
        """The blocks held, and the full ones published: a step that skipped publishing on a
        long table would cost nothing there (tests/hostile/publish_nothing_on_a_long_table.py)."""
        snap = self.d.state()
        want = self.n + -(-self.steps // BS)
        held = table(snap, "long")
        if len(held) != want:
            raise AssertionError(
                f"after {self.steps} decode steps a request of {self.n:,} full blocks must hold "
                f"{want:,} blocks"
            )
        full = (self.n * BS + self.steps) // BS
        unpublished = [b for b in held[:full] if snap["hash"][b] is None]
        if unpublished or snap["num_cached_block"].get("long") != full:
            raise AssertionError(
                f"after {self.steps} decode steps a request of {self.n:,} full blocks has {full:,} "
                f"full blocks, each published as it fills (README, task 9): "
                f"{len(unpublished):,} have no hash (first {unpublished[:5]}), num_cached_block "
                f"is {snap['num_cached_block'].get('long')}"
            )
        check_state(snap)


@graded(
    2,
    "Cost: a decode step of a long request is O(1): cache_blocks reads num_cached_block, it "
    "never walks the request's table",
    "labs/lab-07-kv-cache-manager/README.md#your-tasks",
    timeout=30,
)
def test_decode_steps_cost_the_same_on_a_long_request():
    """200 decode steps cost about the same on a request of 500 blocks and on one of 50,000,
    and stay under a ceiling measured in the judge (CPU time of plain relinks)."""
    benches = {n: LongDecodeBench(n) for n in (500, 50_000)}
    t_small = best_time(benches[500].step)
    t_big = best_time(benches[50_000].step)
    assert_cost_does_not_grow(
        t_small,
        t_big,
        lambda ratio, ceiling: (
            f"200 decode steps took {t_big * 1e3:.1f} ms on a request of 50,000 blocks vs "
            f"{t_small * 1e3:.1f} ms on one of 500 ({ratio:.0f}x for 100x more blocks; at most "
            f"12x, and {ceiling * 1e3:.0f} ms on this machine): a step must not walk the request's "
            "table; cache_blocks reads how many blocks are published from num_cached_block "
            "(README, task 9)"
        ),
    )
    for bench in benches.values():
        bench.verify()
