"""lab-02, part 1: the two allocators and where the memory a request holds goes."""

from __future__ import annotations

import pytest

from grading.suite import graded, load_impl
from tests.labs.common import assert_value_error
from tests.labs.lab_02.worked_example import DOC


def frag():
    return load_impl("fragmentation")


def reserve(alloc, request_id: str, max_len: int, length: int = 1) -> bool:
    return alloc.ensure(request_id, length, max_len)


@graded(
    2,
    "Contiguous: the first ensure of a request reserves max_len slots (not its length) "
    "at the start of a free range; later calls keep that range",
    f"{DOC}#task-1-contiguous-allocation-first-fit",
)
def test_contiguous_reserves_max_len_up_front():
    """A request's range is its whole maximum length, reserved once."""
    alloc = frag().ContiguousAllocator(24)
    assert reserve(alloc, "A", max_len=8, length=4) is True, (
        "ensure('A', 4, max_len=8) on an empty memory of 24 slots must return True"
    )
    assert alloc.ranges == {"A": (0, 8)}, (
        f"A reserves max_len = 8 slots at offset 0, expected ranges {{'A': (0, 8)}}, got "
        f"{alloc.ranges}"
    )
    assert alloc.free_ranges == [(8, 16)], f"the rest stays free: {alloc.free_ranges}"
    assert alloc.ensure("A", 8, 8) is True and alloc.ranges["A"] == (0, 8), (
        "a request that already has its range keeps it as it grows"
    )
    assert reserve(alloc, "B", max_len=16) is True, (
        "ensure('B', 1, max_len=16) with exactly 16 slots free must return True"
    )
    assert alloc.ranges["B"] == (8, 16) and alloc.free_ranges == [], (
        f"an exact fit uses the whole free range and leaves no empty range: {alloc.free_ranges}"
    )
    assert reserve(alloc, "C", max_len=1) is False, "a full memory refuses"
    assert "C" not in alloc.ranges, f"a refused request gets no range: ranges {alloc.ranges}"
    with pytest.raises(ValueError):
        alloc.ensure("A", 9, 8)
    alloc.free("B")  # a later call that succeeds: the refusal's change, if any, shows now
    assert alloc.ranges == {"A": (0, 8)} and alloc.free_ranges == [(8, 16)], (
        f"after the refused ensure('A', 9, max_len=8), free('B') must leave A's range (0, 8) "
        f"and the free range (8, 16): ranges {alloc.ranges}, free ranges {alloc.free_ranges} "
        "(a refused call changes nothing, then or at a later call)"
    )
    fresh = frag().ContiguousAllocator(24)
    assert_value_error("ensure('D', 9, max_len=8), D's first call", lambda: fresh.ensure("D", 9, 8))
    assert fresh.ranges == {} and fresh.free_ranges == [(0, 24)], (
        "a length over max_len is refused before anything is reserved, at a request's first "
        f"call too: ranges {fresh.ranges}, free ranges {fresh.free_ranges}"
    )
    assert fresh.ensure("E", 4, 6) is True and fresh.ranges == {"E": (0, 6)}, (
        "after the refusal, ensure('E', 4, max_len=6) must reserve E's 6 slots at offset 0: a "
        f"refused call changes nothing, then or at a later call; ranges {fresh.ranges}"
    )


