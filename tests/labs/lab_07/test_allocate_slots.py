"""lab-07, part 2: allocate_slots — new blocks only, all or nothing, hits claimed, publishing."""

from __future__ import annotations

from grading.suite import graded, learner_module
from tests.labs.common import assert_value_error
from tests.labs.lab_07.checks import compare_states
from tests.labs.lab_07.helpers import (
    BS,
    DOC,
    cache_key,
    check_state,
    describe_change,
    driver,
    free_queue,
    num_free,
    oracle,
    table,
    twin,
    unchanged,
)


@graded(
    2,
    "Allocating slots: a request with n tokens to place holds cdiv(n, block_size) blocks, "
    "in order, each with ref_cnt 1",
    f"{DOC}#allocating-slots",
)
def test_prefill_gets_cdiv_blocks():
    """10 tokens, blocks of 4: three blocks, taken from the front of the free queue."""
    d = driver(10)
    d.add("a", list(range(10)))
    out = d.admit("a")
    assert out["num_hit"] == 0
    assert out["new"] is not None, "9 blocks are free: 3 must fit"
    assert out["new"] == [1, 2, 3], (
        f"a fresh pool hands out blocks 1, 2, 3 for 10 tokens; allocate_slots returned {out['new']}"
    )
    state = d.state()
    assert table(state, "a") == [1, 2, 3], (
        f"req_to_blocks['a'] should be [1, 2, 3], is {table(state, 'a')}"
    )
    assert num_free(state) == 6
    check_state(state, expected_ref_cnts={1: 1, 2: 1, 3: 1})
    # A pool of 200 usable blocks fills to its last block: nothing is held back.
    big = driver(201, max_model_len=800)
    big.add("a", list(range(800)))
    new = big.admit("a")["new"]
    assert new == list(range(1, 201)), (
        "800 tokens need exactly the 200 free blocks of a 201-block pool: allocate_slots "
        "refuses only when the blocks needed exceed the free blocks (no reserve, no "
        "watermark of a share of the pool is kept back); got "
        f"{'None' if new is None else f'{len(new)} blocks'}"
    )


@graded(
    3,
    "Allocating slots: allocate_slots returns only the blocks it added this call (none "
    "when the table has room), never the whole table",
    f"{DOC}#allocating-slots",
)
def test_returns_only_new_blocks():
    """Decode steps fill the last block before a new one is taken."""
    d = driver(10)
    side = learner_module("learner_side")
    a = d.add("a", list(range(6)))
    first = d.mgr.allocate_slots(a, 6)  # a's prefill; the returned set is kept and read again
    a.num_computed_tokens = 6
    first_ids = side.block_ids(first)
    assert first_ids == [1, 2], f"a's 6 tokens need blocks [1, 2], got {first_ids}"
    for n, (token, expected) in enumerate(((100, []), (101, []), (102, [3]), (103, []), (104, []))):
        new = d.decode("a", token)
        assert new is not None, "the pool has room"
        assert new == expected, (
            f"decoding token {7 + n} (slot {6 + n}) of a request holding "
            f"{table(d.state(), 'a')}: expected new blocks {expected}, got {new}"
        )
    assert table(d.state(), "a") == [1, 2, 3]
    later = side.block_ids(first)
    assert later == [1, 2], (
        f"the blocks allocate_slots returned for a's prefill were [1, 2] and are now {later}: "
        "the returned KVCacheBlocks shares its list with req_to_blocks['a'], so growing the "
        "table changed it; extend the table with the new blocks and return a list of their own"
    )


@graded(
    3,
    "Claiming hits: allocate_slots touches the hits (ref_cnt + 1) and puts them first in "
    "the new request's table; only the fresh blocks are returned",
    f"{DOC}#claiming-hits",
)
def test_hits_are_shared_and_touched():
    """b shares a's first 8 tokens: both tables start with the same two blocks."""
    d = driver(10)
    d.add("a", list(range(9)))
    d.admit("a")
    tokens = [*range(8), 55, 56]
    d.add("b", tokens)
    out = d.admit("b")
    assert out["num_hit"] == 8
    assert out["new"] == [4], (
        f"b needs 10 slots: 2 hit blocks + 1 fresh; allocate_slots must return only the fresh "
        f"block [4], got {out['new']}"
    )
    state = d.state()
    assert table(state, "b") == [1, 2, 4], f"b's table should be [1, 2, 4], is {table(state, 'b')}"
    check_state(state, expected_ref_cnts={1: 2, 2: 2, 3: 1, 4: 1})
    assert state["hash"][1] == cache_key(tokens, 0), "a hit block keeps its hash"
    side = learner_module("learner_side")
    c = d.add("c", [*range(8), 57, 58])
    hits, num_hit = d.mgr.get_computed_blocks(c)
    d.mgr.allocate_slots(c, 2, num_hit, hits)
    c.num_computed_tokens = 10
    for token in (200, 201, 202, 203):
        d.decode("c", token)
    held = side.block_ids(hits)
    assert held == [1, 2], (
        f"the hits get_computed_blocks gave for c were [1, 2] and are now {held}: c's table "
        "became the caller's list of hits and grew with it; start the table with a copy "
        "(extend a list of its own)"
    )


