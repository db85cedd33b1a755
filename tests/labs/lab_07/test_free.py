"""lab-07, part 3: freeing tail first, block ids, usage."""

from __future__ import annotations

from grading.suite import graded
from tests.labs.common import close_to
from tests.labs.lab_07.helpers import (
    DOC,
    check_state,
    driver,
    free_queue,
    num_free,
    table,
    twin,
)


@graded(
    3,
    "Freeing: a request's blocks go back tail first, so under LRU eviction the end of a "
    "sequence is evicted before its prefix",
    f"{DOC}#freeing-tail-first",
)
def test_free_returns_blocks_tail_first():
    """a holds 1 2 3; after free the queue is 4 5 3 2 1 and eviction takes 3 before 1."""
    d = driver(6)
    d.add("a", list(range(12)))
    d.admit("a")
    assert table(d.state(), "a") == [1, 2, 3]
    d.free("a")
    state = d.state()
    assert free_queue(state) == [4, 5, 3, 2, 1], (
        f"never-used blocks 4, 5 stay in front and a's blocks follow tail first: expected "
        f"[4, 5, 3, 2, 1], got {free_queue(state)}"
    )
    d.add("c", [70 + i for i in range(13)])
    d.admit("c")
    state = d.state()
    assert table(state, "c") == [4, 5, 3, 2], (
        f"c's 4 blocks come from the front of the queue: [4, 5, 3, 2], got {table(state, 'c')}"
    )
    d.add("d", list(range(5)))
    _, num_hit = d.lookup("d")
    assert num_hit == 4, "a's first block (block 1) was freed last and must still be cached"
    check_state(d.state())
    # Without caching too: free still hands the blocks over tail first (older vLLM V1 reversed
    # them only with caching on).
    off = driver(6, enable_caching=False)
    off.add("a", list(range(12)))
    off.admit("a")
    off.free("a")
    assert free_queue(off.state()) == [4, 5, 3, 2, 1], (
        f"with enable_caching=False, free still returns a's blocks 1 2 3 tail first: expected "
        f"the free queue [4, 5, 3, 2, 1], got {free_queue(off.state())} (README task 11: "
        f"reverse order, caching or not)"
    )


@graded(
    2,
    "Freeing: free forgets the request (its req_to_blocks and num_cached_block entries), "
    "so a preempted request can be admitted again from scratch",
    f"{DOC}#freeing-tail-first",
)
def test_free_forgets_the_request():
    """Free, then admit the same request again (a preemption by recompute)."""
    d = driver(10)
    d.add("a", list(range(10)))
    d.admit("a")
    d.free("a", True)
    state = d.state()
    assert "a" not in state["tables"], "free must remove the request's block table"
    assert "a" not in state["num_cached_block"], (
        "free must forget how many of its blocks were cached"
    )
    out = d.admit("a")
    assert out["num_hit"] == 8 and out["new"] is not None, (
        "readmitted, a hits its own two cached blocks"
    )
    state = d.state()
    assert len(table(state, "a")) == 3, (
        f"a's new table covers 10 tokens in 3 blocks, got {table(state, 'a')}"
    )
    check_state(state, expected_ref_cnts={b: 1 for b in table(state, "a")})


@graded(
    2,
    "Freeing: a block shared with another request stays held (ref_cnt drops by one) and "
    "out of the free queue",
    f"{DOC}#freeing-tail-first",
)
def test_free_keeps_shared_blocks_held():
    """a and b share two blocks; freeing a leaves them to b."""
    d = driver(10)
    d.add("a", list(range(9)))
    d.add("b", list(range(9)))
    d.admit("a")
    d.admit("b")
    d.free("a")
    state = d.state()
    check_state(state, expected_ref_cnts={1: 1, 2: 1})
    assert 1 not in free_queue(state) and 2 not in free_queue(state)
    d.free("b")
    state = d.state()
    check_state(state, expected_ref_cnts={1: 0, 2: 0})
    assert num_free(state) == 9