@graded(
    3,
    "Contiguous: first fit takes the free range with the LOWEST start that is long "
    "enough (not the smallest, not the largest), and refuses when no single range is "
    "long enough even if the free ranges together are",
    f"{DOC}#task-1-contiguous-allocation-first-fit",
)
def test_first_fit_and_refusal_despite_enough_free():
    """Holes of 8 and 4 slots: a 4-slot request goes into the first hole; 6 slots fit nowhere."""
    alloc = frag().ContiguousAllocator(24)
    for rid, size in (("A", 8), ("B", 4), ("C", 4), ("D", 8)):
        assert reserve(alloc, rid, max_len=size), (
            f"ensure({rid!r}, 1, max_len={size}) must fit in the free memory"
        )
    want = {"A": (0, 8), "B": (8, 4), "C": (12, 4), "D": (16, 8)}
    assert alloc.ranges == want, (
        f"A, B, C, D placed one after the other: expected ranges {want}, got {alloc.ranges}"
    )
    alloc.free("A")
    alloc.free("C")
    assert alloc.free_ranges == [(0, 8), (12, 4)], (
        f"after freeing A and C the free ranges are [(0, 8), (12, 4)], got {alloc.free_ranges}"
    )
    assert reserve(alloc, "E", max_len=4) is True, (
        "ensure('E', 1, max_len=4) must fit in a free range of 8"
    )
    assert alloc.ranges["E"] == (0, 4), (
        f"first fit puts E (4 slots) at the lowest free range long enough, offset 0, got "
        f"{alloc.ranges['E']} (best fit would pick the 4-slot hole at 12)"
    )
    assert alloc.free_ranges == [(4, 4), (12, 4)], (
        f"E took the front of (0, 8): free ranges [(4, 4), (12, 4)] expected, got "
        f"{alloc.free_ranges}"
    )
    free = alloc.num_free_tokens()
    assert free == 8, f"num_free_tokens() sums the free ranges, 4 + 4 = 8: got {free}"
    assert reserve(alloc, "F", max_len=6) is False, (
        "8 slots are free in total but in two ranges of 4: a 6-slot range cannot be placed "
        "(external fragmentation)"
    )
    assert alloc.free_ranges == [(4, 4), (12, 4)] and "F" not in alloc.ranges, (
        "a refused ensure changes nothing"
    )
    # Nor does the refusal leave a change for later: F's next call, 4 slots, fits first at 4
    # (tests/hostile/drop_the_scanned_ranges_at_the_next_call.py).
    assert reserve(alloc, "F", max_len=4) is True, (
        "after the refusal, ensure('F', 1, max_len=4) must fit in the free range (4, 4)"
    )
    want = {"B": (8, 4), "D": (16, 8), "E": (0, 4), "F": (4, 4)}
    assert alloc.ranges == want and alloc.free_ranges == [(12, 4)], (
        f"after the refused ensure('F', 1, max_len=6), ensure('F', 1, max_len=4) must reserve "
        f"(4, 4), leaving ranges {want} and free ranges [(12, 4)]; got ranges {alloc.ranges} "
        f"and free ranges {alloc.free_ranges} (a refused call changes nothing, then or at a "
        "later call)"
    )
    # The lowest hole is the smaller one and lies before the last reservation.
    alloc = frag().ContiguousAllocator(16)
    assert reserve(alloc, "A", max_len=4) and reserve(alloc, "B", max_len=4)
    alloc.free("A")
    assert reserve(alloc, "E", max_len=4) is True
    assert alloc.ranges["E"] == (0, 4) and alloc.free_ranges == [(8, 8)], (
        f"16 slots, A (0, 4) and B (4, 4) reserved, A freed: the free ranges are [(0, 4), "
        f"(8, 8)] and first fit puts E (4 slots) at offset 0, the lowest start, leaving "
        f"[(8, 8)]; got E at {alloc.ranges['E']} and free ranges {alloc.free_ranges} (not the "
        f"largest range, not the one after the last reservation)"
    )


@graded(
    3,
    "Contiguous: free gives the range back and merges it with the free ranges just "
    "before and just after it, so free ranges never touch",
    f"{DOC}#task-1-contiguous-allocation-first-fit",
)
def test_free_coalesces_neighbours():
    """Freed ranges merge with both neighbours; memory ends as one range."""
    alloc = frag().ContiguousAllocator(24)
    for rid in "ABCD":
        assert reserve(alloc, rid, max_len=6), f"ensure({rid!r}, 1, max_len=6) must fit"
    alloc.free("B")
    assert alloc.free_ranges == [(6, 6)], (
        f"freeing B (6..12) leaves the free ranges [(6, 6)], got {alloc.free_ranges}"
    )
    alloc.free("D")
    assert alloc.free_ranges == [(6, 6), (18, 6)], (
        f"freeing D (18..24) leaves [(6, 6), (18, 6)], sorted by start: got {alloc.free_ranges}"
    )
    alloc.free("C")
    assert alloc.free_ranges == [(6, 18)], (
        f"C (12..18) touches the free ranges on both sides: expected [(6, 18)], got "
        f"{alloc.free_ranges}"
    )
    alloc.free("A")
    assert alloc.free_ranges == [(0, 24)] and alloc.ranges == {}, (
        f"everything freed must be one free range again, got {alloc.free_ranges}"
    )
    assert reserve(alloc, "E", max_len=24), "after coalescing, the whole memory is one range"
    with pytest.raises(ValueError):
        alloc.free("A")
    alloc.free("E")  # a later call that succeeds: the refusal's change, if any, shows now
    assert alloc.ranges == {} and alloc.free_ranges == [(0, 24)], (
        f"after the refused free('A') (A holds nothing), free('E') must leave the whole memory "
        f"free, [(0, 24)]: ranges {alloc.ranges}, free ranges {alloc.free_ranges} (a refused "
        "call changes nothing, then or at a later call)"
    )

    # The neighbour before is not always the first free range, nor the last one.
    alloc = frag().ContiguousAllocator(36)
    for rid in "ABCDEF":
        assert reserve(alloc, rid, max_len=6), f"ensure({rid!r}, 1, max_len=6) must fit"
    for rid in "ACF":
        alloc.free(rid)
    assert alloc.free_ranges == [(0, 6), (12, 6), (30, 6)], (
        f"freeing A, C and F of six 6-slot ranges leaves [(0, 6), (12, 6), (30, 6)], got "
        f"{alloc.free_ranges}"
    )
    alloc.free("D")
    assert alloc.free_ranges == [(0, 6), (12, 12), (30, 6)], (
        f"D (18..24) merges with C's range (12, 6) just before it, the second of three free "
        f"ranges: expected [(0, 6), (12, 12), (30, 6)], got {alloc.free_ranges}"
    )
    alloc.free("E")
    assert alloc.free_ranges == [(0, 6), (12, 24)], (
        f"E (24..30) touches (12, 12) before it and (30, 6) after it: expected "
        f"[(0, 6), (12, 24)], got {alloc.free_ranges}"
    )
    alloc.free("B")
    assert alloc.free_ranges == [(0, 36)], (
        f"B (6..12) closes the last gap: expected [(0, 36)], got {alloc.free_ranges}"
    )