@graded(
    3,
    "Claiming hits: a hit on a free cached block revives it: ref_cnt 1, out of the free "
    "queue, and it costs one free block",
    f"{DOC}#claiming-hits",
)
def test_free_cached_hits_are_revived():
    """a finished; b with the same prefix gets a's blocks back."""
    d = driver(10)
    d.add("a", list(range(9)))
    d.admit("a")
    d.free("a")
    free_before = num_free(d.state())
    d.add("b", list(range(9)))
    out = d.admit("b")
    assert out["num_hit"] == 8 and out["new"] is not None
    state = d.state()
    assert table(state, "b")[:2] == [1, 2], (
        f"b must reuse blocks 1 and 2, its table is {table(state, 'b')}"
    )
    assert 1 not in free_queue(state) and 2 not in free_queue(state), (
        "revived hit blocks must leave the free queue"
    )
    assert num_free(state) == free_before - 3, (
        "b took 2 free hit blocks and 1 fresh block: 3 fewer free blocks"
    )
    check_state(state, expected_ref_cnts={1: 1, 2: 1})


@graded(
    2,
    "Claiming hits: allocate_slots claims (touches) the hits before it takes fresh blocks: "
    "a free cached hit at the head of the free queue is not evicted by the request's own "
    "fresh allocation",
    f"{DOC}#claiming-hits",
)
def test_hits_are_claimed_before_fresh_blocks():
    """3 usable blocks. a's block 1 is cached and free at the head of the queue, 3 and 2 behind
    it; b hits block 1 and needs one fresh block."""
    d = twin(4)
    d.add("a", [0, 1, 2, 3])
    d.admit("a")  # block 1, cached
    d.free("a")  # free queue 2 3 1
    d.add("c", [50 + i for i in range(8)])
    d.admit("c")  # blocks 2 and 3: free queue 1
    d.free("c")  # free queue 1 3 2
    assert free_queue(d.state()) == [1, 3, 2], (
        f"set-up: the free queue should be [1, 3, 2], is {free_queue(d.state())}"
    )
    d.add("b", [0, 1, 2, 3, 60])
    out = d.admit("b")
    assert out["num_hit"] == 4 and out["hit"] == [1], (
        f"b's first block is cached in block 1: expected the hit [1], got {out['hit']}"
    )
    state = d.state()
    assert out["new"] == [3] and table(state, "b") == [1, 3], (
        f"b's hit is block 1, free and first in the free queue [1, 3, 2]: claiming it (touch) "
        f"takes it out of the queue, and only then is the fresh block taken, 3. Expected the "
        f"new blocks [3] and the table [1, 3]; got {out['new']} and {table(state, 'b')}. A "
        f"fresh block taken before the hits are claimed is block 1 itself, evicted from the "
        f"cache while b is about to use it (upstream fixed this order in vLLM PR 11562)"
    )
    check_state(state, expected_ref_cnts={1: 1, 3: 1})
    d.close()


@graded(
    4,
    "All or nothing: when the blocks do not fit, allocate_slots returns None and changes "
    "NOTHING: free count, free-queue order, ref counts, hashes, block tables (no empty "
    "entry either)",
    f"{DOC}#all-or-nothing",
)
def test_none_changes_nothing():
    """4 usable blocks, 3 held: a request needing 2 is refused cleanly."""
    d = twin(5)
    d.add("a", list(range(12)))
    d.admit("a")
    d.add("b", [50 + i for i in range(8)])
    before = d.state()
    assert d.allocate("b", 8) is None, "b needs 2 blocks, 1 is free: expected None"
    after = d.state()
    assert unchanged(before, after), (
        f"a refused allocation changed {describe_change(before, after)}"
    )
    assert "b" not in after["tables"], (
        "a refused request must not get an entry in req_to_blocks, not even an empty one"
    )
    # A running request that cannot grow is refused the same way.
    d.add("c", list(range(4)))
    assert d.allocate("c", 4) is not None  # the last free block
    d.append("a", 7)
    before = d.state()
    assert d.allocate("a", 1) is None, "a's 13th slot needs a 4th block and none is free: None"
    after = d.state()
    assert unchanged(before, after), f"a refused decode changed {describe_change(before, after)}"
    check_state(after)
    d.close()  # the states after the calls that follow: a refusal leaves no change for later


@graded(
    3,
    "All or nothing: a refused admission leaves its prefix hits unclaimed (ref_cnt 0, in "
    "the free queue, same place)",
    f"{DOC}#all-or-nothing",
)
def test_none_leaves_hits_unclaimed():
    """b's hits are free cached blocks; b does not fit, then fits with one token fewer."""
    d = twin(5)
    d.add("a", list(range(9)))
    d.admit("a")
    d.free("a")
    d.add("b", [*range(8), *(90 + i for i in range(9))])
    hit, num_hit = d.lookup("b")
    assert num_hit == 8 and hit == [1, 2]
    before = d.state()
    assert d.allocate("b", 9) is None, (
        "b needs 17 slots = 5 blocks: 2 free hits + 3 fresh > 4 free blocks"
    )
    after = d.state()
    assert unchanged(before, after), f"a refused admission changed {describe_change(before, after)}"
    assert after["ref_cnt"][1] == after["ref_cnt"][2] == 0, "refused hits must not be touched"
    d.lookup("b")
    assert d.allocate("b", 8) is not None, (
        "with 8 new tokens b needs 4 blocks (2 hits + 2 fresh) and 4 are free: it fits"
    )
    check_state(d.state())
    d.close()


