"""lab-11, part 1: even shares. ``divide`` refuses what does not split, ``shard_range`` tiles a
dimension, ``num_heads_per_rank`` splits the query heads."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from grading.suite import graded
from tests.labs.common import GRADED_SETTINGS, same_data
from tests.labs.lab_11.support import (
    KV_HEADS,
    SHARES,
    check_table,
    numbers,
    plain_ints_hint,
    show,
    side,
    value,
)


@graded(
    2,
    "divide: the exact quotient, or a ValueError naming both numbers (a denominator of 0 "
    "is a ValueError too); a sharding rule that floors hands the ranks short shards "
    "without an error",
    SHARES,
)
def test_divide_is_exact_or_refuses():
    """12 / 4, 9 / 3, 0 / 5 and 4096 / 8 divide; 9 / 2, 7 / 4 and 5 / 0 do not."""
    cases = [[12, 4], [9, 3], [0, 5], [4096, 8], [9, 2], [7, 4], [4097, 8], [5, 0]]
    got = check_table("divide", cases, "divide must be exact")
    for (a, b), outcome in zip(cases, got, strict=True):
        if outcome[0] == "error" and b:
            assert {a, b} <= numbers(outcome[2]), (
                f"divide({a}, {b}) refused, but its message does not name {a} and {b}: "
                f"{outcome[2]!r}"
            )


@graded(
    3,
    "shard_range: rank r holds [r * size, (r + 1) * size) with size = total / tp_size; "
    "the ranks' ranges tile [0, total) in rank order",
    SHARES,
)
@GRADED_SETTINGS
@given(tp=st.integers(1, 16), size=st.integers(0, 40))
def test_shard_ranges_tile_the_dimension(tp: int, size: int):
    """Every rank's range of a dimension of tp * size items: equal, in order, no gap."""
    total = tp * size
    got = side().outcomes("shard_range", [[total, r, tp] for r in range(tp)])
    ranges = [value(o, f"shard_range({total}, {r}, {tp})") for r, o in enumerate(got)]
    start = 0
    for rank, rng in enumerate(ranges):
        assert same_data(rng, [start, start + size]), (
            f"shard_range({total}, {rank}, {tp}) should be ({start}, {start + size}), two plain "
            f"ints: rank {rank}'s {size} items of {total} over {tp} ranks; got {show(got[rank])}"
            f"{plain_ints_hint(rng)}"
        )
        start += size


@graded(
    2,
    "shard_range refuses a total that does not divide (via divide) and a rank outside [0, tp_size)",
    SHARES,
)
def test_shard_range_refuses():
    """10 rows over 4 ranks, rank 4 of 4, rank -1; and beside them, the valid calls they
    spoil (a check that refuses everything is not a check). Both wrong: the rank's error."""
    check_table(
        "shard_range",
        [[10, 0, 4], [10, 3, 4], [12, 4, 4], [12, -1, 4], [12, 0, 0], [12, 3, 4], [10, 1, 2]],
        "shard_range must refuse only what does not split",
    )
    outcome = side().outcomes("shard_range", [[10, 5, 4]])[0]
    assert outcome[0] == "error" and 10 not in numbers(str(outcome[2])), (
        "shard_range(10, 5, 4): rank 5 is outside the group of 4 and 10 rows do not split 4 "
        "ways; the rank is checked first (_check_rank), so the error is about rank 5, not "
        f"about 10: {show(outcome)}"
    )


@graded(
    1,
    "num_heads_per_rank: query heads are split evenly, never replicated: total / tp_size, "
    "refused when it does not divide",
    KV_HEADS,
)
def test_query_heads_per_rank():
    """SmolLM2's 9 heads over 1, 3, 9 and 2 ranks; Llama-3-8B's 32 over 8 and 16."""
    check_table(
        "num_heads_per_rank",
        [[9, 1], [9, 3], [9, 9], [9, 2], [32, 8], [32, 16], [32, 3]],
        "query heads per rank",
    )