@graded(
    2,
    "Paged: a request of n tokens holds ceil(n / block_size) whole blocks, whatever the "
    "block size (3 too); ensure grows its block table only when a new block is needed",
    f"{DOC}#task-2-paged-allocation",
)
def test_paged_holds_whole_blocks_covering_the_tokens():
    """Blocks are taken from the free list in order as the request grows."""
    alloc = frag().PagedAllocator(16, 4)
    assert [alloc.tokens_to_hold(n, 100) for n in (1, 4, 5, 8, 9)] == [4, 4, 8, 8, 12], (
        "tokens_to_hold rounds the length UP to whole blocks"
    )
    assert alloc.ensure("A", 5, 100) is True, "ensure('A', 5 tokens) on 4 free blocks is True"
    assert alloc.block_tables["A"] == [0, 1], (
        f"5 tokens need 2 blocks of 4, the first two free ones: {alloc.block_tables}"
    )
    assert alloc.ensure("A", 8, 100) is True and alloc.block_tables["A"] == [0, 1], (
        "8 tokens still fit in 2 blocks: no new block"
    )
    assert alloc.ensure("A", 9, 100) is True and alloc.block_tables["A"] == [0, 1, 2], (
        f"9 tokens need a third block, block 2: block tables {alloc.block_tables}"
    )
    held, free = alloc.held("A"), alloc.num_free_tokens()
    assert (held, free) == (12, 4), (
        f"3 blocks of 4: held('A') is 12 and num_free_tokens() 4, got {held} and {free}"
    )
    assert list(alloc.free_block_ids) == [3], (
        f"block 3 is the only free block: free_block_ids {list(alloc.free_block_ids)}"
    )
    # Blocks of 3 slots: a block size need not be a power of two.
    alloc = frag().PagedAllocator(18, 3)
    got = [alloc.tokens_to_hold(n, 100) for n in (1, 3, 4, 6, 7)]
    assert got == [3, 3, 6, 6, 9], (
        f"blocks of 3: tokens_to_hold of 1, 3, 4, 6 and 7 tokens is ceil(n / 3) x 3 = "
        f"[3, 3, 6, 6, 9], got {got}; a block size need not be a power of two, and a bit "
        "mask such as (n + b - 1) & -b rounds up to a multiple of b only when it is one "
        "(Task 2: paged allocation)"
    )
    assert alloc.ensure("A", 7, 100) is True and alloc.block_tables["A"] == [0, 1, 2], (
        f"7 tokens in blocks of 3 need ceil(7 / 3) = 3 blocks, the first three free ones: "
        f"block tables {alloc.block_tables}"
    )


@graded(
    2,
    "Paged: ensure is all or nothing: when fewer blocks are free than needed the "
    "request gets none of them; a request that needs no new block succeeds even when "
    "none is free",
    f"{DOC}#task-2-paged-allocation",
)
def test_paged_ensure_is_all_or_nothing():
    """A refused request takes no block; a smaller one still fits; a full memory still lets a
    request grow inside its last block."""
    alloc = frag().PagedAllocator(16, 4)
    assert alloc.ensure("A", 12, 100), "ensure('A', 12 tokens) on 4 free blocks of 4 is True"
    assert alloc.ensure("B", 5, 100) is False, (
        "ensure('B', 5 tokens) needs 2 blocks and 1 is free: it must return False"
    )
    assert alloc.held("B") == 0 and list(alloc.free_block_ids) == [3], (
        "a refused ensure must not take the one free block"
    )
    assert "B" not in alloc.block_tables, (
        f"a refused request gets no block table, not even an empty one (free('B') must still "
        f"be the ValueError of a request that holds nothing): {alloc.block_tables}"
    )
    assert alloc.ensure("B", 4, 100) is True and alloc.block_tables["B"] == [3], (
        f"ensure('B', 4 tokens) takes the last free block, 3: block tables {alloc.block_tables}"
    )
    grown = alloc.ensure("A", 12, 100)
    assert grown is True and alloc.block_tables["A"] == [0, 1, 2], (
        f"no block is free, but A's 12 tokens fit in the 3 blocks it holds: ensure('A', 12) "
        f"must return True and take nothing, got {grown} with block tables {alloc.block_tables}"
    )
    assert alloc.ensure("A", 13, 100) is False and alloc.block_tables["A"] == [0, 1, 2], (
        f"no block is free: ensure('A', 13) is False and A keeps [0, 1, 2]: block tables "
        f"{alloc.block_tables}"
    )
    # Nor does a refusal leave a change for later: once B is freed, A grows into its block.
    alloc.free("B")
    grown = alloc.ensure("A", 13, 100)
    tables, free = alloc.block_tables, list(alloc.free_block_ids)
    assert grown is True and tables == {"A": [0, 1, 2, 3]} and free == [], (
        f"after the refusals, free('B') then ensure('A', 13) must give A the freed block 3: "
        f"expected True, block tables {{'A': [0, 1, 2, 3]}} and no free block, got {grown}, "
        f"{tables} and free_block_ids {free} (a refused call changes nothing, then or at a "
        "later call)"
    )