@graded(
    3,
    "Capacity: claiming a free cached hit takes a block out of the free queue, so hits "
    "with ref_cnt 0 count against the free blocks just like fresh ones",
    f"{DOC}#hits-on-free-blocks-cost-capacity",
)
def test_free_hits_count_against_capacity():
    """3 usable blocks; b hits 2 free blocks and needs 2 more: 4 > 3, so None."""
    d = twin(4)
    d.add("a", list(range(8)))
    d.admit("a")
    d.free("a")
    d.add("b", [*range(8), 99, 98, 97, 96, 95])
    _, num_hit = d.lookup("b")
    assert num_hit == 8
    before = d.state()
    try:
        result = d.allocate("b", 5)
    except (ValueError, RuntimeError) as exc:
        raise AssertionError(
            f"allocate_slots ran out of blocks half-way ({type(exc).__name__}: {exc}): it must "
            f"count the 2 free hit blocks it will claim, see 4 > 3 free, and return None"
        ) from exc
    assert result is None, "b needs 4 blocks (2 free hits + 2 fresh), 3 are free: expected None"
    after = d.state()
    assert unchanged(before, after), f"a refused admission changed {describe_change(before, after)}"
    d.close()


@graded(
    3,
    "Capacity: a hit on blocks that running requests hold (ref_cnt > 0, not in the free "
    "queue) costs no free block: only the fresh blocks count, and only the hits with "
    "ref_cnt 0 are added",
    f"{DOC}#hits-on-free-blocks-cost-capacity",
)
def test_in_use_hits_cost_no_free_block():
    """5 usable blocks. a holds 3 and runs; b shares a's 2 full blocks and needs 2 fresh: 2 free
    blocks are enough. Then c hits 1 free block and 1 in-use one."""
    d = driver(6)
    d.add("a", list(range(9)))
    d.admit("a")  # a holds 1 2 3
    d.add("b", [*range(8), *(40 + i for i in range(8))])
    out = d.admit("b")  # 2 in-use hits + 2 fresh, 2 free
    assert out["num_hit"] == 8, (
        f"b shares a's two full blocks: an 8-token hit, got {out['num_hit']}"
    )
    assert out["new"] == [4, 5], (
        f"b's hits are blocks 1 and 2, which a holds: claiming them takes no free block, so b "
        f"needs only 2 fresh blocks and 2 are free. allocate_slots must succeed with [4, 5], got "
        f"{out['new']} (None means it counted the in-use hits as blocks to allocate)"
    )
    state = d.state()
    check_state(state, expected_ref_cnts={1: 2, 2: 2, 3: 1, 4: 1, 5: 1})
    assert num_free(state) == 0
    # b finishes: 4 and 5 are free again, both cached (b's blocks 2 and 3 are full).
    d.free("b")
    d.add("c", [*range(8), *(40 + i for i in range(4)), 7, 7, 7, 7, 7])
    out = d.admit("c")
    assert out["num_hit"] == 12 and out["hit"] == [1, 2, 4], (
        f"c's first 12 tokens are cached in blocks 1, 2 (held by a) and 4 (free): got a hit of "
        f"{out['num_hit']} tokens in {out['hit']}"
    )
    assert out["new"] is None, (
        "c needs 5 blocks: 3 hits and 2 fresh. The in-use hits 1, 2 cost nothing; the free hit "
        "4 costs one free block and the fresh blocks two: 3 > 2 free blocks (4 and 5), so "
        f"allocate_slots must return None, got {out['new']}"
    )
    d.lookup("c")
    assert d.allocate("c", 4) == [5], (
        "with 4 new tokens c needs 4 blocks: hits 1, 2 (in use, free of charge), 4 (free: 1 "
        "block) and 1 fresh = 2 of the 2 free blocks: it fits exactly and gets block 5"
    )
    check_state(d.state(), expected_ref_cnts={1: 2, 2: 2, 3: 1, 4: 1, 5: 1})


@graded(
    3,
    "Publishing: every block this step fills completely is cached (under the request's "
    "chained hash), once; partial blocks are not",
    f"{DOC}#publishing-full-blocks",
)
def test_newly_full_blocks_are_published():
    """7 tokens publish one block; the decode that fills the second publishes it."""
    d = driver(10)
    tokens = list(range(7))
    d.add("a", tokens)
    d.admit("a")
    state = d.state()
    first, second = table(state, "a")
    assert state["hash"][first] == cache_key(tokens, 0), "block 0 is full after the prefill: cached"
    assert state["hash"][second] is None, "block 1 holds 3 of 4 tokens: it must not be cached"
    d.decode("a", 7)
    state = d.state()
    assert state["hash"][second] == cache_key([*tokens, 7], 1), (
        "the decode step scheduled a's 8th token: block 1 is full now and must be cached"
    )
    d.decode("a", 8)
    state = d.state()
    assert state["hash"][table(state, "a")[2]] is None
    d.add("b", [*range(8), 1])
    _, num_hit = d.lookup("b")
    assert num_hit == 8, (
        f"both full blocks of a are published: expected an 8-token hit, got {num_hit}"
    )
    check_state(d.state())


@graded(
    3,
    "Publishing: only tokens computed by this step count: a prefill chunk publishes the "
    "blocks it fills, not the rest of the prompt",
    f"{DOC}#publishing-full-blocks",
)
def test_a_chunk_publishes_only_what_it_fills():
    """A 12-token prompt in chunks of 6: 1 block, then 3."""
    d = driver(10)
    tokens = list(range(12))
    d.add("a", tokens)
    new = d.allocate("a", 6)
    assert new is not None and len(new) == 2
    state = d.state()
    blocks = table(state, "a")
    assert state["hash"][blocks[0]] == cache_key(tokens, 0)
    assert state["hash"][blocks[1]] is None, (
        "after a 6-token chunk block 1 holds only 2 computed tokens: it must not be cached yet"
    )
    new = d.allocate("a", 6)
    assert new is not None and len(new) == 1
    state = d.state()
    assert [state["hash"][b] for b in table(state, "a")] == [cache_key(tokens, i) for i in range(3)]


