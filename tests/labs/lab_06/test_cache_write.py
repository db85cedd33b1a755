"""lab-06, part 1: slot mapping and the cache write (``compute_slot_mapping``,
``reshape_and_cache``)."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from grading.remote import writes
from grading.suite import graded, learner_module
from tests.labs.common import GRADED_SETTINGS
from tests.labs.lab_06.oracle import as_array, pa

DOC = "phases/04-attention-kernels/README.md"


@graded(
    1, "slot = block_table[p // block_size] * block_size + p % block_size", f"{DOC}#slot-mapping"
)
def test_slot_mapping_worked_example():
    """The slots of positions 0-11 through the table [7, 2, 5] with blocks of 4 tokens."""
    got = as_array(pa().compute_slot_mapping(np.array([7, 2, 5]), np.arange(12), 4), "slots")
    want = [28, 29, 30, 31, 8, 9, 10, 11, 20, 21, 22, 23]
    assert got.tolist() == want, (
        f"positions 0-3 live in logical block 0 = physical block 7 (slots 28-31), 4-7 in block 2 "
        f"(slots 8-11), 8-11 in block 5 (slots 20-23): expected {want}, got {got.tolist()}"
    )


@st.composite
def slot_cases(draw):
    block_size = draw(st.sampled_from([1, 2, 3, 4, 8, 16]))
    num_blocks = draw(st.integers(1, 12))
    pool = draw(st.integers(num_blocks, 40))
    table = draw(st.permutations(range(pool)))[:num_blocks]
    capacity = num_blocks * block_size
    positions = draw(st.lists(st.integers(0, capacity - 1), min_size=1, max_size=30))
    return block_size, table, positions


@graded(
    3,
    "slot = block_table[p // block_size] * block_size + p % block_size: the block "
    "table maps the LOGICAL block p // block_size; the offset p % block_size is unchanged",
    f"{DOC}#slot-mapping",
)
@GRADED_SETTINGS
@given(slot_cases())
def test_slot_formula(case):
    """Any block size, any table (a random choice of physical blocks), positions in any order."""
    block_size, table, positions = case
    got = as_array(
        pa().compute_slot_mapping(np.array(table), np.array(positions), block_size), "slots"
    )
    assert got.shape == (len(positions),), f"slots shape {got.shape}, expected ({len(positions)},)"
    for p, slot in zip(positions, got.tolist()):
        want = table[p // block_size] * block_size + p % block_size
        assert slot == want, (
            f"position {p} with block_size {block_size} and table {table}: logical block "
            f"{p // block_size} is physical block {table[p // block_size]}, offset "
            f"{p % block_size}, so slot {want}; got {slot}"
        )


@graded(
    1,
    "a negative position, however far below 0, is padding and maps to slot -1 without "
    "being looked up in the table; the positions passed in are left unchanged",
    f"{DOC}#padding-slots",
)
def test_negative_positions_are_padding():
    """Positions < 0 (padding of a fixed-size batch) get slot -1, the others their slot."""
    pa()
    positions = [-1, 0, 5, -1, -7, -9, -100]
    got, table_after, positions_after = learner_module("learner_side").slot_mapping_and_inputs(
        np.array([3, 1]), np.array(positions), 4
    )
    got = as_array(got, "slots")
    want = [-1, 12, 5, -1, -1, -1, -1]
    assert got.tolist() == want, (
        f"positions {positions} through the table [3, 1] (blocks of 4): expected {want} "
        f"(padding -> -1), got {got.tolist()}"
    )
    after = as_array(positions_after, "the positions after the call").tolist()
    assert after == positions, (
        f"compute_slot_mapping changed the positions array it was given: {positions} became "
        f"{after}; the model still needs them (RoPE), so work on a copy"
    )
    table = as_array(table_after, "the block table after the call").tolist()
    assert table == [3, 1], f"compute_slot_mapping changed the block table [3, 1] into {table}"
    # A one-block sequence's table has a single entry: padding parked on any stand-in logical
    # block but 0 (or looked up at all, past a table of one) falls off the end of the table.
    setting = "positions [-1, 2, -5] through the one-entry table [3] (blocks of 4)"
    try:
        got = as_array(pa().compute_slot_mapping(np.array([3]), np.array([-1, 2, -5]), 4), "slots")
    except (IndexError, ValueError) as exc:
        raise AssertionError(
            f"{setting}: raised {type(exc).__name__} ({exc}); a padding position never needs "
            "a table entry: give it slot -1 whatever the table holds, and look up only "
            "block_table[p // block_size] for p >= 0"
        ) from None
    assert got.tolist() == [-1, 14, -1], f"{setting}: expected [-1, 14, -1], got {got.tolist()}"


@graded(
    1,
    "block table entries past the blocks the positions fall in are padding (-1, 0, any id): "
    "only block_table[p // block_size] is read, so a padded table must be accepted",
    f"{DOC}#reading-the-cache",
)
def test_slot_mapping_through_a_padded_table():
    """The engine hands each sequence a row of a rectangle of tables, padded past its blocks."""
    table = [6, 2, -1, -1]
    positions = [0, 3, 4, 7, -1]
    want = [24, 27, 8, 11, -1]
    setting = f"positions {positions} through the table {table} (blocks of 4, 2 blocks used)"
    try:
        got = as_array(pa().compute_slot_mapping(np.array(table), np.array(positions), 4), "slots")
    except ValueError as exc:
        raise AssertionError(
            f"{setting}: compute_slot_mapping raised ValueError ({exc}); the -1 entries are "
            "padding no position falls in: check only the entries the positions look up"
        ) from None
    assert got.tolist() == want, f"{setting}: expected {want}, got {got.tolist()}"


@graded(
    1,
    "slots come back with the positions' shape (no positions: an empty array, not an error), "
    "as int64 whatever the inputs' integer type, and are computed in int64 (an int32 block id "
    "times block_size may pass 2**31)",
    f"{DOC}#slot-mapping",
)
def test_slot_mapping_keeps_shape():
    """A 2-D int32 array of positions gives a 2-D int64 array of slots; none give none; an int32
    table whose block id times block_size passes 2**31 still gives the right slot (upstream's
    slot-mapping kernel widens the int32 block ids to int64 before multiplying)."""
    positions = np.array([[0, 1, 2], [5, 6, -1]], dtype=np.int32)
    table = np.array([4, 0], dtype=np.int32)
    got = as_array(pa().compute_slot_mapping(table, positions, 4), "slots")
    assert got.shape == (2, 3), f"slots shape {got.shape}, expected (2, 3)"
    assert got.dtype == np.int64, (
        f"slots must be int64 (the dtype of vLLM's slot_mapping), got {got.dtype} from int32 "
        "positions and table: convert the table and the positions with .astype(np.int64) "
        "before the arithmetic"
    )
    assert got.tolist() == [[16, 17, 18], [1, 2, -1]], f"got {got.tolist()}"
    far = np.array([2**27, 3], dtype=np.int32)
    wide = as_array(pa().compute_slot_mapping(far, np.array([1, 33], dtype=np.int32), 32), "slots")
    want = [2**32 + 1, 97]
    assert wide.tolist() == want, (
        f"positions [1, 33] through the int32 table [2**27, 3] (blocks of 32): expected slots "
        f"{want}, got {wide.tolist()}: 2**27 * 32 = 2**32 wraps in int32; widen the block ids "
        "to int64 before multiplying by block_size, not the slots afterwards (the README's "
        "task 1: int64)"
    )
    try:
        none = pa().compute_slot_mapping(table, np.zeros(0, dtype=np.int32), 4)
    except ValueError as exc:
        raise AssertionError(
            f"no positions (an empty int32 array): compute_slot_mapping raised ValueError ({exc}); "
            "expected an empty int64 array (guard a max() or min() of the positions: an empty "
            "array has none)"
        ) from None
    none = as_array(none, "slots of no positions")
    assert none.shape == (0,) and none.dtype == np.int64, (
        f"no positions: expected an empty int64 array of shape (0,), got {none.dtype} of shape "
        f"{none.shape}"
    )


# -------------------------------------------------------------------------- reshape_and_cache


@st.composite
def write_cases(draw):
    block_size = draw(st.sampled_from([1, 2, 4, 8]))
    num_blocks = draw(st.integers(1, 6))
    num_kv_heads = draw(st.integers(1, 3))
    head_dim = draw(st.sampled_from([1, 4, 8]))
    slots = draw(st.permutations(range(num_blocks * block_size)))
    num_tokens = draw(st.integers(0, len(slots)))
    seed = draw(st.integers(0, 99))
    return block_size, num_blocks, num_kv_heads, head_dim, slots[:num_tokens], seed


def expected_caches(key_cache, value_cache, key, value, slots):
    kc, vc = key_cache.copy(), value_cache.copy()
    block_size = kc.shape[1]
    for i, slot in enumerate(slots):
        if slot >= 0:
            kc[slot // block_size, slot % block_size] = key[i]
            vc[slot // block_size, slot % block_size] = value[i]
    return kc, vc


def check_caches(key_cache, value_cache, want_k, want_v, rule: str) -> None:
    for name, got, want in (("key_cache", key_cache, want_k), ("value_cache", value_cache, want_v)):
        diff = np.argwhere(np.any(got != want, axis=(2, 3)))
        if diff.size:
            block, offset = diff[0].tolist()
            slot = block * got.shape[1] + offset
            raise AssertionError(
                f"{rule}: {name}[{block}, {offset}] (slot {slot}) holds the wrong row "
                f"({len(diff)} slots differ); expected {_row(want[block, offset])}, "
                f"got {_row(got[block, offset])}"
            )


def _row(row) -> str:
    """The first values of a cache row (head 0), short: enough to recognise which row it is."""
    values = ", ".join(f"{v:.4g}" for v in row[0, :4])
    return f"[{values}{', ...' if row.shape[-1] > 4 else ''}]"


@graded(
    2,
    "reshape_and_cache: token i's K row goes to key_cache[s // block_size, s % block_size] "
    "for s = slot_mapping[i] (V likewise into value_cache); every other slot is untouched",
    f"{DOC}#writing-the-cache",
)
@GRADED_SETTINGS
@given(write_cases())
def test_reshape_and_cache_scatters_rows(case):
    """New rows land in their slots, in place; nothing else in either cache changes."""
    block_size, num_blocks, kv_heads, head_dim, slots, seed = case
    rng = np.random.default_rng(seed)
    shape = (num_blocks, block_size, kv_heads, head_dim)
    key_cache, value_cache = rng.standard_normal(shape), rng.standard_normal(shape)
    key = rng.standard_normal((len(slots), kv_heads, head_dim))
    value = rng.standard_normal((len(slots), kv_heads, head_dim))
    want_k, want_v = expected_caches(key_cache, value_cache, key, value, slots)
    pa().reshape_and_cache(key, value, key_cache, value_cache, np.array(slots, dtype=np.int64))
    check_caches(
        key_cache, value_cache, want_k, want_v, f"slots {list(slots)} with block_size {block_size}"
    )


@graded(
    1,
    "reshape_and_cache writes into the caches it is given and returns None, as upstream's op "
    "does: the caller keeps using its own caches",
    f"{DOC}#writing-the-cache",
)
def test_reshape_and_cache_returns_none():
    """The write is in place: the result is None and the given caches hold the new rows."""
    rng = np.random.default_rng(5)
    shape = (2, 4, 1, 8)
    key_cache, value_cache = rng.standard_normal(shape), rng.standard_normal(shape)
    key, value = rng.standard_normal((2, 1, 8)), rng.standard_normal((2, 1, 8))
    slots = np.array([6, 1])
    want_k, want_v = expected_caches(key_cache, value_cache, key, value, slots)
    result = pa().reshape_and_cache(key, value, key_cache, value_cache, slots)
    check_caches(key_cache, value_cache, want_k, want_v, "slots [6, 1] with block_size 4")
    assert result is None, (
        f"reshape_and_cache wrote the rows but returned {type(result).__name__}: it writes in "
        "place and returns None (the stub's signature, and upstream's reshape_and_cache)"
    )


@graded(
    2,
    "a slot < 0 is padding and is skipped; numpy's cache[-1] would silently overwrite "
    "the LAST slot of the cache",
    f"{DOC}#padding-slots",
)
def test_padding_slots_are_skipped():
    """Slot -1 (and any negative slot) leaves both caches exactly as they were."""
    rng = np.random.default_rng(6)
    shape = (3, 4, 2, 8)
    key_cache, value_cache = rng.standard_normal(shape), rng.standard_normal(shape)
    key = rng.standard_normal((5, 2, 8))
    value = rng.standard_normal((5, 2, 8))
    slots = np.array([-1, 5, -1, 0, -4])
    want_k, want_v = expected_caches(key_cache, value_cache, key, value, slots)
    pa().reshape_and_cache(key, value, key_cache, value_cache, slots)
    check_caches(
        key_cache,
        value_cache,
        want_k,
        want_v,
        "slots [-1, 5, -1, 0, -4]: only slots 5 and 0 may change",
    )


@graded(
    1,
    "write through [block, offset] indexing: a reshape of a non-contiguous cache is a "
    "copy, and writing into the copy changes nothing",
    f"{DOC}#writing-the-cache",
)
def test_writes_land_in_a_strided_cache():
    """K and V caches that are views into one interleaved buffer are still updated in place.

    Arrays reach the learner process as contiguous copies, so the views are made there
    (``learner_side.write_interleaved``) from the buffer sent, and the buffer comes back."""
    pa()
    rng = np.random.default_rng(7)
    buffer = rng.standard_normal((4, 2, 4, 2, 8))  # [blocks, k/v, block_size, heads, dim]
    want_k, want_v = buffer[:, 0].copy(), buffer[:, 1].copy()
    key = rng.standard_normal((3, 2, 8))
    value = rng.standard_normal((3, 2, 8))
    slots = np.array([9, 2, 15])
    want_k, want_v = expected_caches(want_k, want_v, key, value, slots)
    side = learner_module("learner_side")
    got = side.write_interleaved(writes(buffer.copy()), key, value, slots)
    assert isinstance(got, np.ndarray) and got.shape == buffer.shape, (
        f"the interleaved buffer came back as {type(got).__name__} "
        f"{getattr(got, 'shape', '')}, expected an array of shape {buffer.shape}"
    )
    check_caches(
        got[:, 0],
        got[:, 1],
        want_k,
        want_v,
        "caches that are strided views (buffer[:, 0] and buffer[:, 1])",
    )