@graded(
    1,
    "Freeing: freeing a request that holds no blocks (aborted while waiting) is a no-op",
    f"{DOC}#freeing-tail-first",
)
def test_free_unknown_request():
    """Nothing to free: nothing changes."""
    d = driver(10)
    d.add("a", list(range(5)))
    d.admit("a")
    queue = free_queue(d.state())
    d.add("ghost", [1, 2, 3])
    d.free("ghost")
    state = d.state()
    assert free_queue(state) == queue and "ghost" not in state["tables"]
    check_state(state)
    # The control: freeing a, which holds blocks, does give them back.
    held = table(state, "a")
    d.free("a")
    state = d.state()
    assert "a" not in state["tables"] and set(held) <= set(free_queue(state)), (
        f"freeing a (blocks {held}) must give its blocks back to the free queue: a free that "
        "does nothing is right only for a request that holds nothing"
    )
    check_state(state)


@graded(
    2,
    "get_block_ids: the request's table as ids, one list per KV cache group: ([1, 2, 3],); "
    "([],) for a request holding nothing",
    f"{DOC}#block-tables",
)
def test_get_block_ids():
    """Ids in table order, wrapped in a one-group tuple."""
    d = driver(10)
    d.add("a", list(range(9)))
    d.admit("a")
    d.add("b", [*range(8), 40, 41, 42, 43, 44])
    d.admit("b")
    for rid, expected in (("a", ([1, 2, 3],)), ("b", ([1, 2, 4, 5],)), ("nobody", ([],))):
        got = d.get_block_ids(rid)
        assert type(got) is tuple and got == expected, (
            f"get_block_ids({rid!r}): expected {expected}, got {got!r}"
        )
    d.free("a")
    got = d.get_block_ids("a")
    assert type(got) is tuple and got == ([],), f"a freed: expected ([],), got {got!r}"


@graded(
    1,
    "get_block_ids only reads: asking about a request that holds nothing answers ([],) and "
    "files no table for it (only requests holding blocks have a req_to_blocks entry)",
    f"{DOC}#block-tables",
)
def test_get_block_ids_adds_no_table():
    """a holds blocks; "ghost" was never admitted, and b was refused."""
    d = twin(4)
    d.add("a", list(range(8)))
    d.admit("a")  # blocks 1 and 2: 1 free
    d.add("b", [50 + i for i in range(8)])
    assert d.allocate("b", 8) is None, "set-up: b needs 2 blocks and 1 is free"
    for rid in ("ghost", "b"):
        got = d.get_block_ids(rid)
        assert type(got) is tuple and got == ([],), (
            f"get_block_ids({rid!r}) for a request holding nothing: expected ([],), got {got!r}"
        )
        tables = d.state()["tables"]
        assert rid not in tables, (
            f"get_block_ids({rid!r}) filed an empty table for a request that holds nothing: "
            f"req_to_blocks is now {tables}. Only requests holding blocks have an entry "
            "(get_num_common_prefix_blocks counts them): read the table with "
            "self.req_to_blocks.get(request_id) (get_blocks does), never by indexing a "
            "defaultdict or with setdefault"
        )
    d.close()  # the states after the calls that follow, compared with the reference's


@graded(
    2,
    "usage: the fraction of usable blocks (the null block excluded) held by requests; "
    "free cached blocks count as free",
    f"{DOC}#usage-and-prefix-cache-statistics",
)
def test_usage():
    """10 blocks = 9 usable; 3 held is 1/3."""
    d = driver(10)
    assert d.usage() == 0.0
    d.add("a", list(range(10)))
    d.admit("a")
    usage = d.usage()
    assert close_to(usage, 3 / 9), f"3 of 9 usable blocks held: 0.333, got {usage}"
    d.add("b", [*range(8), 5])
    d.admit("b")
    assert close_to(d.usage(), 4 / 9), "b shares 2 blocks and takes 1: 4 blocks held"
    d.free("a")
    assert close_to(d.usage(), 3 / 9), "b still holds 3 blocks"