@graded(
    2,
    "Publishing: lookahead slots are allocated but never published: only tokens the "
    "request has and this step computes are cached",
    f"{DOC}#publishing-full-blocks",
)
def test_lookahead_slots_are_not_published():
    """4 tokens computed, 8 lookahead slots: 3 blocks, 1 cached."""
    d = driver(10)
    tokens = list(range(12))
    d.add("a", tokens)
    new = d.allocate("a", 4, 8)
    assert new is not None and len(new) == 3, "4 + 8 slots: 3 blocks"
    state = d.state()
    hashes = [state["hash"][b] for b in table(state, "a")]
    assert hashes[0] == cache_key(tokens, 0) and hashes[1:] == [None, None], (
        "only block 0 is computed this step; blocks 1 and 2 are lookahead slots and must not "
        "be cached"
    )


@graded(
    1,
    "Capacity: the count covers the lookahead slots too (n = computed + new + lookahead): "
    "a step whose new tokens fit but whose lookahead slots need a block more than is free "
    "returns None and changes nothing",
    f"{DOC}#allocating-slots",
)
def test_lookahead_slots_count_against_capacity():
    """3 usable blocks: 8 new tokens and 5 lookahead slots need 4 blocks (None); with 4
    lookahead slots, 3 (it fits). A count that leaves the lookahead out sees 2 blocks, passes,
    and runs out of blocks half-way."""
    d = twin(4)
    d.add("a", list(range(8)))
    before = d.state()
    try:
        result = d.allocate("a", 8, 5)
    except (ValueError, RuntimeError) as exc:
        raise AssertionError(
            f"allocate_slots(a, 8 new tokens, 5 lookahead slots) ran out of blocks half-way "
            f"({type(exc).__name__}: {exc}): the capacity count must size the table for "
            "min(computed + new computed + new + lookahead, max_model_len) slots, 13 here, "
            "so 4 blocks > 3 free: None (README: allocating slots)"
        ) from exc
    assert result is None, (
        "8 new tokens + 5 lookahead slots = 13 slots = 4 blocks, 3 are free: expected None "
        "(the lookahead slots are allocated, so they count; README: allocating slots)"
    )
    after = d.state()
    assert unchanged(before, after), (
        f"a refused allocation changed {describe_change(before, after)}"
    )
    assert d.allocate("a", 8, 4) is not None, (
        "8 new tokens + 4 lookahead slots = 12 slots = 3 blocks, and 3 are free: it fits"
    )
    d.append("a", 50)
    assert d.allocate("a", 1) == [], (
        "a holds 3 blocks (12 slots) and its decode step needs 9 slots: no block beyond the "
        "table, so it fits with none free (count only the blocks beyond the table and the "
        "hits; README: hits on free blocks cost capacity)"
    )
    check_state(d.state())
    d.close()
    # With prefix hits too: b hits a's 2 freed blocks (free, so each costs a free block).
    d = twin(6)
    d.add("a", list(range(8)))
    d.admit("a")
    d.free("a")
    d.add("b", [*range(8), 90, 91, 92, 93])
    _, num_hit = d.lookup("b")
    assert num_hit == 8
    before = d.state()
    try:
        result = d.allocate("b", 4, 9)
    except (ValueError, RuntimeError) as exc:
        raise AssertionError(
            f"allocate_slots(b, 8 hit tokens, 4 new, 9 lookahead slots) ran out of blocks "
            f"half-way ({type(exc).__name__}: {exc}): with hits the lookahead slots count too, "
            "n = 8 + 4 + 9 = 21 slots = 6 blocks (2 free hits + 4 fresh) > 5 free: None "
            "(README: allocating slots)"
        ) from exc
    assert result is None, (
        "b: 8 hit tokens + 4 new + 9 lookahead = 21 slots = 6 blocks (2 free hits + 4 fresh), "
        "5 are free: expected None (README: allocating slots)"
    )
    after = d.state()
    assert unchanged(before, after), (
        f"a refused allocation changed {describe_change(before, after)}"
    )
    d.lookup("b")
    assert d.allocate("b", 4, 8) is not None, (
        "b: 8 + 4 + 8 lookahead = 20 slots = 5 blocks (2 free hits + 3 fresh), 5 are free: fits"
    )
    check_state(d.state())
    d.close()


@graded(
    2,
    "Allocating slots: a step may reach past the request's known tokens (the async scheduler "
    "schedules the next position before the token in flight arrives): the slots are given, "
    "and only full blocks of tokens the request has are published",
    f"{DOC}#publishing-full-blocks",
)
def test_a_step_past_the_known_tokens():
    """a's 7 tokens are computed; its next position is scheduled while token 8 is in flight."""
    d = driver(10)
    tokens = list(range(7))
    d.add("a", tokens)
    assert d.allocate("a", 7) == [1, 2]
    try:
        ahead = d.allocate("a", 1)  # 7 computed + 1 new > 7 known tokens
        state = d.state()
        d.append("a", 7)  # the token in flight arrives
        next_ahead = d.allocate("a", 1)  # 8 computed + 1 new > 8 known tokens
    except (ValueError, IndexError, RuntimeError, KeyError) as exc:
        raise AssertionError(
            f"allocate_slots(a, 1) with a.num_computed_tokens == a.num_tokens raised "
            f"{type(exc).__name__} ({exc}): with async scheduling the next position is "
            "scheduled before the token in flight is known, so num_computed_tokens + "
            "num_new_tokens may pass num_tokens; give the slots, and publish "
            "min(computed + new, request.num_tokens) tokens"
        ) from exc
    assert ahead == [], f"8 slots fit a's 2 blocks: expected no new block, got {ahead}"
    assert state["hash"][2] is None, (
        "with 7 known tokens, a's block 2 is not full of known tokens: it must not be "
        "published (publish min(computed + new, num_tokens) tokens)"
    )
    assert next_ahead == [3], f"9 slots need a 3rd block: expected [3], got {next_ahead}"
    state = d.state()
    assert state["hash"][2] == cache_key([*tokens, 7], 1) and state["hash"][3] is None, (
        "once token 8 is known, the step that reaches slot 9 publishes a's block 2 (8 known "
        "tokens), and not block 3"
    )
    check_state(state, expected_ref_cnts={1: 1, 2: 1, 3: 1})


