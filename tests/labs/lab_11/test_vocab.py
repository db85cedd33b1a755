"""lab-11, part 3: the vocabulary is padded to a multiple of 64, then split evenly."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from grading.suite import graded
from tests.labs.common import GRADED_SETTINGS, same_data
from tests.labs.lab_11.support import SHARES, check_table, plain_ints_hint, show, side, value


@graded(
    2,
    "pad_vocab_size rounds UP to a multiple of pad_to (64 by default); a multiple stays as it is",
    SHARES,
)
def test_pad_vocab_size():
    """SmolLM2's 49,152 and Llama-3's 128,256 stay; GPT-2's 50,257 becomes 50,304."""
    cases = [[49152], [128256], [32000], [50257], [151936], [1], [64], [65], [50257, 128]]
    cases += [[100, 1], [128, 96]]  # a multiple of 64 is not one of 96: 128 becomes 192
    check_table("pad_vocab_size", cases, "vocabulary padding")


@graded(
    2,
    "vocab_range: the rank's equal share of the PADDED vocabulary, so that every shard "
    "has one shape; the last range may run past the real vocabulary",
    SHARES,
)
@GRADED_SETTINGS
@given(vocab=st.integers(1, 200_000), tp=st.sampled_from([1, 2, 4, 8, 16, 32, 64]))
def test_vocab_ranges_tile_the_padded_vocabulary(vocab: int, tp: int):
    """A vocabulary of any size over a power-of-two number of ranks."""
    padded = -(-vocab // 64) * 64
    size = padded // tp
    got = side().outcomes("vocab_range", [[vocab, r, tp] for r in range(tp)])
    for rank, outcome in enumerate(got):
        rng = value(outcome, f"vocab_range({vocab}, {rank}, {tp})")
        assert same_data(rng, [rank * size, (rank + 1) * size]), (
            f"vocab_range({vocab}, {rank}, {tp}) should be ({rank * size}, {(rank + 1) * size}) "
            f"({vocab:,} padded to {padded:,}, {size:,} ids a rank), two plain ints (token ids "
            f"index the embedding's rows), got {show(outcome)}{plain_ints_hint(rng)}"
        )


@graded(
    1,
    "vocab_range is shard_range of the padded vocabulary: a padded vocabulary tp does not "
    "divide, or a rank outside [0, tp_size), is refused with ValueError, never floored into "
    "short shards that leave the last ids to nobody",
    SHARES,
)
def test_vocab_range_refuses():
    """A vocabulary of 100 (padded to 128) over 3 ranks; GPT-2's 50,257 at ranks 4 and -1 of 4;
    beside them, valid calls (100 over 2 ranks, GPT-2's last rank of 4)."""
    check_table(
        "vocab_range",
        [[100, 0, 3], [100, 2, 3], [50257, 4, 4], [50257, -1, 4], [100, 1, 2], [50257, 3, 4]],
        "vocab_range must refuse like shard_range (100 ids pad to 128, which 3 ranks cannot "
        "split evenly; a group of 4 has ranks 0..3)",
    )