@graded(
    1,
    "Paged: free returns every block of the request to the back of the free list, in "
    "table order or tail first",
    f"{DOC}#task-2-paged-allocation",
)
def test_paged_free_returns_the_blocks():
    """Freed blocks are handed out again after the blocks that were already free."""
    alloc = frag().PagedAllocator(16, 4)
    assert alloc.ensure("A", 8, 100), "ensure('A', 8 tokens) on 4 free blocks is True"
    alloc.free("A")
    assert "A" not in alloc.block_tables, (
        f"a freed request has no block table: {alloc.block_tables}"
    )
    got = list(alloc.free_block_ids)
    assert got[:2] == [2, 3] and sorted(got[2:]) == [0, 1], (
        f"A's blocks 0 and 1 go back after the blocks already free, 2 and 3: expected "
        f"[2, 3, 0, 1] (or [2, 3, 1, 0], tail first as vLLM frees), got {got}"
    )
    free = alloc.num_free_tokens()
    assert free == 16, f"after the free every slot is free again (16): got {free}"
    with pytest.raises(ValueError):
        alloc.free("A")
    # Nor does the refusal leave a change for later: the next call takes the four free blocks,
    # in the free list's order.
    assert alloc.ensure("B", 16, 100) is True, "ensure('B', 16 tokens) on 4 free blocks is True"
    tables, free = alloc.block_tables, list(alloc.free_block_ids)
    assert tables == {"B": got} and free == [], (
        f"after the refused free('A') (A holds nothing), ensure('B', 16) must take the four "
        f"free blocks in the free list's order, {got}: block tables {tables}, free_block_ids "
        f"{free} (a refused call changes nothing, then or at a later call)"
    )
    # A table out of block-id order: C grows into block 3, then into A's freed block 0.
    alloc = frag().PagedAllocator(16, 4)
    for rid in "ACB":
        assert alloc.ensure(rid, 4, 100), f"ensure({rid!r}, 4 tokens) on a free block is True"
    alloc.free("A")
    assert alloc.ensure("C", 12, 100) and alloc.block_tables["C"] == [1, 3, 0], (
        f"C (block 1) grows to 3 blocks: the free 3, then A's freed 0, so [1, 3, 0]; block "
        f"tables {alloc.block_tables}"
    )
    alloc.free("C")
    got = list(alloc.free_block_ids)
    assert got in ([1, 3, 0], [0, 3, 1]), (
        f"C's table [1, 3, 0] goes back in table order, [1, 3, 0], or tail first, [0, 3, 1], "
        f"not sorted by block id: free_block_ids {got}"
    )


@graded(
    2,
    "split_held: used = the tokens now; reserved = held slots the request will still "
    "fill before it finishes; internal = held slots it will never fill",
    f"{DOC}#task-3-where-the-held-memory-goes",
)
def test_split_held():
    """The three parts add up to what is held, whatever the allocator."""
    split = frag().split_held
    assert tuple(split(4, 5, 8)) == (4, 1, 3), "contiguous: 4 tokens, final 5, 8 reserved"
    assert tuple(split(5, 7, 8)) == (5, 2, 1), "paged: 5 tokens in 2 blocks of 4, final 7"
    assert tuple(split(7, 7, 8)) == (7, 0, 1), "a finished request: 7 used, 1 never filled"
    assert tuple(split(3, 10, 4)) == (3, 1, 0), "one block of 4, the request goes on past it"
    assert tuple(split(8, 8, 8)) == (8, 0, 0), "a full, finished request: all 8 used"
    with pytest.raises(ValueError):
        split(5, 7, 4)