@graded(
    2,
    "Publishing: a block is published under its request's hash, so a request built without "
    "a block_hasher (no block_hashes) has no hit and publishes nothing, yet gets its slots",
    f"{DOC}#publishing-full-blocks",
)
def test_request_without_hashes_publishes_nothing():
    """The same 9 tokens, cached by a hashed request: the unhashed one neither hits nor
    publishes, and decodes on as usual."""
    d = driver(10)
    d.add("a", list(range(9)))
    d.admit("a")  # blocks 1 2 3, the first two published
    d.add_unhashed("u", list(range(9)))
    try:
        out = d.admit("u")
        new = d.decode("u", 9)
        more = [d.decode("u", token) for token in (10, 11, 12)]
    except (ValueError, IndexError, RuntimeError, KeyError) as exc:
        raise AssertionError(
            f"a request without a block_hasher made your manager raise {type(exc).__name__} "
            f"({exc}): its block_hashes is empty, so it hits nothing and cache_blocks publishes "
            "at most len(request.block_hashes) = 0 blocks"
        ) from exc
    assert out["num_hit"] == 0 and out["hit"] == [], (
        f"u has no block hashes, so nothing can be looked up: expected no hit, got "
        f"{out['num_hit']} tokens in {out['hit']}"
    )
    assert out["new"] == [4, 5, 6], (
        f"u needs 9 slots = 3 fresh blocks: expected [4, 5, 6], got {out['new']}"
    )
    assert new == [] and more == [[], [], [7]], (
        f"decoding tokens 10-13 of u: expected new blocks [], [], [], [7], got {[new, *more]}"
    )
    state = d.state()
    hashes = {b: state["hash"][b] for b in table(state, "u")}
    assert all(h is None for h in hashes.values()), (
        f"u's full blocks {[b for b, h in hashes.items() if h is not None]} were published: a "
        "request without block hashes publishes nothing"
    )
    recorded = state["num_cached_block"].get("u", 0)
    assert recorded == 0, (
        f"num_cached_block['u'] is {recorded}, but u published nothing: num_cached_block counts "
        "the blocks really published, at most len(request.block_hashes) = 0, so the cap comes "
        "before num_cached_block advances"
    )
    check_state(state, expected_ref_cnts={4: 1, 5: 1, 6: 1, 7: 1})
    # cache_blocks called directly (the async scheduler does): its own contract.
    try:
        d.publish("u", 12)
    except (ValueError, IndexError, RuntimeError, KeyError) as exc:
        raise AssertionError(
            f"cache_blocks(u, 12), called directly, raised {type(exc).__name__} ({exc}): it "
            "publishes at most len(request.block_hashes) = 0 blocks, so the cap belongs in "
            "cache_blocks itself, not only in allocate_slots"
        ) from exc
    d.publish("a", 4)  # a published 2 blocks already: a smaller count publishes nothing
    state = d.state()
    assert state["num_cached_block"].get("a") == 2, (
        f"cache_blocks(a, 4) after a had published 2 blocks set num_cached_block['a'] to "
        f"{state['num_cached_block'].get('a')}: the count only grows (a smaller one publishes "
        "nothing), or the blocks already published are hashed again"
    )
    # A count past the hashes: c's 9 tokens have 2 block hashes, its table 3 blocks.
    c = driver(10)
    tokens = list(range(100, 109))
    c.add("c", tokens)
    c.allocate("c", 3, lookahead=9)  # 12 slots, blocks 1 2 3, nothing full yet
    c.publish("c", 12)
    state = c.state()
    recorded = state["num_cached_block"].get("c", 0)
    assert recorded == 2 and state["hash"][3] is None, (
        f"cache_blocks(c, 12) with 2 block hashes set num_cached_block['c'] to {recorded}: it "
        "publishes blocks 1 and 2 only (at most len(request.block_hashes)), and "
        "num_cached_block counts the blocks really published, not num_computed_tokens // "
        "block_size"
    )
    for token in (9, 10, 11):
        c.append("c", token)
    c.publish("c", 12)  # the 3rd hash now exists
    state = c.state()
    assert state["hash"][3] == cache_key([*tokens, 9, 10, 11], 2), (
        "once c has 12 tokens (3 hashes), cache_blocks(c, 12) publishes block 3: "
        f"num_cached_block['c'] is {state['num_cached_block'].get('c')}, so it was counted "
        "as published before it was"
    )
    check_state(state, expected_ref_cnts={1: 1, 2: 1, 3: 1})
    off = driver(10, enable_caching=False)
    off.add("a", list(range(9)))
    off.admit("a")
    off.publish("a", 9)
    state = off.state()
    published = [b for b in table(state, "a") if state["hash"][b] is not None]
    assert not published, (
        f"with enable_caching=False, cache_blocks(a, 9) called directly published blocks "
        f"{published}: without caching nothing is ever published"
    )


@graded(
    2, "Allocating slots: no request gets slots beyond max_model_len", f"{DOC}#allocating-slots"
)
def test_slots_capped_at_max_model_len():
    """max_model_len 8: 6 tokens + 10 lookahead still get only 2 blocks."""
    d = driver(10, max_model_len=8)
    d.add("a", list(range(6)))
    new = d.allocate("a", 6, 10)
    assert new is not None and len(new) == 2, (
        f"max_model_len=8 caps the slots at 8 = 2 blocks, got "
        f"{None if new is None else len(new)} blocks"
    )
    # A max_model_len that is not a multiple of the block size: the cap is in tokens.
    for length in (9, 10):
        d = driver(10, max_model_len=length)
        d.add("a", list(range(length)))
        new = d.allocate("a", length, 4)
        assert new is not None and len(new) == 3, (
            f"max_model_len={length}, blocks of {BS}: a {length}-token request holds slots for "
            f"min({length} + 4 lookahead, {length}) = {length} tokens, cdiv({length}, {BS}) = 3 "
            f"blocks; got {None if new is None else len(new)} (the cap is max_model_len tokens, "
            f"not max_model_len // block_size blocks, nor max_model_len - 1 tokens)"
        )
    # The capacity count sizes the same capped table: 2 usable blocks are enough.
    d = driver(3, max_model_len=8)
    d.add("a", list(range(6)))
    new = d.allocate("a", 6, 10)
    assert new is not None and len(new) == 2, (
        "2 usable blocks, max_model_len=8: 6 tokens + 10 lookahead are capped at 8 slots = 2 "
        f"blocks, which fit; got {None if new is None else f'{len(new)} blocks'} (the capacity "
        "count must size the capped table, min(..., max_model_len), not 16 slots; README: "
        "allocating slots)"
    )


@graded(
    1,
    "Allocating slots: num_new_tokens must be > 0 (ValueError), hits must match "
    "num_new_computed_tokens, and only a request's first allocation may bring hits (each a "
    "ValueError, not an assert); checked before the gate and the capacity count",
    f"{DOC}#allocating-slots",
)
def test_bad_arguments_are_rejected():
    """Nothing to allocate for, or hits that do not add up, is the caller's bug."""
    side = learner_module("learner_side")

    def expect_value_error(call, what: str, why: str) -> None:
        assert_value_error(
            what,
            call,
            why,
            describe=lambda got: "None" if got is None else f"the new blocks {side.block_ids(got)}",
        )

    d = driver(10)
    a = d.add("a", list(range(6)))
    mgr = d.mgr
    expect_value_error(
        lambda: mgr.allocate_slots(a, 0),
        "allocate_slots(a, num_new_tokens=0)",
        "there is nothing to allocate for: num_new_tokens <= 0 is the caller's bug",
    )
    expect_value_error(
        lambda: mgr.allocate_slots(a, -1),
        "allocate_slots(a, num_new_tokens=-1)",
        "num_new_tokens <= 0 is the caller's bug, a negative count as well as 0 (test <= 0, "
        "not == 0)",
    )
    expect_value_error(
        lambda: mgr.allocate_slots(a, 2, num_lookahead_tokens=-1),
        "allocate_slots(a, 2, num_lookahead_tokens=-1)",
        "a negative number of lookahead slots is the caller's bug: it would take back slots "
        "that the scheduled tokens need (lab README, 'Details the tests hold you to')",
    )
    big = d.add("big", list(range(60)))  # more than the pool holds: the gate would say None
    expect_value_error(
        lambda: mgr.allocate_slots(big, 0, full_sequence_must_fit=True),
        "allocate_slots(big, num_new_tokens=0, full_sequence_must_fit=True)",
        "num_new_tokens <= 0 is checked first, before the admission gate (which would say None "
        "for a request this big)",
    )
    expect_value_error(
        lambda: mgr.allocate_slots(a, 2, num_new_computed_tokens=BS),
        f"allocate_slots(a, 2, num_new_computed_tokens={BS}) with no hit blocks",
        "the hits must cover exactly num_new_computed_tokens tokens",
    )
    state = d.state()
    assert "a" not in state["tables"] and num_free(state) == 9
    # Hits are for a request's first allocation only: a holds blocks after its first chunk.
    d.allocate("a", 4)
    hits, num_hit = mgr.get_computed_blocks(a)  # a's own first block, cached
    assert num_hit == BS
    hit_blocks = hits.blocks[0]  # read here: only the call below may raise the ValueError
    assert_value_error(
        "get_num_blocks_to_allocate('a', 12, <a hit>), a already holding blocks,",
        lambda: mgr.get_num_blocks_to_allocate("a", 12, hit_blocks),
        "prefix-cache hits apply only to a request's first allocation (a ValueError: upstream's "
        "assert would vanish under python -O)",
        describe=repr,
    )
    expect_value_error(
        lambda: mgr.allocate_slots(a, 2, BS, hits),
        f"allocate_slots(a, 2, num_new_computed_tokens={BS}, new_computed_blocks=<a's own hit>)",
        "a already holds blocks, and hits apply only to a request's first allocation: "
        "allocate_slots must refuse them (get_num_blocks_to_allocate raises), not drop them",
    )
    # Hit blocks that num_new_computed_tokens does not count: b would write over a's block.
    b = d.add("b", list(range(6)))
    b_hits, b_num_hit = mgr.get_computed_blocks(b)
    assert b_num_hit == BS
    expect_value_error(
        lambda: mgr.allocate_slots(b, 2, 0, b_hits),
        "allocate_slots(b, 2, num_new_computed_tokens=0, new_computed_blocks=<1 hit block>)",
        "the hits must cover exactly num_new_computed_tokens tokens (len(blocks) * "
        "block_size), too many blocks as well as too few",
    )
    # A hit count that is not a whole number of blocks: one block cannot cover BS + 1 tokens.
    expect_value_error(
        lambda: mgr.allocate_slots(b, 2, BS + 1, b_hits),
        f"allocate_slots(b, 2, num_new_computed_tokens={BS + 1}, new_computed_blocks=<1 hit "
        "block>)",
        f"1 block of {BS} tokens covers {BS} tokens, not {BS + 1}, so token {BS} would count as "
        "computed with no KV behind it; compare len(blocks) * block_size with "
        "num_new_computed_tokens (not len(blocks) with num_new_computed_tokens // block_size)",
    )
    expect_value_error(
        lambda: mgr.allocate_slots(b, 0, BS, b_hits),
        f"allocate_slots(b, num_new_tokens=0, num_new_computed_tokens={BS}, "
        "new_computed_blocks=<1 hit block>)",
        "num_new_tokens must be > 0 with hits too: the hit is capped at num_tokens - 1, so a "
        "request always has a token left to compute",
    )
    # The arguments are checked before any capacity question: big does not fit (nor does its
    # whole sequence), yet a hit count that does not add up is still the caller's bug.
    big_hits, big_num_hit = mgr.get_computed_blocks(big)  # a's first block, held by a
    assert big_num_hit == BS
    for gate in (False, True):
        expect_value_error(
            lambda gate=gate: mgr.allocate_slots(big, 56, 0, big_hits, full_sequence_must_fit=gate),
            f"allocate_slots(big, 56, num_new_computed_tokens=0, new_computed_blocks=<1 hit "
            f"block>, full_sequence_must_fit={gate})",
            "the hits do not add up to num_new_computed_tokens, so it is a ValueError whether "
            "or not the blocks would fit: validate the arguments first, before the admission "
            "gate and the capacity count (a None tells the scheduler to preempt someone)",
        )
    # With caching off there are no hits, so a hit count is never matched by blocks.
    off = driver(10, enable_caching=False)
    x = off.add("x", list(range(6)))
    expect_value_error(
        lambda: off.mgr.allocate_slots(x, 2, num_new_computed_tokens=BS),
        f"With enable_caching=False, allocate_slots(x, 2, num_new_computed_tokens={BS}) (no "
        "hit blocks)",
        "no blocks cover those tokens, with caching on or off: the hit check does not depend "
        "on enable_caching",
    )
    # Nor does a refusal change anything, then or at a later call: after an admission that
    # succeeds, each manager's whole state is the reference's given only the calls that
    # succeeded (tests/hostile/leave_the_refusals_trace_one_call_later.py).
    d.admit("b")  # its hit (a's block 1) and one fresh block
    off.admit("x")
    ref, ref_off = oracle(10), oracle(10, enable_caching=False)
    for rid, tokens in (("a", list(range(6))), ("big", list(range(60))), ("b", list(range(6)))):
        ref.add(rid, tokens)
    ref.allocate("a", 4)
    ref.admit("b")
    ref_off.add("x", list(range(6)))
    ref_off.admit("x")
    after = "the refused calls, then the admission of b (of x, caching off)"
    compare_states(d.state(), ref.state(), after)
    compare_states(off.state(), ref_off.state(), after)
    check_state(d.state())


@graded(
    3,
    "The admission gate: with full_sequence_must_fit=True, allocate_slots returns None "
    "(changing nothing) unless the request's whole sequence fits, counting its hits as "
    "usual; when it fits, only the chunk asked for gets blocks",
    f"{DOC}#the-admission-gate",
)
def test_admission_gate():
    """Five usable blocks; a holds three of them."""
    d = twin(6)
    d.add("a", list(range(12)))
    d.admit("a")
    # b: 12 tokens of its own (3 blocks); its first chunk of 4 would fit the 2 free blocks.
    d.add("b", [50 + i for i in range(12)])
    before = d.state()
    out = d.admit("b", 4, gate=True)
    assert out["new"] is None, (
        "b's whole prompt needs 3 blocks and 2 are free: the gate must refuse it (None), "
        f"although its first 4-token chunk fits; allocate_slots returned {out['new']}"
    )
    after = d.state()
    assert unchanged(before, after), f"a refused admission changed {describe_change(before, after)}"
    # c shares a's first 8 tokens (2 blocks a holds: free of charge) + 4 tokens (1 fresh block).
    d.add("c", [*range(8), 90, 91, 92, 93])
    out = d.admit("c", 2, gate=True)
    assert out["num_hit"] == 8
    assert out["new"] == [4], (
        "c's whole sequence needs 3 blocks, 2 of them hits held by a (free of charge): 1 free "
        f"block needed, 2 free, so the gate lets it through; expected the new blocks [4] "
        f"(the chunk's only), got {out['new']}"
    )
    # e shares the same 2 held blocks but is 20 tokens long: 3 fresh blocks, 1 free.
    d.add("e", [*range(8), *(60 + i for i in range(12))])
    before = d.state()
    out = d.admit("e", 2, gate=True)
    assert out["num_hit"] == 8
    assert out["new"] is None, (
        "e's whole sequence is 20 tokens = 5 blocks: 2 hits held by others (free of charge) "
        "and 3 fresh, but only 1 block is free, so the gate must refuse it (None); got "
        f"{out['new']}. The hits are counted once, as blocks: size the sequence by "
        "min(num_tokens, max_model_len), not by num_tokens less the hit tokens"
    )
    after = d.state()
    assert unchanged(before, after), f"a refused admission changed {describe_change(before, after)}"
    d.close()
    # Gate passed: the chunk gets its blocks, not the whole sequence.
    d2 = driver(10)
    d2.add("long", list(range(20)))
    out = d2.admit("long", 4, gate=True)
    assert out["new"] == [1], (
        "the gate only checks that the whole 20-token prompt (5 blocks) would fit 9 free "
        f"blocks; it reserves nothing: a 4-token chunk gets 1 block, got {out['new']}"
    )
    assert num_free(d2.state()) == 8
    # A whole sequence that needs every free block of a large pool fits: no block held back.
    big = driver(201, max_model_len=800)
    big.add("a", list(range(800)))
    new = big.admit("a", 4, gate=True)["new"]
    assert new == [1], (
        "a's 800 tokens need exactly the 200 free blocks of a 201-block pool: the gate lets "
        "it through (it refuses only when the whole sequence needs more blocks than are free; "
        "no watermark of a share of the pool is kept back), and its 4-token chunk gets block "
        f"1; got {new}"
    )
    # max_model_len 10, not a multiple of the block size: a 9-token prompt needs 3 blocks.
    d3 = twin(5, max_model_len=10)
    d3.add("a", list(range(8)))
    d3.admit("a")  # 2 of the 4 usable blocks
    d3.add("b", [50 + i for i in range(9)])
    out = d3.admit("b", 4, gate=True)
    assert out["new"] is None, (
        "max_model_len 10, blocks of 4, 2 blocks free: b's whole 9-token prompt needs "
        "cdiv(min(9, 10), 4) = 3 blocks, so the gate must refuse it (None); got "
        f"{out['new']} (min(num_tokens, max_model_len) is in tokens: do not round "
        "max_model_len down to whole blocks)"
    )
    d3.close()
    # The gate counts the whole sequence whoever asks: a request that holds blocks too (its
    # held blocks cost nothing, as in every count).
    d4 = twin(6)
    d4.add("a", [50 + i for i in range(12)])
    assert d4.allocate("a", 4) == [1]  # a's first chunk: 1 of the 3 blocks it will need
    d4.add("b", list(range(12)))
    d4.admit("b")  # 3 blocks: 1 free
    before = d4.state()
    new = d4.allocate("a", 4, gate=True)
    assert new is None, (
        "a holds 1 block (4 of its 12 tokens computed) and asks for 4 more with "
        "full_sequence_must_fit=True: its whole sequence is 12 tokens = 3 blocks, 1 held, so 2 "
        f"free blocks are needed and 1 is free: the gate must refuse (None), got {new}. The "
        "gate counts min(num_tokens, max_model_len) tokens through get_num_blocks_to_allocate "
        "for any request: not only for requests without blocks, and not only the tokens past "
        "num_computed_tokens"
    )
    after = d4.state()
    assert unchanged(before, after), (
        f"a refused allocation changed {describe_change(before, after)}"
    )
    d4.close()


@graded(
    1,
    "The admission gate counts the whole sequence only, min(num_tokens, max_model_len): "
    "lookahead slots are counted for the chunk, never added to the gate's sequence",
    f"{DOC}#the-admission-gate",
)
def test_admission_gate_leaves_out_the_lookahead():
    """3 usable blocks; a's 12 tokens need all 3, its first chunk of 4 with 4 lookahead slots 2."""
    d = twin(4)
    d.add("a", list(range(12)))
    out = d.admit("a", 4, lookahead=4, gate=True)
    assert out["new"] == [1, 2], (
        "a's whole sequence is 12 tokens = 3 blocks and 3 are free: the gate lets it through; "
        "its 4-token chunk and 4 lookahead slots need 2 blocks, [1, 2]; got "
        f"{out['new']}. The gate sizes min(num_tokens, max_model_len) tokens: lookahead slots "
        "(drafts that may be rejected) are not part of the sequence"
    )
    d.close()


@graded(
    2,
    "The admission gate counts a resumed request's whole sequence, its outputs "
    "included (num_tokens, not the prompt)",
    f"{DOC}#the-admission-gate",
)
def test_admission_gate_counts_outputs():
    """Caching off: p generates 8 tokens after a 4-token prompt, is preempted, and comes back."""
    d = twin(6, enable_caching=False)
    d.add("p", [7, 7, 7, 7])
    d.admit("p")
    for token in range(8):
        d.decode("p", 30 + token)
    d.free("p", preempt=True)
    d.add("q", list(range(8)))
    d.admit("q")  # 2 blocks: 3 free
    out = d.admit("p", 4, gate=True)
    assert out["new"] is not None, (
        "p's 12 tokens need 3 blocks and 3 are free: the gate must let it in, got None"
    )
    d.free("p", preempt=True)
    d.add("r", [1, 2, 3, 4])
    d.admit("r")  # 1 block: 2 free
    before = d.state()
    out = d.admit("p", 4, gate=True)
    assert out["new"] is None, (
        "p comes back with 4 prompt + 8 generated tokens: 12 tokens, 3 blocks, and 2 are free: "
        "the gate must count num_tokens (outputs included), not the prompt alone; got "
        f"{out['new']}"
    )
    assert unchanged(before, d.state())
    d.close()
